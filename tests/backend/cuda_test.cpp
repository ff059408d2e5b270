// The CUDA backend (kiln/backend/cuda): every op has a CUDA kernel (each op's values on CUDA,
// in every dtype of its record, are checked against ATen by the op table's OpCuda run, Note
// [The op table on CUDA] in tests/ops/op_test.cpp), gradients through the CUDA kernels, a training
// step, the allocator, streams and events, kernel-reported errors, and compile's CUDA graphs
// against eager. Every test skips when no CUDA device (or no driver) is present, as in CI.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <unistd.h>

#include "kiln/backend/backend.h"
#include "kiln/backend/cuda/cuda.h"
#include "kiln/compile/compile.h"
#include "kiln/core/stream.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "tests/backend/cuda_util.h"

namespace kiln::test {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!cuda_unavailable().empty()) GTEST_SKIP() << cuda_unavailable()

Device gpu() { return Device("cuda:0"); }

// Tolerances per result dtype: CUDA's math functions and summation order differ from the CPU's.
std::pair<double, double> tol(DType d, bool accum) {
  switch (d) {
    case DType::Float64:
      return {1e-10, 1e-10};
    case DType::Float32:
      return accum ? std::pair{2e-4, 2e-5} : std::pair{2e-6, 1e-5};
    case DType::Float16:
      return {4e-3, 1e-3};
    case DType::BFloat16:
      return {2e-2, 1e-2};
    default:
      return {0, 0};
  }
}

testing::AssertionResult close(const Tensor& got, const Tensor& want, bool accum) {
  if (got.device() != gpu())
    return testing::AssertionFailure() << "result is on " << got.device().str();
  if (got.dtype() != want.dtype())
    return testing::AssertionFailure() << fmt::format("dtype {} vs {}", got.dtype(), want.dtype());
  if (!std::ranges::equal(got.sizes(), want.sizes()))
    return testing::AssertionFailure() << "sizes differ";
  std::vector<double> g = got.to(Device(kCPU)).to(kFloat64).contiguous().to_vector<double>();
  std::vector<double> w = want.to(kFloat64).contiguous().to_vector<double>();
  auto [rtol, atol] = tol(want.dtype(), accum);
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (std::abs(g[i] - w[i]) > atol + rtol * std::abs(w[i]))
      return testing::AssertionFailure()
             << "element " << i << ": cuda " << g[i] << ", cpu " << w[i];
  }
  return testing::AssertionSuccess();
}

Tensor draw(IntArrayRef sizes, DType d, Device dev, uint64_t seed, double lo = -2, double hi = 2) {
  Generator g(seed);
  Tensor t = rand(sizes, &g, kFloat64) * (hi - lo) + lo;
  return t.to(d).to(dev);
}

// Every op has a CUDA kernel of its own (views share one kernel on every backend).
TEST(CudaOps, EveryOpHasACudaKernel) {
  SKIP_WITHOUT_CUDA();
  std::vector<std::string> missing;
  for (OpDef* op : ops::all_ops())
    if (!op->has_kernel(DispatchKey::CUDA)) missing.emplace_back(op->name());
  EXPECT_TRUE(missing.empty()) << fmt::format("{}", fmt::join(missing, ", "));
}

TEST(CudaOps, RandomDrawsHaveTheRightDistribution) {
  SKIP_WITHOUT_CUDA();
  manual_seed(1);
  Tensor u = rand({100000}, nullptr, kFloat32, gpu()),
         n = randn({100000}, nullptr, kFloat32, gpu());
  EXPECT_NEAR(mean(u).item<double>(), 0.5, 0.01);
  EXPECT_NEAR(mean(n).item<double>(), 0.0, 0.02);
  EXPECT_NEAR(var(n).item<double>(), 1.0, 0.02);
  Tensor u2 = rand({100000}, nullptr, kFloat32, gpu());
  EXPECT_FALSE(equal(u.to(Device(kCPU)), u2.to(Device(kCPU))));  // the offset advanced
  manual_seed(1);
  EXPECT_TRUE(equal(u.to(Device(kCPU)), rand({100000}, nullptr, kFloat32, gpu()).to(Device(kCPU))));
  auto [out, mask] = ops::op_native_dropout(ones({10000}, kFloat32, gpu()), 0.25, nullptr);
  EXPECT_NEAR(mean(mask.to(kFloat32)).item<double>(), 0.75, 0.02);
}

TEST(CudaErrors, BadInputRaisesBeforeAnythingIsWritten) {
  SKIP_WITHOUT_CUDA();
  Tensor a = ones({4, 3}, kFloat32, gpu()), b = ones({5, 2}, kFloat32, gpu());
  try {
    mm(a, b);
    FAIL() << "mm of mismatched sizes did not raise";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[mm]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(add(a, ones({4, 3})), DeviceError);  // a cuda and a cpu tensor
  Tensor out = zeros({4, 3}, kFloat32, gpu());
  EXPECT_THROW(add_out(out, a, ones({4, 5}, kFloat32, gpu())), ValueError);
  EXPECT_EQ(sum(out).item<float>(), 0.0f);
}

TEST(CudaErrors, AnIndexOutOfRangeOnTheDeviceIsReportedAtTheNextSync) {
  SKIP_WITHOUT_CUDA();
  Tensor w = ones({4, 2}, kFloat32, gpu());
  Tensor idx = from_vector<int64_t>({0, 7}).to(gpu());
  Tensor e = embedding(w, idx);  // queued: the kernel finds index 7
  try {
    synchronize(gpu());
    FAIL() << "no error after an out-of-range index";
  } catch (const IndexError& err) {
    EXPECT_NE(std::string(err.what()).find("[embedding]"), std::string::npos) << err.what();
  }
  synchronize(gpu());  // reported once
}

// Max-pool backward checks its indices as the CPU kernel does: one outside its input plane is
// reported by the device (the gathering kernel alone would drop its gradient without a word).
TEST(CudaErrors, MaxPoolBackwardReportsAnIndexOutsideItsPlane) {
  SKIP_WITHOUT_CUDA();
  for (const bool three_d : {false, true}) {
    const std::string op =
        three_d ? "[max_pool3d_with_indices_backward]" : "[max_pool2d_with_indices_backward]";
    Tensor x = ones(three_d ? Shape{1, 2, 4, 4, 4} : Shape{1, 2, 4, 4}, kFloat32, gpu());
    Tensor gy = ones(three_d ? Shape{1, 2, 2, 2, 2} : Shape{1, 2, 2, 2}, kFloat32, gpu());
    const int64_t plane = three_d ? 64 : 16;
    Tensor idx = full(gy.sizes(), static_cast<double>(plane), kInt64, gpu());
    Tensor gx = three_d ? max_pool3d_with_indices_backward(gy, x, {2}, {}, {0}, {1}, false, idx)
                        : max_pool2d_with_indices_backward(gy, x, {2}, {}, {0}, {1}, false, idx);
    try {
      synchronize(gpu());
      ADD_FAILURE() << "no error for index " << plane << " in a plane of " << plane;
    } catch (const IndexError& err) {
      EXPECT_NE(std::string(err.what()).find(op), std::string::npos) << err.what();
    }
    synchronize(gpu());  // reported once
  }
}

TEST(CudaErrors, OutOfMemorySaysWhatIsHeld) {
  SKIP_WITHOUT_CUDA();
  try {
    empty({int64_t{1} << 45}, kUInt8, gpu());  // 32 TiB
    FAIL() << "no out-of-memory error";
  } catch (const DeviceError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved"), std::string::npos) << m;
  }
  EXPECT_EQ(sum(ones({2}, kFloat32, gpu())).item<float>(), 2.0f);  // still usable
}

TEST(CudaAllocator, ReusesFreedBlocksAndCountsThem) {
  SKIP_WITHOUT_CUDA();
  synchronize(gpu());
  cuda::MemoryStats before = cuda::memory_stats(0);
  for (int i = 0; i < 100; ++i) {
    Tensor t = empty({1000, 1000}, kFloat32, gpu());
    (void)t;
  }
  cuda::MemoryStats after = cuda::memory_stats(0);
  EXPECT_LE(after.cuda_mallocs - before.cuda_mallocs, 1);
  EXPECT_GE(after.cache_hits - before.cache_hits, 99);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_GE(after.peak_allocated, before.allocated + 4000000);
  cuda::empty_cache(0);
  EXPECT_LE(cuda::memory_stats(0).reserved, after.reserved);
  // The same counts behind the backend interface (kiln::memory_stats), and a new peak.
  const cuda::MemoryStats now = cuda::memory_stats(0);
  const DeviceMemoryStats seen = memory_stats(gpu());
  EXPECT_EQ(seen.allocated, now.allocated);
  EXPECT_EQ(seen.reserved, now.reserved);
  EXPECT_EQ(seen.peak_allocated, now.peak_allocated);
  reset_peak_memory(gpu());
  EXPECT_EQ(memory_stats(gpu()).peak_allocated, now.allocated);
}

TEST(CudaStreams, EventsOrderTwoStreams) {
  SKIP_WITHOUT_CUDA();
  Stream side = Stream::create(gpu());
  Tensor x = ones({1 << 20}, kFloat32, gpu());
  Event ready(gpu());
  ready.record();
  Tensor y;
  {
    StreamGuard g(side);
    ready.wait(side);
    y = mul(x, 3.0);
  }
  Event done(gpu());
  done.record(side);
  done.synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_EQ(sum(y).item<double>(), 3.0 * (1 << 20));
}

// Note [Timing cuDNN plans]: a held stream runs nothing queued behind it until the hold is over.
TEST(CudaStreams, AHeldStreamRunsNothingBeforeTheHoldEnds) {
  SKIP_WITHOUT_CUDA();
  Tensor x = ones({1024}, kFloat32, gpu());
  synchronize(gpu());
  const auto start = std::chrono::steady_clock::now();
  cuda::hold_current_stream(0, 200'000'000);  // 200 ms
  Tensor y = mul(x, 2.0);
  Event done(gpu());
  done.record();
  EXPECT_FALSE(done.query());  // queued behind the hold
  done.synchronize();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  EXPECT_EQ(sum(y).item<double>(), 2048.0);
}

// Note [cuBLASLt workspaces]: products on two streams at once each use their own workspace
// (split-K products of a long inner dim write it), and a made stream's goes with the stream.
TEST(CudaStreams, ProductsOnTwoStreamsUseTheirOwnWorkspaces) {
  SKIP_WITHOUT_CUDA();
  Tensor a = draw({64, 16384}, kFloat32, gpu(), 60), b = draw({16384, 64}, kFloat32, gpu(), 61);
  Tensor c = draw({64, 16384}, kFloat32, gpu(), 62);
  Tensor want_ab = mm(a, b), want_cb = mm(c, b);
  int64_t before = cuda::lt_workspace_count(0);
  {
    Stream s1 = Stream::create(gpu()), s2 = Stream::create(gpu());
    synchronize(gpu());
    TensorList ab, cb;
    for (int i = 0; i < 20; ++i) {
      {
        StreamGuard g(s1);
        ab.push_back(mm(a, b));
      }
      StreamGuard g(s2);
      cb.push_back(mm(c, b));
    }
    s1.synchronize();
    s2.synchronize();
    EXPECT_EQ(cuda::lt_workspace_count(0), before + 2);
    for (int i = 0; i < 20; ++i) {
      EXPECT_TRUE(allclose(ab[i], want_ab, 1e-5, 1e-3)) << i;
      EXPECT_TRUE(allclose(cb[i], want_cb, 1e-5, 1e-3)) << i;
    }
  }
  EXPECT_EQ(cuda::lt_workspace_count(0), before);
}

TEST(CudaStreams, PoolHandsOutItsStreamsRoundRobin) {
  SKIP_WITHOUT_CUDA();
  std::set<uint64_t> ids;
  for (int i = 0; i < 2 * cuda::kStreamPoolSize; ++i) ids.insert(cuda::stream_from_pool(0).id());
  EXPECT_EQ(ids.size(), size_t{cuda::kStreamPoolSize});
  EXPECT_FALSE(ids.count(Stream::default_stream(gpu()).id()));
  Stream s = cuda::stream_from_pool(0);
  Tensor y;
  {
    StreamGuard g(s);
    y = mul(ones({1000}, kFloat32, gpu()), 2.0);
  }
  s.synchronize();
  EXPECT_EQ(sum(y).item<double>(), 2000.0);
  EXPECT_THROW(cuda::stream_from_pool(cuda::device_count()), DeviceError);
}

TEST(CudaDevice, PropertiesDescribeTheGpu) {
  SKIP_WITHOUT_CUDA();
  cuda::DeviceProperties p = cuda::device_properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GE(p.major, 7);
  EXPECT_GT(p.multiprocessors, 0);
  EXPECT_GT(p.total_memory, size_t{1} << 30);
  EXPECT_GE(p.shared_memory_per_block, size_t{48} << 10);
  EXPECT_EQ(p.warp_size, 32);
  RecordProperty("gpu", fmt::format("{} sm_{}{} {} SMs {} GiB", p.name, p.major, p.minor,
                                    p.multiprocessors, p.total_memory >> 30));
  EXPECT_THROW(cuda::device_properties(cuda::device_count()), DeviceError);
}

TEST(CudaAllocator, RecordStreamHoldsABlockUntilTheOtherStreamIsDone) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kN = int64_t{3} << 20;  // 12 MiB: a large-pool segment of its own
  const void* first = nullptr;
  {  // freed and allocated again on one stream, a block is reused at once
    Tensor x = empty({kN}, kFloat32, gpu());
    first = x.impl()->data();
  }
  {
    Tensor y = empty({kN}, kFloat32, gpu());
    EXPECT_EQ(y.impl()->data(), first);
  }
  Stream side = Stream::create(gpu());
  Tensor x = zeros({kN}, kFloat32, gpu());
  const void* xp = x.impl()->data();
  Event ready(gpu());
  ready.record();
  {
    StreamGuard g(side);
    ready.wait(side);
    cuda::hold_current_stream(0, 50'000'000);  // 50 ms, allocating nothing
    Tensor use = add(x, 1.0);                  // the side stream reads x after the hold
  }
  cuda::record_stream(x, side);
  x = Tensor();
  Tensor y = empty({kN}, kFloat32, gpu());
  EXPECT_NE(y.impl()->data(), xp) << "reused while the side stream may still read it";
  side.synchronize();
  Tensor z = empty({kN}, kFloat32, gpu());
  EXPECT_EQ(z.impl()->data(), xp) << "not reused once the side stream is done";
  EXPECT_THROW(cuda::record_stream(ones({2}), side), DeviceError);
  EXPECT_THROW(cuda::record_stream(z, Stream::default_stream(Device(kCPU))), DeviceError);
}

TEST(CudaHost, PinnedCopiesRunWithoutTheHostWaiting) {
  SKIP_WITHOUT_CUDA();
  constexpr int64_t kN = int64_t{1} << 20;
  Tensor src = arange(0, kN, 1, kFloat32);
  Tensor p = cuda::pin_memory(src);
  EXPECT_TRUE(cuda::is_pinned(p));
  EXPECT_FALSE(cuda::is_pinned(src));
  EXPECT_EQ(p.device(), Device(kCPU));
  Tensor d = empty({kN}, kFloat32, gpu());
  cuda::copy_async(d, p);
  Tensor back = cuda::pin_memory(zeros({kN}, kFloat32));
  cuda::copy_async(back, mul(d, 2.0));
  Stream::current(gpu()).synchronize();
  EXPECT_EQ(sum(back).item<double>(), 2 * sum(src).item<double>());
  // A freed pinned block is cached, and reused once its copies are done.
  const void* bp = back.impl()->data();
  back = Tensor();
  Tensor again = cuda::pin_memory(zeros({kN}, kFloat32));
  EXPECT_EQ(again.impl()->data(), bp);
  EXPECT_THROW(cuda::copy_async(d, src), DeviceError);  // not pinned
  EXPECT_THROW(cuda::copy_async(empty({kN}, kFloat16, gpu()), p), TypeError);
  EXPECT_THROW(cuda::copy_async(empty({10}, kFloat32, gpu()), p), ValueError);
  EXPECT_THROW(cuda::pin_memory(d), DeviceError);
  EXPECT_EQ(sum(d).item<double>(), sum(src).item<double>());  // nothing written by the errors
}

TEST(CudaAutograd, GradientsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  auto grads = [](Device d) {
    Generator g(3);
    nn::Init init{.gen = &g};
    nn::GPT model(nn::GPTConfig::tiny(64), init);
    model.to(d);
    Generator gi(4);
    Tensor idx = randint(0, 64, {2, 16}, &gi).to(d), tgt = randint(0, 64, {2, 16}, &gi).to(d);
    Tensor loss = model.loss(idx, tgt);
    loss.backward();
    TensorList out = {loss};
    for (const Tensor& p : model.parameters()) out.push_back(p.grad());
    return out;
  };
  TensorList want = grads(Device(kCPU)), got = grads(gpu());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(close(got[i], want[i], true)) << i;
}

// Note [Fused attention]: the CUDA kernels against the CPU's (float64, a reference summed in
// double), for each kind of product (exact float32 FMAs, TF32, float16 and bfloat16 on tensor
// cores), head dims 7 to 128, causal or not, lengths that are not multiples of the 64-row
// tiles, fewer or more queries than keys, and inputs that are transposed views; float64 and a
// head dim of 160, which the kernels do not take, through flash_attention_math.
struct AttnCase {
  std::vector<int64_t> q, k;  // [B, H, T, E] (or [N, T, E])
  bool causal;
  bool transposed;  // q, k, v made as [B, T, H, E] and transposed to [B, H, T, E]
};
Tensor attn_input(const std::vector<int64_t>& shape, bool transposed, uint64_t seed) {
  if (!transposed) return draw(shape, kFloat64, Device(kCPU), seed, -1.5, 1.5);
  std::vector<int64_t> bthe = {shape[0], shape[2], shape[1], shape[3]};
  return transpose(draw(bthe, kFloat64, Device(kCPU), seed, -1.5, 1.5), 1, 2);
}
// max |got - want| <= tol * max(1, max |want|)
testing::AssertionResult near(const Tensor& got, const Tensor& want, double tol) {
  std::vector<double> g = got.to(Device(kCPU)).to(kFloat64).contiguous().to_vector<double>();
  std::vector<double> w = want.to(kFloat64).contiguous().to_vector<double>();
  if (g.size() != w.size()) return testing::AssertionFailure() << "sizes differ";
  double worst = 0, scale = 1;
  size_t at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    scale = std::max(scale, std::abs(w[i]));
    double d = std::isfinite(g[i]) ? std::abs(g[i] - w[i]) : INFINITY;
    if (d > worst) worst = d, at = i;
  }
  if (worst <= tol * scale) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "element " << at << ": cuda " << g[at] << ", cpu " << w[at]
                                     << " (max |want| " << scale << ")";
}

// Note [GELU epilogue]: the gradients of a linear layer with GELU, through the fused epilogue
// (float16: its saved preactivation) and the unfused path (float32), equal the CPU's.
TEST(CudaAutograd, LinearGeluGradientsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  auto grads = [](Device d, DType t) {
    Tensor x = draw({2, 7, 32}, t, d, 50).requires_grad_();
    Tensor w = draw({48, 32}, t, d, 51).requires_grad_();
    Tensor b = draw({48}, t, d, 52).requires_grad_();
    Tensor y = linear_gelu(x, w, b);
    sum(mul(y, draw({2, 7, 48}, t, d, 53))).backward();
    return TensorList{y, x.grad(), w.grad(), b.grad()};
  };
  for (DType t : {kFloat16, kFloat32}) {
    TensorList want = grads(Device(kCPU), t), got = grads(gpu(), t);
    for (size_t i = 0; i < got.size(); ++i) {
      if (t == kFloat32) {
        EXPECT_TRUE(close(got[i], want[i], true)) << i;
      } else {
        EXPECT_TRUE(near(got[i], want[i], 1e-2)) << i;
      }
    }
  }
}

TEST(CudaAttention, FlashKernelsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  const std::vector<AttnCase> cases = {
      {{2, 3, 100, 64}, {2, 3, 100, 64}, true, false},
      {{1, 2, 130, 32}, {1, 2, 70, 32}, false, false},
      {{1, 2, 70, 80}, {1, 2, 150, 80}, true, false},
      {{1, 1, 150, 128}, {1, 1, 90, 128}, true, false},
      {{2, 2, 65, 48}, {2, 2, 65, 48}, true, true},
      {{3, 64, 16}, {3, 64, 16}, false, false},
      {{2, 1, 40, 7}, {2, 1, 50, 7}, true, false},      // rows of 7: element by element loads
      {{1, 2, 40, 160}, {1, 2, 30, 160}, true, false},  // over 128: flash_attention_math
  };
  struct Mode {
    DType dtype;
    bool tf32;
    double tol;
  };
  const std::vector<Mode> modes = {{kFloat32, false, 2e-4},
                                   {kFloat32, true, 1.5e-2},
                                   {kFloat16, false, 1.5e-2},
                                   {kBFloat16, false, 5e-2},
                                   {kFloat64, false, 1e-10}};  // flash_attention_math
  for (const AttnCase& c : cases) {
    for (const Mode& m : modes) {
      for (bool det : {false, true}) {
        SCOPED_TRACE(fmt::format("q {} k {} causal {} transposed {} {} tf32 {} deterministic {}",
                                 fmt::join(c.q, ","), fmt::join(c.k, ","), c.causal, c.transposed,
                                 m.dtype, m.tf32, det));
        std::vector<int64_t> vshape = c.k;
        Tensor q = attn_input(c.q, c.transposed, 1).to(m.dtype);
        Tensor k = attn_input(c.k, c.transposed, 2).to(m.dtype);
        Tensor v = attn_input(vshape, c.transposed, 3).to(m.dtype);
        Tensor g = draw(c.q, kFloat64, Device(kCPU), 4).to(m.dtype);
        set_allow_tf32(m.tf32);
        set_deterministic_algorithms(det);
        auto [out, lse] = flash_attention(q.to(gpu()), k.to(gpu()), v.to(gpu()), c.causal);
        auto [dq, dk, dv] = flash_attention_backward(g.to(gpu()), q.to(gpu()), k.to(gpu()),
                                                     v.to(gpu()), out, lse, c.causal);
        if (det) {  // the same bits again
          auto [dq2, dk2, dv2] = flash_attention_backward(g.to(gpu()), q.to(gpu()), k.to(gpu()),
                                                          v.to(gpu()), out, lse, c.causal);
          EXPECT_TRUE(equal(dq2, dq) && equal(dk2, dk) && equal(dv2, dv));
        }
        set_deterministic_algorithms(false);
        set_allow_tf32(false);
        Tensor q64 = q.to(kFloat64), k64 = k.to(kFloat64), v64 = v.to(kFloat64);
        auto [want_out, want_lse] = flash_attention(q64, k64, v64, c.causal);
        // The backward from the output CUDA gave (as autograd would hand it over).
        auto [wq, wk, wv] = flash_attention_backward(
            g.to(kFloat64), q64, k64, v64, out.to(Device(kCPU)).to(kFloat64), want_lse, c.causal);
        EXPECT_EQ(out.dtype(), m.dtype);
        EXPECT_EQ(lse.dtype(), m.dtype == kFloat64 ? kFloat64 : kFloat32);
        EXPECT_TRUE(near(out, want_out, m.tol)) << "out";
        EXPECT_TRUE(near(lse, want_lse, m.tol)) << "logsumexp";
        EXPECT_TRUE(near(dq, wq, m.tol)) << "dq";
        EXPECT_TRUE(near(dk, wk, m.tol)) << "dk";
        EXPECT_TRUE(near(dv, wv, m.tol)) << "dv";
      }
    }
  }
}

// Note [cuDNN fused attention]: cuDNN's engines take the 16-bit calls that fit them (compute
// capability 8.0 and later), agree with Kiln's kernels, and either forward pairs with either
// backward: both give the natural-log logsumexp of the scaled scores.
TEST(CudaAttention, CudnnAndKilnKernelsAgreeAndPair) {
  SKIP_WITHOUT_CUDA();
  const bool cudnn_expected = cuda::device_properties(0).major >= 8;
  struct Run {
    Tensor out, lse, dq, dk, dv;
  };
  for (DType t : {kBFloat16, kFloat16}) {
    for (bool causal : {false, true}) {
      for (bool transposed : {false, true}) {
        SCOPED_TRACE(fmt::format("{} causal {} transposed {}", t, causal, transposed));
        // Transposed: [B, T, H, E] on the device viewed as [B, H, T, E], as a GPT's heads are.
        auto input = [&](std::vector<int64_t> shape, uint64_t seed) {
          if (!transposed) return attn_input(shape, false, seed).to(t).to(gpu());
          std::swap(shape[1], shape[2]);
          return transpose(draw(shape, kFloat64, Device(kCPU), seed, -1.5, 1.5).to(t).to(gpu()), 1,
                           2);
        };
        Tensor q = input({2, 4, 192, 64}, 11), k = input({2, 4, 256, 64}, 12),
               v = input({2, 4, 256, 64}, 13);
        Tensor g = draw({2, 4, 192, 64}, t, gpu(), 14);
        auto run = [&](bool cudnn_forward, bool cudnn_backward, const Run* from = nullptr) {
          Run r;
          cuda::set_cudnn_attention(cudnn_forward);
          std::tie(r.out, r.lse) = flash_attention(q, k, v, causal);
          cuda::set_cudnn_attention(cudnn_backward);
          const Run& fwd = from ? *from : r;
          std::tie(r.dq, r.dk, r.dv) =
              flash_attention_backward(g, q, k, v, fwd.out, fwd.lse, causal);
          cuda::set_cudnn_attention(true);
          return r;
        };
        int64_t before = cuda::cudnn_attention_runs();
        Run cudnn = run(true, true);
        if (cudnn_expected) {
          EXPECT_EQ(cuda::cudnn_attention_runs() - before, 2);
        }
        Run kiln = run(false, false);
        Run kiln_after_cudnn = run(false, false, &cudnn);
        Run cudnn_after_kiln = run(true, true, &kiln);
        // Note [Attention outputs in their input's layout]: cuDNN's outputs follow the inputs'
        // memory order; Kiln's kernels write packed ones.
        for (const Tensor* x : {&cudnn.out, &cudnn.dq, &cudnn.dk, &cudnn.dv}) {
          if (cudnn_expected) {
            EXPECT_TRUE(transposed ? transpose(*x, 1, 2).is_contiguous() : x->is_contiguous());
          }
        }
        for (const Tensor* x : {&kiln.out, &kiln.dq, &kiln.dk, &kiln.dv})
          EXPECT_TRUE(x->is_contiguous());
        auto cpu = [](const Tensor& x) { return x.to(Device(kCPU)); };
        const double tol = t == kBFloat16 ? 5e-2 : 1.5e-2;
        EXPECT_TRUE(near(cudnn.out, cpu(kiln.out), tol)) << "out";
        EXPECT_TRUE(near(cudnn.lse, cpu(kiln.lse), tol)) << "logsumexp";
        for (const auto& [a, b] : {std::pair{&cudnn, &kiln}, std::pair{&kiln_after_cudnn, &cudnn},
                                   std::pair{&cudnn_after_kiln, &kiln}}) {
          EXPECT_TRUE(near(a->dq, cpu(b->dq), tol)) << "dq";
          EXPECT_TRUE(near(a->dk, cpu(b->dk), tol)) << "dk";
          EXPECT_TRUE(near(a->dv, cpu(b->dv), tol)) << "dv";
        }
      }
    }
  }
}

TEST(CudaAttention, SdpaTakesTheFusedKernelsAndItsGradientsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  auto run = [](Device d, DType t) {
    Tensor q = draw({2, 4, 33, 16}, t, d, 5).requires_grad_();
    Tensor k = draw({2, 4, 33, 16}, t, d, 6).requires_grad_();
    Tensor v = draw({2, 4, 33, 16}, t, d, 7).requires_grad_();
    Tensor y = scaled_dot_product_attention(q, k, v, {}, true);
    std::string fn = y.grad_fn_name();
    sum(mul(y, y)).backward();
    return std::make_pair(fn, TensorList{y, q.grad(), k.grad(), v.grad()});
  };
  auto [cpu_fn, want] = run(Device(kCPU), kFloat32);
  auto [gpu_fn, got] = run(gpu(), kFloat32);
  EXPECT_EQ(gpu_fn, "FlashAttentionBackward");
  EXPECT_NE(cpu_fn, "FlashAttentionBackward");
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(close(got[i], want[i], true)) << i;
  // float64 and head dims over 128 keep the math path on CUDA (flash_attention itself takes
  // them through flash_attention_math: FlashKernelsMatchTheCpu).
  auto [f64_fn, f64] = run(gpu(), kFloat64);
  EXPECT_NE(f64_fn, "FlashAttentionBackward");
  set_fused_attention(false);  // as torch.backends.cuda.enable_flash_sdp(False)
  auto [math_fn, math] = run(gpu(), kFloat32);
  set_fused_attention(true);
  EXPECT_NE(math_fn, "FlashAttentionBackward");
  for (size_t i = 0; i < math.size(); ++i) EXPECT_TRUE(close(math[i], want[i], true)) << i;
  Tensor wide = zeros({2, 5, 160}, kFloat32, gpu());
  EXPECT_NE(scaled_dot_product_attention(wide.requires_grad_(), wide, wide).grad_fn_name(),
            "FlashAttentionBackward");
}

TEST(CudaCompile, ChainCapturedIntoAGraphEqualsEager) {
  SKIP_WITHOUT_CUDA();
  auto chain = [](const Tensor& x0) {
    Tensor x = x0;
    for (int i = 0; i < 16; ++i) x = sub(relu(add(mul(x, 1.0001), 0.0001)), 0.00005);
    return x;
  };
  CompiledFunction f = compile(chain, {.name = "chain"});
  for (int i = 0; i < 5; ++i) {
    Tensor x = draw({4096}, kFloat32, gpu(), 80 + i);
    Tensor got = f({x})[0];
    EXPECT_TRUE(equal(got.to(Device(kCPU)), chain(x).to(Device(kCPU)))) << "call " << i;
  }
  EXPECT_GE(f.entries().at(0).captures, 1) << f.explain();
}

TEST(CudaCompile, TrainingStepCapturedEqualsEager) {
  SKIP_WITHOUT_CUDA();
  auto run = [](bool compiled) {
    Generator g(5);
    nn::Init init{.gen = &g};
    nn::Sequential model;
    model.push_back(std::make_shared<nn::Linear>(32, 64, true, init));
    model.push_back(std::make_shared<nn::GELU>());
    model.push_back(std::make_shared<nn::Linear>(64, 10, true, init));
    model.to(gpu());
    optim::AdamW opt(model.parameters(), {.lr = 1e-2});
    Tensor x = randn({16, 32}, &g).to(gpu()), y = randint(0, 10, {16}, &g).to(gpu());
    auto step = [&](const Tensor& xs, const Tensor& ys) {
      opt.zero_grad();
      Tensor loss = cross_entropy(model(xs), ys);
      loss.backward();
      opt.step();
      return loss.detach();
    };
    CompiledFunction cf = compile(step, {.name = "train_step"});
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i)
      losses.push_back((compiled ? cf({x, y})[0] : step(x, y)).item<double>());
    if (compiled) {
      EXPECT_GE(cf.entries().at(0).captures, 1) << cf.explain();
    }
    return losses;
  };
  std::vector<double> eager = run(false), compiled = run(true);
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_NEAR(compiled[i], eager[i], 1e-5) << i;
  EXPECT_LT(eager.back(), eager.front());
}

TEST(CudaCompile, RandomOpsDrawFreshNumbersEachReplay) {
  SKIP_WITHOUT_CUDA();
  CompiledFunction f =
      compile([](const Tensor& x) { return add(x, rand({256}, nullptr, kFloat32, x.device())); },
              {.name = "noise"});
  Tensor x = zeros({256}, kFloat32, gpu());
  std::vector<std::vector<float>> draws;
  for (int i = 0; i < 4; ++i) draws.push_back(f({x})[0].to_vector<float>());
  EXPECT_GE(f.entries().at(0).captures, 1) << f.explain();
  EXPECT_NE(draws[2], draws[3]);  // two replays of the captured graph
  Generator mine(7);
  CompiledFunction g =
      compile([&](const Tensor& y) { return add(y, rand({4}, &mine, kFloat32, y.device())); },
              {.name = "mine"});
  Tensor y = zeros({4}, kFloat32, gpu());
  try {
    for (int i = 0; i < 3; ++i) g({y});
    FAIL() << "a caller's generator was captured";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("rand"), std::string::npos) << e.what();
  }
}

TEST(CudaCompile, AHostReadInsideIsAnErrorNamingTheOp) {
  SKIP_WITHOUT_CUDA();
  auto fn = [](const Tensor& x) {
    double s = sum(x).item<double>();
    return mul(x, s);
  };
  CompiledFunction f = compile(fn, {.name = "reads"});
  Tensor x = ones({4}, kFloat32, gpu());
  try {
    f({x});
    f({x});
    FAIL() << "a host read was compiled";
  } catch (const CompileError& e) {
    EXPECT_NE(std::string(e.what()).find("sum"), std::string::npos) << e.what();
  }
}

// Note [Graph timelines] in kiln/backend/cuda/graph_timeline.cpp: a file per executable graph,
// a line per followed node after the replay's, each ending after it could start and before the
// replay ends; the stamps change no value; KILN_GRAPH_TIMELINE_MATCH keeps only named kernels.
TEST(CudaCompile, GraphTimelinesTimeTheNodesOfEachReplay) {
  SKIP_WITHOUT_CUDA();
  namespace fs = std::filesystem;
  auto chain = [](const Tensor& x0) {
    Tensor x = x0;
    for (int i = 0; i < 4; ++i) x = relu(add(mul(x, 1.5), 0.25));
    return x;
  };
  struct Line {
    std::string name;
    double could_start, ended, mean, least;
  };
  auto timeline = [&](const char* match) {
    const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("timeline_{}", getpid());
    fs::remove_all(dir);
    setenv("KILN_GRAPH_TIMELINE", dir.c_str(), 1);
    if (match) setenv("KILN_GRAPH_TIMELINE_MATCH", match, 1);
    {
      CompiledFunction f = compile(chain, {.name = "timed"});
      for (int i = 0; i < 6; ++i) {
        Tensor x = draw({4096}, kFloat32, gpu(), 90 + i);
        EXPECT_TRUE(equal(f({x})[0].to(Device(kCPU)), chain(x).to(Device(kCPU)))) << i;
      }
      EXPECT_GE(f.entries().at(0).captures, 1) << f.explain();
    }  // the executable graph is destroyed, and its timeline written
    unsetenv("KILN_GRAPH_TIMELINE");
    unsetenv("KILN_GRAPH_TIMELINE_MATCH");
    std::vector<fs::path> files;
    if (fs::is_directory(dir))
      for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
    EXPECT_EQ(files.size(), 1u);
    std::vector<Line> lines;
    if (files.empty()) return lines;
    std::ifstream in(files[0]);
    std::string text;
    std::getline(in, text);
    EXPECT_NE(text.find("replays"), std::string::npos) << text;
    std::getline(in, text);
    EXPECT_EQ(text, "name\tcould_start_us\tended_us\tmean_us\tleast_us");
    while (std::getline(in, text)) {
      Line l;
      std::istringstream fields(text);
      std::getline(fields, l.name, '\t');
      fields >> l.could_start >> l.ended >> l.mean >> l.least;
      EXPECT_FALSE(fields.fail()) << text;
      lines.push_back(l);
    }
    fs::remove_all(dir);
    return lines;
  };
  std::vector<Line> all = timeline(nullptr);
  ASSERT_GE(all.size(), 1u + 4u);  // the replay, then at least the 4 fused or unfused steps
  EXPECT_EQ(all[0].name, "(replay)");
  EXPECT_EQ(all[0].could_start, 0.0);
  EXPECT_GT(all[0].ended, 0.0);
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_NE(all[i].name, "kernel") << "line " << i << ": a kernel without its name";
    EXPECT_GE(all[i].could_start, 0.0) << all[i].name;
    EXPECT_GE(all[i].ended, all[i].could_start) << all[i].name;
    EXPECT_LE(all[i].ended, all[0].ended) << all[i].name;
    EXPECT_GE(all[i].mean, all[i].least) << all[i].name;
  }
  // Only the kernels whose name has a word are followed: none for a word no kernel has; for the
  // first kernel's own name (after its namespaces), only kernels of that name.
  std::vector<Line> none = timeline("no_kernel_is_named_so");
  ASSERT_EQ(none.size(), 1u);
  EXPECT_GT(none[0].ended, 0.0);
  const std::string& first = all[1].name;
  const std::string head = first.substr(0, std::min(first.find('<'), first.find('(')));
  const std::string word =
      head.substr(head.rfind(':') == std::string::npos ? 0 : head.rfind(':') + 1);
  std::vector<Line> some = timeline(word.c_str());
  ASSERT_GE(some.size(), 2u) << word;
  for (size_t i = 1; i < some.size(); ++i)
    EXPECT_NE(some[i].name.find(word), std::string::npos) << some[i].name;
}

}  // namespace
}  // namespace kiln::test
