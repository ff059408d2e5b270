// CUDA convolutions (kiln/backend/cuda/conv.cpp and conv_graph.cpp) against the CPU in float64:
// forward and the three gradients over 1-D, 2-D and 3-D geometries with stride, padding,
// dilation and groups, in float64, float32 (with and without TF32) and bfloat16. Whichever
// cuDNN path the search picks for a key (a legacy algorithm or a graph-API engine, Note [cuDNN
// graph convolutions]) must give these results; the second call of each key replays the choice.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "kiln/ops/conv.h"
#include "kiln/ops/ops.h"
#include "tests/backend/cuda_util.h"

namespace kiln::test {
namespace {

struct ConvCase {
  const char* name;
  int nd;
  int64_t n, ci, co, size, k, stride, pad, dil, groups;
};

const ConvCase kCases[] = {
    {"3x3", 2, 2, 8, 16, 9, 3, 1, 1, 1, 1},
    {"3x3_stride2", 2, 2, 16, 32, 14, 3, 2, 1, 1, 1},
    {"1x1", 2, 2, 8, 8, 10, 1, 1, 0, 1, 1},
    {"dilated_grouped", 2, 2, 8, 16, 11, 3, 1, 2, 2, 2},
    {"depthwise", 2, 2, 8, 8, 9, 3, 1, 1, 1, 8},
    {"1d", 1, 2, 4, 6, 20, 5, 1, 2, 1, 1},
    {"3d", 3, 1, 4, 6, 6, 3, 1, 1, 1, 1},
};

Tensor draw(std::vector<int64_t> sizes, uint64_t seed) {
  Generator g(seed);
  return rand(sizes, &g, kFloat64) * 2.0 - 1.0;
}

// The largest difference from `want`, relative to want's largest magnitude (at least 1).
double max_rel_error(const Tensor& got, const Tensor& want) {
  std::vector<double> g = got.to(Device(kCPU)).to(kFloat64).contiguous().to_vector<double>();
  std::vector<double> w = want.contiguous().to_vector<double>();
  double scale = 1, err = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < g.size(); ++i) err = std::max(err, std::abs(g[i] - w[i]));
  return err / scale;
}

struct Grads {
  Tensor y, gx, gw, gb;
};

Grads run(const ConvCase& c, const Tensor& x64, const Tensor& w64, const Tensor& b64,
          const Tensor& gy64, DType dt, Device dev) {
  // detach(): for float64 on the cpu, to() returns the input itself, which must stay a plain leaf.
  Tensor x = x64.to(dt).to(dev).detach().requires_grad_();
  Tensor w = w64.to(dt).to(dev).detach().requires_grad_();
  Tensor b = b64.to(dt).to(dev).detach().requires_grad_();
  std::vector<int64_t> stride(static_cast<size_t>(c.nd), c.stride),
      pad(static_cast<size_t>(c.nd), c.pad), dil(static_cast<size_t>(c.nd), c.dil),
      out_pad(static_cast<size_t>(c.nd), 0);
  Tensor y = convolution(x, w, b, stride, pad, dil, false, out_pad, c.groups);
  y.backward(gy64.to(dt).to(dev));
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

TEST(CudaConvolution, EveryPassMatchesTheCpuInFloat64) {
  if (!cuda_unavailable().empty()) GTEST_SKIP() << cuda_unavailable();
  const Device gpu("cuda:0");
  struct Precision {
    DType dtype;
    bool tf32;
    double tol;
  };
  const Precision precisions[] = {{kFloat64, false, 1e-10},
                                  {kFloat32, false, 1e-4},
                                  {kFloat32, true, 1e-2},
                                  {kBFloat16, false, 4e-2}};
  const bool tf32_before = allow_tf32();
  for (const ConvCase& c : kCases) {
    std::vector<int64_t> xs{c.n, c.ci}, ws{c.co, c.ci / c.groups};
    for (int i = 0; i < c.nd; ++i) {
      xs.push_back(c.size);
      ws.push_back(c.k);
    }
    Tensor x = draw(xs, 1), w = draw(ws, 2), b = draw({c.co}, 3);
    std::vector<int64_t> st(static_cast<size_t>(c.nd), c.stride),
        pd(static_cast<size_t>(c.nd), c.pad), dl(static_cast<size_t>(c.nd), c.dil),
        op(static_cast<size_t>(c.nd), 0);
    Tensor y_shape = convolution(x, w, b, st, pd, dl, false, op, c.groups);
    Tensor gy = draw(std::vector<int64_t>(y_shape.sizes().begin(), y_shape.sizes().end()), 4);
    Grads want = run(c, x, w, b, gy, kFloat64, Device(kCPU));
    for (const Precision& p : precisions) {
      set_allow_tf32(p.tf32);
      for (int call = 0; call < 2; ++call) {  // the search, then the cached choice
        Grads got = run(c, x, w, b, gy, p.dtype, gpu);
        const std::string what =
            fmt::format("{} {}{} call {}", c.name, p.dtype, p.tf32 ? " tf32" : "", call);
        EXPECT_LE(max_rel_error(got.y, want.y), p.tol) << what << ": y";
        EXPECT_LE(max_rel_error(got.gx, want.gx), p.tol) << what << ": grad x";
        EXPECT_LE(max_rel_error(got.gw, want.gw), p.tol) << what << ": grad w";
        EXPECT_LE(max_rel_error(got.gb, want.gb), p.tol) << what << ": grad b";
      }
    }
  }
  set_allow_tf32(tf32_before);
}

}  // namespace
}  // namespace kiln::test
