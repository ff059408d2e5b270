#pragma once
// The executable: a traced, optimised graph lowered to a flat list of bound kernel calls.
// See DESIGN.md "Compile" step 4 and Note [Replay] in executable.cpp.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/compile/graph.h"
#include "kiln/compile/passes.h"

namespace kiln::compiler {

struct ExecutableStats {
  int steps = 0;               // kernel calls per replay
  int allocating_steps = 0;    // steps whose kernel allocates its result (no out= variant)
  int host_reads = 0;          // graph breaks replayed between segments (piecewise)
  int segments = 1;            // stretches of steps between graph breaks
  size_t arena_bytes = 0;      // one block for every planned intermediate
  size_t unplanned_bytes = 0;  // the same intermediates without reuse
  size_t output_bytes = 0;     // buffers handed to the caller
  // Device graphs (Note [Device graphs] in device_graphs.cpp).
  bool device_graphs = false;  // replays launch captured graphs
  std::string no_graphs;       // why not, when the device has graphs but this one does not
  int graph_segments = 0;      // captured graphs per replay
  int captures = 0;            // times the steps were captured (the first, and re-captures)
  int graph_updates = 0;       // captures applied by update() (only addresses changed)
  int graph_nodes = 0;         // kernel launches recorded in the graphs
  // Collectives run on the executable's communication stream, overlapping the steps after
  // them (Note [Collectives on a stream of their own] in comm_stream.cpp).
  int comm_stream_steps = 0;
};

// How an executable may use device graphs.
struct GraphOptions {
  bool capture = true;     // capture on devices that support it (CompileOptions::capture)
  bool piecewise = false;  // copies through the host end a segment instead of failing capture
  std::string name;        // the compiled function's, for errors
};

class Executable {
 public:
  // Lowers `graph` (after the passes) to steps and plans its memory.
  // Inputs with `is_static[i]` stay bound to the storage they were traced with.
  Executable(Graph graph, std::vector<bool> is_static, GraphOptions graphs = {});
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  // Replays with `inputs` (which the guards have checked) and writes the outputs.
  void run(std::span<const Tensor> inputs, TensorList& outputs);

  const Graph& graph() const { return graph_; }
  // References this executable holds to `t` (its graph, slots and bound arguments): guards on
  // free tensors count them as the cache entry's own.
  int refs_to(const TensorImpl* t) const;
  const ExecutableStats& stats() const { return stats_; }
  // One line per step: "3: addmm_out(%7 <- %2, %5, %6) [cpu kernel]".
  std::string str() const;

 private:
  struct Step;        // executable_impl.h
  struct Graphs;      // executable_impl.h
  struct CommStream;  // executable_impl.h
  // build() lowers the graph in these steps (executable_build.cpp).
  struct Lowered;
  void build();
  Lowered lower_nodes() const;                // how each node runs
  void make_buffers(const Lowered& lowered);  // storage per buffer, the arena
  void make_slots();                          // a tensor per value over its buffer
  void bind_traced_inputs();                  // inputs to buffers; drops what only tracing needed
  void make_steps(const Lowered& lowered);    // bound kernel calls
  // Device graphs (device_graphs.cpp).
  void setup_graphs();
  void run_graphs(std::span<const Tensor> inputs, TensorList& outputs);
  void capture(bool update);
  // Collectives on a stream of their own (comm_stream.cpp).
  void plan_comm_stream();
  // The communication stream's work joined into the current stream, if any is outstanding.
  void join_comm_stream();
  // Replay (executable.cpp).
  void run_steps(size_t begin, size_t end);
  void run_steps_in_order(size_t begin, size_t end);  // run_steps without its error handling
  // Binds input i's buffer to `input`'s storage; whether that changed anything.
  bool bind_input(size_t i, const Tensor& input);
  void bind_inputs(std::span<const Tensor> inputs);
  void rebind(int buffer, Ref<StorageImpl> storage, int64_t delta_bytes);
  Tensor output(int value, std::span<const Tensor> inputs) const;

  Graph graph_;
  ExecutableStats stats_;
  std::vector<Tensor> slots_;                // per value: the tensor kernels are bound to
  std::vector<std::vector<int>> in_buffer_;  // per buffer: its values
  std::vector<Ref<StorageImpl>> storage_;    // per buffer: what its slots point at now
  std::vector<int64_t> bound_offset_;        // per input buffer: offset (bytes) now bound
  std::vector<int> owned_outputs_;           // buffers handed to the caller, reallocated on need
  std::vector<int> input_buffers_;           // per input: its buffer if it is that buffer's first
  std::vector<bool> is_static_;              // per input: bound once (the guards check it)
  Ref<StorageImpl> arena_;
  std::unordered_map<const TensorImpl*, int> bound_refs_;  // per impl: copies in bound calls
  std::vector<std::unique_ptr<Step>> steps_;
  GraphOptions graph_options_;
  std::unique_ptr<Graphs> graphs_;
  std::unique_ptr<CommStream> comm_;  // set when a step communicates on a device with streams
  // Calls on another stream than the previous call's wait for it: every call (the warm-up,
  // a replay of steps or of graphs) uses the executable's buffers. Set for an executable on
  // one device other than the cpu.
  struct StreamOrder {
    DeviceInterface* iface = nullptr;
    Device device;
    std::optional<uint64_t> last = {};
    void follow();
  };
  std::optional<StreamOrder> order_;
};

}  // namespace kiln::compiler
