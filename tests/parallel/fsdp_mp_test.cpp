// fully_shard's mixed-precision policy (kiln/parallel/fsdp.h, Note [FSDP mixed precision] in
// fsdp_unit.cpp) on every rank of the world (scripts/mpirun.sh 2, and alone as a world of one):
// the forward sees 16-bit gathered parameters, the gathers move 16-bit bytes and the
// reduce-scatters reduce_dtype ones, the gradients equal one process computing on parameters
// rounded to the 16-bit dtype, the master weights and their gradients stay float32, with
// resharding, prefetch, a retained graph's second backward, compile and a GradScaler; the errors.
#include <gtest/gtest.h>

#include "kiln/amp/grad_scaler.h"
#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/fsdp.h"
#include "tests/parallel/fsdp_test_util.h"

namespace kiln::test {
namespace {

using namespace kiln::parallel;  // NOLINT

constexpr int64_t kRowsPerRank = 4;

// Linear layers whose sizes give uneven shards at 2 ranks, GELUs between.
std::shared_ptr<nn::Sequential> mlp(uint64_t seed, int64_t layers = 3) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  const int64_t sizes[] = {6, 11, 5, 9};
  auto m = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < layers; ++i) {
    if (i) m->push_back(std::make_shared<nn::GELU>(true));
    m->push_back(
        std::make_shared<nn::Linear>(sizes[i], i + 1 == layers ? 2 : sizes[i + 1], true, init));
  }
  return m;
}

// fully_shard with `mp` on each Linear, then on the root, whose output is float32.
void shard(nn::Sequential& m, MixedPrecisionPolicy mp, FullyShardOptions options = {}) {
  options.mp = mp;
  for (size_t i = 0; i < m.size(); ++i)
    if (dynamic_cast<nn::Linear*>(&m[i])) fully_shard(m[i], mesh(), options);
  options.mp.output_dtype = kFloat32;
  fully_shard(m, mesh(), options);
}

// The same model with every parameter rounded to `dtype` (a leaf again): the one-process
// reference of a param_dtype run.
std::shared_ptr<nn::Sequential> rounded(uint64_t seed, DType dtype, int64_t layers = 3) {
  auto m = mlp(seed, layers);
  for (auto& [name, slot] : m->named_parameter_slots())
    *slot = slot->detach().to(dtype).requires_grad_(true);
  return m;
}

std::pair<Tensor, Tensor> batch(int64_t s, int64_t in = 6, int64_t out = 2) {
  Generator gen(300 + s);
  const int64_t rows = kRowsPerRank * world();
  return {randn({rows, in}, &gen), randn({rows, out}, &gen)};
}

Tensor mse(const Tensor& y, const Tensor& target) { return mean(pow(sub(y, target), 2.0)); }

// The reference's loss: its input rounded, its output back in float32.
Tensor ref_loss(nn::Sequential& ref, const Tensor& x, const Tensor& target, DType dtype) {
  return mse(ref(x.to(dtype)).to(kFloat32), target);
}

void expect_grads_close(nn::Module& sharded, nn::Module& ref, double tol, double times = 1) {
  auto a = sharded.named_parameters(), b = ref.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    EXPECT_EQ(a[i].second.dtype(), kFloat32);
    const Tensor& g = a[i].second.grad();
    ASSERT_TRUE(g.defined());
    ASSERT_TRUE(dt::is_dtensor(g));
    EXPECT_EQ(dt::spec_of(g), dt::spec_of(a[i].second));  // float32, Shard(0)
    EXPECT_TRUE(close(dt::full_tensor(g), mul(b[i].second.grad(), times), tol));
  }
}

TEST(FSDPMixedPrecision, GatheredParametersAreBfloat16AndGradientsMatchARoundedRun) {
  for (std::optional<DType> reduce :
       {std::optional<DType>(), std::optional<DType>(kFloat32), std::optional<DType>(kBFloat16)}) {
    SCOPED_TRACE(reduce ? fmt::format("reduce_dtype {}", *reduce) : "reduce_dtype unset");
    auto m = mlp(1), ref = rounded(1, kBFloat16);
    shard(*m, {.param_dtype = kBFloat16, .reduce_dtype = reduce});
    // What each Linear's forward sees (its pre-hook runs after fully_shard's).
    std::vector<DType> seen;
    for (size_t i : {0, 2, 4})
      dynamic_cast<nn::UnaryModule&>((*m)[i]).register_forward_pre_hook([&, i](const Tensor& x) {
        auto& lin = dynamic_cast<nn::Linear&>((*m)[i]);
        seen.push_back(lin.weight.dtype());
        seen.push_back(lin.bias.dtype());
        seen.push_back(x.dtype());
        EXPECT_FALSE(dt::is_dtensor(lin.weight));
        return x;
      });
    auto [x, target] = batch(0);
    Tensor y = (*m)(share(x, kRowsPerRank));
    EXPECT_EQ(y.dtype(), kFloat32);  // the root's output_dtype
    ASSERT_EQ(seen.size(), 9u);
    for (DType t : seen) EXPECT_EQ(t, kBFloat16);
    mse(y, share(target, kRowsPerRank)).backward();
    ref_loss(*ref, x, target, kBFloat16).backward();
    // Each rank's share rounds its own sums; bfloat16 keeps 8 bits.
    expect_grads_close(*m, *ref, 2e-2);
    // Between calls the members hold the float32 shards again.
    for (auto& [name, p] : m->named_parameters()) {
      EXPECT_TRUE(dt::is_dtensor(p)) << name;
      EXPECT_EQ(p.dtype(), kFloat32) << name;
    }
  }
}

TEST(FSDPMixedPrecision, MasterWeightsStayFloat32ThroughSteps) {
  auto m = mlp(2);
  shard(*m, {.param_dtype = kBFloat16, .reduce_dtype = kFloat32});
  optim::SGD opt(m->parameters(), {.lr = 0.1, .momentum = 0.9});
  double first = 0, last = 0;
  for (int s = 0; s < 8; ++s) {
    auto [x, target] = batch(0);
    Tensor l = mse((*m)(share(x, kRowsPerRank)), share(target, kRowsPerRank));
    l.backward();
    opt.step();
    opt.zero_grad();
    (s == 0 ? first : last) = mean_over_ranks(l).item<double>();
  }
  EXPECT_LT(last, first);
  // The updated weights are float32 values that bfloat16 cannot hold: not rounded each step.
  for (auto& [name, p] : m->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_EQ(p.dtype(), kFloat32);
    Tensor w = dt::full_tensor(p);
    EXPECT_GT(amax(abs(sub(w, w.to(kBFloat16).to(kFloat32)))).item<double>(), 0.0);
  }
}

TEST(FSDPMixedPrecision, OutputDtypeAndInputCasts) {
  auto m = mlp(3);
  shard(*m, {.param_dtype = kBFloat16});
  auto& first = dynamic_cast<nn::UnaryModule&>((*m)[0]);
  auto [x, target] = batch(0);
  EXPECT_EQ(first(share(x, kRowsPerRank)).dtype(),
            kBFloat16);  // no output_dtype on the Linear's unit
  EXPECT_EQ((*m)(share(x, kRowsPerRank)).dtype(), kFloat32);
  // Without cast_forward_inputs a float32 input meets bfloat16 weights: the op raises.
  auto n = mlp(3);
  fully_shard((*n)[0], mesh(), {.mp = {.param_dtype = kBFloat16, .cast_forward_inputs = false}});
  EXPECT_THROW(dynamic_cast<nn::UnaryModule&>((*n)[0])(share(x, kRowsPerRank)), std::exception);
}

// Four Linears, each a unit resharding (or not) and prefetching, then the root.
TEST(FSDPMixedPrecision, ReshardPrefetchAndARetainedGraphMatchARoundedRun) {
  for (bool reshard : {false, true}) {
    SCOPED_TRACE(fmt::format("reshard {}", reshard));
    auto m = mlp(4, 4), ref = rounded(4, kBFloat16, 4);
    shard(*m, {.param_dtype = kBFloat16}, {.reshard_after_forward = reshard, .prefetch = true});
    auto [x, target] = batch(1, 6, 2);
    ref_loss(*ref, x, target, kBFloat16).backward();
    for (int step = 0; step < 2; ++step) {  // the second forward prefetches in its order
      mse((*m)(share(x, kRowsPerRank)), share(target, kRowsPerRank)).backward();
      expect_grads_close(*m, *ref, 2e-2, step + 1);
    }
    // A retained graph's second backward gathers the freed parameters again.
    Tensor loss = mse((*m)(share(x, kRowsPerRank)), share(target, kRowsPerRank));
    autograd::backward({loss}, {}, /*retain_graph=*/true);
    autograd::backward({loss});
    expect_grads_close(*m, *ref, 2e-2, 4);
  }
}

// The collectives since `mark`: (all-gather bytes, reduce-scatter bytes), checking their dtypes.
std::pair<int64_t, int64_t> collective_bytes(double mark, DType gather, DType reduce) {
  int64_t ag = 0, rs = 0;
  for (const auto& e : dist::FlightRecorder::get().entries()) {
    if (e.started_s <= mark) continue;
    const int64_t bytes = e.numel * static_cast<int64_t>(itemsize(e.dtype));
    if (e.op.find("all_gather") != std::string::npos) {
      EXPECT_EQ(e.dtype, gather) << dist::FlightRecorder::format(e);
      ag += bytes;
    } else if (e.op.find("reduce_scatter") != std::string::npos) {
      EXPECT_EQ(e.dtype, reduce) << dist::FlightRecorder::format(e);
      rs += bytes;
    }
  }
  return {ag, rs};
}

TEST(FSDPMixedPrecision, GathersMoveHalfTheBytes) {
  if (world() == 1) GTEST_SKIP() << "a world of one runs no collectives";
  auto [x, target] = batch(0);
  int64_t ag[3], rs[3];
  const MixedPrecisionPolicy policies[] = {
      {}, {.param_dtype = kBFloat16}, {.param_dtype = kBFloat16, .reduce_dtype = kBFloat16}};
  const DType reduces[] = {kFloat32, kFloat32, kBFloat16};
  for (int k = 0; k < 3; ++k) {
    auto m = mlp(5);
    shard(*m, policies[k]);
    const double mark = calls_mark();
    mse((*m)(share(x, kRowsPerRank)), share(target, kRowsPerRank)).backward();
    std::tie(ag[k], rs[k]) =
        collective_bytes(mark, policies[k].param_dtype.value_or(kFloat32), reduces[k]);
  }
  EXPECT_GT(ag[0], 0);
  EXPECT_EQ(ag[1] * 2, ag[0]);
  EXPECT_EQ(rs[1], rs[0]);
  EXPECT_EQ(ag[2], ag[1]);
  EXPECT_EQ(rs[2] * 2, rs[0]);
}

TEST(FSDPMixedPrecision, CompiledStepEqualsEager) {
  auto eager = mlp(6), comp = mlp(6);
  const MixedPrecisionPolicy mp{.param_dtype = kBFloat16, .reduce_dtype = kFloat32};
  shard(*eager, mp);
  shard(*comp, mp);
  optim::SGD eager_opt(eager->parameters(), {.lr = 0.1});
  optim::SGD comp_opt(comp->parameters(), {.lr = 0.1});
  CompiledFunction step = compile(
      [&](const Tensor& x, const Tensor& target) {
        Tensor loss = mse((*comp)(x), target);
        loss.backward();
        comp_opt.step();
        comp_opt.zero_grad(/*set_to_none=*/true);
        return loss.detach();
      },
      {.name = "fsdp_mp_step"});
  for (int s = 0; s < 4; ++s) {
    auto [x, target] = batch(s);
    Tensor le = mse((*eager)(share(x, kRowsPerRank)), share(target, kRowsPerRank));
    le.backward();
    eager_opt.step();
    eager_opt.zero_grad(/*set_to_none=*/true);
    Tensor lc = step({share(x, kRowsPerRank), share(target, kRowsPerRank)})[0];
    EXPECT_TRUE(close(lc, le, 1e-6)) << "step " << s;
  }
  ASSERT_EQ(step.entries().size(), 1u);
  if (world() > 1) {
    EXPECT_NE(step.graph_str(0).find("all_gather"), std::string::npos);
  }
  auto a = comp->named_parameters(), b = eager->named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(close(dt::full_tensor(a[i].second), dt::full_tensor(b[i].second), 1e-6))
        << a[i].first;
}

TEST(FSDPMixedPrecision, Float16WithAGradScaler) {
  auto m = mlp(7), ref = rounded(7, kFloat16);
  shard(*m, {.param_dtype = kFloat16, .reduce_dtype = kFloat32});
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  amp::GradScaler scaler(kCpu, {.init_scale = 1024.0});  // 65536 would overflow float16 here
  auto [x, target] = batch(2);
  scaler.scale(mse((*m)(share(x, kRowsPerRank)), share(target, kRowsPerRank))).backward();
  scaler.unscale_(opt);
  ref_loss(*ref, x, target, kFloat16).backward();
  expect_grads_close(*m, *ref, 1e-2);
  const Tensor before = dt::full_tensor(m->parameters()[0]).clone();
  scaler.step(opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024.0);  // nothing overflowed
  EXPECT_GT(amax(abs(sub(dt::full_tensor(m->parameters()[0]), before))).item<double>(), 0.0);
}

TEST(FSDPMixedPrecision, Errors) {
  auto m = mlp(8);
  std::string e = error_of([&] { fully_shard((*m)[0], mesh(), {.mp = {.param_dtype = kInt32}}); });
  EXPECT_NE(e.find("[fully_shard] mp.param_dtype must be a floating dtype, got int32"),
            std::string::npos)
      << e;
  e = error_of([&] { fully_shard((*m)[0], mesh(), {.mp = {.reduce_dtype = kInt64}}); });
  EXPECT_NE(e.find("[fully_shard] mp.reduce_dtype must be a floating dtype, got int64"),
            std::string::npos)
      << e;
  e = error_of([&] { fully_shard((*m)[0], mesh(), {.mp = {.output_dtype = kBool}}); });
  EXPECT_NE(e.find("[fully_shard] mp.output_dtype must be a floating dtype, got bool"),
            std::string::npos)
      << e;
  e = error_of([&] { fully_shard((*m)[0], mesh_2d(kCpu), {.mp = {.param_dtype = kBFloat16}}); });
  EXPECT_NE(e.find("[fully_shard] a mixed-precision policy takes a 1-D mesh, got DeviceMesh("),
            std::string::npos)
      << e;
  // Nothing changed.
  EXPECT_FALSE(is_fully_sharded((*m)[0]));
  for (auto& [name, p] : m->named_parameters()) EXPECT_FALSE(dt::is_dtensor(p)) << name;
}

}  // namespace
}  // namespace kiln::test
