// Host glue of the elementwise ops on CUDA: dtype promotion and casts as the CPU kernels do
// them (backend/cpu/unary.cpp, binary.cpp), then one launch of elementwise.cu; copies between
// devices, fills and the allocation factories.
#include "kiln/backend/cuda/elementwise.h"
#include "kiln/backend/cuda/common.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cuda {
namespace {

void* data(const Tensor& t) { return t.impl()->data(); }
Operand number(const Scalar& s) {
  Operand o;
  o.scalar = true;
  o.f = s.to_double();
  o.i = s.is_floating() ? 0 : s.to_int();
  if (s.is_bool()) o.i = s.to_bool();
  return o;
}

void unary(const Tensor& out, const Tensor& a, DType compute, UnaryOp op, const char* name) {
  Tensor ca = as_dtype(a, compute);
  with_result(out, compute, false, [&](const Tensor& r) {
    launch_unary(op, dt(compute), make_indexer<2>(r, {&ca}), data(r), operand(ca), stream_for(r));
    check_launch(name);
  });
}

#define KILN_CUDA_UNARY(name, Op, compute)               \
  void name##_impl(const Tensor& out, const Tensor& a) { \
    unary(out, a, compute, UnaryOp::Op, #name);          \
  }                                                      \
  KILN_CUDA_POINTWISE(name, &name##_impl);
KILN_CUDA_UNARY(neg, Neg, a.dtype())
KILN_CUDA_UNARY(abs, Abs, a.dtype())
KILN_CUDA_UNARY(relu, Relu, a.dtype())
KILN_CUDA_UNARY(ceil, Ceil, a.dtype())
KILN_CUDA_UNARY(floor, Floor, a.dtype())
KILN_CUDA_UNARY(round, Round, a.dtype())
KILN_CUDA_UNARY(trunc, Trunc, a.dtype())
KILN_CUDA_UNARY(sign, Sign, a.dtype())
KILN_CUDA_UNARY(bitwise_not, BitwiseNot, a.dtype())
#define KILN_CUDA_FLOAT_UNARY(name, Enumerator, expression) \
  KILN_CUDA_UNARY(name, Enumerator, meta::float_result(a.dtype()))
KILN_CUDA_FLOAT_UNARY_OPS(KILN_CUDA_FLOAT_UNARY)
#undef KILN_CUDA_FLOAT_UNARY
#undef KILN_CUDA_UNARY

void gelu_impl(const Tensor& out, const Tensor& a, bool approximate_tanh) {
  unary(out, a, a.dtype(), approximate_tanh ? UnaryOp::GeluTanh : UnaryOp::Gelu, "gelu");
}
KILN_CUDA_POINTWISE(gelu, &gelu_impl);

void logical_not_impl(const Tensor& out, const Tensor& a) {
  with_result(out, kBool, false, [&](const Tensor& r) {
    launch_logical_not(dt(a.dtype()), make_indexer<2>(r, {&a}), data(r), operand(a), stream_for(r));
    check_launch("logical_not");
  });
}
KILN_CUDA_POINTWISE(logical_not, &logical_not_impl);

#define KILN_CUDA_FLOAT_PREDICATE(name, Op)                                                        \
  void name##_impl(const Tensor& out, const Tensor& a) {                                           \
    with_result(out, kBool, false, [&](const Tensor& r) {                                          \
      launch_float_predicate(FloatPredicate::Op, dt(a.dtype()), make_indexer<2>(r, {&a}), data(r), \
                             operand(a), stream_for(r));                                           \
      check_launch(#name);                                                                         \
    });                                                                                            \
  }                                                                                                \
  KILN_CUDA_POINTWISE(name, &name##_impl);
KILN_CUDA_FLOAT_PREDICATE(isnan, IsNan)
KILN_CUDA_FLOAT_PREDICATE(isinf, IsInf)
#undef KILN_CUDA_FLOAT_PREDICATE

// hardtanh is clamp with both bounds, in self's dtype.
void hardtanh_impl(const Tensor& out, const Tensor& a, const Scalar& lo, const Scalar& hi) {
  with_result(out, a.dtype(), false, [&](const Tensor& r) {
    launch_clamp(dt(a.dtype()), make_indexer<2>(r, {&a}), data(r), operand(a), true, number(lo),
                 true, number(hi), stream_for(r));
    check_launch("hardtanh");
  });
}
KILN_CUDA_POINTWISE(hardtanh, &hardtanh_impl);

void leaky_relu_impl(const Tensor& out, const Tensor& a, const Scalar& negative_slope) {
  with_result(out, a.dtype(), false, [&](const Tensor& r) {
    launch_leaky_relu(dt(a.dtype()), make_indexer<2>(r, {&a}), data(r), operand(a),
                      number(negative_slope), stream_for(r));
    check_launch("leaky_relu");
  });
}
KILN_CUDA_POINTWISE(leaky_relu, &leaky_relu_impl);

void clamp_impl(const Tensor& out, const Tensor& a, const OptScalar& lo, const OptScalar& hi) {
  DType ct = meta::clamp(a, lo, hi).dtype;
  Tensor ca = as_dtype(a, ct);
  with_result(out, ct, false, [&](const Tensor& r) {
    launch_clamp(dt(ct), make_indexer<2>(r, {&ca}), data(r), operand(ca), lo.has_value(),
                 lo ? number(*lo) : Operand{}, hi.has_value(), hi ? number(*hi) : Operand{},
                 stream_for(r));
    check_launch("clamp");
  });
}
KILN_CUDA_POINTWISE(clamp, &clamp_impl);

void binary(const Tensor& out, const Tensor& a, const Tensor& b, DType compute, BinaryOp op,
            const Scalar& alpha, const char* name) {
  Tensor ca = as_dtype(a, compute), cb = as_dtype(b, compute);
  with_result(out, compute, false, [&](const Tensor& r) {
    launch_binary(op, dt(compute), make_indexer<3>(r, {&ca, &cb}), data(r), operand(ca),
                  operand(cb), number(alpha), stream_for(r));
    check_launch(name);
  });
}
void add_impl(const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  binary(out, a, b, meta::result_type(a, b), BinaryOp::Add, alpha, "add");
}
void sub_impl(const Tensor& out, const Tensor& a, const Tensor& b, const Scalar& alpha) {
  binary(out, a, b, meta::result_type(a, b), BinaryOp::Sub, alpha, "sub");
}
#define KILN_CUDA_BINARY(name, Op, compute)                               \
  void name##_impl(const Tensor& out, const Tensor& a, const Tensor& b) { \
    binary(out, a, b, compute, BinaryOp::Op, Scalar(int64_t{1}), #name);  \
  }
KILN_CUDA_BINARY(mul, Mul, meta::result_type(a, b))
KILN_CUDA_BINARY(div, Div, meta::float_result(meta::result_type(a, b)))
KILN_CUDA_BINARY(pow, Pow, meta::result_type(a, b))
KILN_CUDA_BINARY(maximum, Maximum, meta::result_type(a, b))
KILN_CUDA_BINARY(minimum, Minimum, meta::result_type(a, b))
KILN_CUDA_BINARY(atan2, Atan2, meta::float_result(meta::result_type(a, b)))
KILN_CUDA_BINARY(fmod, Fmod, meta::result_type(a, b))
KILN_CUDA_BINARY(remainder, Remainder, meta::result_type(a, b))
KILN_CUDA_BINARY(div_trunc, DivTrunc, meta::result_type(a, b))
KILN_CUDA_BINARY(div_floor, DivFloor, meta::result_type(a, b))
KILN_CUDA_BINARY(bitwise_and, BitwiseAnd, meta::result_type(a, b))
KILN_CUDA_BINARY(bitwise_or, BitwiseOr, meta::result_type(a, b))
KILN_CUDA_BINARY(bitwise_xor, BitwiseXor, meta::result_type(a, b))
#undef KILN_CUDA_BINARY
KILN_CUDA_POINTWISE(add, &add_impl);
KILN_CUDA_POINTWISE(sub, &sub_impl);
KILN_CUDA_POINTWISE(mul, &mul_impl);
KILN_CUDA_POINTWISE(div, &div_impl);
KILN_CUDA_POINTWISE(pow, &pow_impl);
KILN_CUDA_POINTWISE(maximum, &maximum_impl);
KILN_CUDA_POINTWISE(minimum, &minimum_impl);
KILN_CUDA_POINTWISE(atan2, &atan2_impl);
KILN_CUDA_POINTWISE(fmod, &fmod_impl);
KILN_CUDA_POINTWISE(remainder, &remainder_impl);
KILN_CUDA_POINTWISE(div_trunc, &div_trunc_impl);
KILN_CUDA_POINTWISE(div_floor, &div_floor_impl);
KILN_CUDA_POINTWISE(bitwise_and, &bitwise_and_impl);
KILN_CUDA_POINTWISE(bitwise_or, &bitwise_or_impl);
KILN_CUDA_POINTWISE(bitwise_xor, &bitwise_xor_impl);

#define KILN_CUDA_COMPARE(name, Op)                                                               \
  void name##_impl(const Tensor& out, const Tensor& a, const Tensor& b) {                         \
    DType ct = meta::result_type(a, b);                                                           \
    Tensor ca = as_dtype(a, ct), cb = as_dtype(b, ct);                                            \
    with_result(out, kBool, false, [&](const Tensor& r) {                                         \
      launch_compare(CompareOp::Op, dt(ct), make_indexer<3>(r, {&ca, &cb}), data(r), operand(ca), \
                     operand(cb), stream_for(r));                                                 \
      check_launch(#name);                                                                        \
    });                                                                                           \
  }                                                                                               \
  KILN_CUDA_POINTWISE(name, &name##_impl);
KILN_CUDA_COMPARE(eq, Eq)
KILN_CUDA_COMPARE(ne, Ne)
KILN_CUDA_COMPARE(lt, Lt)
KILN_CUDA_COMPARE(le, Le)
KILN_CUDA_COMPARE(gt, Gt)
KILN_CUDA_COMPARE(ge, Ge)
KILN_CUDA_COMPARE(logical_and, LogicalAnd)
KILN_CUDA_COMPARE(logical_or, LogicalOr)
KILN_CUDA_COMPARE(logical_xor, LogicalXor)
#undef KILN_CUDA_COMPARE

void where_impl(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  DType ct = meta::result_type(a, b);
  Tensor cc = as_dtype(cond, kBool), ca = as_dtype(a, ct), cb = as_dtype(b, ct);
  with_result(out, ct, false, [&](const Tensor& r) {
    launch_where(dt(ct), make_indexer<4>(r, {&cc, &ca, &cb}), data(r), operand(cc), operand(ca),
                 operand(cb), stream_for(r));
    check_launch("where");
  });
}
KILN_CUDA_POINTWISE(where, &where_impl);

// ---------------------------------------------------------------- copies and factories

bool on_cuda(const Tensor& t) { return t.device().type() == kCUDA; }

// dst = src where at least one of them is on a CUDA device (validated by the caller).
void copy_any(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  const bool dc = on_cuda(dst), sc = on_cuda(src);
  if (dc && (is_host_scalar(src) || (sc && src.device() == dst.device()))) {
    copy_kernel(dst, src);  // on the device (a 0-d cpu source is a fill)
    return;
  }
  DeviceInterface* iface = device_interface(kCUDA);
  if (dc && !sc) {  // host to device: stage the host values in dst's dtype, shape and order
    Tensor host = kiln::expand(src.to(dst.dtype()), dst.sizes()).contiguous();
    Tensor dev = dst.is_contiguous() ? dst : empty_cuda(dst.sizes(), dst.dtype(), dst.device());
    iface->copy_bytes(data(dev), true, data(host), false, host.nbytes(), dst.device().index());
    if (!dst.is_contiguous()) copy_kernel(dst, dev);
    return;
  }
  // Device to host, or between two devices: through a contiguous host buffer.
  Tensor dev = contiguous_as(src, src.dtype());
  Tensor host = empty(src.sizes(), src.dtype(), Device(kCPU));
  iface->copy_bytes(data(host), false, data(dev), true, dev.nbytes(), src.device().index());
  if (!dc) {
    ops::op_copy_.call_at(DispatchKey::CPU, dst, host);
    return;
  }
  copy_any(dst, host);
}

void copy_(const Tensor& self, const Tensor& src) {
  meta::copy_(self, src);
  copy_any(self, src);
  self.impl()->storage()->bump_version();
}

Tensor to_copy(const Tensor& self, DType dtype, Device device) {
  TensorSpec s = meta::to_copy(self, dtype, device);
  Tensor out = empty(s.sizes, dtype, device);
  copy_any(out, self);
  return out;
}

// A floating value is read as float64 and cast to self's dtype (truncated into an integer
// tensor, nonzero into bool, as ATen's fill_): read in an integer dtype it was the Operand's
// integer field, 0 (constant_pad_nd's integer rows on the H100, run I15).
void fill(const Tensor& self, const Scalar& value) {
  if (self.numel() == 0) return;
  Indexer<2> ix = make_indexer<2>(self, {&self});
  for (int d = 0; d < ix.ndim; ++d) ix.strides[1][d] = 0;
  const DType in = value.is_floating() ? kFloat64 : self.dtype();
  launch_copy(dt(self.dtype()), dt(in), ix, data(self), number(value), stream_for(self));
  check_launch("fill_");
}

void fill_(const Tensor& self, const Scalar& value) {
  meta::fill_(self, value);
  fill(self, value);
  self.impl()->storage()->bump_version();
}

Tensor op_empty(IntArrayRef sizes, DType dtype, Device device) {
  meta::factory("empty", sizes, dtype);
  return empty_cuda(sizes, dtype, device);
}

Tensor full(IntArrayRef sizes, const Scalar& value, DType dtype, Device device) {
  meta::factory("full", sizes, dtype);
  meta::check_fits("full", value, dtype);
  Tensor out = empty_cuda(sizes, dtype, device);
  fill(out, value);
  return out;
}

KILN_CUDA_KERNELS(backend_kernel(ops::op_copy_, &copy_), backend_kernel(ops::op_to_copy, &to_copy),
                  backend_kernel(ops::op_fill_, &fill_), backend_kernel(ops::op_empty, &op_empty),
                  backend_kernel(ops::op_full, &full));

}  // namespace
}  // namespace kiln::cuda
