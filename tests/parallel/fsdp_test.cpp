// kiln/parallel/fsdp.h on every rank of the world (scripts/mpirun.sh 2, 3 and 4, and alone as a
// world of one). A model built from the same seed on every rank is trained with fully_shard, each
// rank on its share of a batch, against the same model in one process on the whole batch: the
// mean loss of every step, every gathered parameter and gradient within float tolerance. Then
// the placements and sizes of the shards and gradients (uneven and empty shards at 3 and 4
// ranks), a compiled step against eager, and the errors.
#include <gtest/gtest.h>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/compile.h"
#include "kiln/core/storage.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "kiln/parallel/fsdp.h"
#include "kiln/parallel/tensor_parallel.h"
#include "tests/parallel/fsdp_test_util.h"

namespace kiln::test {
namespace {

using namespace kiln::parallel;  // NOLINT

// Every parameter of `sharded` (gathered) equals `ref`'s, and with `grads` so do the gradients,
// which are Shard(0) DTensors with their parameter's spec.
void expect_same_parameters(nn::Module& sharded, nn::Module& ref, double tol, bool grads) {
  auto a = sharded.named_parameters(), b = ref.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_TRUE(dt::is_dtensor(a[i].second));
    EXPECT_EQ(dt::spec_of(a[i].second)->placements()[0], dt::Placement(dt::Shard(0)));
    EXPECT_TRUE(close(dt::full_tensor(a[i].second), b[i].second, tol));
    if (!grads) continue;
    const Tensor& g = a[i].second.grad();
    ASSERT_TRUE(g.defined());
    ASSERT_TRUE(dt::is_dtensor(g));
    EXPECT_EQ(dt::spec_of(g), dt::spec_of(a[i].second));
    EXPECT_TRUE(close(dt::full_tensor(g), b[i].second.grad(), tol));
  }
}

// An MLP whose sizes give uneven shards at 2, 3 and 4 ranks, and empty ones at 3 and 4 (the last
// layer's 2 rows).
std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(6, 11, true, init));
  m->push_back(std::make_shared<nn::GELU>(true));
  m->push_back(std::make_shared<nn::Linear>(11, 5, true, init));
  m->push_back(std::make_shared<nn::GELU>(true));
  m->push_back(std::make_shared<nn::Linear>(5, 2, true, init));
  return m;
}

// fully_shard on each Linear, then on the root (which then manages nothing).
void shard_mlp(nn::Sequential& m) {
  for (size_t i : {0, 2, 4}) fully_shard(m[i], mesh());
  fully_shard(m, mesh());
}

constexpr int64_t kRowsPerRank = 3;

// Step `s`'s whole batch: inputs [rows, 6] and targets [rows, 2], the same on every rank.
std::pair<Tensor, Tensor> mlp_batch(int64_t s) {
  Generator gen(200 + s);
  const int64_t rows = kRowsPerRank * world();
  return {randn({rows, 6}, &gen), randn({rows, 2}, &gen)};
}

Tensor mse(const Tensor& y, const Tensor& target) { return mean(pow(sub(y, target), 2.0)); }

constexpr int kSteps = 20;

TEST(FSDP, MlpTrainedWithFullyShardMatchesOneProcess) {
  auto ref = mlp(1), fsdp = mlp(1);
  shard_mlp(*fsdp);
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD opt(fsdp->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < kSteps; ++s) {
    auto [x, target] = mlp_batch(s);
    Tensor lr = mse((*ref)(x), target);
    lr.backward();
    Tensor l = mse((*fsdp)(share(x, kRowsPerRank)), share(target, kRowsPerRank));
    EXPECT_FALSE(dt::is_dtensor(l));
    l.backward();
    EXPECT_TRUE(close(mean_over_ranks(l), lr, 1e-5)) << "step " << s;
    if (s == 0) expect_same_parameters(*fsdp, *ref, 1e-5, /*grads=*/true);
    ref_opt.step();
    opt.step();
    ref_opt.zero_grad();
    opt.zero_grad();
  }
  expect_same_parameters(*fsdp, *ref, 1e-4, /*grads=*/false);
  // The optimizer's state is sharded like the parameters.
  for (size_t i = 0; i < opt.params().size(); ++i) {
    const Tensor& buf = opt.momentum_buffers()[i];
    ASSERT_TRUE(dt::is_dtensor(buf));
    EXPECT_EQ(dt::spec_of(buf)->placements()[0], dt::Placement(dt::Shard(0)));
    EXPECT_EQ(dt::to_local(buf).sizes(), dt::to_local(opt.params()[i]).sizes());
  }
}

TEST(FSDP, ShardsAreChunksOfDimZeroInStoragesOfTheirOwn) {
  auto ref = mlp(3), fsdp = mlp(3);
  shard_mlp(*fsdp);
  int64_t local = 0, whole = 0, bound = 0, row_sum = 0;
  auto a = fsdp->named_parameters(), b = ref->named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].first);
    const Tensor& p = a[i].second;
    ASSERT_TRUE(dt::is_dtensor(p));
    EXPECT_TRUE(p.is_leaf() && p.requires_grad());
    EXPECT_EQ(p.sizes(), b[i].second.sizes());
    const int64_t rows = b[i].second.size(0);
    const int64_t want_rows = dt::chunk_length(rows, world(), rank());
    const Tensor shard = dt::to_local(p);
    EXPECT_EQ(shard.size(0), want_rows);
    EXPECT_TRUE(bitwise_equal(
        shard, narrow(b[i].second.detach(), 0, dt::chunk_offset(rows, world(), rank()), want_rows)
                   .contiguous()));
    // The shard's storage holds the shard only, not the whole parameter.
    EXPECT_EQ(static_cast<int64_t>(shard.impl()->storage()->nbytes()), shard.numel() * 4);
    local += shard.numel();
    whole += b[i].second.numel();
    bound += dt::chunk_size(rows, world()) * (b[i].second.numel() / rows);
    row_sum += b[i].second.numel() / rows;
  }
  // 1/N of the parameters, plus at most one row per parameter of rounding.
  EXPECT_LE(local, bound);
  EXPECT_LE(bound * world(), whole + (world() - 1) * row_sum);
  EXPECT_EQ(fully_sharded_parameters((*fsdp)[0]), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_TRUE(fully_sharded_parameters(*fsdp).empty());
  EXPECT_TRUE(is_fully_sharded(*fsdp) && is_fully_sharded((*fsdp)[2]));
  EXPECT_FALSE(is_fully_sharded((*fsdp)[1]));
}

TEST(FSDP, ForwardWithoutGradAndParametersBetweenCalls) {
  auto ref = mlp(4), fsdp = mlp(4);
  shard_mlp(*fsdp);
  auto [x, target] = mlp_batch(0);
  Tensor want = (*ref)(x);
  {
    autograd::NoGradGuard no_grad;
    Tensor y = (*fsdp)(x);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(close(y, want, 1e-6));
  }
  // After a call the modules hold their shards again.
  for (auto& [name, p] : fsdp->named_parameters()) EXPECT_TRUE(dt::is_dtensor(p)) << name;
  // A module called twice in one forward: both uses' gradients reach the shard.
  auto& l = dynamic_cast<nn::Linear&>((*fsdp)[4]);
  auto& lr = dynamic_cast<nn::Linear&>((*ref)[4]);
  Tensor in = randn({4, 5});
  sum(add(l(in), l(mul(in, 2.0)))).backward();
  sum(add(lr(in), lr(mul(in, 2.0)))).backward();
  // Each rank's input is the same here, so the average is the one-process gradient.
  EXPECT_TRUE(close(dt::full_tensor(l.weight.grad()), lr.weight.grad(), 1e-5));
  EXPECT_TRUE(close(dt::full_tensor(l.bias.grad()), lr.bias.grad(), 1e-5));
}

// ---------------------------------------------------------------- resharding and prefetch

// A module that raises when armed (a forward that stops half way).
class Raiser : public nn::UnaryModule {
 public:
  Tensor forward(const Tensor& x) override {
    if (armed) throw std::runtime_error("raised on purpose");
    return x;
  }
  bool armed = false;
};

// `layers` square Linear layers without bias, a Raiser after the first; each Linear its own
// unit with `options`, then the root.
std::shared_ptr<nn::Sequential> deep_mlp(int64_t layers, int64_t width, uint64_t seed) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  auto m = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < layers; ++i) {
    m->push_back(std::make_shared<nn::Linear>(width, width, false, init));
    if (i == 0) m->push_back(std::make_shared<Raiser>());
  }
  return m;
}

void shard_deep_mlp(nn::Sequential& m, FullyShardOptions options) {
  for (size_t i = 0; i < m.size(); ++i)
    if (dynamic_cast<nn::Linear*>(&m[i])) fully_shard(m[i], mesh(), options);
  fully_shard(m, mesh());
}

TensorList gathered_grads(nn::Module& m) {
  TensorList out;
  for (const Tensor& p : m.parameters()) out.push_back(dt::full_tensor(p.grad()));
  return out;
}

TEST(FSDP, ReshardAfterForwardHoldsFewUnitsWholeAtTheForwardsPeak) {
  constexpr int64_t kLayers = 8, kWidth = 256;
  const size_t layer_bytes = kWidth * kWidth * 4;
  auto ref = deep_mlp(kLayers, kWidth, 5);
  Generator gen(6);
  Tensor x = randn({2, kWidth}, &gen);
  sum(pow((*ref)(x), 2.0)).backward();
  for (bool reshard : {false, true}) {
    for (bool prefetch : {false, true}) {
      SCOPED_TRACE(fmt::format("reshard {} prefetch {}", reshard, prefetch));
      auto m = deep_mlp(kLayers, kWidth, 5);
      shard_deep_mlp(*m, {.reshard_after_forward = reshard, .prefetch = prefetch});
      for (int step = 0; step < 2; ++step) {  // the second forward prefetches in its order
        begin_cpu_peak();
        Tensor loss = sum(pow((*m)(x), 2.0));
        const size_t peak = end_cpu_peak();
        if (reshard) {
          // The unit computing, the one prefetched and its buffers: not every layer.
          EXPECT_LE(peak, 4 * layer_bytes) << "step " << step;
        } else {
          EXPECT_GE(peak, (kLayers - 1) * layer_bytes) << "step " << step;
        }
        loss.backward();
        TensorList got = gathered_grads(*m);
        auto want = ref->parameters();
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i)
          EXPECT_TRUE(close(got[i], mul(want[i].grad(), static_cast<double>(step + 1)), 1e-5))
              << "parameter " << i << " step " << step;
      }
    }
  }
}

TEST(FSDP, ASecondBackwardThroughARetainedGraphGathersAgain) {
  auto ref = deep_mlp(3, 16, 7), m = deep_mlp(3, 16, 7);
  shard_deep_mlp(*m, {});
  Tensor x = randn({4, 16});
  Tensor loss = sum(pow((*m)(x), 2.0)), ref_loss = sum(pow((*ref)(x), 2.0));
  autograd::backward({loss}, {}, /*retain_graph=*/true);
  autograd::backward({loss});
  autograd::backward({ref_loss}, {}, true);
  autograd::backward({ref_loss});
  TensorList got = gathered_grads(*m);
  auto want = ref->parameters();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(close(got[i], want[i].grad(), 1e-5)) << i;
}

TEST(FSDP, APrefetchOfShardsThatChangedSinceIsDropped) {
  auto ref = deep_mlp(4, 12, 8), m = deep_mlp(4, 12, 8);
  shard_deep_mlp(*m, {});
  Tensor x = randn({3, 12});
  (*m)(x);  // records the units' order
  // The next forward stops in the Raiser, after the first Linear prefetched the second.
  auto& raiser = dynamic_cast<Raiser&>((*m)[1]);
  raiser.armed = true;
  EXPECT_THROW((*m)(x), std::runtime_error);
  raiser.armed = false;
  // The second Linear's shards change while its gather is in flight.
  {
    autograd::NoGradGuard no_grad;
    Tensor shard = dt::to_local(dynamic_cast<nn::Linear&>((*m)[2]).weight);
    mul_(shard, -2.0);
    mul_(dynamic_cast<nn::Linear&>((*ref)[2]).weight, -2.0);
  }
  EXPECT_TRUE(close((*m)(x), (*ref)(x), 1e-6));
  for (auto& [name, p] : m->named_parameters()) EXPECT_TRUE(dt::is_dtensor(p)) << name;
}

TEST(FSDP, WholeStateDictsLoadIntoShardedModulesAndOptimizers) {
  auto ref = mlp(11), fsdp = mlp(12);  // other weights, to be overwritten
  shard_mlp(*fsdp);
  optim::AdamW ref_opt(ref->parameters(), {.lr = 0.01});
  optim::AdamW opt(fsdp->parameters(), {.lr = 0.01});
  auto [x, target] = mlp_batch(0);
  mse((*ref)(x), target).backward();
  ref_opt.step();
  // A single-process checkpoint: whole tensors, loaded on every rank; each keeps its piece.
  fsdp->load_state_dict(ref->state_dict());
  opt.load_state_dict(ref_opt.state_dict());
  expect_same_parameters(*fsdp, *ref, 0, /*grads=*/false);
  for (size_t i = 0; i < opt.params().size(); ++i) {
    ASSERT_TRUE(dt::is_dtensor(opt.exp_avg()[i]));
    EXPECT_EQ(dt::spec_of(opt.exp_avg()[i]), dt::spec_of(opt.params()[i]));
    EXPECT_TRUE(close(dt::full_tensor(opt.exp_avg()[i]), ref_opt.exp_avg()[i], 0));
    EXPECT_TRUE(close(dt::full_tensor(opt.exp_avg_sq()[i]), ref_opt.exp_avg_sq()[i], 0));
  }
  // The next step is the same.
  ref_opt.zero_grad();
  opt.zero_grad();
  mse((*ref)(x), target).backward();
  mse((*fsdp)(share(x, kRowsPerRank)), share(target, kRowsPerRank)).backward();
  ref_opt.step();
  opt.step();
  expect_same_parameters(*fsdp, *ref, 1e-5, /*grads=*/false);
}

// ---------------------------------------------------------------- GPT

nn::GPTConfig gpt_config() {
  nn::GPTConfig c;
  c.vocab_size = 37;  // uneven rows at 2, 3 and 4 ranks
  c.context = 16;
  c.width = 20;
  c.layers = 2;
  c.heads = 2;
  return c;
}

std::unique_ptr<nn::GPT> make_gpt() {
  Generator gen(11);
  return std::make_unique<nn::GPT>(gpt_config(), nn::Init{.gen = &gen});
}

// fully_shard on every Block, then on the GPT (embeddings, final LayerNorm).
void shard_gpt(nn::GPT& m) {
  for (auto& [path, sub] : m.named_modules())
    if (sub->type_name() == "Block") fully_shard(*sub, mesh());
  fully_shard(m, mesh());
}

constexpr int64_t kSeqsPerRank = 2, kT = 8;

std::pair<Tensor, Tensor> gpt_batch(int64_t s) {
  Generator gen(100 + s);
  Tensor ids = randint(0, gpt_config().vocab_size, {kSeqsPerRank * world(), kT + 1}, &gen);
  return {narrow(ids, 1, 0, kT).contiguous(), narrow(ids, 1, 1, kT).contiguous()};
}

// Trains a GPT with fully_shard and one in one process on the whole batch, `make_opt` making
// each one's optimizer, for kSteps steps: the mean loss of every step, the first step's
// gradients and the final parameters within `tol`.
template <class MakeOpt>
void train_gpt_against_one_process(MakeOpt make_opt, double tol) {
  auto ref = make_gpt(), fsdp = make_gpt();
  shard_gpt(*fsdp);
  EXPECT_EQ(fully_sharded_parameters(*fsdp),
            (std::vector<std::string>{"transformer.wte.weight", "transformer.wpe.weight",
                                      "transformer.ln_f.weight", "transformer.ln_f.bias"}));
  auto ref_opt = make_opt(ref->parameters()), opt = make_opt(fsdp->parameters());
  for (int s = 0; s < kSteps; ++s) {
    auto [ids, targets] = gpt_batch(s);
    Tensor lr = ref->loss(ids, targets);
    lr.backward();
    Tensor l = fsdp->loss(share(ids, kSeqsPerRank), share(targets, kSeqsPerRank));
    l.backward();
    EXPECT_TRUE(close(mean_over_ranks(l), lr, tol)) << "step " << s;
    if (s == 0) expect_same_parameters(*fsdp, *ref, tol, /*grads=*/true);
    ref_opt->step();
    opt->step();
    ref_opt->zero_grad();
    opt->zero_grad();
  }
  expect_same_parameters(*fsdp, *ref, 10 * tol, /*grads=*/false);
}

TEST(FSDP, GptTrainedWithFullyShardMatchesOneProcess) {
  train_gpt_against_one_process(
      [](TensorList ps) {
        return std::make_unique<optim::SGD>(std::move(ps), optim::SGDOptions{.lr = 0.3});
      },
      1e-5);
}

// AdamW on the shards: its moments are Shard(0) DTensors, lr and step counts replicated ones.
// Adam's normalisation turns gradients that are zero but for rounding (the key bias's: softmax
// ignores a shift of every key), whose noise differs with the order of the sums, into updates of
// the learning rate's size, so the runs drift apart by about the rate times the steps' share of
// such noise: a small rate keeps that within the tolerance.
TEST(FSDP, GptTrainedWithFullyShardAndAdamWMatchesOneProcess) {
  train_gpt_against_one_process(
      [](TensorList ps) {
        return std::make_unique<optim::AdamW>(std::move(ps), optim::AdamWOptions{.lr = 1e-3});
      },
      1e-5);
}

TEST(FSDP, CompiledGptStepEqualsEager) {
  auto eager = make_gpt(), comp = make_gpt();
  shard_gpt(*eager);
  shard_gpt(*comp);
  optim::SGD eager_opt(eager->parameters(), {.lr = 0.3});
  optim::SGD comp_opt(comp->parameters(), {.lr = 0.3});
  CompiledFunction step = compile(
      [&](const Tensor& ids, const Tensor& targets) {
        Tensor loss = comp->loss(ids, targets);
        loss.backward();
        comp_opt.step();
        comp_opt.zero_grad(/*set_to_none=*/true);
        return loss.detach();
      },
      {.name = "fsdp_gpt_step"});
  for (int s = 0; s < 4; ++s) {
    auto [ids, targets] = gpt_batch(s);
    Tensor mine = share(ids, kSeqsPerRank), mine_t = share(targets, kSeqsPerRank);
    Tensor le = eager->loss(mine, mine_t);
    le.backward();
    eager_opt.step();
    eager_opt.zero_grad(/*set_to_none=*/true);
    Tensor lc = step({mine, mine_t})[0];
    EXPECT_TRUE(close(lc, le, 1e-6)) << "step " << s;
  }
  ASSERT_EQ(step.entries().size(), 1u);
  EXPECT_GE(step.entries()[0].hits, 2);
  if (world() > 1) {
    EXPECT_NE(step.graph_str(0).find("all_gather"), std::string::npos);
    EXPECT_NE(step.graph_str(0).find("reduce_scatter"), std::string::npos);
  }
  auto a = comp->named_parameters(), b = eager->named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(close(dt::full_tensor(a[i].second), dt::full_tensor(b[i].second), 1e-6))
        << a[i].first;
}

// ---------------------------------------------------------------- FSDP + tensor parallel

// Heads that divide over 1, 2 and 3 tensor-parallel ranks; a vocabulary that does not.
nn::GPTConfig tp_gpt_config() { return {37, 16, 24, 2, 6, true}; }

// The 2-D mesh's parameters gathered whole, in the module's order (a fused c_attn's rows back in
// the module's order).
nn::NamedTensors gathered_2d(nn::GPT& m, int64_t tp) {
  nn::NamedTensors out;
  for (auto& [name, p] : m.named_parameters()) {
    Tensor w = dt::full_tensor(p);
    if (name.find("c_attn") != std::string::npos) w = fused_rows_to_module_order(w, 3, tp);
    out.emplace_back(name, w.detach());
  }
  return out;
}

// A GPT with tensor parallel over the 2-D mesh's "tp" dim and fully_shard over "dp".
std::unique_ptr<nn::GPT> make_fsdp_tp_gpt(const dt::DeviceMesh& mesh2) {
  const dt::DeviceMesh& tp_mesh = mesh2.submesh({"tp"});
  Generator gen(11);
  auto model = std::make_unique<nn::GPT>(tp_gpt_config(), nn::Init{.gen = &gen});
  parallelize_module(*model, tp_mesh, gpt_tensor_parallel_plan(tp_gpt_config(), tp_mesh));
  for (auto& [path, sub] : model->named_modules())
    if (sub->type_name() == "Block") fully_shard(*sub, mesh2);
  fully_shard(*model, mesh2);
  return model;
}

// This dp rank's mean loss (loss parallel over tp) of `model` on its share of ids/targets.
Tensor fsdp_tp_loss(nn::GPT& model, const Tensor& x, const Tensor& y) {
  Tensor logits = model(x);
  return loss_parallel_cross_entropy(logits.reshape({-1, tp_gpt_config().vocab_size}),
                                     y.reshape({-1}));
}

// GPT with tensor parallel over the 2-D mesh's "tp" dim and fully_shard over "dp" (a 2x2 mesh
// at 4 ranks, 1 x n otherwise), each dp rank on its share of the batch, against one process on
// the whole batch.
TEST(FSDP, GptWithTensorParallelOnA2DMeshMatchesOneProcess) {
  const dt::DeviceMesh& mesh2 = mesh_2d(kCpu);
  const int64_t dp = mesh2.size(0), tp = mesh2.size(1), dp_rank = mesh2.coordinate(0);
  Generator g1(11);
  auto ref = std::make_unique<nn::GPT>(tp_gpt_config(), nn::Init{.gen = &g1});
  auto model = make_fsdp_tp_gpt(mesh2);
  // Every parameter is a DTensor on the 2-D mesh: tensor-parallel placements on tp, sharded over
  // dp along a dim tp does not shard.
  for (auto& [name, p] : model->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(dt::is_dtensor(p));
    const dt::DTensorSpec& s = *dt::spec_of(p);
    EXPECT_EQ(&s.mesh(), &mesh2);
    const dt::Placement pd = s.placements()[0], pt = s.placements()[1];
    if (pt.is_shard(0))
      EXPECT_EQ(pd, p.dim() >= 2 ? dt::Placement(dt::Shard(1)) : dt::Placement(dt::Replicate()));
    else
      EXPECT_EQ(pd, dt::Placement(dt::Shard(0)));
  }
  optim::SGD ref_opt(ref->parameters(), {.lr = 0.3});
  optim::SGD opt(model->parameters(), {.lr = 0.3});
  const int64_t v = tp_gpt_config().vocab_size;
  for (int s = 0; s < kSteps; ++s) {
    Generator gen(300 + s);
    Tensor ids = randint(0, v, {kSeqsPerRank * dp, kT + 1}, &gen);
    Tensor x = narrow(ids, 1, 0, kT).contiguous(), y = narrow(ids, 1, 1, kT).contiguous();
    Tensor lr = ref->loss(x, y);
    lr.backward();
    Tensor mine_x = narrow(x, 0, dp_rank * kSeqsPerRank, kSeqsPerRank).contiguous();
    Tensor mine_y = narrow(y, 0, dp_rank * kSeqsPerRank, kSeqsPerRank).contiguous();
    Tensor l = fsdp_tp_loss(*model, mine_x, mine_y);
    l.backward();
    Tensor mean = dt::to_local(l).detach();
    if (dp > 1) mean = dist::all_reduce(mean, dist::ReduceOp::Avg, &mesh2.group(0));
    EXPECT_TRUE(close(mean, lr, 1e-5)) << "step " << s;
    if (s == 0)
      for (auto& [name, p] : model->named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << name;
        EXPECT_EQ(dt::spec_of(p.grad()), dt::spec_of(p)) << name;
      }
    ref_opt.step();
    opt.step();
    ref_opt.zero_grad();
    opt.zero_grad();
  }
  auto a = gathered_2d(*model, tp), b = ref->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(close(a[i].second, b[i].second, 1e-4)) << a[i].first;
}

TEST(FSDP, CompiledFsdpTpStepEqualsEager) {
  const dt::DeviceMesh& mesh2 = mesh_2d(kCpu);
  auto eager = make_fsdp_tp_gpt(mesh2), comp = make_fsdp_tp_gpt(mesh2);
  optim::SGD eager_opt(eager->parameters(), {.lr = 0.3});
  optim::SGD comp_opt(comp->parameters(), {.lr = 0.3});
  CompiledFunction step = compile(
      [&](const Tensor& x, const Tensor& y) {
        Tensor loss = fsdp_tp_loss(*comp, x, y);
        loss.backward();
        comp_opt.step();
        comp_opt.zero_grad(/*set_to_none=*/true);
        return dt::to_local(loss).detach();
      },
      {.name = "fsdp_tp_gpt_step"});
  for (int s = 0; s < 4; ++s) {
    Generator gen(400 + s + 10 * mesh2.coordinate(0));  // each dp rank its own batch
    Tensor ids = randint(0, tp_gpt_config().vocab_size, {kSeqsPerRank, kT + 1}, &gen);
    Tensor x = narrow(ids, 1, 0, kT).contiguous(), y = narrow(ids, 1, 1, kT).contiguous();
    Tensor le = fsdp_tp_loss(*eager, x, y);
    le.backward();
    eager_opt.step();
    eager_opt.zero_grad(/*set_to_none=*/true);
    Tensor lc = step({x, y})[0];
    EXPECT_TRUE(close(lc, dt::to_local(le), 1e-6)) << "step " << s;
  }
  ASSERT_EQ(step.entries().size(), 1u);
  EXPECT_GE(step.entries()[0].hits, 2);
  auto a = comp->named_parameters(), b = eager->named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(close(dt::full_tensor(a[i].second), dt::full_tensor(b[i].second), 1e-6))
        << a[i].first;
}

// ---------------------------------------------------------------- errors

// A module whose calls run no hooks, and one with a 0-d parameter.
struct NotUnary : nn::Module {
  NotUnary() { register_parameter("w", &w); }
  Tensor w = ones({4});
};
struct Scalar0d : nn::UnaryModule {
  Scalar0d() { register_parameter("scale", &scale); }
  Tensor forward(const Tensor& x) override { return mul(x, scale); }
  Tensor scale = ones({});
};

TEST(FSDP, Errors) {
  auto m = mlp(5);
  fully_shard((*m)[0], mesh());
  EXPECT_NE(error_of([&] {
              fully_shard((*m)[0], mesh());
            }).find("[fully_shard] module '0' (Linear) is already sharded"),
            std::string::npos);
  // A parent sharded before its submodule.
  fully_shard(*m, mesh());
  std::string e = error_of([&] { fully_shard((*m)[2], mesh()); });
  EXPECT_NE(e.find("[fully_shard] parameter 'weight' of module '2' (Linear) is already a DTensor"),
            std::string::npos)
      << e;
  // A 3-D mesh.
  auto fresh = mlp(5);
  static const dt::DeviceMesh& mesh3 = dt::init_device_mesh(kCpu, {1, 1, world()});
  e = error_of([&] { fully_shard(*fresh, mesh3); });
  EXPECT_NE(e.find("[fully_shard] takes a 1-D mesh (data parallel) or a 2-D one (data parallel, "
                   "tensor parallel), got DeviceMesh(cpu, [1, 1, "),
            std::string::npos)
      << e;
  // A tensor-parallel parameter (already a DTensor).
  auto& lin = dynamic_cast<nn::Linear&>((*fresh)[0]);
  lin.weight = dt::distribute_tensor(lin.weight.detach(), mesh(), {dt::Shard(1)});
  e = error_of([&] { fully_shard(lin, mesh()); });
  EXPECT_NE(e.find("[fully_shard] parameter 'weight' of module '0' (Linear) is already a DTensor "
                   "(Spec([S(1)]"),
            std::string::npos)
      << e;
  // On a 2-D mesh, a DTensor on another mesh than its tp dim.
  e = error_of([&] { fully_shard(lin, mesh_2d(kCpu)); });
  EXPECT_NE(e.find("only tensor-parallel parameters on the mesh's second dim"), std::string::npos)
      << e;
  // Nothing changed: the bias is still a plain tensor, and the module is not sharded.
  EXPECT_FALSE(dt::is_dtensor(lin.bias));
  EXPECT_FALSE(is_fully_sharded(lin));
  NotUnary nu;
  e = error_of([&] { fully_shard(nu, mesh()); });
  EXPECT_NE(e.find("[fully_shard] module NotUnary is not a UnaryModule"), std::string::npos) << e;
  Scalar0d s0;
  e = error_of([&] { fully_shard(s0, mesh()); });
  EXPECT_NE(e.find("[fully_shard] parameter 'scale' of module Scalar0d is 0-d"), std::string::npos)
      << e;
  EXPECT_FALSE(dt::is_dtensor(s0.scale));
  // A whole-tensor state dict of other sizes is refused before anything loads.
  auto sharded = mlp(7);
  shard_mlp(*sharded);
  const Tensor before = dt::full_tensor((*sharded)[0].named_parameters()[0].second);
  nn::NamedTensors bad = mlp(8)->state_dict();
  bad.back().second = zeros({3, 5});
  e = error_of([&] { sharded->load_state_dict(bad); });
  EXPECT_NE(e.find("[load_state_dict] size mismatch for 4.bias"), std::string::npos) << e;
  EXPECT_TRUE(close(dt::full_tensor((*sharded)[0].named_parameters()[0].second), before, 0));
}

TEST(FSDP, ARegistryEntryEndsWithItsModule) {
  for (int i = 0; i < 3; ++i) {
    auto m = mlp(6);
    EXPECT_FALSE(is_fully_sharded(*m));
    shard_mlp(*m);
    EXPECT_TRUE(is_fully_sharded(*m));
  }
}

}  // namespace
}  // namespace kiln::test
