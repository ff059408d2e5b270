// Shared meta rules: broadcasting, type promotion, devices, reductions, in-place/out checks.
#include "kiln/ops/meta.h"

namespace kiln::meta {

Shape broadcast_shapes(const char* op, IntArrayRef a, IntArrayRef b) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(sa == sb || sa == 1 || sb == 1,
               "[{}] shapes [{}] and [{}] are not broadcastable (size {} vs {} at dim {})", op,
               fmt::join(a, ", "), fmt::join(b, ", "), sa, sb, i);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

void check_broadcasts_to(const char* op, const char* what, IntArrayRef from, IntArrayRef to) {
  Shape b = broadcast_shapes(op, to, from);
  KILN_CHECK(std::ranges::equal(b, to), "[{}] {} of shape [{}] does not broadcast to [{}]", op,
             what, fmt::join(from, ", "), fmt::join(to, ", "));
}

namespace {
// PyTorch's combine_categories (ATen/native/TypeProperties.cpp), without complex types.
// `lower` is always set by the callers; an unset `higher` yields `lower`.
DType combine_categories(std::optional<DType> higher, DType lower) {
  if (!higher) return lower;
  if (is_floating(*higher)) return *higher;
  if (*higher == kBool || is_floating(lower)) return promote_types(*higher, lower);
  return *higher;
}
void update(std::optional<DType>& slot, DType t) { slot = slot ? promote_types(*slot, t) : t; }
}  // namespace

DType result_type(std::initializer_list<const Tensor*> tensors) {
  std::optional<DType> dim_result, zero_dim_result, wrapped_result;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    DType d = t->dtype();
    if (t->impl()->is_wrapped_number()) {
      update(wrapped_result, is_floating(d) ? default_dtype() : d);
    } else if (t->dim() == 0) {
      update(zero_dim_result, d);
    } else {
      update(dim_result, d);
    }
  }
  if (!zero_dim_result && !wrapped_result) return dim_result.value_or(default_dtype());
  DType lower =
      wrapped_result ? combine_categories(zero_dim_result, *wrapped_result) : *zero_dim_result;
  return combine_categories(dim_result, lower);
}

DType result_type(const Tensor& a, const Tensor& b) {
  // Fast path for the common case: two ordinary tensors of one dtype.
  if (a.dtype() == b.dtype()) return a.dtype();
  return result_type({&a, &b});
}

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  std::optional<Device> dev;
  std::optional<Device> cpu_scalar;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    if (t->dim() == 0 && t->device().is_cpu()) {
      cpu_scalar = t->device();
      continue;
    }
    if (!dev) {
      dev = t->device();
    } else {
      KILN_CHECK_DEVICE(*dev == t->device(),
                        "[{}] expected all tensors to be on the same device, but found {} and {}",
                        op, *dev, t->device());
    }
  }
  return dev ? *dev : cpu_scalar.value_or(Device(kCPU));
}

void check_defined(const char* op, const Tensor& t, const char* arg) {
  KILN_CHECK(t.defined(), "[{}] argument '{}' is an undefined tensor", op, arg);
}

SmallVector<bool, 8> reduce_mask(const char* op, const Tensor& self, IntArrayRef dims) {
  int64_t nd = self.dim();
  SmallVector<bool, 8> mask(static_cast<size_t>(nd), dims.empty());
  for (int64_t d : dims) {
    int64_t w = wrap_dim(d, nd, op);
    if (nd == 0) continue;
    KILN_CHECK(!mask[w], "[{}] dim {} appears multiple times in the list of dims [{}]", op, w,
               fmt::join(dims, ", "));
    mask[w] = true;
  }
  return mask;
}

Shape reduced_shape(IntArrayRef sizes, const SmallVector<bool, 8>& mask, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!mask[i])
      out.push_back(sizes[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

DType float_result(DType t) { return is_floating(t) ? t : default_dtype(); }

namespace {
// Whether some element of t is reached from two index tuples (an expanded tensor).
bool has_internal_overlap(const Tensor& t) {
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.strides()[i] == 0 && t.sizes()[i] > 1) return true;
  return false;
}
// Byte range [lo, hi) that t may touch in its storage.
std::pair<int64_t, int64_t> byte_range(const Tensor& t) {
  int64_t lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.sizes()[i] == 0) return {0, 0};
    int64_t ext = (t.sizes()[i] - 1) * t.strides()[i];
    if (ext < 0)
      lo += ext;
    else
      hi += ext;
  }
  int64_t isz = static_cast<int64_t>(t.itemsize());
  return {lo * isz, (hi + 1) * isz};
}
bool same_view(const Tensor& a, const Tensor& b) {
  return a.storage_offset() == b.storage_offset() && a.dtype() == b.dtype() &&
         std::ranges::equal(a.sizes(), b.sizes()) && std::ranges::equal(a.strides(), b.strides());
}
void check_written(std::string_view op, const char* what, const Tensor& out, const TensorSpec& spec,
                   ArrayRef<const Tensor*> inputs) {
  KILN_CHECK(std::ranges::equal(out.sizes(), spec.sizes),
             "[{}] {} has shape [{}] but the result has shape [{}]", op, what,
             fmt::join(out.sizes(), ", "), fmt::join(spec.sizes, ", "));
  KILN_CHECK_TYPE(can_cast(spec.dtype, out.dtype()),
                  "[{}] result type {} can't be cast to the desired output type {}", op, spec.dtype,
                  out.dtype());
  KILN_CHECK_DEVICE(out.device() == spec.device, "[{}] {} is on {} but the result is on {}", op,
                    what, out.device(), spec.device);
  KILN_CHECK(!has_internal_overlap(out),
             "[{}] unsupported operation: more than one element of the written-to tensor refers "
             "to a single memory location; clone() it first",
             op);
  if (out.numel() == 0) return;
  auto [olo, ohi] = byte_range(out);
  for (const Tensor* in : inputs) {
    if (!in || !in->defined() || in->numel() == 0) continue;
    if (in->impl()->storage() != out.impl()->storage()) continue;
    if (same_view(*in, out)) continue;
    auto [ilo, ihi] = byte_range(*in);
    KILN_CHECK(ihi <= olo || ohi <= ilo,
               "[{}] unsupported operation: some elements of the input tensor and the written-to "
               "tensor refer to a single memory location; clone() the input first",
               op);
  }
}
}  // namespace

void check_inplace(std::string_view op, const Tensor& self, const TensorSpec& spec,
                   ArrayRef<const Tensor*> inputs) {
  check_written(op, "the in-place tensor", self, spec, inputs);
}

void check_out(std::string_view op, const Tensor& out, const TensorSpec& spec,
               ArrayRef<const Tensor*> inputs) {
  KILN_CHECK(out.defined(), "[{}] out is an undefined tensor", op);
  check_written(op, "out", out, spec, inputs);
}

bool shares_storage(const Tensor& out, ArrayRef<const Tensor*> inputs) {
  for (const Tensor* in : inputs)
    if (in && in->defined() && in->impl()->storage() == out.impl()->storage()) return true;
  return false;
}

}  // namespace kiln::meta
