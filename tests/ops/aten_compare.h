#pragma once
// Helpers shared by the tests whose oracle is libtorch: comparing a Kiln result with an ATen
// one, and expecting a ValueError with given message parts.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "tests/ops/torch_bridge.h"

namespace kiln::test {

// |kiln - aten| <= atol + rtol * |aten| elementwise, with matching shape and dtype. A failure
// counts the elements out of tolerance and shows the worst one.
inline testing::AssertionResult close_to_aten(const Tensor& got, const at::Tensor& want,
                                              double rtol, double atol) {
  if (!got.defined() || !want.defined())
    return testing::AssertionFailure()
           << "undefined: kiln " << got.defined() << ", torch " << want.defined();
  at::Tensor g = to_aten(got);
  if (g.sizes() != want.sizes() || g.scalar_type() != want.scalar_type())
    return testing::AssertionFailure() << "kiln " << g.sizes() << " " << g.scalar_type()
                                       << ", torch " << want.sizes() << " " << want.scalar_type();
  at::Tensor err = (g.to(at::kDouble) - want.to(at::kDouble)).abs();
  at::Tensor bound = want.to(at::kDouble).abs() * rtol + atol;
  at::Tensor bad = err > bound;
  if (!bad.any().item<bool>()) return testing::AssertionSuccess();
  int64_t worst = (err - bound).flatten().argmax().item<int64_t>();
  return testing::AssertionFailure()
         << bad.sum().item<int64_t>() << " of " << err.numel() << " elements out of tolerance; "
         << "max error " << err.max().item<double>() << "; worst at flat index " << worst
         << ": kiln " << g.flatten()[worst].item<double>() << ", torch "
         << want.flatten()[worst].item<double>();
}

// Bitwise-equal values (same shape and dtype).
inline bool same_values(const Tensor& a, const Tensor& b) { return to_aten(a).equal(to_aten(b)); }

// Runs f, expecting kiln::ValueError whose message contains every one of `parts`.
inline void expect_value_error(const std::function<void()>& f,
                               const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing '" << parts.front() << "'";
  } catch (const ValueError& e) {
    std::string msg = e.what();
    for (const std::string& part : parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

}  // namespace kiln::test
