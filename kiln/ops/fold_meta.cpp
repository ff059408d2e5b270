// im2col and col2im: meta functions, meta kernels and the geometry the backends share.
#include "kiln/ops/fold_meta.h"

#include "kiln/ops/structured.h"

namespace kiln {

// Note [im2col and col2im]
// im2col(self, kernel_size, dilation, padding, stride) and col2im(self, output_size,
// kernel_size, dilation, padding, stride) are ATen's (torch.nn.functional.unfold and fold). Per
// spatial dim, for image size I, kernel k, dilation d, padding p and stride s, the number of
// blocks (sliding positions) is
//   B = (I + 2p - d (k - 1) - 1) / s + 1   (at least 1; checked);
// im2col turns an image [N, C, H, W] into columns [N, C kh kw, Bh Bw]: row (c, i, j) of block
// (y, x) is image[c, y sh - ph + i dh, x sw - pw + j dw], 0 in the padding. col2im is its
// adjoint: it sums every column entry into the pixel it came from, giving [N, C, H, W] with
// (H, W) = output_size; each is the other's gradient. Both take an unbatched input too
// ([C, H, W] and [C kh kw, L]) and a batch of 0, as ATen's. The kernels compute each output
// element on its own (kiln/ops/fold_math.h): col2im gathers the entries of a pixel in ATen's CPU
// order (taps row-major), so no atomics and the same bits every run. 16-bit inputs are computed
// in float32 and rounded once (ATen's CPU col2im rounds after every add).

namespace meta {
namespace {

struct Args {
  int64_t kh, kw, dh, dw, ph, pw, sh, sw;
};

void check_pair(const char* op, const char* what, IntArrayRef v) {
  KILN_CHECK(v.size() == 2, "[{}] {} must have 2 elements, got {}", op, what, v);
}
Args check_args(const char* op, IntArrayRef kernel_size, IntArrayRef dilation, IntArrayRef padding,
                IntArrayRef stride) {
  check_pair(op, "kernel_size", kernel_size);
  check_pair(op, "dilation", dilation);
  check_pair(op, "padding", padding);
  check_pair(op, "stride", stride);
  KILN_CHECK(kernel_size[0] > 0 && kernel_size[1] > 0,
             "[{}] kernel size should be greater than zero, but got kernel_size={}", op,
             kernel_size);
  KILN_CHECK(dilation[0] > 0 && dilation[1] > 0,
             "[{}] dilation should be greater than zero, but got dilation={}", op, dilation);
  KILN_CHECK(padding[0] >= 0 && padding[1] >= 0,
             "[{}] padding should be non-negative, but got padding={}", op, padding);
  KILN_CHECK(stride[0] > 0 && stride[1] > 0,
             "[{}] stride should be greater than zero, but got stride={}", op, stride);
  return {kernel_size[0], kernel_size[1], dilation[0], dilation[1],
          padding[0],     padding[1],     stride[0],   stride[1]};
}
// Rounded down, as ATen's div_rtn: a window wider than the padded image gives 0 or fewer.
int64_t blocks(int64_t size, int64_t k, int64_t d, int64_t p, int64_t s) {
  const int64_t num = size + 2 * p - d * (k - 1) - 1;
  return (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
}
// Blocks per dim of an (H, W) image, each at least 1.
std::pair<int64_t, int64_t> check_blocks(const char* op, int64_t H, int64_t W, const Args& a,
                                         IntArrayRef kernel_size, IntArrayRef dilation,
                                         IntArrayRef padding, IntArrayRef stride) {
  const int64_t bh = blocks(H, a.kh, a.dh, a.ph, a.sh), bw = blocks(W, a.kw, a.dw, a.pw, a.sw);
  KILN_CHECK(bh >= 1 && bw >= 1,
             "[{}] given spatial size ({}, {}), kernel_size={}, dilation={}, padding={}, "
             "stride={}, the array of sliding blocks would be ({}, {}): it must be at least one "
             "block in each dim",
             op, H, W, kernel_size, dilation, padding, stride, bh, bw);
  return {bh, bw};
}
void check_float(const char* op, const Tensor& t) {
  KILN_CHECK_TYPE(is_floating(t.dtype()), "[{}] only supports floating-point dtypes, got {}", op,
                  t.dtype());
}

}  // namespace

TensorSpec im2col(const Tensor& self, IntArrayRef kernel_size, IntArrayRef dilation,
                  IntArrayRef padding, IntArrayRef stride) {
  const char* op = "im2col";
  check_defined(op, self, "self");
  Args a = check_args(op, kernel_size, dilation, padding, stride);
  const int64_t nd = self.dim();
  KILN_CHECK((nd == 3 && self.numel() > 0) ||
                 (nd == 4 && self.size(1) > 0 && self.size(2) > 0 && self.size(3) > 0),
             "[{}] expected a 3-D or 4-D (batch mode) input with non-zero dims but for the "
             "batch, got sizes {}",
             op, self.sizes());
  check_float(op, self);
  const int64_t C = self.size(-3);
  auto [bh, bw] =
      check_blocks(op, self.size(-2), self.size(-1), a, kernel_size, dilation, padding, stride);
  Shape out;
  if (nd == 4) out.push_back(self.size(0));
  out.push_back(C * a.kh * a.kw);
  out.push_back(bh * bw);
  return {out, self.dtype(), self.device()};
}

TensorSpec col2im(const Tensor& self, IntArrayRef output_size, IntArrayRef kernel_size,
                  IntArrayRef dilation, IntArrayRef padding, IntArrayRef stride) {
  const char* op = "col2im";
  check_defined(op, self, "self");
  check_pair(op, "output_size", output_size);
  Args a = check_args(op, kernel_size, dilation, padding, stride);
  KILN_CHECK(output_size[0] > 0 && output_size[1] > 0, "[{}] output_size must be positive, got {}",
             op, output_size);
  const int64_t nd = self.dim();
  KILN_CHECK((nd == 2 && self.numel() > 0) || (nd == 3 && self.size(1) > 0 && self.size(2) > 0),
             "[{}] expected a 2-D or 3-D (batch mode) input with non-zero dims but for the "
             "batch, got sizes {}",
             op, self.sizes());
  check_float(op, self);
  const int64_t rows = self.size(-2), L = self.size(-1), kk = a.kh * a.kw;
  KILN_CHECK(rows % kk == 0,
             "[{}] expected the input's dim {} to be divisible by the product of kernel_size, "
             "but got {} and kernel_size={}",
             op, nd - 2, rows, kernel_size);
  auto [bh, bw] =
      check_blocks(op, output_size[0], output_size[1], a, kernel_size, dilation, padding, stride);
  KILN_CHECK(L == bh * bw,
             "[{}] given output_size={}, kernel_size={}, dilation={}, padding={}, stride={}, "
             "expected the input's dim {} to be the number of sliding blocks {} * {} = {}, got {}",
             op, output_size, kernel_size, dilation, padding, stride, nd - 1, bh, bw, bh * bw, L);
  Shape out;
  if (nd == 3) out.push_back(self.size(0));
  out.push_back(rows / kk);
  out.push_back(output_size[0]);
  out.push_back(output_size[1]);
  return {out, self.dtype(), self.device()};
}

}  // namespace meta

namespace detail {
namespace {
FoldDims dims(int64_t C, int64_t H, int64_t W, IntArrayRef k, IntArrayRef d, IntArrayRef p,
              IntArrayRef s) {
  FoldDims g;
  g.C = C;
  g.H = H;
  g.W = W;
  g.kh = k[0];
  g.kw = k[1];
  g.dh = d[0];
  g.dw = d[1];
  g.ph = p[0];
  g.pw = p[1];
  g.sh = s[0];
  g.sw = s[1];
  g.bh = (H + 2 * g.ph - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.bw = (W + 2 * g.pw - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  return g;
}
}  // namespace

FoldGeom im2col_geom(const Tensor& self, IntArrayRef kernel_size, IntArrayRef dilation,
                     IntArrayRef padding, IntArrayRef stride) {
  FoldGeom g;
  g.N = self.dim() == 4 ? self.size(0) : 1;
  g.d = dims(self.size(-3), self.size(-2), self.size(-1), kernel_size, dilation, padding, stride);
  return g;
}
FoldGeom col2im_geom(const Tensor& self, IntArrayRef output_size, IntArrayRef kernel_size,
                     IntArrayRef dilation, IntArrayRef padding, IntArrayRef stride) {
  FoldGeom g;
  g.N = self.dim() == 3 ? self.size(0) : 1;
  g.d = dims(self.size(-2) / (kernel_size[0] * kernel_size[1]), output_size[0], output_size[1],
             kernel_size, dilation, padding, stride);
  return g;
}

}  // namespace detail

namespace {
Tensor meta_im2col(const Tensor& self, IntArrayRef k, IntArrayRef d, IntArrayRef p, IntArrayRef s) {
  TensorSpec spec = meta::im2col(self, k, d, p, s);
  return detail::empty_tensor(spec.sizes, spec.dtype, Device(kMeta));
}
Tensor meta_col2im(const Tensor& self, IntArrayRef out, IntArrayRef k, IntArrayRef d, IntArrayRef p,
                   IntArrayRef s) {
  TensorSpec spec = meta::col2im(self, out, k, d, p, s);
  return detail::empty_tensor(spec.sizes, spec.dtype, Device(kMeta));
}

template <class Sig>
void reg(TypedOp<Sig>& op, Sig* fn) {
  op.def.set_meta_raw(reinterpret_cast<void*>(fn));
  op.set_kernel(DispatchKey::Meta, fn);
}
const bool registered = [] {
  reg(ops::op_im2col, &meta_im2col);
  reg(ops::op_col2im, &meta_col2im);
  return true;
}();
}  // namespace

}  // namespace kiln
