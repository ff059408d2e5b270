// Host glue of the CUDA reductions (sum, mean, var, amax/amin, all/any, argmax/argmin, max/min
// with indices) and of softmax / log_softmax: each views its input as reduce.h's problem and
// launches it, with the CPU kernels' dtypes (kiln/backend/cpu/reduce.cpp).
#include <algorithm>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/reduce.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cuda {
namespace {

// A reduction's input as reduce.h sees it: x contiguous, (batch, len, cols), reduced over len.
struct Problem {
  Tensor x;
  int64_t batch = 1, len = 1, cols = 1;
};

// `self` in `dtype`, reduced over `dims`. A contiguous tensor whose reduced dims form one run
// (size-1 dims aside) is read in place, as (dims before, run, dims after): no transposing copy
// for the leading dims of bias gradients. Anything else is copied with the kept dims first.
Problem make_problem(const char* op, const Tensor& self, IntArrayRef dims, DType dtype) {
  auto mask = meta::reduce_mask(op, self, dims);
  Problem p;
  bool in_run = false, after_run = false, one_run = true;
  for (int64_t i = 0; i < self.dim(); ++i) {
    int64_t size = self.sizes()[i];
    if (size == 1) continue;
    if (mask[i]) {
      one_run = one_run && !after_run;
      in_run = true;
      p.len *= size;
    } else if (in_run) {
      after_run = true;
      p.cols *= size;
    } else {
      p.batch *= size;
    }
  }
  if (one_run && self.is_contiguous()) {
    p.x = contiguous_as(self, dtype);
    return p;
  }
  Shape perm;
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i = 0; i < self.dim(); ++i)
      if (mask[i] == (pass == 1)) perm.push_back(i);
  p.x = contiguous_as(ops::op_permute(self, perm), dtype);
  p.batch *= p.cols;
  p.cols = 1;
  return p;
}

// Writes the reduction `kind` of self over dims, computed in `dtype` (self is cast to it):
// values (if defined) and indices (int64, if defined) of the kept dims' shape.
void reduce(const char* op, Reduce kind, DType dtype, const Tensor& values, const Tensor& indices,
            const Tensor& self, IntArrayRef dims, int64_t correction = 0) {
  Problem p = make_problem(op, self, dims, dtype);
  cudaStream_t stream = stream_for(self);
  auto launch = [&](const Tensor& v, const Tensor& ix) {
    ReduceArgs a;
    a.op = kind;
    a.dtype = dt(dtype);
    a.x = p.x.impl()->data();
    a.batch = p.batch;
    a.len = p.len;
    a.cols = p.cols;
    a.values = v.defined() ? v.impl()->data() : nullptr;
    a.indices = ix.defined() ? static_cast<int64_t*>(ix.impl()->data()) : nullptr;
    a.correction = correction;
    size_t bytes = reduce_workspace_bytes(a);
    Tensor ws = bytes ? empty_cuda({static_cast<int64_t>(bytes)}, kUInt8, self.device()) : Tensor();
    launch_reduce(a, ws.defined() ? ws.impl()->data() : nullptr, stream);
    check_launch(op);
  };
  if (!indices.defined()) {
    with_result(values, dtype, true, [&](const Tensor& v) { launch(v, Tensor()); });
    return;
  }
  with_result(indices, kInt64, true, [&](const Tensor& ix) {
    if (!values.defined()) return launch(Tensor(), ix);
    with_result(values, dtype, true, [&](const Tensor& v) { launch(v, ix); });
  });
}

// As on the CPU, sum and mean reduce in out's dtype (a float32 out of a float16 input sums in
// float32); the dtype= argument is already out's dtype for the functional op.
void sum_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool, const OptDType&) {
  reduce("sum", Reduce::Sum, out.dtype(), out, Tensor(), self, dims);
}
void mean_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool, const OptDType&) {
  KILN_CHECK_TYPE(is_floating(out.dtype()), "[mean] expected a floating-point out, got {}",
                  out.dtype());
  reduce("mean", Reduce::Mean, out.dtype(), out, Tensor(), self, dims);
}
void var_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, int64_t correction, bool) {
  reduce("var", Reduce::Var, self.dtype(), out, Tensor(), self, dims, correction);
}
void amax_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  reduce("amax", Reduce::Max, self.dtype(), out, Tensor(), self, dims);
}
void amin_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  reduce("amin", Reduce::Min, self.dtype(), out, Tensor(), self, dims);
}
// The input is read as bool; a uint8 out (uint8 input) gets the bools cast.
void all_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  reduce("all", Reduce::All, kBool, out, Tensor(), self, dims);
}
void any_impl(const Tensor& out, const Tensor& self, IntArrayRef dims, bool) {
  reduce("any", Reduce::Any, kBool, out, Tensor(), self, dims);
}

// argmax / argmin: over `dim`, or over the flattened tensor (positions in row-major order).
void arg_extreme(const char* op, Reduce kind, const Tensor& out, const Tensor& self,
                 const OptInt& dim) {
  Shape dims;
  if (dim)
    dims.push_back(*dim);
  else
    for (int64_t i = 0; i < self.dim(); ++i) dims.push_back(i);
  reduce(op, kind, self.dtype(), Tensor(), out, self, dims);
}
void argmax_impl(const Tensor& out, const Tensor& self, const OptInt& dim, bool) {
  arg_extreme("argmax", Reduce::Max, out, self, dim);
}
void argmin_impl(const Tensor& out, const Tensor& self, const OptInt& dim, bool) {
  arg_extreme("argmin", Reduce::Min, out, self, dim);
}

TensorPair minmax_dim(const char* op, Reduce kind, const Tensor& self, int64_t dim, bool keepdim) {
  TensorSpec s =
      kind == Reduce::Max ? meta::max_dim(self, dim, keepdim) : meta::min_dim(self, dim, keepdim);
  Tensor values = empty_cuda(s.sizes, s.dtype, s.device);
  Tensor indices = empty_cuda(s.sizes, kInt64, s.device);
  if (self.numel() > 0) reduce(op, kind, s.dtype, values, indices, self, IntArrayRef(&dim, 1));
  return {values, indices};
}
TensorPair max_dim_kernel(const Tensor& self, int64_t dim, bool keepdim) {
  return minmax_dim("max", Reduce::Max, self, dim, keepdim);
}
TensorPair min_dim_kernel(const Tensor& self, int64_t dim, bool keepdim) {
  return minmax_dim("min", Reduce::Min, self, dim, keepdim);
}

// Below this many (outer, inner) lines, softmax over a dim that is not last moves the dim last
// (a copy each way) rather than give each long line to one thread.
constexpr int64_t kMinLines = 32768;

void softmax_common(const Tensor& out, const Tensor& self, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  int64_t d = wrap_dim(dim, self.dim(), op);
  if (self.numel() == 0) return;
  int64_t n = self.dim() == 0 ? 1 : self.sizes()[d], outer = 1, inner = 1;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i < d) outer *= self.sizes()[i];
    if (i > d) inner *= self.sizes()[i];
  }
  DType t = self.dtype();
  cudaStream_t stream = stream_for(self);
  if (inner > 1 && outer * inner < kMinLines && n > 32) {
    Shape perm;
    for (int64_t i = 0; i < self.dim(); ++i)
      if (i != d) perm.push_back(i);
    perm.push_back(d);
    Tensor x = contiguous_as(ops::op_permute(self, perm), t);
    Tensor y = empty_cuda(x.sizes(), t, self.device());
    launch_softmax(dt(t), x.impl()->data(), y.impl()->data(), outer * inner, n, 1, log, stream);
    check_launch(op);
    copy_kernel(ops::op_permute(out, perm), y);
    return;
  }
  Tensor x = contiguous_as(self, t);
  with_result(out, t, true, [&](const Tensor& o) {
    launch_softmax(dt(t), x.impl()->data(), o.impl()->data(), outer, n, inner, log, stream);
    check_launch(op);
  });
}
void softmax_impl(const Tensor& out, const Tensor& self, int64_t dim) {
  softmax_common(out, self, dim, false);
}
void log_softmax_impl(const Tensor& out, const Tensor& self, int64_t dim) {
  softmax_common(out, self, dim, true);
}

}  // namespace

KILN_CUDA_STRUCTURED(sum, &sum_impl);
KILN_CUDA_STRUCTURED(mean, &mean_impl);
KILN_CUDA_STRUCTURED(var, &var_impl);
KILN_CUDA_STRUCTURED(amax, &amax_impl);
KILN_CUDA_STRUCTURED(amin, &amin_impl);
KILN_CUDA_STRUCTURED(all, &all_impl);
KILN_CUDA_STRUCTURED(any, &any_impl);
KILN_CUDA_STRUCTURED(argmax, &argmax_impl);
KILN_CUDA_STRUCTURED(argmin, &argmin_impl);
KILN_CUDA_STRUCTURED(softmax, &softmax_impl);
KILN_CUDA_STRUCTURED(log_softmax, &log_softmax_impl);
KILN_CUDA_KERNELS(::kiln::backend_kernel(ops::op_max_dim, &max_dim_kernel),
                  ::kiln::backend_kernel(ops::op_min_dim, &min_dim_kernel));

}  // namespace kiln::cuda
