// kiln/nn/upsample.h: nn::Upsample against torch::nn::Upsample on the same inputs (size and
// scale_factor, nearest, linear and bilinear, align_corners), gradients through it against
// libtorch's autograd, no parameters, and the constructor errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "kiln/core/error.h"
#include "kiln/nn/upsample.h"
#include "kiln/ops/ops.h"
#include "tests/ops/aten_compare.h"

namespace kiln::test {
namespace {

testing::AssertionResult close(const Tensor& got, const torch::Tensor& want) {
  return close_to_aten(got, want, 1e-5, 1e-6);
}

struct Case {
  nn::UpsampleOptions opt;
  torch::nn::UpsampleOptions want;
  Shape x;
};

std::vector<Case> cases() {
  using torch::nn::UpsampleOptions;
  return {
      {{.size = std::vector<int64_t>{7, 9}},
       UpsampleOptions().size(std::vector<int64_t>{7, 9}),
       Shape{2, 3, 4, 5}},
      {{.scale_factor = std::vector<double>{2}},
       UpsampleOptions().scale_factor(std::vector<double>{2, 2}),
       Shape{2, 3, 4, 5}},
      {{.scale_factor = std::vector<double>{1.5, 0.5}, .mode = "bilinear"},
       UpsampleOptions().scale_factor(std::vector<double>{1.5, 0.5}).mode(torch::kBilinear),
       Shape{1, 2, 6, 8}},
      {{.size = std::vector<int64_t>{9, 3}, .mode = "bilinear", .align_corners = true},
       UpsampleOptions()
           .size(std::vector<int64_t>{9, 3})
           .mode(torch::kBilinear)
           .align_corners(true),
       Shape{2, 2, 4, 5}},
      {{.size = std::vector<int64_t>{11}, .mode = "linear"},
       UpsampleOptions().size(std::vector<int64_t>{11}).mode(torch::kLinear),
       Shape{2, 3, 5}},
      {{.scale_factor = std::vector<double>{3}},
       UpsampleOptions().scale_factor(std::vector<double>{3}),
       Shape{2, 3, 5}},
  };
}

TEST(UpsampleModuleTest, MatchesTorchForEveryMode) {
  Generator gen(60);
  for (const Case& c : cases()) {
    nn::Upsample up(c.opt);
    torch::nn::Upsample ref(c.want);
    EXPECT_TRUE(up.named_parameters().empty());
    Tensor x = randn(c.x, &gen, kFloat32);
    EXPECT_TRUE(close(up(x), ref->forward(to_aten(x)))) << c.opt.mode << " " << c.x.size();
  }
}

TEST(UpsampleModuleTest, GradientsMatchTorch) {
  Generator gen(61);
  for (const Case& c : cases()) {
    nn::Upsample up(c.opt);
    torch::nn::Upsample ref(c.want);
    Tensor x = randn(c.x, &gen, kFloat64).requires_grad_(true);
    Tensor w = randn(up(x).sizes(), &gen, kFloat64);
    sum(mul(up(x), w)).backward();
    torch::Tensor ax = to_aten(x.detach()).requires_grad_(true);
    (ref->forward(ax) * to_aten(w)).sum().backward();
    EXPECT_TRUE(close(x.grad(), ax.grad())) << c.opt.mode;
  }
}

TEST(UpsampleModuleTest, ConstructorErrors) {
  auto expect_error = [](const nn::UpsampleOptions& o, const char* what) {
    try {
      nn::Upsample up(o);
      ADD_FAILURE() << "no error for " << what;
    } catch (const ValueError& e) {
      EXPECT_TRUE(std::string(e.what()).starts_with("[Upsample]")) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error({}, "exactly one of size and scale_factor");
  expect_error({.size = std::vector<int64_t>{4}, .scale_factor = std::vector<double>{2}},
               "exactly one of size and scale_factor");
  expect_error({.size = std::vector<int64_t>{0, 4}}, "size must be positive");
  expect_error({.scale_factor = std::vector<double>{-1}}, "scale_factor must be positive");
  expect_error({.size = std::vector<int64_t>{4}, .mode = "bicubic"}, "bicubic");
  expect_error({.size = std::vector<int64_t>{4}, .align_corners = true}, "align_corners");
  // The input's rank is interpolate's check.
  nn::Upsample up({.size = std::vector<int64_t>{4}, .mode = "bilinear"});
  EXPECT_THROW(up(ones({2, 3, 5}, kFloat32)), ValueError);
}

}  // namespace
}  // namespace kiln::test
