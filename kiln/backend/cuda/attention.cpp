// CUDA kernels of flash_attention and flash_attention_backward: host glue (Note [Fused
// attention] in kiln/ops/ops.h; the kernels are in attention.cu).
#include "kiln/backend/cuda/attention.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/ops/factory_meta.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cuda {
namespace {

// Whether the kernels take q's dtype and head dim; flash_attention_math runs the others.
bool kernels_take(const Tensor& q) {
  return q.dtype() != kFloat64 && q.size(-1) <= kMaxAttnHeadDim;
}

// The stride of t's outer dims (the leading dims but the innermost) read as one dim: the
// stride of the innermost of them whose size is not 1 (0 when there is none), or nullopt
// when they do not merge into one dim (the column stride must be 1 as well).
std::optional<int64_t> outer_stride(const Tensor& t) {
  if (t.stride(-1) != 1 && t.size(-1) != 1) return std::nullopt;
  int64_t lead = t.dim() - 2, last = -1;
  for (int64_t d = 0; d < lead - 1; ++d) {
    if (t.size(d) == 1) continue;
    if (last >= 0 && t.stride(last) != t.stride(d) * t.size(d)) return std::nullopt;
    last = d;
  }
  return last >= 0 ? t.stride(last) : 0;
}

// t as an AttnOperand; `keep` holds the contiguous copy made when t's layout does not fit.
AttnOperand operand_of(const Tensor& t, Tensor& keep) {
  std::optional<int64_t> outer = outer_stride(t);
  keep = outer ? t : contiguous_as(t, t.dtype());
  if (!outer) outer = outer_stride(keep);
  int64_t lead = keep.dim() - 2;
  AttnOperand op;
  op.data = keep.impl()->data();
  op.row_stride = keep.stride(-2);
  op.inner_stride = lead >= 1 ? keep.stride(lead - 1) : 0;
  op.outer_stride = *outer;
  return op;
}

AttnShape shape_of(const Tensor& q, const Tensor& k, bool causal, double scale) {
  AttnShape sh;
  int64_t lead = q.dim() - 2;
  for (int64_t d = 0; d < lead; ++d) sh.n *= q.size(d);
  sh.inner = lead >= 1 ? q.size(lead - 1) : 1;
  sh.l = q.size(-2);
  sh.s = k.size(-2);
  sh.e = static_cast<int>(q.size(-1));
  sh.causal = causal;
  sh.scale = static_cast<float>(scale);
  int64_t tiles = (std::max(sh.l, sh.s) + 63) / 64;
  constexpr int64_t kMaxBlocks = std::numeric_limits<int32_t>::max();
  KILN_CHECK(sh.n <= kMaxBlocks / std::max<int64_t>(tiles, 1) && sh.n * sh.l / 4 < kMaxBlocks,
             "[flash_attention] {} batch entries of {} queries and {} keys are more blocks than "
             "one launch takes",
             sh.n, sh.l, sh.s);
  return sh;
}

bool use_tensor_cores(DType t) { return t != kFloat32 || allow_tf32(); }

// Note [Attention outputs in their input's layout]
// cuDNN writes any strides, so the 16-bit outputs that may go to it take the order of their
// input's dims (as PyTorch's SDPA gives them): dense, with like's dims ordered by like's
// strides. A GPT's q, k and v are [B, H, T, E] views of a [B, T, 3C] projection, so its output
// and gradients come out as [B, T, H, E] memory, and the transpose back and the view to
// [B, T, C] (or the three gradients' views before split's backward) copy nothing: four copies
// of [B, T, C] a layer fewer. Kiln's own kernels write packed outputs, so when cuDNN does not
// take the call the output is packed (a second allocation). Contiguous when like's last dim is
// not its innermost or its leading dims would not read as one (AttnOperand).
Tensor empty_in_order_of(const Tensor& like, IntArrayRef sizes, DType dtype, Device device) {
  const int64_t nd = like.dim();
  if (dtype == kFloat32 || dtype == kFloat64 || nd < 3 || like.stride(-1) != 1)
    return empty_cuda(sizes, dtype, device);
  std::vector<int64_t> order(static_cast<size_t>(nd - 1));  // the leading dims, outermost first
  for (int64_t d = 0; d < nd - 1; ++d) order[static_cast<size_t>(d)] = d;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> strides(static_cast<size_t>(nd));
  int64_t step = sizes[static_cast<size_t>(nd - 1)];
  strides[static_cast<size_t>(nd - 1)] = 1;
  for (size_t i = order.size(); i-- > 0;) {
    strides[static_cast<size_t>(order[i])] = step;
    step *= sizes[static_cast<size_t>(order[i])];
  }
  Tensor t = detail::empty_strided_tensor(sizes, strides, dtype, device);
  return outer_stride(t) ? t : empty_cuda(sizes, dtype, device);
}

// An output as the kernels see it (it must read as one: empty_in_order_of sees to it).
AttnOperand output_of(const Tensor& t) {
  Tensor same;
  AttnOperand op = operand_of(t, same);
  KILN_DEBUG_ASSERT(same.impl() == t.impl(), "[flash_attention] an output that needs a copy");
  return op;
}

TensorPair cuda_flash_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                double scale) {
  const char* op = "flash_attention";
  TensorSpec s = meta::flash_attention(q, k, v, causal, scale);
  if (!kernels_take(q)) return detail::flash_attention_math(q, k, v, causal, scale);
  Tensor out = empty_in_order_of(q, s.sizes, s.dtype, s.device);
  Tensor lse = empty_cuda(meta::attention_stats_sizes(q), kFloat32, s.device);
  AttnShape sh = shape_of(q, k, causal, scale);
  if (sh.n == 0) return {out, lse};
  Tensor kq, kk, kv;
  AttnOperand oq = operand_of(q, kq), ok = operand_of(k, kk), ov = operand_of(v, kv);
  float* l = static_cast<float*>(lse.impl()->data());
  if (!cudnn_flash_forward(dt(q.dtype()), sh, oq, ok, ov, output_of(out), l, out)) {
    if (!out.is_contiguous()) out = empty_cuda(s.sizes, s.dtype, s.device);
    launch_flash_forward(dt(q.dtype()), use_tensor_cores(q.dtype()), sh, oq, ok, ov,
                         out.impl()->data(), l, stream_for(out));
  }
  check_launch(op);
  return {out, lse};
}

TensorTriple cuda_flash_attention_backward(const Tensor& g, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           bool causal, double scale) {
  const char* op = "flash_attention_backward";
  TensorSpec s = meta::flash_attention_backward(g, q, k, v, out, lse, causal, scale);
  if (!kernels_take(q))
    return detail::flash_attention_backward_math(g, q, k, v, out, lse, causal, scale);
  Tensor dq = empty_in_order_of(q, q.sizes(), s.dtype, s.device);
  Tensor dk = empty_in_order_of(k, k.sizes(), s.dtype, s.device);
  Tensor dv = empty_in_order_of(v, v.sizes(), s.dtype, s.device);
  AttnShape sh = shape_of(q, k, causal, scale);
  if (sh.n == 0) return {dq, dk, dv};
  Tensor clse = contiguous_as(lse, kFloat32);
  const bool deterministic = deterministic_algorithms();
  Tensor kq, kk, kv, ko, kg;
  AttnOperand oq = operand_of(q, kq), ok = operand_of(k, kk), ov = operand_of(v, kv),
              oo = operand_of(out, ko), og = operand_of(g, kg);
  const float* l = static_cast<const float*>(clse.impl()->data());
  if (cudnn_flash_backward(dt(q.dtype()), sh, oq, ok, ov, oo, og, l, output_of(dq), output_of(dk),
                           output_of(dv), dq))
    return {dq, dk, dv};
  if (!dq.is_contiguous()) dq = empty_cuda(q.sizes(), s.dtype, s.device);
  if (!dk.is_contiguous()) dk = empty_cuda(k.sizes(), s.dtype, s.device);
  if (!dv.is_contiguous()) dv = empty_cuda(v.sizes(), s.dtype, s.device);
  Tensor delta = empty_cuda({sh.n * sh.l}, kFloat32, s.device);
  launch_flash_backward(dt(q.dtype()), use_tensor_cores(q.dtype()), sh, oq, ok, ov, oo, og, l,
                        static_cast<float*>(delta.impl()->data()), deterministic, dq.impl()->data(),
                        dk.impl()->data(), dv.impl()->data(), stream_for(dq));
  check_launch(op);
  return {dq, dk, dv};
}

}  // namespace

KILN_CUDA_KERNELS(backend_kernel(ops::op_flash_attention, &cuda_flash_attention),
                  backend_kernel(ops::op_flash_attention_backward, &cuda_flash_attention_backward));

}  // namespace kiln::cuda
