// kiln::index, index_put(_) and nonzero, and the C++ indexing API of kiln/ops/indexing.h
// (libtorch's torch::indexing applySlicing and set_item, in the same order of steps).
#include "kiln/ops/indexing.h"

#include "kiln/core/tensor_impl.h"
#include "kiln/ops/op_list.h"

namespace kiln {
namespace {

// The indices with each bool/uint8 mask replaced by its nonzero() columns, one per dim it
// covers; a mask's shape must match the dims it covers (ATen's message).
TensorList expand_masks(const Tensor& self, const TensorList& indices) {
  TensorList out;
  for (const Tensor& t : indices) {
    if (!t.defined() || (t.dtype() != kBool && t.dtype() != kUInt8)) {
      out.push_back(t);
      continue;
    }
    const int64_t at = static_cast<int64_t>(out.size());
    KILN_CHECK_INDEX(at + t.dim() <= self.dim(),
                     "[index] too many indices for tensor of dimension {} (a mask of {} dims at "
                     "index {})",
                     self.dim(), t.dim(), at);
    for (int64_t j = 0; j < t.dim(); ++j)
      KILN_CHECK_INDEX(t.sizes()[j] == self.sizes()[at + j],
                       "[index] The shape of the mask [{}] at index {} does not match the shape "
                       "of the indexed tensor [{}] at index {}",
                       fmt::join(t.sizes(), ", "), j, fmt::join(self.sizes(), ", "), at + j);
    Tensor nz = nonzero(t);
    for (int64_t j = 0; j < t.dim(); ++j) out.push_back(ops::op_select(nz, 1, j));
  }
  return out;
}

bool records_grad(const Tensor& a, const Tensor& b) {
  return (a.requires_grad() || b.requires_grad()) &&
         !local_dispatch_state().excluded.has(DispatchKey::Autograd);
}

}  // namespace

Tensor index(const Tensor& self, const std::vector<Tensor>& indices) {
  return ops::op_index(self, expand_masks(self, indices));
}

Tensor index_put(const Tensor& self, const std::vector<Tensor>& indices, const Tensor& values,
                 bool accumulate) {
  return ops::op_index_put(self, expand_masks(self, indices), values, accumulate);
}

// As the other in-place indexing ops (ops.cpp): out= into self, or a recorded functional call
// copied in when autograd records.
Tensor& index_put_(Tensor& self, const std::vector<Tensor>& indices, const Tensor& values,
                   bool accumulate) {
  TensorList idx = expand_masks(self, indices);
  if (records_grad(self, values))
    return self.copy_(ops::op_index_put(self, idx, values, accumulate));
  ops::op_index_put_out(self, self, idx, values, accumulate);
  return self;
}

Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  return ops::op_scatter(self, dim, index, src);
}
// scatter.value: src is `value` in self's dtype, expanded to the index's shape.
Tensor scatter(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value) {
  KILN_CHECK(self.defined() && index.defined(), "[scatter] self and index must be defined");
  return ops::op_scatter(self, dim, index,
                         expand(full({}, value, self.dtype(), self.device()), index.sizes()));
}
Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  if (records_grad(self, src)) return self.copy_(ops::op_scatter(self, dim, index, src));
  ops::op_scatter_out(self, self, dim, index, src);
  return self;
}
Tensor& scatter_(Tensor& self, int64_t dim, const Tensor& index, const Scalar& value) {
  KILN_CHECK(self.defined() && index.defined(), "[scatter] self and index must be defined");
  return scatter_(self, dim, index,
                  expand(full({}, value, self.dtype(), self.device()), index.sizes()));
}
namespace {
// scatter_reduce's reduce names, in the op's order (Note [scatter_reduce]).
int64_t reduce_code(std::string_view reduce) {
  constexpr std::string_view names[] = {"sum", "prod", "mean", "amax", "amin"};
  for (int64_t i = 0; i < 5; ++i)
    if (reduce == names[i]) return i;
  KILN_CHECK(false,
             "[scatter_reduce] reduce argument must be either sum, prod, mean, amax or amin, got "
             "'{}'",
             reduce);
  return -1;
}
}  // namespace
Tensor scatter_reduce(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                      std::string_view reduce, bool include_self) {
  return ops::op_scatter_reduce(self, dim, index, src, reduce_code(reduce), include_self);
}
Tensor& scatter_reduce_(Tensor& self, int64_t dim, const Tensor& index, const Tensor& src,
                        std::string_view reduce, bool include_self) {
  const int64_t r = reduce_code(reduce);
  if (records_grad(self, src))
    return self.copy_(ops::op_scatter_reduce(self, dim, index, src, r, include_self));
  ops::op_scatter_reduce_out(self, self, dim, index, src, r, include_self);
  return self;
}
Tensor select_scatter(const Tensor& self, const Tensor& src, int64_t dim, int64_t index) {
  return ops::op_select_scatter(self, src, dim, index);
}
Tensor slice_scatter(const Tensor& self, const Tensor& src, int64_t dim,
                     std::optional<int64_t> start, std::optional<int64_t> end, int64_t step) {
  return ops::op_slice_scatter(self, src, dim, start, end, step);
}
// Composite: the k-th true position of the mask (broadcast to self) takes source's k-th element,
// found by a running count of the mask; no host read (too small a source is index_select's
// out-of-range error). An empty source is allowed, as in ATen, when the mask is all false: it
// gets one padding element that the false positions read (index 0) and where() discards, while
// a true position reads index 1, out of range as before.
Tensor masked_scatter(const Tensor& self, const Tensor& mask, const Tensor& source) {
  KILN_CHECK(self.defined() && mask.defined() && source.defined(),
             "[masked_scatter] self, mask and source must be defined");
  KILN_CHECK_TYPE(mask.dtype() == kBool, "[masked_scatter] mask must be bool, got {}",
                  mask.dtype());
  KILN_CHECK_TYPE(source.dtype() == self.dtype(),
                  "[masked_scatter] source dtype {} differs from self {}", source.dtype(),
                  self.dtype());
  Tensor m = expand(mask, self.sizes());
  if (source.numel() == 0) {
    Tensor padded = cat({reshape(source, {-1}), zeros({1}, self.dtype(), self.device())}, 0);
    Tensor taken = index_select(padded, 0, reshape(m, {-1}).to(kInt64));
    return where(m, reshape(taken, self.sizes()), self);
  }
  Tensor pos = sub(cumsum(reshape(m, {-1}), 0, kInt64), 1);
  Tensor taken = index_select(reshape(source, {-1}), 0, clamp(pos, 0, std::nullopt));
  return where(m, reshape(taken, self.sizes()), self);
}

Tensor nonzero(const Tensor& self) {
  KILN_CHECK(self.defined(), "[nonzero] argument 'self' is an undefined tensor");
  detail::note_host_read(*self.impl(), "nonzero");
  return ops::op_nonzero(self);
}

namespace {

// The dims an index list names (libtorch's count_specified_dimensions): integers, slices and
// int tensors one each, a mask as many as it has; None, Ellipsis and bools none.
int64_t specified_dims(ArrayRef<TensorIndex> indices) {
  int64_t n = 0;
  for (const TensorIndex& i : indices) {
    switch (i.kind()) {
      case TensorIndex::Kind::Integer:
      case TensorIndex::Kind::Slice:
        ++n;
        break;
      case TensorIndex::Kind::Tensor: {
        const Tensor& t = i.tensor();
        n += (t.dtype() == kBool || t.dtype() == kUInt8) ? t.dim() : 1;
        break;
      }
      default:
        break;
    }
  }
  return n;
}

// Python's slice of a dim of `size`: start/stop clamped to [0, size] after wrapping.
Tensor apply_slice(const Tensor& t, int64_t dim, const indexing::Slice& s) {
  const int64_t size = t.sizes()[dim];
  const int64_t step = s.step.value_or(1);
  KILN_CHECK(step > 0, "[index] slice step must be positive, got {}", step);
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + size : *v;
    return std::clamp<int64_t>(x, 0, size);
  };
  const int64_t start = clamp(s.start, 0);
  const int64_t stop = std::max(start, clamp(s.stop, size));
  return ops::op_slice(t, dim, start, stop, step);
}

// The views of the basic indices applied to self, and the advanced indices (undefined where a
// dim is kept) of what remains; libtorch's applySlicing.
Tensor apply_slicing(const Tensor& self, ArrayRef<TensorIndex> indices, TensorList& advanced) {
  const int64_t given = specified_dims(indices);
  KILN_CHECK_INDEX(given <= self.dim(), "[index] too many indices for tensor of dimension {}",
                   self.dim());
  Tensor r = self;
  int64_t dim = 0;
  auto record = [&](const Tensor& t) {
    advanced.resize(static_cast<size_t>(dim + 1));
    advanced[static_cast<size_t>(dim)] = t;
    ++dim;
  };
  auto bool_index = [&](bool b) {
    r = unsqueeze(r, dim);
    record(b ? zeros({1}, kInt64, self.device()) : empty({0}, kInt64, self.device()));
  };
  bool seen_ellipsis = false;
  for (const TensorIndex& i : indices) {
    switch (i.kind()) {
      case TensorIndex::Kind::Integer: {
        const int64_t size = r.sizes()[dim];
        const int64_t v = i.integer();
        KILN_CHECK_INDEX(v >= -size && v < size,
                         "[index] index {} is out of bounds for dimension {} with size {}", v, dim,
                         size);
        r = ops::op_select(r, dim, v < 0 ? v + size : v);
        break;
      }
      case TensorIndex::Kind::Slice:
        r = apply_slice(r, dim, i.slice());
        ++dim;
        break;
      case TensorIndex::Kind::None:
        r = unsqueeze(r, dim);
        ++dim;
        break;
      case TensorIndex::Kind::Ellipsis:
        KILN_CHECK_INDEX(!seen_ellipsis, "[index] an index can only have a single ellipsis");
        seen_ellipsis = true;
        dim += self.dim() - given;
        break;
      case TensorIndex::Kind::Boolean:
        bool_index(i.boolean());
        break;
      case TensorIndex::Kind::Tensor: {
        const Tensor& t = i.tensor();
        KILN_CHECK(t.defined(), "[index] an undefined tensor used as an index");
        const bool mask = t.dtype() == kBool || t.dtype() == kUInt8;
        if (t.dim() == 0 && (mask || is_integral(t.dtype(), false))) {
          if (mask) {  // a 0-d mask: a host read of its one value
            bool_index(t.item<int64_t>() != 0);
          } else {  // a 0-d integer tensor selects (a host read, as libtorch's)
            const int64_t size = r.sizes()[dim];
            const int64_t v = t.item<int64_t>();
            KILN_CHECK_INDEX(v >= -size && v < size,
                             "[index] index {} is out of bounds for dimension {} with size {}", v,
                             dim, size);
            r = ops::op_select(r, dim, v < 0 ? v + size : v);
          }
          break;
        }
        record(t);
        break;
      }
    }
  }
  return r;
}

}  // namespace

Tensor indexing::get_item(const Tensor& self, ArrayRef<TensorIndex> indices) {
  KILN_CHECK(self.defined(), "[index] self is undefined");
  TensorList advanced;
  Tensor r = apply_slicing(self, indices, advanced);
  if (advanced.empty()) return r;
  return index(r, advanced);
}

Tensor& indexing::set_item(Tensor& self, ArrayRef<TensorIndex> indices, const Tensor& values) {
  KILN_CHECK(self.defined(), "[index_put_] self is undefined");
  TensorList advanced;
  Tensor r = apply_slicing(self, indices, advanced);
  if (advanced.empty()) {
    r.copy_(values);
    return self;
  }
  index_put_(r, advanced, values, false);
  return self;
}

Tensor Tensor::index(std::initializer_list<TensorIndex> indices) const {
  return indexing::get_item(*this, ArrayRef<TensorIndex>(indices));
}
Tensor Tensor::index(const std::vector<TensorIndex>& indices) const {
  return indexing::get_item(*this, ArrayRef<TensorIndex>(indices));
}
Tensor& Tensor::index_put_(std::initializer_list<TensorIndex> indices, const Tensor& values) {
  return indexing::set_item(*this, ArrayRef<TensorIndex>(indices), values);
}
Tensor& Tensor::index_put_(std::initializer_list<TensorIndex> indices, const Scalar& value) {
  return indexing::set_item(*this, ArrayRef<TensorIndex>(indices),
                            full({}, value, dtype(), device()));
}

}  // namespace kiln
