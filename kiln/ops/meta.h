#pragma once
// Meta functions: each validates an op's arguments and computes its output's sizes, dtype and
// device, touching no data. They are the ops' kernels on the meta device and the first thing
// every backend kernel runs, so an error is raised before anything is written.
#include <initializer_list>

#include "kiln/ops/op_list.h"

namespace kiln {

// What a functional op returns: a new contiguous tensor of this shape, dtype and device.
struct TensorSpec {
  Shape sizes;
  DType dtype;
  Device device;
};

namespace meta {

// --- shared rules ---
// Broadcast shape of a and b, or "[op] shapes [..] and [..] are not broadcastable".
Shape broadcast_shapes(const char* op, IntArrayRef a, IntArrayRef b);
// Checks that shape `from` broadcasts to exactly `to` (it may not grow it):
// "[op] <what> of shape [..] does not broadcast to [..]".
void check_broadcasts_to(const char* op, const char* what, IntArrayRef from, IntArrayRef to);
// PyTorch's result_type over tensors (wrapped numbers promote like Scalars).
DType result_type(std::initializer_list<const Tensor*> tensors);
DType result_type(const Tensor& a, const Tensor& b);
// The common device of the tensor arguments; 0-d cpu tensors go along with any device.
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors);
void check_defined(const char* op, const Tensor& t, const char* arg);
// Reduction dims wrapped and checked for duplicates; empty means all dims.
SmallVector<bool, 8> reduce_mask(const char* op, const Tensor& self, IntArrayRef dims);
Shape reduced_shape(IntArrayRef sizes, const SmallVector<bool, 8>& mask, bool keepdim);
// The dtype unary float ops compute in: the input's if floating, else the default dtype.
DType float_result(DType t);

// In-place and out= rules: `out` must have the spec's sizes, a dtype the result can be cast
// to, the spec's device, no internal overlap, and no partial overlap with any input.
void check_inplace(std::string_view op, const Tensor& self, const TensorSpec& spec,
                   ArrayRef<const Tensor*> inputs);
void check_out(std::string_view op, const Tensor& out, const TensorSpec& spec,
               ArrayRef<const Tensor*> inputs);
// Whether `out` shares storage with any input (a non-elementwise kernel then writes through a
// temporary, since it may read an input element after writing the output element over it).
bool shares_storage(const Tensor& out, ArrayRef<const Tensor*> inputs);

// --- one meta function per op (same arguments as the op) ---
#define KILN_DECLARE_META(name, ARGS, schema) TensorSpec name ARGS;
KILN_FORALL_POINTWISE(KILN_DECLARE_META)
KILN_FORALL_STRUCTURED(KILN_DECLARE_META)
#undef KILN_DECLARE_META

}  // namespace meta
}  // namespace kiln
