// The kernels of the collective ops: validation, then the group's backend for the tensors'
// device type. Registered at every backend key.
#include <numeric>

#include "kiln/core/tensor_impl.h"
#include "kiln/distributed/collective_backend.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

// Note [Collectives are ops]
// all_reduce and its family are ops of kiln/ops/op_list.h like add: a schema, a meta function
// (kiln/ops/collective_meta.cpp: the group's size is an argument, so shapes are known without
// the group), a backward formula (collective_grads.cpp) and a kernel. So autograd records
// them, compile traces them (marked OpDef::side_effects: never dropped or merged) and device
// graphs capture them with the kernels around them. Whether a step's collectives are captured
// is decided by the trace, identically on every rank. Which path a backend takes may depend on
// it: on CUDA in Auto, a small all-reduce takes NCCL eagerly and the custom all-reduce when
// captured (Note [Which all-reduce in Auto] in kiln/backend/cuda/custom_allreduce.cpp), so a
// step's warm-up and its replays may differ in the last bit past two ranks.
//
// One kernel per op serves every device type: it validates the call (before anything is sent,
// so a bad call fails on its own rank with a clear message), then hands the tensors to the
// group's backend for their device type (collective_backend.h), which orders the collective in
// the device's work. The kernel is registered at CPU, CUDA and every PrivateUse key, so a
// plugin's tensors reach it without the plugin knowing about collectives.
namespace kiln::distributed {
namespace {

std::string where(const ProcessGroup& g) {
  return fmt::format("group {} (rank {} of {})", g.name(), g.rank(), g.size());
}

void check_defined(std::string_view op, const ProcessGroup& g, const Tensor& t, const char* what) {
  KILN_CHECK(t.defined(), "[{}] {} is undefined ({})", op, what, where(g));
}
void check_contiguous(std::string_view op, const ProcessGroup& g, const Tensor& t,
                      const char* what) {
  KILN_CHECK(t.is_contiguous(),
             "[{}] {} must be contiguous (written in place), got sizes {} strides {} ({})", op,
             what, t.sizes(), t.strides(), where(g));
}
// `out` must be on self's device, of its dtype, of `sizes`, contiguous and apart from it.
void check_out(std::string_view op, const ProcessGroup& g, const Tensor& out, const Tensor& self,
               IntArrayRef sizes) {
  check_defined(op, g, out, "out");
  KILN_CHECK_DEVICE(out.device() == self.device(), "[{}] out is on {} but self is on {} ({})", op,
                    out.device(), self.device(), where(g));
  KILN_CHECK_TYPE(out.dtype() == self.dtype(), "[{}] out is {} but self is {} ({})", op,
                  out.dtype(), self.dtype(), where(g));
  KILN_CHECK(out.sizes() == sizes, "[{}] out has sizes {}, expected {} for self of sizes {} ({})",
             op, out.sizes(), sizes, self.sizes(), where(g));
  check_contiguous(op, g, out, "out");
  if (out.impl()->storage() == self.impl()->storage() && out.numel() && self.numel()) {
    auto* a = static_cast<const char*>(out.impl()->data());
    auto* b = static_cast<const char*>(self.impl()->data());
    KILN_CHECK(a + out.nbytes() <= b || b + self.nbytes() <= a,
               "[{}] out overlaps self (they share storage); pass separate tensors ({})", op,
               where(g));
  }
}
void check_group_size(std::string_view op, const ProcessGroup& g, int64_t group_size) {
  KILN_CHECK(group_size == g.size(), "[{}] group_size is {} but {} has {} ranks", op, group_size,
             where(g), g.size());
}
ReduceOp check_reduce(std::string_view op, const ProcessGroup& g, int64_t r, DType t) {
  ReduceOp reduce = reduce_op_from(r, op);
  KILN_CHECK_TYPE(reduce != ReduceOp::Avg || is_floating(t),
                  "[{}] avg needs a floating dtype, got {} ({})", op, t, where(g));
  return reduce;
}
int check_peer(std::string_view op, const ProcessGroup& g, int64_t peer, const char* what,
               bool may_be_self) {
  KILN_CHECK(peer >= 0 && peer < g.size(), "[{}] {} {} is outside {}", op, what, peer, where(g));
  KILN_CHECK(may_be_self || peer != g.rank(), "[{}] {} {} is this rank ({})", op, what, peer,
             where(g));
  return static_cast<int>(peer);
}
Tensor contiguous_of(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }
Tensor empty_on(IntArrayRef sizes, const Tensor& like) {
  return empty(sizes, like.dtype(), like.device());
}
// all_gather's result sizes: `group_size` blocks of self along dim 0 (a 0-d self counts as [1]).
Shape gathered_sizes(const Tensor& self, int64_t group_size) {
  Shape s(self.sizes());
  if (s.empty()) return Shape{group_size};
  s[0] *= group_size;
  return s;
}
Shape scattered_sizes(std::string_view op, const ProcessGroup& g, const Tensor& self,
                      int64_t group_size) {
  KILN_CHECK(self.dim() >= 1, "[{}] self must have at least one dimension ({})", op, where(g));
  KILN_CHECK(self.size(0) % group_size == 0,
             "[{}] dim 0 of self (sizes {}) is not divisible by the group's {} ranks ({})", op,
             self.sizes(), group_size, where(g));
  Shape s(self.sizes());
  s[0] /= group_size;
  return s;
}

Collective make(std::string_view op, const ProcessGroup& g, ReduceOp r = ReduceOp::Sum,
                int peer = -1) {
  Collective c;
  c.op = op;
  c.group = &g;
  c.reduce = r;
  c.peer = peer;
  return c;
}

// ---------------------------------------------------------------- kernels

Tensor all_reduce_k(const Tensor& self, int64_t r, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "all_reduce");
  check_defined("all_reduce", g, self, "self");
  ReduceOp op = check_reduce("all_reduce", g, r, self.dtype());
  CollectiveBackend& b = g.backend(self.device(), "all_reduce");
  Tensor in = contiguous_of(self);
  Tensor out = empty_on(self.sizes(), self);
  b.all_reduce(in, out, make("all_reduce", g, op));
  return out;
}
void all_reduce_inplace_k(const Tensor& self, int64_t r, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "all_reduce_");
  check_defined("all_reduce_", g, self, "self");
  ReduceOp op = check_reduce("all_reduce_", g, r, self.dtype());
  check_contiguous("all_reduce_", g, self, "self");
  g.backend(self.device(), "all_reduce_").all_reduce(self, self, make("all_reduce_", g, op));
}

void all_gather_out_k(const Tensor& out, const Tensor& self, int64_t group_size, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "all_gather_into_tensor");
  check_defined("all_gather_into_tensor", g, self, "self");
  check_group_size("all_gather_into_tensor", g, group_size);
  check_out("all_gather_into_tensor", g, out, self, gathered_sizes(self, group_size));
  CollectiveBackend& b = g.backend(self.device(), "all_gather_into_tensor");
  b.all_gather(contiguous_of(self), out, make("all_gather_into_tensor", g));
}
Tensor all_gather_k(const Tensor& self, int64_t group_size, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "all_gather_into_tensor");
  check_defined("all_gather_into_tensor", g, self, "self");
  check_group_size("all_gather_into_tensor", g, group_size);
  Tensor out = empty_on(gathered_sizes(self, group_size), self);
  all_gather_out_k(out, self, group_size, group);
  return out;
}

void reduce_scatter_out_k(const Tensor& out, const Tensor& self, int64_t r, int64_t group_size,
                          int64_t group) {
  const ProcessGroup& g = group_by_id(group, "reduce_scatter_tensor");
  check_defined("reduce_scatter_tensor", g, self, "self");
  check_group_size("reduce_scatter_tensor", g, group_size);
  ReduceOp op = check_reduce("reduce_scatter_tensor", g, r, self.dtype());
  check_out("reduce_scatter_tensor", g, out, self,
            scattered_sizes("reduce_scatter_tensor", g, self, group_size));
  CollectiveBackend& b = g.backend(self.device(), "reduce_scatter_tensor");
  b.reduce_scatter(contiguous_of(self), out, make("reduce_scatter_tensor", g, op));
}
Tensor reduce_scatter_k(const Tensor& self, int64_t r, int64_t group_size, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "reduce_scatter_tensor");
  check_defined("reduce_scatter_tensor", g, self, "self");
  check_group_size("reduce_scatter_tensor", g, group_size);
  Tensor out = empty_on(scattered_sizes("reduce_scatter_tensor", g, self, group_size), self);
  reduce_scatter_out_k(out, self, r, group_size, group);
  return out;
}

void broadcast_inplace_k(const Tensor& self, int64_t src, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "broadcast_");
  check_defined("broadcast_", g, self, "self");
  int root = check_peer("broadcast_", g, src, "src", true);
  check_contiguous("broadcast_", g, self, "self");
  g.backend(self.device(), "broadcast_")
      .broadcast(self, make("broadcast_", g, ReduceOp::Sum, root));
}
Tensor broadcast_k(const Tensor& self, int64_t src, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "broadcast");
  check_defined("broadcast", g, self, "self");
  int root = check_peer("broadcast", g, src, "src", true);
  CollectiveBackend& b = g.backend(self.device(), "broadcast");
  Tensor out = self.clone();  // contiguous; on the source it already holds the result
  b.broadcast(out, make("broadcast", g, ReduceOp::Sum, root));
  return out;
}

// Rows per rank for one side of all_to_all_single: `splits`, or dim 0 in equal parts.
Shape split_rows(std::string_view op, const ProcessGroup& g, IntArrayRef splits, int64_t rows,
                 const char* what) {
  if (splits.empty()) {
    KILN_CHECK(rows % g.size() == 0,
               "[{}] dim 0 ({}) is not divisible by the group's {} ranks and no {} were given "
               "({})",
               op, rows, g.size(), what, where(g));
    return Shape(static_cast<size_t>(g.size()), rows / g.size());
  }
  KILN_CHECK(static_cast<int64_t>(splits.size()) == g.size(),
             "[{}] {} has {} entries, expected one per rank ({}) ({})", op, what, splits.size(),
             g.size(), where(g));
  for (int64_t s : splits)
    KILN_CHECK(s >= 0, "[{}] {} {} has a negative entry ({})", op, what, splits, where(g));
  return Shape(splits);
}
void all_to_all_out_k(const Tensor& out, const Tensor& self, IntArrayRef out_splits,
                      IntArrayRef in_splits, int64_t group) {
  constexpr std::string_view op = "all_to_all_single";
  const ProcessGroup& g = group_by_id(group, op);
  check_defined(op, g, self, "self");
  KILN_CHECK(self.dim() >= 1, "[{}] self must have at least one dimension ({})", op, where(g));
  Shape in_rows = split_rows(op, g, in_splits, self.size(0), "input_split_sizes");
  int64_t in_total = std::accumulate(in_rows.begin(), in_rows.end(), int64_t{0});
  KILN_CHECK(in_total == self.size(0),
             "[{}] input_split_sizes {} sum to {} but dim 0 of self is {} ({})", op, in_splits,
             in_total, self.size(0), where(g));
  check_defined(op, g, out, "out");
  Shape out_rows = split_rows(op, g, out_splits, out.dim() ? out.size(0) : 0, "output_split_sizes");
  Shape want(self.sizes());
  want[0] = std::accumulate(out_rows.begin(), out_rows.end(), int64_t{0});
  // Without splits every rank sends dim 0 of self in equal parts, so out is self's size.
  if (out_splits.empty() && in_splits.empty()) want[0] = self.size(0);
  check_out(op, g, out, self, want);
  int64_t row = 1;  // elements per row of dim 0
  for (int64_t d = 1; d < self.dim(); ++d) row *= self.size(d);
  Shape send_counts(in_rows), recv_counts(out_rows);
  for (auto& c : send_counts) c *= row;
  for (auto& c : recv_counts) c *= row;
  Collective c = make(op, g);
  c.send_counts = send_counts.span();
  c.recv_counts = recv_counts.span();
  g.backend(self.device(), op).all_to_all(contiguous_of(self), out, c);
}
Tensor all_to_all_k(const Tensor& self, IntArrayRef out_splits, IntArrayRef in_splits,
                    int64_t group) {
  constexpr std::string_view op = "all_to_all_single";
  const ProcessGroup& g = group_by_id(group, op);
  check_defined(op, g, self, "self");
  KILN_CHECK(self.dim() >= 1, "[{}] self must have at least one dimension ({})", op, where(g));
  Shape sizes(self.sizes());
  if (!out_splits.empty()) {
    Shape rows = split_rows(op, g, out_splits, 0, "output_split_sizes");
    sizes[0] = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  }
  Tensor out = empty_on(sizes, self);
  all_to_all_out_k(out, self, out_splits, in_splits, group);
  return out;
}

void send_k(const Tensor& self, int64_t dst, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "send");
  check_defined("send", g, self, "self");
  int peer = check_peer("send", g, dst, "dst", false);
  g.backend(self.device(), "send").send(contiguous_of(self), make("send", g, ReduceOp::Sum, peer));
}
void recv_k(const Tensor& self, int64_t src, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "recv_");
  check_defined("recv_", g, self, "self");
  int peer = check_peer("recv_", g, src, "src", false);
  check_contiguous("recv_", g, self, "self");
  g.backend(self.device(), "recv_").recv(self, make("recv_", g, ReduceOp::Sum, peer));
}
void barrier_k(Device device, int64_t group) {
  const ProcessGroup& g = group_by_id(group, "barrier");
  g.backend(device, "barrier").barrier(device, make("barrier", g));
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  for (DispatchKey k : {DispatchKey::CPU, DispatchKey::CUDA, DispatchKey::PrivateUse1,
                        DispatchKey::PrivateUse2, DispatchKey::PrivateUse3})
    op.set_kernel(k, fn);
  op.def.set_side_effects(true);
}

const bool registered = [] {
  reg(ops::op_all_reduce, &all_reduce_k);
  reg(ops::op_all_reduce_, &all_reduce_inplace_k);
  reg(ops::op_all_gather_into_tensor, &all_gather_k);
  reg(ops::op_all_gather_into_tensor_out, &all_gather_out_k);
  reg(ops::op_reduce_scatter_tensor, &reduce_scatter_k);
  reg(ops::op_reduce_scatter_tensor_out, &reduce_scatter_out_k);
  reg(ops::op_broadcast, &broadcast_k);
  reg(ops::op_broadcast_, &broadcast_inplace_k);
  reg(ops::op_all_to_all_single, &all_to_all_k);
  reg(ops::op_all_to_all_single_out, &all_to_all_out_k);
  reg(ops::op_send, &send_k);
  reg(ops::op_recv_, &recv_k);
  reg(ops::op_barrier, &barrier_k);
  return true;
}();

}  // namespace
}  // namespace kiln::distributed
