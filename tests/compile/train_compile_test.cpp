// Compiled training steps against the same steps run eagerly: losses and parameters after
// every step, bitwise (the replay runs the same kernels in the same order).
#include <gtest/gtest.h>

#include "kiln/compile/compile.h"
#include "kiln/nn/cnn.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/layers.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"

namespace kiln {
namespace {

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  Generator gen(seed);
  nn::Init init{.gen = &gen};
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(16, 32, true, init));
  m->push_back(std::make_shared<nn::GELU>());
  m->push_back(std::make_shared<nn::Linear>(32, 32, true, init));
  m->push_back(std::make_shared<nn::GELU>());
  m->push_back(std::make_shared<nn::Linear>(32, 10, true, init));
  return m;
}

// One training step of an MLP (a UnaryModule): cross entropy, backward, the optimizer's step.
Tensor step(nn::Module& m, optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
  opt.zero_grad();
  Tensor loss = cross_entropy(static_cast<nn::UnaryModule&>(m).forward(x), y);
  loss.backward();
  opt.step();
  return loss.detach();
}

void expect_params_equal(const nn::Module& a, const nn::Module& b, int step) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_EQ(pa[i].second.to_vector<float>(), pb[i].second.to_vector<float>())
        << "parameter " << pa[i].first << " after step " << step;
}

TEST(CompileTrain, MlpTenStepsMatchEagerBitwise) {
  auto eager = make_mlp(1), compiled = make_mlp(1);
  optim::AdamW eager_opt(eager->parameters(), {.lr = 1e-2});
  optim::AdamW opt(compiled->parameters(), {.lr = 1e-2});
  CompiledFunction f =
      compile([&](const Tensor& x, const Tensor& y) { return step(*compiled, opt, x, y); },
              {.name = "mlp_step"});
  Generator data(7);
  for (int s = 1; s <= 10; ++s) {
    Tensor x = randn({8, 16}, &data), y = randint(0, 10, {8}, &data);
    Tensor want = step(*eager, eager_opt, x, y);
    Tensor got = f({x, y})[0];
    EXPECT_EQ(got.item<float>(), want.item<float>()) << "loss at step " << s;
    expect_params_equal(*eager, *compiled, s);
    if (s == 5) {  // the learning rate lives in a tensor: changing it reaches the replay
      eager_opt.set_lr(3e-3);
      opt.set_lr(3e-3);
    }
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.eager_calls(), 1);      // the warm-up made the gradients
  EXPECT_EQ(f.entries()[0].hits, 8);  // steps 3 to 10 replayed
  EXPECT_EQ(f.entries()[0].steps > 20, true);
  // State the replays updated in place is the optimizer's own.
  EXPECT_EQ(opt.step_counts()[0].item<double>(), 10.0);
}

// SGD reads its rate from a device tensor (Note [SGD in a compiled step]): set_lr between calls
// reaches the replay without a recompile, momentum, weight decay and Nesterov included.
TEST(CompileTrain, SgdSetLrReachesTheReplay) {
  auto eager = make_mlp(2), compiled = make_mlp(2);
  const optim::SGDOptions o{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  optim::SGD eager_opt(eager->parameters(), o), opt(compiled->parameters(), o);
  CompiledFunction f =
      compile([&](const Tensor& x, const Tensor& y) { return step(*compiled, opt, x, y); },
              {.name = "sgd_step"});
  Generator data(9);
  TensorList before;
  for (int s = 1; s <= 10; ++s) {
    const double lr = s <= 4 ? 0.05 : s <= 7 ? 0.01 : 0.0;  // a schedule, then a rate of 0
    eager_opt.set_lr(lr);
    opt.set_lr(lr);
    before.clear();
    for (const Tensor& p : compiled->parameters()) before.push_back(p.clone());
    Tensor x = randn({8, 16}, &data), y = randint(0, 10, {8}, &data);
    Tensor want = step(*eager, eager_opt, x, y);
    EXPECT_EQ(f({x, y})[0].item<float>(), want.item<float>()) << "loss at step " << s;
    expect_params_equal(*eager, *compiled, s);
  }
  // With a rate of 0 the last replay left the parameters as they were.
  TensorList after = compiled->parameters();
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_EQ(after[i].to_vector<float>(), before[i].to_vector<float>()) << "parameter " << i;
  EXPECT_TRUE(f.miss_reasons().empty()) << f.explain();
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.eager_calls(), 1);  // the warm-up made the gradients and momentum buffers
  EXPECT_EQ(f.entries()[0].hits, 8);
}

TEST(CompileTrain, GptTenStepsMatchEagerBitwise) {
  nn::GPTConfig cfg{.vocab_size = 64, .context = 16, .width = 32, .layers = 2, .heads = 2};
  Generator g1(3), g2(3);
  nn::GPT eager(cfg, {.gen = &g1}), compiled(cfg, {.gen = &g2});
  optim::AdamW eager_opt(eager.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  optim::AdamW opt(compiled.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  auto step = [](nn::GPT& m, optim::Optimizer& o, const Tensor& idx, const Tensor& tgt) {
    o.zero_grad();
    Tensor loss = m.loss(idx, tgt);
    loss.backward();
    optim::clip_grad_norm_(o.params(), 1.0);
    o.step();
    return loss.detach();
  };
  CompiledFunction f =
      compile([&](const Tensor& idx, const Tensor& tgt) { return step(compiled, opt, idx, tgt); },
              {.name = "gpt_step"});
  Generator data(11);
  for (int s = 1; s <= 10; ++s) {
    Tensor idx = randint(0, 64, {4, 16}, &data), tgt = randint(0, 64, {4, 16}, &data);
    Tensor want = step(eager, eager_opt, idx, tgt);
    Tensor got = f({idx, tgt})[0];
    EXPECT_EQ(got.item<float>(), want.item<float>()) << "loss at step " << s;
    expect_params_equal(eager, compiled, s);
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 8);
  EXPECT_LT(f.entries()[0].arena_bytes, f.entries()[0].eager_peak_bytes);
}

// The CNN of `kiln train --model cnn`: convolutions whose backward leaves the input's gradient
// undefined (a result the replay must skip), batch norm updating its running statistics in
// place, max pooling with indices and dropout drawing from the default generator. Ten steps
// replayed equal ten eager ones bitwise: losses, parameters and buffers.
TEST(CompileTrain, CnnTenStepsMatchEagerBitwise) {
  nn::CNNConfig cfg{.in_channels = 1, .image_size = 12, .channels = {4, 8}, .hidden = 16};
  Generator g1(5), g2(5);
  nn::CNN eager(cfg, {.gen = &g1}), compiled(cfg, {.gen = &g2});
  optim::AdamW eager_opt(eager.parameters(), {.lr = 1e-2});
  optim::AdamW opt(compiled.parameters(), {.lr = 1e-2});
  CompiledFunction f =
      compile([&](const Tensor& x, const Tensor& y) { return step(compiled, opt, x, y); },
              {.name = "cnn_step"});
  Generator data(13);
  for (int s = 1; s <= 10; ++s) {
    Tensor x = randn({6, 1, 12, 12}, &data), y = randint(0, 10, {6}, &data);
    const uint64_t offset = default_generator().offset();
    Tensor want = step(eager, eager_opt, x, y);
    default_generator().set_offset(offset);  // the same dropout masks on both sides
    Tensor got = f({x, y})[0];
    EXPECT_EQ(got.item<float>(), want.item<float>()) << "loss at step " << s;
    expect_params_equal(eager, compiled, s);
    auto be = eager.named_buffers(), bc = compiled.named_buffers();
    ASSERT_EQ(be.size(), bc.size());
    for (size_t i = 0; i < be.size(); ++i)
      EXPECT_TRUE(equal(be[i].second, bc[i].second)) << be[i].first << " after step " << s;
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 8);
}

// A module applied twice to the same input: CSE merges the two calls (forward and, with equal
// incoming gradients, backward), and the replay must still match eager. The convolution's
// backward allocates its results (a Result step), the ReLU's backward reads a merged value.
TEST(CompileTrain, ModuleAppliedTwiceMatchesEagerBitwise) {
  struct Twice {
    explicit Twice(uint64_t seed)
        : gen(seed), conv(1, 4, {3}, {}, {.gen = &gen}), head(4 * 6 * 6, 10, true, {.gen = &gen}) {}
    Generator gen;
    nn::Conv2d conv;
    nn::Linear head;
    std::vector<Tensor> parameters() { return {conv.weight, conv.bias, head.weight, head.bias}; }
    Tensor step(optim::Optimizer& opt, const Tensor& x, const Tensor& y) {
      opt.zero_grad();
      Tensor h = add(relu(conv.forward(x)), relu(conv.forward(x)));
      Tensor loss = cross_entropy(head.forward(flatten(h, 1)), y);
      loss.backward();
      opt.step();
      return loss.detach();
    }
  };
  Twice eager(3), compiled(3);
  optim::AdamW eager_opt(eager.parameters(), {.lr = 1e-2});
  optim::AdamW opt(compiled.parameters(), {.lr = 1e-2});
  CompiledFunction f =
      compile([&](const Tensor& x, const Tensor& y) { return compiled.step(opt, x, y); },
              {.name = "twice"});
  Generator data(17);
  for (int s = 1; s <= 5; ++s) {
    Tensor x = randn({3, 1, 8, 8}, &data), y = randint(0, 10, {3}, &data);
    Tensor want = eager.step(eager_opt, x, y);
    Tensor got = f({x, y})[0];
    EXPECT_EQ(got.item<float>(), want.item<float>()) << "loss at step " << s;
    std::vector<Tensor> pe = eager.parameters(), pc = compiled.parameters();
    for (size_t i = 0; i < pe.size(); ++i)
      EXPECT_EQ(pe[i].to_vector<float>(), pc[i].to_vector<float>())
          << "parameter " << i << " after step " << s;
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].hits, 3);
  EXPECT_GT(f.entries()[0].cse_merged, 0);
}

TEST(CompileTrain, GptWithDynamicBatchDerivesNewSizes) {
  nn::GPTConfig cfg{.vocab_size = 32, .context = 8, .width = 16, .layers = 1, .heads = 2};
  Generator g1(4), g2(4);
  nn::GPT eager(cfg, {.gen = &g1}), compiled(cfg, {.gen = &g2});
  optim::AdamW eager_opt(eager.parameters(), {.lr = 3e-3});
  optim::AdamW opt(compiled.parameters(), {.lr = 3e-3});
  auto step = [](nn::GPT& m, optim::Optimizer& o, const Tensor& idx, const Tensor& tgt) {
    o.zero_grad();
    Tensor loss = m.loss(idx, tgt);
    loss.backward();
    o.step();
    return loss.detach();
  };
  CompiledFunction f =
      compile([&](const Tensor& idx, const Tensor& tgt) { return step(compiled, opt, idx, tgt); },
              {.name = "gpt_step", .dynamic = {{0, 0}, {1, 0}}});
  Generator data(13);
  int s = 0;
  for (int64_t b : {2, 2, 4, 6, 3, 4, 8}) {
    ++s;
    Tensor idx = randint(0, 32, {b, 8}, &data), tgt = randint(0, 32, {b, 8}, &data);
    Tensor want = step(eager, eager_opt, idx, tgt);
    EXPECT_EQ(f({idx, tgt})[0].item<float>(), want.item<float>()) << "batch " << b;
    expect_params_equal(eager, compiled, s);
  }
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(f.entries()[0].sizes_derived, 3) << f.explain();  // 6, 3 and 8
}

}  // namespace
}  // namespace kiln
