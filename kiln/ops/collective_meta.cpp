// Meta functions of the collectives (Note [Collectives are ops] in
// kiln/distributed/collective_kernels.cpp): shapes follow from the arguments alone (the group's
// size is one), so meta tensors and shape inference need no process group. What needs the
// group (that it exists, peers inside it, the backend) is checked by the kernels.
#include <numeric>

#include "kiln/ops/op_list.h"
#include "kiln/ops/structured.h"

namespace kiln {
namespace {

Device meta_device() { return Device(kMeta); }
Tensor empty_meta(IntArrayRef sizes, DType dtype) {
  return detail::empty_tensor(sizes, dtype, meta_device());
}

void check_self(const char* op, const Tensor& self) {
  KILN_CHECK(self.defined(), "[{}] self is undefined", op);
}
void check_reduce(const char* op, int64_t r, DType t) {
  KILN_CHECK(r >= 0 && r <= 4,
             "[{}] reduce_op {} is not a ReduceOp (0 sum, 1 avg, 2 max, 3 min, 4 product)", op, r);
  KILN_CHECK_TYPE(r != 1 || is_floating(t), "[{}] avg needs a floating dtype, got {}", op, t);
}
void check_group_size(const char* op, int64_t n) {
  KILN_CHECK(n >= 1, "[{}] group_size must be positive, got {}", op, n);
}
void check_out(const char* op, const Tensor& out, const Tensor& self, IntArrayRef sizes) {
  KILN_CHECK(out.defined(), "[{}] out is undefined", op);
  KILN_CHECK_DEVICE(out.device() == self.device(), "[{}] out is on {} but self is on {}", op,
                    out.device(), self.device());
  KILN_CHECK_TYPE(out.dtype() == self.dtype(), "[{}] out is {} but self is {}", op, out.dtype(),
                  self.dtype());
  KILN_CHECK(out.sizes() == sizes, "[{}] out has sizes {}, expected {} for self of sizes {}", op,
             out.sizes(), sizes, self.sizes());
  KILN_CHECK(out.is_contiguous(), "[{}] out must be contiguous, got strides {}", op, out.strides());
}
Shape gathered(const Tensor& self, int64_t n) {
  Shape s(self.sizes());
  if (s.empty()) return Shape{n};
  s[0] *= n;
  return s;
}
Shape scattered(const char* op, const Tensor& self, int64_t n) {
  KILN_CHECK(self.dim() >= 1, "[{}] self must have at least one dimension", op);
  KILN_CHECK(self.size(0) % n == 0, "[{}] dim 0 of self (sizes {}) is not divisible by {} ranks",
             op, self.sizes(), n);
  Shape s(self.sizes());
  s[0] /= n;
  return s;
}
int64_t total_rows(const char* op, IntArrayRef splits, int64_t rows, const char* what) {
  if (splits.empty()) return rows;
  for (int64_t v : splits) KILN_CHECK(v >= 0, "[{}] {} {} has a negative entry", op, what, splits);
  return std::accumulate(splits.begin(), splits.end(), int64_t{0});
}

Tensor meta_all_reduce(const Tensor& self, int64_t r, int64_t) {
  check_self("all_reduce", self);
  check_reduce("all_reduce", r, self.dtype());
  return empty_meta(self.sizes(), self.dtype());
}
void meta_all_reduce_(const Tensor& self, int64_t r, int64_t) {
  check_self("all_reduce_", self);
  check_reduce("all_reduce_", r, self.dtype());
}
Tensor meta_all_gather(const Tensor& self, int64_t n, int64_t) {
  check_self("all_gather_into_tensor", self);
  check_group_size("all_gather_into_tensor", n);
  return empty_meta(gathered(self, n), self.dtype());
}
void meta_all_gather_out(const Tensor& out, const Tensor& self, int64_t n, int64_t) {
  check_self("all_gather_into_tensor", self);
  check_group_size("all_gather_into_tensor", n);
  check_out("all_gather_into_tensor", out, self, gathered(self, n));
}
Tensor meta_reduce_scatter(const Tensor& self, int64_t r, int64_t n, int64_t) {
  check_self("reduce_scatter_tensor", self);
  check_reduce("reduce_scatter_tensor", r, self.dtype());
  check_group_size("reduce_scatter_tensor", n);
  return empty_meta(scattered("reduce_scatter_tensor", self, n), self.dtype());
}
void meta_reduce_scatter_out(const Tensor& out, const Tensor& self, int64_t r, int64_t n, int64_t) {
  check_self("reduce_scatter_tensor", self);
  check_reduce("reduce_scatter_tensor", r, self.dtype());
  check_group_size("reduce_scatter_tensor", n);
  check_out("reduce_scatter_tensor", out, self, scattered("reduce_scatter_tensor", self, n));
}
Tensor meta_broadcast(const Tensor& self, int64_t src, int64_t) {
  check_self("broadcast", self);
  KILN_CHECK(src >= 0, "[broadcast] src must be a rank, got {}", src);
  return empty_meta(self.sizes(), self.dtype());
}
void meta_broadcast_(const Tensor& self, int64_t src, int64_t) {
  check_self("broadcast_", self);
  KILN_CHECK(src >= 0, "[broadcast_] src must be a rank, got {}", src);
}
Tensor meta_all_to_all(const Tensor& self, IntArrayRef out_splits, IntArrayRef in_splits, int64_t) {
  check_self("all_to_all_single", self);
  KILN_CHECK(self.dim() >= 1, "[all_to_all_single] self must have at least one dimension");
  int64_t in = total_rows("all_to_all_single", in_splits, self.size(0), "input_split_sizes");
  KILN_CHECK(in == self.size(0),
             "[all_to_all_single] input_split_sizes {} sum to {} but dim 0 of self is {}",
             in_splits, in, self.size(0));
  Shape s(self.sizes());
  s[0] = total_rows("all_to_all_single", out_splits, self.size(0), "output_split_sizes");
  return empty_meta(s, self.dtype());
}
void meta_all_to_all_out(const Tensor& out, const Tensor& self, IntArrayRef out_splits,
                         IntArrayRef in_splits, int64_t g) {
  Tensor want = meta_all_to_all(self, out_splits, in_splits, g);
  if (out_splits.empty()) {
    KILN_CHECK(out.defined(), "[all_to_all_single] out is undefined");
    Shape s(self.sizes());
    // Without splits every rank sends dim 0 of self in equal parts, so out is self's size.
    if (!in_splits.empty()) s[0] = out.dim() ? out.size(0) : 0;
    check_out("all_to_all_single", out, self, s);
  } else {
    check_out("all_to_all_single", out, self, want.sizes());
  }
}
void meta_send(const Tensor& self, int64_t dst, int64_t) {
  check_self("send", self);
  KILN_CHECK(dst >= 0, "[send] dst must be a rank, got {}", dst);
}
void meta_recv_(const Tensor& self, int64_t src, int64_t) {
  check_self("recv_", self);
  KILN_CHECK(src >= 0, "[recv_] src must be a rank, got {}", src);
}
void meta_barrier(Device, int64_t) {}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_all_reduce, &meta_all_reduce);
  reg(ops::op_all_reduce_, &meta_all_reduce_);
  reg(ops::op_all_gather_into_tensor, &meta_all_gather);
  reg(ops::op_all_gather_into_tensor_out, &meta_all_gather_out);
  reg(ops::op_reduce_scatter_tensor, &meta_reduce_scatter);
  reg(ops::op_reduce_scatter_tensor_out, &meta_reduce_scatter_out);
  reg(ops::op_broadcast, &meta_broadcast);
  reg(ops::op_broadcast_, &meta_broadcast_);
  reg(ops::op_all_to_all_single, &meta_all_to_all);
  reg(ops::op_all_to_all_single_out, &meta_all_to_all_out);
  reg(ops::op_send, &meta_send);
  reg(ops::op_recv_, &meta_recv_);
  reg(ops::op_barrier, &meta_barrier);
  return true;
}();

}  // namespace
}  // namespace kiln
