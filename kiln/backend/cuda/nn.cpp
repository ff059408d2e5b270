// CUDA kernels of layer_norm (and its backward ops), rms_norm, gelu_backward,
// threshold_backward, embedding and nll_loss: host glue.
#include "kiln/backend/cuda/nn.h"

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/index.h"
#include "kiln/ops/norm_meta.h"
#include "kiln/ops/ops.h"

namespace kiln::cuda {
namespace {

// `t` on `device` (a 0-d cpu operand is copied over), contiguous in `dtype`.
Tensor device_contiguous(const Tensor& t, DType dtype, Device device) {
  return contiguous_as(t.device() == device ? t : t.to(device), dtype);
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.impl()->data() : nullptr; }

void norm_common(const Tensor& out, const Tensor& x, IntArrayRef shape, const Tensor& w,
                 const Tensor& b, double eps, bool rms) {
  if (x.numel() == 0) return;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  Tensor cx = contiguous_as(x, x.dtype());
  Tensor cw = w.defined() ? contiguous_as(w, x.dtype()) : Tensor();
  Tensor cb = b.defined() ? contiguous_as(b, x.dtype()) : Tensor();
  with_result(out, x.dtype(), true, [&](const Tensor& y) {
    launch_norm(dt(x.dtype()), cx.impl()->data(), data_or_null(cw), data_or_null(cb),
                y.impl()->data(), x.numel() / n, n, eps, rms, stream_for(out));
    check_launch(rms ? "rms_norm" : "layer_norm");
  });
}
void layer_norm_impl(const Tensor& out, const Tensor& x, IntArrayRef shape, const Tensor& w,
                     const Tensor& b, double eps) {
  norm_common(out, x, shape, w, b, eps, false);
}
void rms_norm_impl(const Tensor& out, const Tensor& x, IntArrayRef shape, const Tensor& w,
                   double eps) {
  norm_common(out, x, shape, w, Tensor(), eps, true);
}

void layer_norm_backward_impl(const Tensor& out, const Tensor& g, const Tensor& x,
                              IntArrayRef shape, const Tensor& w, double eps) {
  if (x.numel() == 0) return;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  Tensor cg = contiguous_as(g, x.dtype()), cx = contiguous_as(x, x.dtype());
  Tensor cw = w.defined() ? contiguous_as(w, x.dtype()) : Tensor();
  with_result(out, x.dtype(), true, [&](const Tensor& y) {
    launch_layer_norm_backward(dt(x.dtype()), cg.impl()->data(), cx.impl()->data(),
                               data_or_null(cw), y.impl()->data(), x.numel() / n, n, eps,
                               stream_for(out));
    check_launch("layer_norm_backward");
  });
}

// layer_norm_fused_backward: dx, dw and db from one pass where rows fit in registers (per-block
// partial sums, then a kernel adding them up); longer rows, or dx alone, take
// layer_norm_backward's kernel for dx, and sums of ops, in float32 for the 16-bit dtypes, for dw
// and db.
TensorTriple layer_norm_fused_backward_kernel(const Tensor& g, const Tensor& x, IntArrayRef shape,
                                              const Tensor& w, double eps, IntArrayRef mask) {
  auto [dx, dw, db, rows, n] = detail::layer_norm_fused_backward_outputs(g, x, shape, w, eps, mask);
  if (rows == 0) return {dx, dw, db};
  Tensor cg = contiguous_as(g, x.dtype()), cx = contiguous_as(x, x.dtype());
  Tensor cw = w.defined() ? contiguous_as(w, x.dtype()) : Tensor();
  if (layer_norm_fused_backward_fit(n) && (dw.defined() || db.defined())) {
    const int64_t parts = layer_norm_fused_backward_parts(rows, n);
    Tensor partial =
        empty_cuda({parts, 2 * n}, x.dtype() == kFloat64 ? kFloat64 : kFloat32, x.device());
    launch_layer_norm_fused_backward(dt(x.dtype()), cg.impl()->data(), cx.impl()->data(),
                                     data_or_null(cw), dx.defined() ? dx.impl()->data() : nullptr,
                                     dw.defined() ? dw.impl()->data() : nullptr,
                                     db.defined() ? db.impl()->data() : nullptr,
                                     partial.impl()->data(), parts, rows, n, eps, stream_for(x));
    check_launch("layer_norm_fused_backward");
    return {dx, dw, db};
  }
  if (dx.defined()) {
    launch_layer_norm_backward(dt(x.dtype()), cg.impl()->data(), cx.impl()->data(),
                               data_or_null(cw), dx.impl()->data(), rows, n, eps, stream_for(x));
    check_launch("layer_norm_fused_backward");
  }
  const DType acc = x.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor g2 = cg.to(acc).view({rows, n});
  if (dw.defined())
    dw.copy_(sum(mul(g2, layer_norm(cx.to(acc).view({rows, n}), {n}, {}, {}, eps)), {0}, false,
                 std::nullopt)
                 .view(shape));
  if (db.defined()) db.copy_(sum(g2, {0}, false, std::nullopt).view(shape));
  return {dx, dw, db};
}

void gelu_backward_impl(const Tensor& out, const Tensor& grad, const Tensor& x,
                        bool approximate_tanh) {
  with_result(out, x.dtype(), false, [&](const Tensor& r) {
    Indexer<3> ix = make_indexer<3>(r, {&grad, &x});
    launch_gelu_backward(dt(x.dtype()), ix, r.impl()->data(), operand(grad), operand(x),
                         approximate_tanh, stream_for(r));
    check_launch("gelu_backward");
  });
}

void threshold_backward_impl(const Tensor& out, const Tensor& grad, const Tensor& x,
                             const Scalar& threshold) {
  with_result(out, x.dtype(), false, [&](const Tensor& r) {
    Indexer<3> ix = make_indexer<3>(r, {&grad, &x});
    launch_threshold_backward(dt(x.dtype()), ix, r.impl()->data(), operand(grad), operand(x),
                              threshold.to_double(), stream_for(r));
    check_launch("threshold_backward");
  });
}

// The rows of weight (V, D) at indices: index_select along dim 0, as (1, V, D) -> (1, N, D).
// padding_idx and scale_grad_by_freq change only the gradient (Note [Embedding gradients]).
void embedding_impl(const Tensor& out, const Tensor& weight, const Tensor& indices, int64_t, bool,
                    bool) {
  static const int kBadIndex =
      error_code("[embedding] an index is out of range [0, num_embeddings) (found on the device)");
  int64_t V = weight.sizes()[0], D = weight.sizes()[1];
  Tensor cw = contiguous_as(weight, weight.dtype());
  Tensor ci = device_contiguous(indices, indices.dtype(), out.device());
  with_result(out, weight.dtype(), true, [&](const Tensor& y) {
    launch_index_select(dt(weight.dtype()), cw.impl()->data(), dt(indices.dtype()),
                        ci.impl()->data(), y.impl()->data(), 1, V, indices.numel(), D,
                        error_word(out.device().index()), kBadIndex, stream_for(out));
    check_launch("embedding");
  });
}

void nll_loss_impl(const Tensor& out, const Tensor& self, const Tensor& target,
                   int64_t ignore_index) {
  static const int kBadTarget = error_code(
      "[nll_loss] a target is out of bounds [0, num_classes) and is not ignore_index (found on "
      "the device)");
  int64_t C = self.sizes()[self.dim() - 1];
  int64_t N = self.dim() == 2 ? self.sizes()[0] : 1;
  Tensor x = contiguous_as(self, self.dtype());
  Tensor t = device_contiguous(target, kInt64, out.device());
  with_result(out, self.dtype(), true, [&](const Tensor& y) {
    launch_nll_loss(dt(self.dtype()), x.impl()->data(),
                    static_cast<const int64_t*>(t.impl()->data()), y.impl()->data(), N, C,
                    ignore_index, error_word(out.device().index()), kBadTarget, stream_for(out));
    check_launch("nll_loss");
  });
}

}  // namespace

KILN_CUDA_KERNELS(backend_kernel(ops::op_layer_norm_fused_backward,
                                 &layer_norm_fused_backward_kernel));
KILN_CUDA_STRUCTURED(layer_norm, &layer_norm_impl);
KILN_CUDA_STRUCTURED(layer_norm_backward, &layer_norm_backward_impl);
KILN_CUDA_STRUCTURED(rms_norm, &rms_norm_impl);
KILN_CUDA_STRUCTURED(gelu_backward, &gelu_backward_impl);
KILN_CUDA_STRUCTURED(threshold_backward, &threshold_backward_impl);
KILN_CUDA_STRUCTURED(embedding, &embedding_impl);
KILN_CUDA_STRUCTURED(nll_loss, &nll_loss_impl);

}  // namespace kiln::cuda
