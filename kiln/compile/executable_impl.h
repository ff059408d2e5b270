#pragma once
// What the files of the executable share: its steps and its device graphs. Internal to
// kiln/compile: executable.cpp (replay), executable_build.cpp (a Graph lowered to steps),
// device_graphs.cpp (capture and graph replay).
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/compile/executable.h"

namespace kiln::compiler {

// One kernel call of a replay (Note [Replay] in executable.cpp).
struct Executable::Step {
  enum class Kind : uint8_t { Call, Result, HostRead } kind = Kind::Call;
  std::unique_ptr<BoundCall> call;
  int node = -1;
  int read_value = -1;                       // HostRead
  std::vector<int> result_buffers;           // Result: buffer of each result, in order
  std::string_view name;                     // the kernel's op name
  DispatchKey key = DispatchKey::Undefined;  // the backend its kernel runs on
  // Note [Collectives on a stream of their own] in comm_stream.cpp.
  bool on_comm_stream = false;    // a collective, run on the communication stream
  bool join_comm_before = false;  // waits for the communication stream's work first
};

// The executable's two events on the communication stream of the running thread (Note
// [Collectives on a stream of their own] in comm_stream.cpp).
struct Executable::CommStream {
  CommStream(DeviceInterface* iface, int index);
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Runs `call` on the stream, after everything queued so far on the current stream.
  void run(BoundCall& call);
  // The current stream waits for everything run on the stream so far.
  void join();

  DeviceInterface* iface;
  int index;
  uint64_t forked = 0;   // recorded on the current stream before each collective
  uint64_t done = 0;     // recorded on the stream after each collective
  bool pending = false;  // work on the stream that the current stream has not waited for
};

// The executable's device graphs (Note [Device graphs] in device_graphs.cpp).
struct Executable::Graphs {
  DeviceInterface* iface = nullptr;
  Device device;
  uint64_t stream = 0, pool = 0;
  // The replay, in order: captured segments of steps, and steps run between them.
  struct Item {
    size_t begin = 0, end = 0;  // steps [begin, end)
    bool eager = false;         // one step run as it is (a host read, a copy through the host)
    uint64_t exec = 0;          // a captured segment's executable graph
  };
  std::vector<Item> schedule;
  int host_step = -1;  // a step on the cpu, which no graph can hold (without piecewise)
  bool captured = false;
  int runs = 0;
  std::vector<int> copy_in;                                  // inputs copied into static buffers
  std::vector<int> copy_back;                                // of those, the ones the steps write
  std::vector<std::pair<const Tensor*, const void*>> baked;  // free tensors' captured addresses

  // Destroys the executable graphs: the next replay captures again.
  void drop_execs();
  ~Graphs();
};

// The allocator buffers on `d` come from; raises a DeviceError when no backend serves `d`.
Allocator* allocator_for(Device d);

}  // namespace kiln::compiler
