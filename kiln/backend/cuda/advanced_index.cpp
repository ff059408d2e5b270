// CUDA kernels of index, index_put and nonzero: host glue (see Note [Advanced indexing] in
// kiln/ops/index_meta.cpp). Index values live on the device, so the kernels check them.
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/index.h"
#include "kiln/ops/index_meta.h"
#include "kiln/ops/ops.h"

namespace kiln::cuda {
namespace {

// The walk of plan `p` over a tensor of `strides` (self's, or a destination of self's sizes),
// reading the broadcast int64 index tensors `idx` (kept alive by the caller).
AdvIndexGeom make_adv_geom(const char* op, const meta::IndexPlan& p, IntArrayRef self_sizes,
                           IntArrayRef strides, const std::vector<Tensor>& idx) {
  const int nr = static_cast<int>(p.result.size());
  KILN_CHECK(nr <= kMaxIndexDims && static_cast<int>(idx.size()) <= kMaxIndexDims,
             "[{}] the indexed shape [{}] has more than {} dims (the limit on cuda)", op,
             fmt::join(p.result, ", "), kMaxIndexDims);
  const int64_t nb = static_cast<int64_t>(p.bshape.size());
  std::vector<int64_t> bstride(static_cast<size_t>(nb), 1);
  for (int64_t i = nb - 2; i >= 0; --i) bstride[i] = bstride[i + 1] * p.bshape[i + 1];
  AdvIndexGeom g;
  g.ndim = nr;
  g.nidx = static_cast<int>(idx.size());
  g.numel = checked_numel(p.result, op);
  for (int r = 0; r < nr; ++r) {  // innermost first
    const int src = nr - 1 - r;
    const int64_t d = p.self_dim[src];
    g.sizes[r] = p.result[src];
    g.strides[r] = d >= 0 ? strides[d] : 0;
    g.bstrides[r] = d >= 0 ? 0 : bstride[src - p.bpos];
  }
  for (int k = 0; k < g.nidx; ++k) {
    const int64_t d = p.adv_dims[k];
    g.idx[k] = static_cast<const int64_t*>(idx[k].impl()->data());
    g.bound[k] = self_sizes[d];
    g.istride[k] = strides[d];
  }
  return g;
}

std::vector<Tensor> device_indices(const meta::IndexPlan& p, const TensorList& indices,
                                   Device device) {
  std::vector<Tensor> idx;
  for (size_t k = 0; k < p.adv_dims.size(); ++k)
    idx.push_back(meta::broadcast_index(p, indices, k, device));
  return idx;
}

int* err_word_of(const Tensor& t) { return error_word(t.device().index()); }

void index_impl(const Tensor& out, const Tensor& self, const TensorList& indices) {
  static const int kBadIndex =
      error_code("[index] an index is out of bounds for its dimension (found on the device)");
  meta::IndexPlan p = meta::plan_index("index", self, indices);
  std::vector<Tensor> idx = device_indices(p, indices, out.device());
  AdvIndexGeom g = make_adv_geom("index", p, self.sizes(), self.strides(), idx);
  KILN_DEBUG_ASSERT(fits_grid(g.numel), "[index] {} elements", g.numel);
  with_result(out, self.dtype(), true, [&](const Tensor& r) {
    launch_index(dt(self.dtype()), self.impl()->data(), r.impl()->data(), g, err_word_of(out),
                 kBadIndex, stream_for(out));
    check_launch("index");
  });
}

void index_put_impl(const Tensor& out, const Tensor& self, const TensorList& indices,
                    const Tensor& values, bool accumulate) {
  static const int kBadIndex =
      error_code("[index_put] an index is out of bounds for its dimension (found on the device)");
  meta::IndexPlan p = meta::plan_index("index_put", self, indices);
  std::vector<Tensor> idx = device_indices(p, indices, out.device());
  Tensor v = values.device() == out.device() ? values : values.to(out.device());
  Tensor cv = contiguous_as(ops::op_expand(v, p.result), self.dtype());
  KILN_DEBUG_ASSERT(fits_grid(cv.numel()), "[index_put] {} values", cv.numel());
  with_result(out, self.dtype(), false, [&](const Tensor& r) {
    copy_kernel(r, self);
    AdvIndexGeom g = make_adv_geom("index_put", p, self.sizes(), r.strides(), idx);
    launch_index_put(dt(self.dtype()), r.impl()->data(), cv.impl()->data(), g, accumulate,
                     err_word_of(out), kBadIndex, stream_for(out));
    check_launch("index_put");
  });
}

// The count of nonzero elements decides the result's size, so it is read on the host anyway:
// the cpu kernel runs on a host copy and its result comes back (kiln::nonzero is a host read).
Tensor nonzero_kernel(const Tensor& self) {
  Tensor host = ops::op_nonzero(self.to(Device(kCPU)));
  return host.to(self.device());
}

}  // namespace

KILN_CUDA_STRUCTURED(index, &index_impl);
KILN_CUDA_STRUCTURED(index_put, &index_put_impl);
KILN_CUDA_KERNELS(::kiln::backend_kernel(ops::op_nonzero, &nonzero_kernel));

}  // namespace kiln::cuda
