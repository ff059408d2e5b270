// convolution and convolution_backward: meta functions, meta kernels and the driver the CPU and
// CUDA kernels share.
#include "kiln/ops/conv_meta.h"

#include <algorithm>

#include "kiln/ops/structured.h"

namespace kiln {

// Note [Convolution]
// convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
// groups) is ATen's core op: 1-3 spatial dims (weight.dim() - 2), each spatial output size
//   (I + 2p - d (K - 1) - 1) / s + 1              (floor; transposed = false)
//   (I - 1) s - 2p + d (K - 1) + output_padding + 1                  (transposed = true).
// A transposed convolution is the adjoint in x of the ordinary one that maps its output back to
// its input with the same weight, so every backend writes three kernels in one direction only,
// the canonical one (ConvGeom: x [n, ci, *x] -> y [n, co, *y], weight [co, ci / groups, *k]):
//   forward          y  = conv(x, w)
//   backward_data    gx = conv_x^T(gy, w)
//   backward_weight  gw = conv_w^T(x, gy)
// and the driver maps the op onto them: convolution is forward (transposed: backward_data with
// x the op's output and y its input); convolution_backward's grad_input is backward_data
// (transposed: forward of grad_output), its grad_weight backward_weight (transposed: with x and
// y swapped), and its grad_bias grad_output summed over every dim but the channels. The bias is
// added with add_ through a [1, C, 1, ...] view; both go through ops, so any backend gets them.
// convolution_backward returns undefined tensors for the outputs output_mask leaves out (bias:
// also when bias_sizes is empty), as ATen does.

namespace meta {
namespace {

constexpr const char* kOp = "convolution";

Shape expand_param(const char* op, const char* what, IntArrayRef v, int64_t nd) {
  KILN_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == nd,
             "[{}] {} must have 1 or {} elements (one per spatial dim), got {}", op, what, nd, v);
  Shape out;
  for (int64_t i = 0; i < nd; ++i) out.push_back(v.size() == 1 ? v[0] : v[static_cast<size_t>(i)]);
  return out;
}

}  // namespace

TensorSpec convolution(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                       bool transposed, IntArrayRef output_padding, int64_t groups,
                       ConvArgs* out_args) {
  const char* op = kOp;
  check_defined(op, input, "input");
  check_defined(op, weight, "weight");
  KILN_CHECK(weight.dim() >= 3 && weight.dim() <= 5,
             "[{}] weight must have 3 to 5 dims (1-3 spatial dims), got {} of shape {}", op,
             weight.dim(), weight.sizes());
  const int64_t nd = weight.dim() - 2;
  KILN_CHECK(input.dim() == weight.dim(),
             "[{}] input must be {}-D ([N, C, {} spatial dims]) for a {}-D weight, got shape {}",
             op, weight.dim(), nd, weight.dim(), input.sizes());
  KILN_CHECK_TYPE(is_floating(input.dtype()) && weight.dtype() == input.dtype(),
                  "[{}] input and weight need one floating dtype, got {} and {}", op, input.dtype(),
                  weight.dtype());
  Device dev = bias.defined() ? common_device(op, {&input, &weight, &bias})
                              : common_device(op, {&input, &weight});
  KILN_CHECK_DEVICE(input.device() == dev && weight.device() == dev,
                    "[{}] input and weight must be on one device, got {} and {}", op,
                    input.device(), weight.device());
  ConvArgs a;
  a.nd = nd;
  a.transposed = transposed;
  a.groups = groups;
  a.stride = expand_param(op, "stride", stride, nd);
  a.padding = expand_param(op, "padding", padding, nd);
  a.dilation = expand_param(op, "dilation", dilation, nd);
  a.output_padding = expand_param(op, "output_padding", output_padding, nd);
  for (int64_t i = 0; i < nd; ++i) {
    KILN_CHECK(a.stride[i] > 0, "[{}] stride must be positive, got {}", op, stride);
    KILN_CHECK(a.dilation[i] > 0, "[{}] dilation must be positive, got {}", op, dilation);
    KILN_CHECK(a.padding[i] >= 0, "[{}] padding must be non-negative, got {}", op, padding);
    KILN_CHECK(a.output_padding[i] >= 0, "[{}] output_padding must be non-negative, got {}", op,
               output_padding);
    KILN_CHECK(!transposed
                   ? a.output_padding[i] == 0
                   : a.output_padding[i] < a.stride[i] || a.output_padding[i] < a.dilation[i],
               "[{}] output_padding {} must be smaller than stride {} or dilation {} (and 0 "
               "unless transposed)",
               op, output_padding, stride, dilation);
  }
  KILN_CHECK(groups > 0, "[{}] groups must be positive, got {}", op, groups);
  const int64_t c_in = input.size(1);
  int64_t c_out;
  if (!transposed) {
    KILN_CHECK(weight.size(0) % groups == 0,
               "[{}] weight's out channels {} must be divisible by groups {}", op, weight.size(0),
               groups);
    KILN_CHECK(weight.size(0) > 0, "[{}] weight must have out channels, got shape {}", op,
               weight.sizes());
    KILN_CHECK(c_in == weight.size(1) * groups,
               "[{}] input has {} channels, but weight {} with groups {} expects {}", op, c_in,
               weight.sizes(), groups, weight.size(1) * groups);
    c_out = weight.size(0);
  } else {
    KILN_CHECK(weight.size(0) % groups == 0,
               "[{}] weight's in channels {} must be divisible by groups {}", op, weight.size(0),
               groups);
    KILN_CHECK(c_in == weight.size(0),
               "[{}] input has {} channels, but the transposed weight {} expects {}", op, c_in,
               weight.sizes(), weight.size(0));
    c_out = weight.size(1) * groups;
    KILN_CHECK(c_out > 0, "[{}] weight must have out channels, got shape {}", op, weight.sizes());
  }
  KILN_CHECK(c_in > 0, "[{}] input must have channels, got shape {}", op, input.sizes());
  if (bias.defined()) {
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == c_out,
               "[{}] bias must be a vector of the {} out channels, got shape {}", op, c_out,
               bias.sizes());
    KILN_CHECK_TYPE(bias.dtype() == input.dtype(), "[{}] bias must be {} like input, got {}", op,
                    input.dtype(), bias.dtype());
  }
  Shape out{input.size(0), c_out};
  for (int64_t i = 0; i < nd; ++i) {
    const int64_t in = input.size(2 + i), k = weight.size(2 + i);
    const int64_t span = a.dilation[i] * (k - 1) + 1;
    int64_t o;
    if (!transposed) {
      KILN_CHECK(in + 2 * a.padding[i] >= span,
                 "[{}] the padded input {} (input {}, padding {}) is smaller than the dilated "
                 "kernel {} (kernel {}, dilation {})",
                 op, in + 2 * a.padding[i], input.sizes(), padding, span, weight.sizes(), dilation);
      o = (in + 2 * a.padding[i] - span) / a.stride[i] + 1;
    } else {
      o = (in - 1) * a.stride[i] - 2 * a.padding[i] + span + a.output_padding[i];
    }
    KILN_CHECK(o > 0,
               "[{}] the output would have size {} in spatial dim {} (input {}, weight {}, "
               "stride {}, padding {}, dilation {})",
               op, o, i, input.sizes(), weight.sizes(), stride, padding, dilation);
    out.push_back(o);
  }
  if (out_args) *out_args = a;
  return {out, input.dtype(), dev};
}

ConvArgs convolution_backward(const Tensor& grad_output, const Tensor& input, const Tensor& weight,
                              IntArrayRef bias_sizes, IntArrayRef stride, IntArrayRef padding,
                              IntArrayRef dilation, bool transposed, IntArrayRef output_padding,
                              int64_t groups, IntArrayRef output_mask) {
  const char* op = "convolution_backward";
  check_defined(op, grad_output, "grad_output");
  ConvArgs a;
  TensorSpec s = convolution(input, weight, Tensor(), stride, padding, dilation, transposed,
                             output_padding, groups, &a);
  KILN_CHECK(bias_sizes.empty() || (bias_sizes.size() == 1 && bias_sizes[0] == s.sizes[1]),
             "[{}] bias_sizes must be empty or [{}] (the out channels), got {}", op, s.sizes[1],
             bias_sizes);
  KILN_CHECK(output_mask.size() == 3, "[{}] output_mask must have 3 flags, got {}", op,
             output_mask);
  for (int64_t m : output_mask)
    KILN_CHECK(m == 0 || m == 1, "[{}] output_mask flags must be 0 or 1, got {}", op, output_mask);
  KILN_CHECK(grad_output.sizes() == IntArrayRef(s.sizes),
             "[{}] grad_output must have the output's shape {}, got {}", op, IntArrayRef(s.sizes),
             grad_output.sizes());
  KILN_CHECK_TYPE(grad_output.dtype() == input.dtype(),
                  "[{}] grad_output must be {} like input, got {}", op, input.dtype(),
                  grad_output.dtype());
  KILN_CHECK_DEVICE(grad_output.device() == s.device, "[{}] grad_output is on {}, input on {}", op,
                    grad_output.device(), s.device);
  return a;
}

}  // namespace meta

namespace detail {
namespace {

ConvGeom geometry(const Tensor& x, const Tensor& y, const Tensor& w, const meta::ConvArgs& a) {
  ConvGeom g;
  g.nd = a.nd;
  g.n = x.size(0);
  g.ci = x.size(1);
  g.co = y.size(1);
  g.groups = a.groups;
  for (int64_t i = 0; i < a.nd; ++i) {
    // Spatial dims right-aligned in the 3 slots: a 1-D conv is [1, 1, L].
    size_t j = static_cast<size_t>(3 - a.nd + i);
    g.x[j] = x.size(2 + i);
    g.y[j] = y.size(2 + i);
    g.k[j] = w.size(2 + i);
    g.stride[j] = a.stride[i];
    g.pad[j] = a.padding[i];
    g.dil[j] = a.dilation[i];
  }
  return g;
}

// A [1, C, 1, ...] view of a C-vector for an nd-spatial-dim tensor.
Tensor channel_view(const Tensor& v, int64_t nd) {
  Shape s{1, v.size(0)};
  for (int64_t i = 0; i < nd; ++i) s.push_back(1);
  return ops::op_view(v, s);
}

// Note [Padding past the input]
// The canonical kernels are a convolution x -> y with symmetric padding, and the libraries
// (oneDNN, cuDNN) derive y's size from x's: y = (x + 2 pad - span) / stride + 1. A transposed
// convolution with output_padding at least the stride (legal while below the dilation) has a
// canonical x longer than that rule allows: rows past the last window, and a window that ends
// inside x where the rule would have it read padding. The libraries refuse that geometry
// (CUDNN_STATUS_BAD_PARAM). So such a geometry is computed on an explicitly padded x: the x a
// convolution with no padding reads, `need` = (y - 1) stride + span rows, holding the real rows
// at [pad, pad + x) cut to `need` and zeros elsewhere; the kernels run with pad 0 on it, and a
// gradient for x is cut back out (rows no window reads get zero). The values are exactly the
// convolution's: each output reads the same inputs, in the same order.
int64_t needed(const ConvGeom& g, size_t j) {
  return (g.y[j] - 1) * g.stride[j] + g.dil[j] * (g.k[j] - 1) + 1;
}
bool past_the_input(const ConvGeom& g) {
  for (size_t j = 0; j < 3; ++j)
    if ((g.x[j] + 2 * g.pad[j] - g.dil[j] * (g.k[j] - 1) - 1) / g.stride[j] + 1 != g.y[j])
      return true;
  return false;
}
ConvGeom unpadded(const ConvGeom& g) {
  ConvGeom u = g;
  for (size_t j = 0; j < 3; ++j) {
    u.x[j] = needed(g, j);
    u.pad[j] = 0;
  }
  return u;
}
// The window of spatial dims of `t` (a canonical x shape when `padded` is false, the unpadded
// one otherwise) holding x's rows [0, len) at [from, from + len).
Tensor window(const Tensor& t, const ConvGeom& g, bool padded) {
  Tensor v = t;
  for (int64_t i = 0; i < g.nd; ++i) {
    const size_t j = static_cast<size_t>(3 - g.nd + i);
    const int64_t len = std::min(g.x[j], needed(g, j) - g.pad[j]);
    v = ops::op_slice(v, 2 + i, padded ? g.pad[j] : 0, (padded ? g.pad[j] : 0) + len, 1);
  }
  return v;
}
Tensor zeros_shaped(const Tensor& like, const ConvGeom& g, bool padded) {
  Shape s{g.n, g.ci};
  for (int64_t i = 0; i < g.nd; ++i) {
    const size_t j = static_cast<size_t>(3 - g.nd + i);
    s.push_back(padded ? needed(g, j) : g.x[j]);
  }
  return ops::op_full(s, 0, like.dtype(), like.device());
}
Tensor pad_input(const Tensor& x, const ConvGeom& g) {
  Tensor p = zeros_shaped(x, g, true);
  ops::op_copy_(window(p, g, true), window(x, g, false));
  return p;
}
Tensor crop_grad(const Tensor& gp, const ConvGeom& g) {
  Tensor gx = zeros_shaped(gp, g, false);
  ops::op_copy_(window(gx, g, false), window(gp, g, true));
  return gx;
}

Tensor forward(const ConvKernels& k, const Tensor& x, const Tensor& w, const ConvGeom& g) {
  if (!past_the_input(g)) return k.forward(x, w, g);
  return k.forward(pad_input(x, g), w, unpadded(g));
}
Tensor backward_data(const ConvKernels& k, const Tensor& gy, const Tensor& w, const ConvGeom& g) {
  if (!past_the_input(g)) return k.backward_data(gy, w, g);
  return crop_grad(k.backward_data(gy, w, unpadded(g)), g);
}
Tensor backward_weight(const ConvKernels& k, const Tensor& x, const Tensor& gy, const ConvGeom& g) {
  if (!past_the_input(g)) return k.backward_weight(x, gy, g);
  return k.backward_weight(pad_input(x, g), gy, unpadded(g));
}

}  // namespace

Tensor run_convolution(const ConvKernels& k, const Tensor& input, const Tensor& weight,
                       const Tensor& bias, IntArrayRef stride, IntArrayRef padding,
                       IntArrayRef dilation, bool transposed, IntArrayRef output_padding,
                       int64_t groups) {
  meta::ConvArgs a;
  TensorSpec s = meta::convolution(input, weight, bias, stride, padding, dilation, transposed,
                                   output_padding, groups, &a);
  Tensor out;
  if (!transposed) {
    Tensor y = empty_tensor(s.sizes, s.dtype, Device(kMeta));
    out = forward(k, input, weight, geometry(input, y, weight, a));
  } else {
    Tensor x = empty_tensor(s.sizes, s.dtype, Device(kMeta));
    out = backward_data(k, input, weight, geometry(x, input, weight, a));
  }
  if (bias.defined()) ops::op_add_(out, channel_view(bias, a.nd), 1);
  return out;
}

TensorTriple run_convolution_backward(const ConvKernels& k, const Tensor& grad_output,
                                      const Tensor& input, const Tensor& weight,
                                      IntArrayRef bias_sizes, IntArrayRef stride,
                                      IntArrayRef padding, IntArrayRef dilation, bool transposed,
                                      IntArrayRef output_padding, int64_t groups,
                                      IntArrayRef output_mask) {
  meta::ConvArgs a =
      meta::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                                 transposed, output_padding, groups, output_mask);
  Tensor gi, gw, gb;
  // Canonical x and y: the op's input and output, swapped when transposed.
  const Tensor& x = transposed ? grad_output : input;
  const Tensor& y = transposed ? input : grad_output;
  ConvGeom g = geometry(x, y, weight, a);
  if (output_mask[0])
    gi = transposed ? forward(k, grad_output, weight, g) : backward_data(k, grad_output, weight, g);
  if (output_mask[1]) gw = backward_weight(k, x, y, g);
  if (output_mask[2] && !bias_sizes.empty()) {
    Shape dims{0};
    for (int64_t i = 0; i < a.nd; ++i) dims.push_back(2 + i);
    gb = ops::op_sum(grad_output, dims, false, std::nullopt);
  }
  return {gi, gw, gb};
}

}  // namespace detail

namespace {

Device meta_dev() { return Device(kMeta); }
Tensor meta_convolution(const Tensor& input, const Tensor& weight, const Tensor& bias,
                        IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                        bool transposed, IntArrayRef output_padding, int64_t groups) {
  TensorSpec s = meta::convolution(input, weight, bias, stride, padding, dilation, transposed,
                                   output_padding, groups);
  return detail::empty_tensor(s.sizes, s.dtype, meta_dev());
}
TensorTriple meta_convolution_backward(const Tensor& grad_output, const Tensor& input,
                                       const Tensor& weight, IntArrayRef bias_sizes,
                                       IntArrayRef stride, IntArrayRef padding,
                                       IntArrayRef dilation, bool transposed,
                                       IntArrayRef output_padding, int64_t groups,
                                       IntArrayRef output_mask) {
  meta::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                             transposed, output_padding, groups, output_mask);
  Tensor gi, gw, gb;
  if (output_mask[0]) gi = detail::empty_tensor(input.sizes(), input.dtype(), meta_dev());
  if (output_mask[1]) gw = detail::empty_tensor(weight.sizes(), input.dtype(), meta_dev());
  if (output_mask[2] && !bias_sizes.empty())
    gb = detail::empty_tensor(bias_sizes, input.dtype(), meta_dev());
  return {gi, gw, gb};
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_convolution, &meta_convolution);
  reg(ops::op_convolution_backward, &meta_convolution_backward);
  return true;
}();

}  // namespace
}  // namespace kiln
