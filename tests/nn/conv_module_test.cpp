// kiln/nn/conv.h: Conv1d/2d/3d and ConvTranspose1d/2d/3d against libtorch's functional
// convolutions on the modules' own weights (every option, batched and unbatched), parameter
// names and shapes as torch.nn's, initialisation bounds, gradients reaching the parameters, and
// the constructor errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/nn/conv.h"
#include "kiln/ops/ops.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

namespace F = torch::nn::functional;

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want) {
  return close_to_aten(got, want, 1e-4, 1e-5);
}

torch::Tensor aten_bias(const Tensor& b) { return b.defined() ? to_aten(b) : torch::Tensor(); }

TEST(ConvModuleTest, Conv2dMatchesTorchForEveryOption) {
  Generator gen(40);
  struct Case {
    nn::ConvOptions opt;
    std::vector<int64_t> kernel;
  };
  std::vector<Case> cases = {
      {{}, {3}},
      {{.stride = {2}, .padding = {1}}, {3}},
      {{.stride = {1, 2}, .padding = {0, 1}, .dilation = {2, 1}}, {3, 2}},
      {{.padding_str = "same", .dilation = {2}}, {4}},
      {{.padding_str = "valid", .groups = 2, .bias = false}, {3}},
  };
  for (const Case& c : cases) {
    nn::Conv2d conv(4, 6, c.kernel, c.opt, {.gen = &gen});
    for (Shape shape : {Shape{2, 4, 9, 8}, Shape{4, 9, 8}}) {
      Tensor x = randn(shape, &gen, kFloat32);
      torch::Tensor want;
      if (c.opt.padding_str.empty())
        want = torch::conv2d(to_aten(x), to_aten(conv.weight), aten_bias(conv.bias), c.opt.stride,
                             c.opt.padding, c.opt.dilation, c.opt.groups);
      else
        want = F::conv2d(
            to_aten(x), to_aten(conv.weight),
            F::Conv2dFuncOptions()
                .bias(aten_bias(conv.bias))
                .stride(c.opt.stride.size() == 1 ? std::vector<int64_t>(2, c.opt.stride[0])
                                                 : c.opt.stride)
                .padding(c.opt.padding_str == "same"
                             ? F::Conv2dFuncOptions::padding_t(torch::kSame)
                             : F::Conv2dFuncOptions::padding_t(torch::kValid))
                .dilation(c.opt.dilation.size() == 1 ? std::vector<int64_t>(2, c.opt.dilation[0])
                                                     : c.opt.dilation)
                .groups(c.opt.groups));
      EXPECT_TRUE(close(conv(x), want)) << shape.size();
    }
  }
}

TEST(ConvModuleTest, Conv1dAnd3dMatchTorch) {
  Generator gen(41);
  nn::Conv1d c1(3, 5, {3}, {.stride = {2}, .padding = {1}}, {.gen = &gen});
  Tensor x1 = randn({2, 3, 11}, &gen, kFloat32);
  EXPECT_TRUE(
      close(c1(x1), torch::conv1d(to_aten(x1), to_aten(c1.weight), to_aten(c1.bias), 2, 1)));
  nn::Conv3d c3(2, 4, {2, 3, 3}, {.padding = {1}, .groups = 2}, {.gen = &gen});
  Tensor x3 = randn({2, 2, 5, 6, 6}, &gen, kFloat32);
  EXPECT_TRUE(
      close(c3(x3), torch::conv3d(to_aten(x3), to_aten(c3.weight), to_aten(c3.bias), 1, 1, 1, 2)));
}

TEST(ConvModuleTest, ConvTransposeMatchesTorch) {
  Generator gen(42);
  nn::ConvTranspose2d t2(4, 6, {3},
                         {.stride = {2}, .padding = {1}, .output_padding = {1}, .groups = 2},
                         {.gen = &gen});
  EXPECT_EQ(t2.weight.sizes(), IntArrayRef({4, 3, 3, 3}));
  for (Shape shape : {Shape{2, 4, 5, 7}, Shape{4, 5, 7}}) {
    Tensor x = randn(shape, &gen, kFloat32);
    EXPECT_TRUE(close(t2(x), torch::conv_transpose2d(to_aten(x), to_aten(t2.weight),
                                                     to_aten(t2.bias), 2, 1, 1, 2)))
        << shape.size();
  }
  nn::ConvTranspose1d t1(3, 2, {4}, {.stride = {3}, .bias = false}, {.gen = &gen});
  Tensor x1 = randn({2, 3, 6}, &gen, kFloat32);
  EXPECT_FALSE(t1.bias.defined());
  EXPECT_TRUE(close(t1(x1), torch::conv_transpose1d(to_aten(x1), to_aten(t1.weight), {}, 3)));
  nn::ConvTranspose3d t3(2, 2, {2}, {.dilation = {2}}, {.gen = &gen});
  Tensor x3 = randn({1, 2, 3, 4, 3}, &gen, kFloat32);
  EXPECT_TRUE(close(t3(x3), torch::conv_transpose3d(to_aten(x3), to_aten(t3.weight),
                                                    to_aten(t3.bias), 1, 0, 0, 1, 2)));
}

TEST(ConvModuleTest, ParametersNamesShapesAndInitBounds) {
  Generator gen(43);
  nn::Conv2d conv(8, 16, {3, 5}, {.groups = 2}, {.gen = &gen});
  auto named = conv.named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_EQ(named[0].first, "weight");
  EXPECT_EQ(named[1].first, "bias");
  EXPECT_EQ(conv.weight.sizes(), IntArrayRef({16, 4, 3, 5}));
  EXPECT_EQ(conv.bias.sizes(), IntArrayRef({16}));
  const double bound = 1.0 / std::sqrt(4.0 * 3 * 5);  // fan_in = in / groups * kernel
  for (const Tensor* t : {&conv.weight, &conv.bias}) {
    torch::Tensor a = to_aten(*t);
    EXPECT_LE(a.abs().max().item<double>(), bound);
    EXPECT_GT(a.abs().max().item<double>(), 0.8 * bound);
    EXPECT_TRUE(t->requires_grad());
  }
  nn::Conv2d no_bias(2, 3, {3}, {.bias = false});
  EXPECT_EQ(no_bias.named_parameters().size(), 1u);
}

TEST(ConvModuleTest, GradientsReachParameters) {
  Generator gen(44);
  nn::Conv2d conv(2, 3, {3}, {.padding = {1}}, {.gen = &gen});
  Tensor x = randn({2, 2, 6, 6}, &gen, kFloat32);
  sum(conv(x)).backward();
  ASSERT_TRUE(conv.weight.grad().defined());
  ASSERT_TRUE(conv.bias.grad().defined());
  torch::Tensor w = to_aten(conv.weight).detach().requires_grad_(true);
  torch::Tensor b = to_aten(conv.bias).detach().requires_grad_(true);
  torch::conv2d(to_aten(x), w, b, 1, 1).sum().backward();
  EXPECT_TRUE(close(conv.weight.grad(), w.grad()));
  EXPECT_TRUE(close(conv.bias.grad(), b.grad()));
}

TEST(ConvModuleTest, ConstructorErrors) {
  expect_value_error([] { nn::Conv2d(0, 4, {3}); }, {"[Conv]", "in=0"});
  expect_value_error([] { nn::Conv2d(4, 6, {3}, {.groups = 4}); },
                     {"[Conv]", "groups=4", "out_channels=6"});
  expect_value_error([] { nn::Conv2d(4, 6, {3, 3, 3}); }, {"[Conv]", "kernel_size", "[3, 3, 3]"});
  expect_value_error([] { nn::Conv2d(4, 6, {0}); }, {"[Conv]", "kernel_size", "at least 1"});
  expect_value_error([] { nn::Conv1d(4, 6, {3}, {.stride = {0}}); }, {"[Conv]", "stride"});
  expect_value_error([] { nn::Conv2d(4, 6, {3}, {.padding = {-1}}); }, {"[Conv]", "padding"});
  expect_value_error([] { nn::Conv2d(4, 6, {3}, {.padding_str = "full"}); }, {"[Conv]", "full"});
  expect_value_error([] { nn::Conv2d(4, 6, {3}, {.stride = {2}, .padding_str = "same"}); },
                     {"[Conv]", "same", "stride"});
  expect_value_error([] { nn::ConvTranspose2d(4, 6, {3}, {.output_padding = {-1}}); },
                     {"[ConvTranspose]", "output_padding"});
  expect_value_error([] { nn::ConvTranspose2d(3, 6, {3}, {.groups = 2}); },
                     {"[ConvTranspose]", "groups=2", "in_channels=3"});
  // A wrong input rank reaches the op's own message.
  nn::Conv2d conv(4, 6, {3});
  EXPECT_THROW(conv(ones({4, 9})), Error);
}

}  // namespace
}  // namespace kiln::test
