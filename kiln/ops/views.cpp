// View ops: each computes a new geometry over the same storage. The same kernel serves every
// backend (they never touch data) and is also the op's meta function.
#include <algorithm>
#include <numeric>

#include "kiln/ops/meta.h"
#include "kiln/ops/views.h"

namespace kiln {

namespace detail {

Tensor make_view(const Tensor& self, IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  return Tensor(make_ref<TensorImpl>(*self.impl(), sizes, strides, offset));
}

Shape infer_size(const char* op, IntArrayRef shape, int64_t numel) {
  Shape out(shape);
  int64_t product = 1;
  bool plain = true;
  for (int64_t s : shape) plain = plain && s >= 0 && !__builtin_mul_overflow(product, s, &product);
  if (plain && product == numel) return out;  // the common case: nothing to infer
  int64_t known = 1;
  std::optional<size_t> infer;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(!infer, "[{}] only one dimension can be inferred (-1) in shape [{}]", op,
                 fmt::join(shape, ", "));
      infer = i;
    } else {
      KILN_CHECK(shape[i] >= 0, "[{}] invalid shape dimension {} in [{}]", op, shape[i],
                 fmt::join(shape, ", "));
      KILN_CHECK(!__builtin_mul_overflow(known, shape[i], &known),
                 "[{}] shape [{}] has too many elements", op, fmt::join(shape, ", "));
    }
  }
  if (infer) {
    KILN_CHECK(known != 0 && numel % known == 0, "[{}] shape [{}] is invalid for input of size {}",
               op, fmt::join(shape, ", "), numel);
    out[*infer] = numel / known;
  } else {
    KILN_CHECK(known == numel, "[{}] shape [{}] is invalid for input of size {}", op,
               fmt::join(shape, ", "), numel);
  }
  return out;
}

// PyTorch's computeStride: strides that let `new_sizes` view the same elements, if any.
std::optional<Shape> view_strides(IntArrayRef old_sizes, IntArrayRef old_strides,
                                  IntArrayRef new_sizes) {
  int64_t numel = 1;
  for (int64_t s : old_sizes) numel *= s;
  if (numel == 0) {
    if (std::ranges::equal(old_sizes, new_sizes)) return Shape(old_strides);
    return contiguous_strides(new_sizes);
  }
  Shape os = old_sizes.empty() ? Shape{1} : Shape(old_sizes);
  Shape ost = old_strides.empty() ? Shape{1} : Shape(old_strides);
  Shape st(new_sizes.size());
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base = ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(os.size()) - 1; td >= 0; --td) {
    tensor_numel *= os[td];
    if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        st[view_d] = view_numel * chunk_base;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base = ost[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return st;
}

}  // namespace detail

namespace {
using detail::make_view;

Tensor view_kernel(const Tensor& self, IntArrayRef sizes) {
  meta::check_defined("view", self, "self");
  if (self.is_contiguous()) {
    int64_t product = 1;
    bool plain = true;
    for (int64_t s : sizes)
      plain = plain && s >= 0 && !__builtin_mul_overflow(product, s, &product);
    if (plain && product == self.numel())  // nothing to infer: build the row-major view directly
      return Tensor(make_ref<TensorImpl>(*self.impl(), sizes, self.storage_offset()));
  }
  Shape shape = detail::infer_size("view", sizes, self.numel());
  if (self.is_contiguous())
    return make_view(self, shape, contiguous_strides(shape), self.storage_offset());
  auto st = detail::view_strides(self.sizes(), self.strides(), shape);
  KILN_CHECK(st.has_value(),
             "[view] size [{}] is not compatible with the input's size [{}] and stride [{}] (at "
             "least one dimension spans two contiguous subspaces); use reshape() instead",
             fmt::join(shape, ", "), fmt::join(self.sizes(), ", "),
             fmt::join(self.strides(), ", "));
  return make_view(self, shape, *st, self.storage_offset());
}

Tensor as_strided_kernel(const Tensor& self, IntArrayRef sizes, IntArrayRef strides,
                         int64_t offset) {
  meta::check_defined("as_strided", self, "self");
  KILN_CHECK(sizes.size() == strides.size(), "[as_strided] got {} sizes but {} strides",
             sizes.size(), strides.size());
  KILN_CHECK(offset >= 0, "[as_strided] negative storage offset {}", offset);
  int64_t max_index = offset;
  bool empty = false, overflow = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    KILN_CHECK(sizes[i] >= 0, "[as_strided] negative size {} at dim {}", sizes[i], i);
    KILN_CHECK(strides[i] >= 0, "[as_strided] negative stride {} at dim {}", strides[i], i);
    if (sizes[i] == 0) empty = true;
    int64_t ext;
    overflow = overflow ||
               __builtin_mul_overflow(sizes[i] > 0 ? sizes[i] - 1 : 0, strides[i], &ext) ||
               __builtin_add_overflow(max_index, ext, &max_index);
  }
  KILN_CHECK_INDEX(!overflow, "[as_strided] size [{}] stride [{}] offset {} overflows",
                   fmt::join(sizes, ", "), fmt::join(strides, ", "), offset);
  if (empty) max_index = -1;
  int64_t capacity = static_cast<int64_t>(self.impl()->storage()->nbytes() / self.itemsize());
  KILN_CHECK_INDEX(max_index < capacity,
                   "[as_strided] size [{}] stride [{}] offset {} reaches element {} but the "
                   "storage holds {}",
                   fmt::join(sizes, ", "), fmt::join(strides, ", "), offset, max_index, capacity);
  return make_view(self, sizes, strides, offset);
}

Tensor permute_kernel(const Tensor& self, IntArrayRef dims) {
  meta::check_defined("permute", self, "self");
  int64_t n = self.dim();
  KILN_CHECK(static_cast<int64_t>(dims.size()) == n,
             "[permute] number of dims don't match: input has {} dims, permutation [{}] has {}", n,
             fmt::join(dims, ", "), dims.size());
  Shape sizes(n), strides(n);
  SmallVector<bool, 8> seen(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims[i], n, "permute");
    KILN_CHECK(!seen[d], "[permute] dim {} repeats in permutation [{}]", d, fmt::join(dims, ", "));
    seen[d] = true;
    sizes[i] = self.sizes()[d];
    strides[i] = self.strides()[d];
  }
  return make_view(self, sizes, strides, self.storage_offset());
}

Tensor transpose_kernel(const Tensor& self, int64_t d0, int64_t d1) {
  meta::check_defined("transpose", self, "self");
  int64_t n = self.dim();
  d0 = wrap_dim(d0, n, "transpose");
  d1 = wrap_dim(d1, n, "transpose");
  Shape sizes(self.sizes()), strides(self.strides());
  if (n > 0) {
    std::swap(sizes[d0], sizes[d1]);
    std::swap(strides[d0], strides[d1]);
  }
  return make_view(self, sizes, strides, self.storage_offset());
}

Tensor slice_kernel(const Tensor& self, int64_t dim, int64_t start, int64_t end, int64_t step) {
  meta::check_defined("slice", self, "self");
  KILN_CHECK_INDEX(self.dim() > 0, "[slice] cannot slice a 0-d tensor");
  int64_t d = wrap_dim(dim, self.dim(), "slice");
  KILN_CHECK(step > 0, "[slice] step must be positive, got {}", step);
  int64_t n = self.sizes()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sizes(self.sizes()), strides(self.strides());
  sizes[d] = end == start ? 0 : (end - start - 1) / step + 1;
  KILN_CHECK(!__builtin_mul_overflow(strides[d], step, &strides[d]),
             "[slice] step {} overflows the stride of dim {}", step, d);
  return make_view(self, sizes, strides, self.storage_offset() + start * self.strides()[d]);
}

Tensor select_kernel(const Tensor& self, int64_t dim, int64_t index) {
  meta::check_defined("select", self, "self");
  KILN_CHECK_INDEX(self.dim() > 0, "[select] cannot select on a 0-d tensor");
  int64_t d = wrap_dim(dim, self.dim(), "select");
  int64_t n = self.sizes()[d];
  KILN_CHECK_INDEX(index >= -n && index < n,
                   "[select] index {} is out of bounds for dimension {} with size {}", index, d, n);
  if (index < 0) index += n;
  Shape sizes(self.sizes()), strides(self.strides());
  sizes.erase(d);
  strides.erase(d);
  return make_view(self, sizes, strides, self.storage_offset() + index * self.strides()[d]);
}

Tensor expand_kernel(const Tensor& self, IntArrayRef sizes) {
  meta::check_defined("expand", self, "self");
  int64_t n = static_cast<int64_t>(sizes.size());
  KILN_CHECK(n >= self.dim(),
             "[expand] the number of sizes provided ({}) must be greater or equal to the number "
             "of dimensions in the tensor ({})",
             n, self.dim());
  Shape out(n), st(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    int64_t j = i - (n - self.dim());
    int64_t want = sizes[i];
    if (j < 0) {
      KILN_CHECK(want >= 0, "[expand] -1 is not allowed in a leading, non-existing dimension {}",
                 i);
      out[i] = want;
      st[i] = 0;
      continue;
    }
    int64_t have = self.sizes()[j];
    if (want == -1) want = have;
    KILN_CHECK(want >= 0, "[expand] invalid size {} at dim {}; sizes must be >= 0 or -1", want, i);
    KILN_CHECK(have == want || have == 1,
               "[expand] the expanded size of the tensor ({}) must match the existing size ({}) "
               "at non-singleton dimension {}; target sizes [{}], tensor sizes [{}]",
               want, have, i, fmt::join(sizes, ", "), fmt::join(self.sizes(), ", "));
    out[i] = want;
    st[i] = have == want ? self.strides()[j] : 0;
  }
  return make_view(self, out, st, self.storage_offset());
}

Tensor squeeze_kernel(const Tensor& self, const std::optional<int64_t>& dim) {
  meta::check_defined("squeeze", self, "self");
  Shape sizes, strides;
  std::optional<int64_t> d;
  if (dim) d = wrap_dim(*dim, self.dim(), "squeeze");
  for (int64_t i = 0; i < self.dim(); ++i) {
    bool drop = self.sizes()[i] == 1 && (!d || *d == i);
    if (!drop) {
      sizes.push_back(self.sizes()[i]);
      strides.push_back(self.strides()[i]);
    }
  }
  return make_view(self, sizes, strides, self.storage_offset());
}

// squeeze.dims: drops the listed dims that have size 1 (wrapped, no repeats; others stay).
Tensor squeeze_dims_kernel(const Tensor& self, IntArrayRef dims) {
  meta::check_defined("squeeze", self, "self");
  Shape sizes, strides;
  SmallVector<bool, 8> listed(static_cast<size_t>(self.dim()), false);
  if (!dims.empty()) listed = meta::reduce_mask("squeeze", self, dims);
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (listed[i] && self.sizes()[i] == 1) continue;
    sizes.push_back(self.sizes()[i]);
    strides.push_back(self.strides()[i]);
  }
  return make_view(self, sizes, strides, self.storage_offset());
}

// diagonal(offset, dim1, dim2): dim1 and dim2 go, and a last dim of the (offset) diagonal's
// length comes, with stride stride1 + stride2, as ATen's diagonal.
Tensor diagonal_kernel(const Tensor& self, int64_t offset, int64_t dim1, int64_t dim2) {
  meta::check_defined("diagonal", self, "self");
  KILN_CHECK_INDEX(self.dim() >= 2, "[diagonal] expected a tensor of at least 2 dims, got {}",
                   self.dim());
  int64_t d1 = wrap_dim(dim1, self.dim(), "diagonal"), d2 = wrap_dim(dim2, self.dim(), "diagonal");
  KILN_CHECK(d1 != d2, "[diagonal] diagonal dimensions cannot be identical {}, {}", dim1, dim2);
  const int64_t n1 = self.sizes()[d1], n2 = self.sizes()[d2];
  int64_t len = 0, start = self.storage_offset();
  if (offset >= 0) {
    len = std::max<int64_t>(std::min(n1, n2 - offset), 0);
    if (len > 0) start += offset * self.strides()[d2];
  } else {
    len = std::max<int64_t>(std::min(n1 + offset, n2), 0);
    if (len > 0) start -= offset * self.strides()[d1];
  }
  Shape sizes, strides;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i == d1 || i == d2) continue;
    sizes.push_back(self.sizes()[i]);
    strides.push_back(self.strides()[i]);
  }
  sizes.push_back(len);
  strides.push_back(self.strides()[d1] + self.strides()[d2]);
  return make_view(self, sizes, strides, start);
}

Tensor unsqueeze_kernel(const Tensor& self, int64_t dim) {
  meta::check_defined("unsqueeze", self, "self");
  int64_t d = wrap_dim(dim, self.dim() + 1, "unsqueeze");
  Shape sizes(self.sizes()), strides(self.strides());
  int64_t st = d < self.dim() ? self.sizes()[d] * self.strides()[d] : 1;
  sizes.insert(d, 1);
  strides.insert(d, st);
  return make_view(self, sizes, strides, self.storage_offset());
}

Tensor alias_kernel(const Tensor& self) {
  meta::check_defined("alias", self, "self");
  return Tensor(make_ref<TensorImpl>(*self.impl()));
}

Tensor detach_kernel(const Tensor& self) {
  meta::check_defined("detach", self, "self");
  return Tensor(make_ref<TensorImpl>(*self.impl()));
}

template <class Sig>
void register_view(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  for (DispatchKey k : {DispatchKey::CPU, DispatchKey::CUDA, DispatchKey::PrivateUse1,
                        DispatchKey::PrivateUse2, DispatchKey::PrivateUse3, DispatchKey::Meta})
    op.set_kernel(k, fn);
}

const bool registered = [] {
  register_view(ops::op_view, &view_kernel);
  register_view(ops::op_as_strided, &as_strided_kernel);
  register_view(ops::op_permute, &permute_kernel);
  register_view(ops::op_transpose, &transpose_kernel);
  register_view(ops::op_slice, &slice_kernel);
  register_view(ops::op_select, &select_kernel);
  register_view(ops::op_expand, &expand_kernel);
  register_view(ops::op_squeeze, &squeeze_kernel);
  register_view(ops::op_unsqueeze, &unsqueeze_kernel);
  register_view(ops::op_squeeze_dims, &squeeze_dims_kernel);
  register_view(ops::op_diagonal, &diagonal_kernel);
  register_view(ops::op_alias, &alias_kernel);
  register_view(ops::op_detach, &detach_kernel);
  return true;
}();
}  // namespace

}  // namespace kiln
