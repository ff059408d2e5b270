// kiln/parallel/tensor_parallel.h on every rank of the world (scripts/mpirun.sh 2 and 3, and
// alone as a world of one). Each style is checked on a small module against the same module
// unsharded (built from the same seed on every rank): the forward output and every parameter's
// gradient, gathered whole. Then the errors, loss parallel, and GPT trained with tensor
// parallel for 20 steps against the single-process run, eager and compiled.
#include <gtest/gtest.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/parallel/tensor_parallel.h"
#include "tests/backend/sim_util.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

using namespace kiln::parallel;  // NOLINT

const Device kCpu{kCPU};
int64_t world() { return dist::world_size(); }

::testing::AssertionResult close(const Tensor& got, const Tensor& want, double tol = 1e-5) {
  if (got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << fmt::format(
               "sizes [{}] vs [{}]", fmt::join(got.sizes(), ", "), fmt::join(want.sizes(), ", "));
  Tensor g = got.to(kCpu).to(kFloat64), w = want.to(kCpu).to(kFloat64);
  double err = g.numel() ? amax(abs(sub(g, w))).item<double>() : 0;
  double scale = w.numel() ? amax(abs(w)).item<double>() : 0;
  if (err <= tol * (1 + scale)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err << " (scale " << scale << ")";
}

// The whole value of a plain or DTensor `y`, differentiable.
Tensor whole(const Tensor& y) {
  if (!dt::is_dtensor(y)) return y;
  const auto& mesh = dt::spec_of(y)->mesh();
  return dt::to_local(dt::redistribute(y, dt::Placements(mesh.ndim(), dt::Replicate())));
}

// A loss that weighs every element of y differently.
Tensor weighted_sum(const Tensor& y) {
  Tensor w = div(global_tensor(y.sizes(), y.dtype(), y.device()), 10.0 * y.numel());
  return sum(mul(y, w));
}

// Every parameter of `tp` (gathered) and its gradient equal `ref`'s.
void expect_same_parameters(nn::Module& tp, nn::Module& ref, bool grads = true, double tol = 1e-5) {
  auto a = tp.named_parameters(), b = ref.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    EXPECT_TRUE(close(dt::is_dtensor(a[i].second) ? dt::full_tensor(a[i].second) : a[i].second,
                      b[i].second, tol));
    if (!grads) continue;
    ASSERT_TRUE(a[i].second.grad().defined());
    const Tensor& g = a[i].second.grad();
    if (dt::is_dtensor(a[i].second)) {
      ASSERT_TRUE(dt::is_dtensor(g));
      EXPECT_EQ(dt::spec_of(g)->placements()[0], dt::spec_of(a[i].second)->placements()[0]);
    }
    EXPECT_TRUE(close(dt::is_dtensor(g) ? dt::full_tensor(g) : g, b[i].second.grad(), tol));
  }
}

dt::Placement placement_of(const Tensor& t) { return dt::spec_of(t)->placements()[0]; }

std::shared_ptr<nn::Sequential> mlp(uint64_t seed, int64_t in, int64_t hidden, int64_t out) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(in, hidden, true, init));
  m->push_back(std::make_shared<nn::GELU>(true));
  m->push_back(std::make_shared<nn::Linear>(hidden, out, true, init));
  return m;
}

const dt::DeviceMesh& mesh() { return mesh_1d(kCpu); }

// Sizes that divide over 1, 2 and 3 ranks.
constexpr int64_t kIn = 6, kHidden = 12, kOut = 6;

void colwise_then_rowwise_mlp(Device device) {
  auto ref = mlp(1, kIn, kHidden, kOut), tp = mlp(1, kIn, kHidden, kOut);
  ref->to(device);
  tp->to(device);
  parallelize_module(
      *tp, mesh_1d(device),
      {{"0", std::make_shared<ColwiseParallel>()}, {"2", std::make_shared<RowwiseParallel>()}});
  auto& l0 = dynamic_cast<nn::Linear&>((*tp)[0]);
  auto& l2 = dynamic_cast<nn::Linear&>((*tp)[2]);
  EXPECT_EQ(placement_of(l0.weight), dt::Placement(dt::Shard(0)));
  EXPECT_EQ(placement_of(l0.bias), dt::Placement(dt::Shard(0)));
  EXPECT_EQ(placement_of(l2.weight), dt::Placement(dt::Shard(1)));
  EXPECT_EQ(placement_of(l2.bias), dt::Placement(dt::Replicate()));
  EXPECT_TRUE(l0.weight.requires_grad() && l2.bias.requires_grad());

  Tensor x = div(global_tensor({4, 3, kIn}, kFloat32, device), 50.0);
  Tensor xr = x.detach().requires_grad_(true), xt = x.detach().requires_grad_(true);
  Tensor yr = (*ref)(xr), yt = (*tp)(xt);
  EXPECT_FALSE(dt::is_dtensor(yt));  // use_local_output: a plain, replicated tensor
  EXPECT_EQ(yt.device(), device);
  EXPECT_TRUE(close(yt, yr));
  weighted_sum(yr).backward();
  weighted_sum(yt).backward();
  expect_same_parameters(*tp, *ref);
  EXPECT_TRUE(close(xt.grad(), xr.grad()));
}

TEST(TensorParallel, ColwiseThenRowwiseMlpMatchesOneProcess) { colwise_then_rowwise_mlp(kCpu); }
TEST(TensorParallel, ColwiseThenRowwiseMlpOnSim) { colwise_then_rowwise_mlp(sim()); }

TEST(TensorParallel, ColwiseOutputLayoutsAndDTensorOutput) {
  auto ref = mlp(2, kIn, kHidden, kOut);
  auto tp = mlp(2, kIn, kHidden, kOut);
  parallelize_module(
      *tp, mesh(),
      {{"0", std::make_shared<ColwiseParallel>(ColwiseOptions{.use_local_output = false})},
       {"2",
        std::make_shared<ColwiseParallel>(ColwiseOptions{.output_layouts = dt::Replicate()})}});
  Tensor x = div(global_tensor({5, kIn}, kFloat32, kCpu), 40.0);
  Tensor h = (*tp)[0](x);
  ASSERT_TRUE(dt::is_dtensor(h));
  EXPECT_EQ(placement_of(h), dt::Placement(dt::Shard(1)));
  Tensor yt = (*tp)(x), yr = (*ref)(x);
  EXPECT_FALSE(dt::is_dtensor(yt));
  EXPECT_TRUE(close(yt, yr));
  weighted_sum(yr).backward();
  weighted_sum(yt).backward();
  expect_same_parameters(*tp, *ref);
}

TEST(TensorParallel, RowwiseTakesShardedOrReplicatedInput) {
  for (bool replicated_input : {false, true}) {
    SCOPED_TRACE(replicated_input ? "input Replicate" : "input Shard(-1)");
    Generator g1(3), g2(3);
    nn::Linear ref(kHidden, kOut, true, {.gen = &g1}), tp(kHidden, kOut, true, {.gen = &g2});
    RowwiseOptions o;
    if (replicated_input) o.input_layouts = dt::Replicate();
    o.use_local_output = false;
    parallelize_module(tp, mesh(), {{"", std::make_shared<RowwiseParallel>(o)}});
    Tensor x = div(global_tensor({4, kHidden}, kFloat32, kCpu), 30.0);
    Tensor xr = x.detach().requires_grad_(true);
    // The local input: the whole x, or this rank's columns.
    const int64_t r = mesh().coordinate(0), n = mesh().size();
    Tensor xl = replicated_input
                    ? x.detach()
                    : narrow(x, 1, dt::chunk_offset(kHidden, n, r), dt::chunk_length(kHidden, n, r))
                          .contiguous();
    xl.requires_grad_(true);
    Tensor yt = tp(xl), yr = ref(xr);
    ASSERT_TRUE(dt::is_dtensor(yt));
    EXPECT_EQ(placement_of(yt), dt::Placement(dt::Replicate()));
    EXPECT_TRUE(close(whole(yt), yr));
    weighted_sum(yr).backward();
    weighted_sum(whole(yt)).backward();
    expect_same_parameters(tp, ref);
    Tensor want = replicated_input ? xr.grad()
                                   : narrow(xr.grad(), 1, dt::chunk_offset(kHidden, n, r),
                                            dt::chunk_length(kHidden, n, r));
    EXPECT_TRUE(close(xl.grad(), want));
  }
}

TEST(TensorParallel, EmbeddingColwiseAndVocabParallelRowwise) {
  for (bool rowwise : {false, true}) {
    SCOPED_TRACE(rowwise ? "RowwiseParallel (vocab parallel)" : "ColwiseParallel");
    Generator g1(4), g2(4);
    // 7 rows: uneven over 2 and 3 ranks.
    nn::Embedding ref(7, kIn, {.gen = &g1}), tp(7, kIn, {.gen = &g2});
    std::shared_ptr<const ParallelStyle> style =
        rowwise
            ? std::shared_ptr<const ParallelStyle>(std::make_shared<RowwiseParallel>())
            : std::make_shared<ColwiseParallel>(ColwiseOptions{.output_layouts = dt::Replicate()});
    parallelize_module(tp, mesh(), {{"", style}});
    EXPECT_EQ(placement_of(tp.weight), dt::Placement(dt::Shard(rowwise ? 0 : 1)));
    Tensor idx = from_vector<int64_t>({0, 6, 3, 3, 1, 5}).reshape({2, 3});
    Tensor yt = tp(idx), yr = ref(idx);
    EXPECT_FALSE(dt::is_dtensor(yt));
    EXPECT_TRUE(close(yt, yr));
    weighted_sum(yr).backward();
    weighted_sum(yt).backward();
    expect_same_parameters(tp, ref);
  }
}

// A LayerNorm (and an RMSNorm) on activations sharded along the sequence: each rank passes its
// rows of the sequence; the weight is replicated and its gradient, a sum over every rank's
// rows, must be the whole sequence's (issue 15).
TEST(TensorParallel, SequenceParallelNormWeightGradientsAreWhole) {
  for (bool rms : {false, true}) {
    SCOPED_TRACE(rms ? "RMSNorm" : "LayerNorm");
    auto make = [&]() -> std::shared_ptr<nn::UnaryModule> {
      if (rms) return std::make_shared<nn::RMSNorm>(kIn);
      return std::make_shared<nn::LayerNorm>(kIn);
    };
    auto ref = make(), tp = make();
    {  // weights that are not all ones, the same on both
      autograd::NoGradGuard no_grad;
      for (auto* m : {ref.get(), tp.get()})
        for (auto& [name, p] : m->named_parameters())
          Tensor(p).copy_(div(global_tensor(p.sizes(), kFloat32, kCpu), 7.0));
    }
    parallelize_module(*tp, mesh(), {{"", std::make_shared<SequenceParallel>()}});
    for (auto& [name, p] : tp->named_parameters())
      EXPECT_EQ(placement_of(p), dt::Placement(dt::Replicate())) << name;
    // A plain input is an even shard (the length divides by 1 to 4 ranks); uneven lengths come
    // as DTensors, below.
    const int64_t t = 12, n = mesh().size(), r = mesh().coordinate(0);
    Tensor x = sin(global_tensor({2, t, kIn}, kFloat32, kCpu));
    Tensor xr = x.detach().requires_grad_(true);
    Tensor xl = narrow(x, 1, dt::chunk_offset(t, n, r), dt::chunk_length(t, n, r)).contiguous();
    xl.requires_grad_(true);
    Tensor yt = (*tp)(xl), yr = (*ref)(xr);
    ASSERT_TRUE(dt::is_dtensor(yt));
    EXPECT_EQ(placement_of(yt), dt::Placement(dt::Shard(1)));
    EXPECT_TRUE(close(dt::full_tensor(yt), yr));
    weighted_sum(yr).backward();
    weighted_sum(whole(yt)).backward();
    expect_same_parameters(*tp, *ref);
    EXPECT_TRUE(close(xl.grad(),
                      narrow(xr.grad(), 1, dt::chunk_offset(t, n, r), dt::chunk_length(t, n, r))));
    // An uneven sequence (7 rows: empty shards at 4 ranks) as a replicated DTensor input.
    Tensor x7 = sin(global_tensor({2, 7, kIn}, kFloat32, kCpu));
    Tensor y7 = (*tp)(dt::distribute_tensor(x7, mesh(), {dt::Replicate()}));
    EXPECT_EQ(placement_of(y7), dt::Placement(dt::Shard(1)));
    EXPECT_TRUE(close(dt::full_tensor(y7), (*ref)(x7)));
  }
}

TEST(TensorParallel, PrepareModuleInputAndOutput) {
  auto ref = mlp(5, kIn, kHidden, kOut), tp = mlp(5, kIn, kHidden, kOut);
  // The input arrives sharded by rows (this rank's rows, plain) and is gathered for the
  // module; the output leaves as a Shard(0) DTensor.
  parallelize_module(*tp, mesh(),
                     {{"", std::make_shared<PrepareModuleInput>(
                               PrepareInputOptions{.input_layouts = dt::Shard(0),
                                                   .desired_input_layouts = dt::Replicate(),
                                                   .use_local_output = true})},
                      {"", std::make_shared<PrepareModuleOutput>(
                               PrepareOutputOptions{.output_layouts = dt::Replicate(),
                                                    .desired_output_layouts = dt::Shard(0),
                                                    .use_local_output = false})}});
  const int64_t rows = 12, n = mesh().size(), r = mesh().coordinate(0);  // even at 1 to 4 ranks
  Tensor x = div(global_tensor({rows, kIn}, kFloat32, kCpu), 25.0);
  Tensor xl = narrow(x, 0, dt::chunk_offset(rows, n, r), dt::chunk_length(rows, n, r));
  Tensor yt = (*tp)(xl.contiguous()), yr = (*ref)(x);
  ASSERT_TRUE(dt::is_dtensor(yt));
  EXPECT_EQ(placement_of(yt), dt::Placement(dt::Shard(0)));
  EXPECT_TRUE(close(dt::full_tensor(yt), yr));
  weighted_sum(yr).backward();
  weighted_sum(whole(yt)).backward();
  // The parameters stayed plain; each rank's gradient is the whole batch's.
  expect_same_parameters(*tp, *ref);
}

// See Note [Fused column shards]: each rank's local output is its chunk of every block.
TEST(TensorParallel, FusedColwiseGivesEachRankItsChunkOfEveryBlock) {
  Generator g1(6), g2(6);
  nn::Linear ref(kIn, 3 * kHidden, true, {.gen = &g1}), tp(kIn, 3 * kHidden, true, {.gen = &g2});
  parallelize_module(tp, mesh(),
                     {{"", std::make_shared<ColwiseParallel>(ColwiseOptions{.fused_chunks = 3})}});
  const int64_t n = mesh().size(), r = mesh().coordinate(0), c = kHidden / n;
  EXPECT_TRUE(close(fused_rows_to_module_order(dt::full_tensor(tp.weight), 3, n), ref.weight));
  EXPECT_TRUE(close(fused_rows_to_module_order(dt::full_tensor(tp.bias), 3, n), ref.bias));
  Tensor x = div(global_tensor({4, kIn}, kFloat32, kCpu), 20.0);
  Tensor yt = tp(x), yr = ref(x);
  std::vector<Tensor> mine;
  for (int64_t b = 0; b < 3; ++b) mine.push_back(narrow(yr, 1, b * kHidden + r * c, c));
  EXPECT_TRUE(close(yt, cat(mine, 1)));
}

TEST(TensorParallel, LossParallelCrossEntropyMatchesTheWholeLogits) {
  const int64_t rows = 5, classes = 7;  // 7 classes: uneven over 2 and 3 ranks
  Tensor logits = div(sin(global_tensor({rows, classes}, kFloat32, kCpu)), 0.3);
  Tensor target = from_vector<int64_t>({3, 6, -100, 0, 4});
  Tensor lr = logits.detach().requires_grad_(true);
  Tensor want = cross_entropy(lr, target);
  want.backward();
  Tensor lt = dt::distribute_tensor(logits, mesh(), {dt::Shard(1)}).requires_grad_(true);
  const double mark = calls_mark();
  Tensor got = loss_parallel_cross_entropy(lt, target);
  // The logits are never gathered: what moves is per row ([N, 1] maxima and sums, padded to
  // ceil(N / ranks) pieces) and the loss.
  int collectives = 0;
  for (const auto& e : dist::FlightRecorder::get().entries()) {
    if (e.started_s <= mark) continue;
    ++collectives;
    EXPECT_LE(e.numel, rows + world()) << calls_str(mark);
  }
  if (world() > 1) {
    EXPECT_GE(collectives, 3) << calls_str(mark);
  }
  ASSERT_TRUE(dt::is_dtensor(got));
  EXPECT_EQ(placement_of(got), dt::Placement(dt::Replicate()));
  EXPECT_TRUE(close(dt::to_local(got), want));
  got.backward();
  EXPECT_EQ(placement_of(lt.grad()), dt::Placement(dt::Shard(1)));
  EXPECT_TRUE(close(dt::full_tensor(lt.grad()), lr.grad()));
  // Plain logits: kiln::cross_entropy.
  EXPECT_TRUE(close(loss_parallel_cross_entropy(logits, target), want));
  EXPECT_THROW(loss_parallel_cross_entropy(lt, from_vector<int64_t>({1, 2})), ValueError);
}

// ---------------------------------------------------------------- errors

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TensorParallel, PlanErrorsRaiseBeforeAnythingChanges) {
  auto tp = mlp(7, kIn, kHidden, kOut);
  auto colwise = std::make_shared<ColwiseParallel>();
  // A path that matches nothing: nothing is parallelized, not even the path before it.
  std::string e = error_of([&] {
    parallelize_module(*tp, mesh(), {{"0", colwise}, {"5", colwise}});
  });
  EXPECT_NE(e.find("[parallelize_module] plan path '5' matches no submodule of Sequential"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("0, 1, 2"), std::string::npos) << e;
  // A style on a module type it does not support.
  e = error_of([&] { parallelize_module(*tp, mesh(), {{"0", colwise}, {"1", colwise}}); });
  EXPECT_NE(e.find("[ColwiseParallel] module '1' (GELU) is not a Linear or an Embedding"),
            std::string::npos)
      << e;
  EXPECT_THROW(parallelize_module(*tp, mesh(), {{"*", std::make_shared<SequenceParallel>()}}),
               TypeError);
  // Two styles that shard the same module's parameters.
  e = error_of([&] {
    parallelize_module(*tp, mesh(), {{"0", colwise}, {"[0]", std::make_shared<RowwiseParallel>()}});
  });
  EXPECT_NE(e.find("matched by more than one style"), std::string::npos) << e;
  // A mesh of the wrong ndim.
  const dt::DeviceMesh& m2 = mesh_2d(kCpu);
  e = error_of([&] { parallelize_module(*tp, m2, {{"0", colwise}}); });
  EXPECT_NE(e.find("[parallelize_module] expected a 1-D mesh, got DeviceMesh(cpu"),
            std::string::npos)
      << e;
  for (auto& [name, p] : tp->named_parameters()) EXPECT_FALSE(dt::is_dtensor(p)) << name;

  // Applying a style twice.
  parallelize_module(*tp, mesh(), {{"0", colwise}});
  e = error_of([&] { parallelize_module(*tp, mesh(), {{"0", colwise}}); });
  EXPECT_NE(e.find("[ColwiseParallel] module '0' (Linear) is already parallelized"),
            std::string::npos)
      << e;
  // Prepare styles need a unary module, and their layouts go in pairs.
  struct NotUnary : nn::Module {};
  NotUnary plain_module;
  EXPECT_THROW(
      parallelize_module(
          plain_module, mesh(),
          {{"", std::make_shared<PrepareModuleInput>(PrepareInputOptions{
                    .input_layouts = dt::Replicate(), .desired_input_layouts = dt::Replicate()})}}),
      TypeError);
  EXPECT_THROW(PrepareModuleInput(PrepareInputOptions{.input_layouts = dt::Replicate()}),
               ValueError);
  EXPECT_THROW(ColwiseParallel(ColwiseOptions{.fused_chunks = 0}), ValueError);
  // Fused blocks that do not divide over the mesh (5 rows per block; only a world of one,
  // where every size divides, takes them).
  if (world() > 1) {
    nn::Linear odd(kIn, 15);
    EXPECT_THROW(parallelize_module(
                     odd, mesh(),
                     {{"", std::make_shared<ColwiseParallel>(ColwiseOptions{.fused_chunks = 3})}}),
                 ValueError);
  }
  nn::GPTConfig cfg{16, 8, 12, 1, 2, true};
  if (2 % world() != 0) {
    EXPECT_THROW(gpt_tensor_parallel_plan(cfg, mesh()), ValueError);
  }
}

// ---------------------------------------------------------------- GPT

// Heads and widths that divide over 1, 2 and 3 ranks; 97 tokens are uneven on every mesh.
nn::GPTConfig gpt_config() { return {97, 16, 48, 2, 12, true}; }  // 12 heads: 1 to 4 ranks

std::unique_ptr<nn::GPT> make_gpt() {
  Generator gen(11);
  return std::make_unique<nn::GPT>(gpt_config(), nn::Init{.gen = &gen});
}

// Step `s`'s batch: ids and targets [2, 12], the same on every rank.
std::pair<Tensor, Tensor> batch(int64_t s) {
  Generator gen(100 + s);
  Tensor ids = randint(0, gpt_config().vocab_size, {2, 13}, &gen);
  return {narrow(ids, 1, 0, 12).contiguous(), narrow(ids, 1, 1, 12).contiguous()};
}

// Plain SGD: p -= lr * grad, the DTensor parameters and the plain ones as separate lists (the
// Sharded layer takes no plain tensor beside a DTensor).
void sgd_step(nn::Module& m, double lr) {
  autograd::NoGradGuard no_grad;
  TensorList dps, dgs, pps, pgs;
  for (Tensor& p : m.parameters()) {
    (dt::is_dtensor(p) ? dps : pps).push_back(p);
    (dt::is_dtensor(p) ? dgs : pgs).push_back(p.grad());
  }
  if (!dps.empty()) foreach_add_(dps, dgs, -lr);
  if (!pps.empty()) foreach_add_(pps, pgs, -lr);
  m.zero_grad(true);
}

Tensor tp_loss(nn::GPT& m, const Tensor& ids, const Tensor& targets) {
  Tensor logits = m.forward(ids);
  return loss_parallel_cross_entropy(logits.reshape({-1, gpt_config().vocab_size}),
                                     targets.reshape({-1}));
}

// The gathered parameters of a GPT under gpt_tensor_parallel_plan, in the module's order.
nn::NamedTensors gathered(nn::GPT& m) {
  nn::NamedTensors out;
  for (auto& [name, p] : m.named_parameters()) {
    Tensor w = dt::is_dtensor(p) ? dt::full_tensor(p) : p;
    if (name.find("c_attn") != std::string::npos)
      w = fused_rows_to_module_order(w, 3, mesh().size());
    out.emplace_back(name, w.detach());
  }
  return out;
}

constexpr int kSteps = 20;
constexpr double kLr = 0.2;

TEST(TensorParallel, GptTrainedWithTensorParallelMatchesOneProcess) {
  auto ref = make_gpt(), tp = make_gpt();
  parallelize_module(*tp, mesh(), gpt_tensor_parallel_plan(gpt_config(), mesh()));
  for (int s = 0; s < kSteps; ++s) {
    auto [ids, targets] = batch(s);
    Tensor lr = ref->loss(ids, targets);
    lr.backward();
    sgd_step(*ref, kLr);
    Tensor lt = tp_loss(*tp, ids, targets);
    lt.backward();
    sgd_step(*tp, kLr);
    EXPECT_TRUE(close(dt::to_local(lt), lr, 1e-5)) << "step " << s;
  }
  auto a = gathered(*tp), b = ref->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(close(a[i].second, b[i].second, 1e-4)) << a[i].first;
}

TEST(TensorParallel, GptLossUnderTheLossParallelScopeMatchesOneProcess) {
  auto ref = make_gpt(), tp = make_gpt();
  parallelize_module(*tp, mesh(), gpt_tensor_parallel_plan(gpt_config(), mesh()));
  auto [ids, targets] = batch(0);
  Tensor lr = ref->loss(ids, targets);
  lr.backward();
  // Without the scope GPT::loss refuses plain targets beside the vocabulary-sharded logits.
  EXPECT_THROW(tp->loss(ids, targets), ValueError);
  {
    LossParallel scope;  // the loss itself gathers nothing (LossParallelCrossEntropy... checks)
    Tensor lt = tp->loss(ids, targets);
    ASSERT_TRUE(dt::is_dtensor(lt));
    EXPECT_TRUE(close(dt::full_tensor(lt), lr, 1e-5));
    lt.backward();  // in the scope: the backward formulas meet the plain targets again
  }
  auto a = tp->named_parameters(), b = ref->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    Tensor g = a[i].second.grad();
    if (dt::is_dtensor(g)) g = dt::full_tensor(g);
    if (a[i].first.find("c_attn") != std::string::npos)
      g = fused_rows_to_module_order(g, 3, mesh().size());
    EXPECT_TRUE(close(g, b[i].second.grad(), 1e-4)) << a[i].first;
  }
}

TEST(TensorParallel, CompiledGptStepEqualsEager) {
  auto eager = make_gpt(), comp = make_gpt();
  parallelize_module(*eager, mesh(), gpt_tensor_parallel_plan(gpt_config(), mesh()));
  parallelize_module(*comp, mesh(), gpt_tensor_parallel_plan(gpt_config(), mesh()));
  CompiledFunction step = compile(
      [&](const Tensor& ids, const Tensor& targets) {
        Tensor loss = tp_loss(*comp, ids, targets);
        loss.backward();
        sgd_step(*comp, kLr);
        return dt::to_local(loss).detach();
      },
      {.name = "tp_gpt_step"});
  for (int s = 0; s < 4; ++s) {
    auto [ids, targets] = batch(s);
    Tensor le = tp_loss(*eager, ids, targets);
    le.backward();
    sgd_step(*eager, kLr);
    Tensor lc = step({ids, targets})[0];
    EXPECT_TRUE(close(lc, dt::to_local(le), 1e-6)) << "step " << s;
  }
  // One trace, replayed: the graph holds the local ops and the collectives, no DTensor work.
  ASSERT_EQ(step.entries().size(), 1u);
  EXPECT_GE(step.entries()[0].hits, 2);
  if (world() > 1) {
    EXPECT_NE(step.graph_str(0).find("all_reduce"), std::string::npos);
  }
  auto a = gathered(*comp), b = gathered(*eager);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(close(a[i].second, b[i].second, 1e-6)) << a[i].first;
}

}  // namespace
}  // namespace kiln::test
