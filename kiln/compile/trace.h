#pragma once
// Tracing: a call run for real with the Trace key included records every op that reaches the
// Trace layer (below Autograd, so forward, backward and optimizer ops alike) into a Graph.
// See DESIGN.md "Compile" step 1 and Note [Values, buffers and mutation] in graph.h.
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/compile/graph.h"
#include "kiln/compile/host_guard.h"

namespace kiln::compiler {

// Why a finished trace cannot be replayed as it is.
struct TraceProblems {
  // Host reads (item(), to_vector(), printing, data_ptr()): "item() of %12 after n11 'sum'".
  std::vector<std::string> host_reads;
  // Of those, the reads that decide a result's size (nonzero, and so indexing with a bool
  // mask): piecewise cannot replay them, since the ops after them replay traced shapes.
  std::vector<std::string> shape_reads;
  // Tensors made by nodes that outlived the call without being returned (stored in optimizer
  // state, in .grad, in a module): "node 40 'mm' made %57 [64, 512] float32".
  std::vector<std::string> escapes;
  // Outputs carrying autograd history (the replay records none).
  std::vector<std::string> outputs_with_history;
  // Tensors made without an op inside the call and then written by a node.
  std::vector<std::string> written_constants;
  // Host values the call changed and did not restore: "module '1' (Dropout) training flag
  // changed from true to false" (See Note [Host values steer traces] in host_guard.cpp).
  std::vector<std::string> host_changes;
};

class Tracer {
 public:
  explicit Tracer(std::span<const Tensor> inputs);
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Tracing is on for this thread while a Scope lives (Trace key included, host reads noted).
  class Scope {
   public:
    explicit Scope(Tracer& t);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer* saved_;
    IncludeKeyGuard include_;
    detail::HostReadHook saved_hook_;
    detail::ReleaseHook saved_release_;
    HostGuardRecorder::Scope host_guards_;
  };

  // Ends the trace: maps the outputs, classifies buffers (constants, escapes) and returns the
  // graph; what stands in the way of replaying it is left in `problems`.
  Graph finish(std::span<const Tensor> outputs, TraceProblems& problems);

  // Called by the Trace fallback: records `op`, runs it below Trace, records its results.
  void record(const OpDef& op, Stack& stack);
  void host_read(const TensorImpl& t, const char* what);
  // A TensorImpl or StorageImpl at `p` was destroyed: forget it (its address may be reused).
  void released(const void* p);
  // Whether ops called now on this thread are being recorded (not from inside a kernel).
  bool tracing() const;
  // The host values the traced call read or changed, those of objects it destroyed dropped by
  // finish() (See Note [Host values steer traces]).
  const HostGuardRecorder& host_guards() const { return host_guards_; }

 private:
  int value_for(const Tensor& t);
  int new_value(const Tensor& t, int buffer, int producer);
  int new_buffer(const Tensor& t, BufferKind kind, int producer);

  Graph g_;
  std::unordered_map<const TensorImpl*, int> value_of_;
  std::unordered_map<const StorageImpl*, int> buffer_of_;  // storages alive now
  HostGuardRecorder host_guards_;
};

// The tracer active on this thread, or nullptr.
Tracer* current_tracer();

// Which arguments of an op it writes ("Tensor(a!)" in its schema; an out= op's `out`).
const std::vector<bool>& written_args(const OpDef& op);

}  // namespace kiln::compiler
