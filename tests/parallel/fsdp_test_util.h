#pragma once
// The fixture shared by the FSDP tests (fsdp_test.cpp, fsdp_mp_test.cpp): the world, the 1-D
// cpu mesh every rank shards over, a rank's share of a batch, the mean loss over the ranks, a
// tolerance check against a one-process reference, and an error's message.
#include <gtest/gtest.h>

#include <exception>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/ops/ops.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {

inline const Device kCpu{kCPU};
inline int64_t world() { return dist::world_size(); }
inline int64_t rank() { return dist::rank(); }
inline const dt::DeviceMesh& mesh() { return mesh_1d(kCpu); }

// |got - want| <= tol * (1 + max |want|) elementwise, after the sizes agree.
inline ::testing::AssertionResult close(const Tensor& got, const Tensor& want, double tol) {
  if (got.sizes() != want.sizes())
    return ::testing::AssertionFailure() << fmt::format(
               "sizes [{}] vs [{}]", fmt::join(got.sizes(), ", "), fmt::join(want.sizes(), ", "));
  Tensor g = got.to(kFloat64), w = want.to(kFloat64);
  double err = g.numel() ? amax(abs(sub(g, w))).item<double>() : 0;
  double scale = w.numel() ? amax(abs(w)).item<double>() : 0;
  if (err <= tol * (1 + scale)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max error " << err << " (scale " << scale << ")";
}

// This rank's rows of a batch whose dim 0 has `per_rank` rows per rank.
inline Tensor share(const Tensor& batch, int64_t per_rank) {
  return narrow(batch, 0, rank() * per_rank, per_rank).contiguous();
}

// The mean over the ranks of a local scalar (what the whole batch's mean loss is).
inline Tensor mean_over_ranks(const Tensor& loss) {
  Tensor l = loss.detach();
  return world() == 1 ? l : dist::all_reduce(l, dist::ReduceOp::Avg);
}

inline Tensor mse(const Tensor& y, const Tensor& target) { return mean(pow(sub(y, target), 2.0)); }

// What f throws, or "(no error)".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace kiln::test
