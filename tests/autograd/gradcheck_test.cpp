// kiln::autograd::gradcheck itself (it must see a view output at x + eps and x - eps, and must
// reject a wrong gradient), and the autograd coverage checks that need no op table: every op
// says how it differentiates, and out= variants and foreach updates are refused.
//
// Every backward formula is checked against finite differences by the op table's records
// (tests/ops/op_test_*.cpp): each record's gradcheck samples run in kiln_op_test's
// Gradcheck/OpGradcheck suite, and OpCoverage.EveryFormulaHasAGradcheck there fails when an
// op with a formula has none (see Note [The op record] in tests/ops/op_test.cpp).
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>

#include "kiln/autograd/derivative.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::test {
namespace {

// Uniform in [-2, 2], float64, requiring grad; deterministic per seed.
Tensor var(const std::string& seed, int64_t n) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(seed)));
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = std::uniform_real_distribution<double>(-2, 2)(rng);
  return from_vector(v).requires_grad_();
}

// gradcheck itself: a function whose output is a view of its input. Central differences must
// see the output at x + eps and at x - eps; if gradcheck keeps the two results and reads them
// after the next perturbation (or after restoring x), both alias the input's current values and
// the numerical derivative is 0.
TEST(GradcheckTool, OutputThatIsAViewOfTheInput) {
  TensorList in = {var("gradcheck_view_output", 6).reshape({2, 3}).detach().requires_grad_()};
  std::string why;
  EXPECT_TRUE(autograd::gradcheck(
      [](const TensorList& x) { return TensorList{transpose(x[0], 0, 1)}; }, in, {}, &why))
      << why;
  EXPECT_TRUE(
      autograd::gradcheck([](const TensorList& x) { return TensorList{x[0]}; }, in, {}, &why))
      << why;
}

// gradcheck rejects a wrong gradient (the tool is not vacuous): a function whose backward
// ignores part of its forward (the detached factor).
TEST(GradcheckTool, DetectsAWrongGradient) {
  TensorList in = {var("gradcheck_wrong", 3)};
  std::string why;
  EXPECT_FALSE(autograd::gradcheck(
      [](const TensorList& x) { return TensorList{x[0] * x[0].detach()}; }, in, {}, &why));
  EXPECT_NE(why.find("analytical"), std::string::npos) << why;
}

// ---------------------------------------------------------------- coverage

using autograd::Differentiability;

// ..._backward ops are backward formulas themselves: Kiln has no double backward. send and
// recv_ are point-to-point: asking a gradient of them raises, as in torch.distributed.nn.
bool is_out_or_foreach(std::string_view name) {
  return name.starts_with("foreach_") || name.ends_with("_out") || name.ends_with("_backward") ||
         name == "send" || name == "recv_";
}

// Every op but the out= variants and foreach updates says how it differentiates.
TEST(AutogradCoverage, EveryOpHasADerivativeKind) {
  std::string missing;
  for (const OpDef* op : ops::all_ops()) {
    if (is_out_or_foreach(op->name())) continue;
    if (autograd::derivative_of(*op).kind == Differentiability::Unsupported)
      missing += std::string(missing.empty() ? "" : ", ") + std::string(op->name());
  }
  EXPECT_EQ(missing, "") << "ops without a backward formula or Differentiability::None";
}

// The out= variants and foreach updates are the only ops autograd refuses.
TEST(AutogradCoverage, OutAndForeachAreUnsupported) {
  for (const OpDef* op : ops::all_ops()) {
    if (!is_out_or_foreach(op->name())) continue;
    EXPECT_EQ(autograd::derivative_of(*op).kind, Differentiability::Unsupported) << op->name();
  }
}

}  // namespace
}  // namespace kiln::test
