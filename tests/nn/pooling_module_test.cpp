// kiln/nn/pooling.h: MaxPool2d, AvgPool2d and AdaptiveAvgPool2d against libtorch's modules on the
// same inputs (every option, batched and unbatched), gradients through them, no parameters, and
// the constructor errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kiln/core/error.h"
#include "kiln/nn/pooling.h"
#include "kiln/ops/ops.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want) {
  return close_to_aten(got, want, 1e-5, 1e-6);
}

const std::vector<Shape> kShapes = {Shape{2, 3, 9, 8}, Shape{3, 9, 8}};

TEST(PoolingModuleTest, MaxPool2dMatchesTorchForEveryOption) {
  Generator gen(50);
  struct Case {
    std::vector<int64_t> kernel;
    nn::MaxPoolOptions opt;
    torch::nn::MaxPool2dOptions want;
  };
  std::vector<Case> cases = {
      {{2}, {}, torch::nn::MaxPool2dOptions(2)},
      {{3}, {.stride = {2}, .padding = {1}}, torch::nn::MaxPool2dOptions(3).stride(2).padding(1)},
      {{3, 2},
       {.stride = {1, 2}, .padding = {1, 0}, .dilation = {2, 1}, .ceil_mode = true},
       torch::nn::MaxPool2dOptions({3, 2})
           .stride({1, 2})
           .padding({1, 0})
           .dilation({2, 1})
           .ceil_mode(true)},
  };
  for (const Case& c : cases) {
    nn::MaxPool2d pool(c.kernel, c.opt);
    torch::nn::MaxPool2d ref(c.want);
    EXPECT_TRUE(pool.named_parameters().empty());
    for (const Shape& shape : kShapes) {
      Tensor x = randn(shape, &gen, kFloat32);
      EXPECT_TRUE(close(pool(x), ref->forward(to_aten(x)))) << shape.size();
    }
  }
}

TEST(PoolingModuleTest, AvgPool2dMatchesTorchForEveryOption) {
  Generator gen(51);
  struct Case {
    std::vector<int64_t> kernel;
    nn::AvgPoolOptions opt;
    torch::nn::AvgPool2dOptions want;
  };
  std::vector<Case> cases = {
      {{2}, {}, torch::nn::AvgPool2dOptions(2)},
      {{3},
       {.stride = {2}, .padding = {1}, .count_include_pad = false},
       torch::nn::AvgPool2dOptions(3).stride(2).padding(1).count_include_pad(false)},
      {{3, 2},
       {.stride = {2, 1}, .padding = {1, 0}, .ceil_mode = true, .divisor_override = 4},
       torch::nn::AvgPool2dOptions({3, 2})
           .stride({2, 1})
           .padding({1, 0})
           .ceil_mode(true)
           .divisor_override(4)},
  };
  for (const Case& c : cases) {
    nn::AvgPool2d pool(c.kernel, c.opt);
    torch::nn::AvgPool2d ref(c.want);
    for (const Shape& shape : kShapes) {
      Tensor x = randn(shape, &gen, kFloat32);
      EXPECT_TRUE(close(pool(x), ref->forward(to_aten(x)))) << shape.size();
    }
  }
}

TEST(PoolingModuleTest, AdaptiveAvgPool2dMatchesTorch) {
  Generator gen(52);
  for (std::vector<int64_t> size : {std::vector<int64_t>{1}, {4}, {3, 5}}) {
    nn::AdaptiveAvgPool2d pool(size);
    EXPECT_EQ(pool.output_size.size(), 2u);
    torch::nn::AdaptiveAvgPool2d ref(
        torch::nn::AdaptiveAvgPool2dOptions({pool.output_size[0], pool.output_size[1]}));
    for (const Shape& shape : kShapes) {
      Tensor x = randn(shape, &gen, kFloat32);
      EXPECT_TRUE(close(pool(x), ref->forward(to_aten(x)))) << size.size();
    }
  }
}

TEST(PoolingModuleTest, GradientsMatchTorch) {
  Generator gen(53);
  Tensor x = randn({2, 3, 8, 8}, &gen, kFloat32);
  x.requires_grad_(true);
  nn::MaxPool2d mp({2});
  nn::AvgPool2d ap({3}, {.stride = {1}, .padding = {1}});
  nn::AdaptiveAvgPool2d gp({1});
  Tensor loss = sum(mul(gp(ap(mp(x))), 2.0));
  loss.backward();
  torch::Tensor tx = to_aten(x.detach()).requires_grad_(true);
  torch::Tensor tl =
      (torch::adaptive_avg_pool2d(torch::avg_pool2d(torch::max_pool2d(tx, 2), 3, 1, 1), {1, 1}) *
       2.0)
          .sum();
  tl.backward();
  EXPECT_TRUE(close(x.grad(), tx.grad()));
}

TEST(PoolingModuleTest, ConstructorErrors) {
  auto raises = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "no error for " << what;
  };
  raises([] { nn::MaxPool2d({0}); }, "[MaxPool2d] kernel_size must be at least 1, got [0]");
  raises([] { nn::MaxPool2d({2, 2, 2}); }, "[MaxPool2d] kernel_size must have 1 or 2 values");
  raises([] { nn::MaxPool2d({2}, {.dilation = {0}}); }, "[MaxPool2d] dilation must be at least 1");
  raises([] { nn::AvgPool2d({2}, {.padding = {-1}}); }, "[AvgPool2d] padding must be at least 0");
  raises([] { nn::AvgPool2d({2}, {.divisor_override = 0}); },
         "[AvgPool2d] divisor_override must not be zero");
  raises([] { nn::AdaptiveAvgPool2d({-1}); }, "[AdaptiveAvgPool2d] output_size must be at least 0");
  // Bad geometry for an input is the functional op's error.
  nn::MaxPool2d pool({3}, {.padding = {2}});
  raises([&] { pool(ones({1, 1, 4, 4})); }, "[max_pool2d_with_indices] padding");
}

}  // namespace
}  // namespace kiln::test
