#pragma once
// Guards: the checks a call must pass to replay a cache entry. See DESIGN.md "Compile" step 5.
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kiln/compile/graph.h"
#include "kiln/compile/host_guard.h"

namespace kiln::compiler {

struct InputGuard {
  DType dtype;
  Device device;  // canonical: every spelling of a device is one value
  Shape sizes;
  Shape strides;
  bool requires_grad = false;
  bool contiguous = true;
  uint32_t dynamic = 0;     // dims whose size is not checked
  int alias_of = -1;        // an earlier input whose storage this one shares, or -1
  int64_t alias_delta = 0;  // storage offset relative to alias_of's
};

// Thread-local state a trace depends on.
struct ModeState {
  bool grad_enabled = true;
  bool inference = false;
  DType default_dtype;
  Device default_device;
  static ModeState current();
  bool operator==(const ModeState&) const = default;
};

class Guards {
 public:
  // Guards for `graph`, traced with `inputs` under `modes`. Build them once the executable
  // holds its references to free tensors (each guard counts what the entry holds).
  // `dynamic[i]` are the dims of input i left unchecked. Static inputs are not guarded by
  // storage: an executable re-binds one whose storage changed (updating its device graphs).
  // `held(t)` counts the references the cache entry holds to free tensor `t`. `host` are the
  // host values the trace read (See Note [Host values steer traces] in host_guard.cpp).
  using HeldRefs = std::function<int(const TensorImpl*)>;
  Guards(const Graph& graph, std::span<const Tensor> inputs, const ModeState& modes,
         std::span<const uint32_t> dynamic, const HeldRefs& held, std::vector<HostGuard> host);
  // The entry came to hold more references (another executable, a size template).
  void add_held(const HeldRefs& held);
  // Whether any input has a dynamic dim.
  bool has_dynamic() const { return has_dynamic_; }
  // The sizes of the dynamic dims of `inputs`, in order (the key of a size specialisation).
  void dynamic_sizes(std::span<const Tensor> inputs, std::vector<int64_t>& out) const;

  // The fast path: whether `inputs` (and the thread's modes) pass every check.
  bool check(std::span<const Tensor> inputs, const ModeState& modes) const;
  // The first failing check in words ("input 0 size mismatch at dim 0: expected 4, got 8"),
  // or "" when all pass.
  std::string why(std::span<const Tensor> inputs, const ModeState& modes,
                  std::span<const std::string> names) const;
  // Every check, one per line (KILN_LOGS=guards).
  std::string str(std::span<const std::string> names) const;
  size_t size() const;

 private:
  std::vector<InputGuard> inputs_;
  ModeState modes_;
  bool has_dynamic_ = false;
  // Free tensors by identity: each must still be referenced outside the compiled function (one
  // that was dropped or replaced will not be reached by the function again).
  struct FreeGuard {
    const TensorImpl* impl;
    int internal_refs;  // references the cache entry itself holds
    std::string label;
  };
  std::vector<FreeGuard> free_;
  // Parameters whose .grad the trace saw: the same gradient tensor must still be attached.
  struct GradGuard {
    Tensor param;
    const TensorImpl* grad;
    std::string label;
  };
  std::vector<GradGuard> grads_;
  // Host values the trace read (rarely any: last, off the common path).
  std::vector<HostGuard> host_;
};

// "input 0 ('x')" or "input 0".
std::string input_label(size_t i, std::span<const std::string> names);

}  // namespace kiln::compiler
