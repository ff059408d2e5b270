// Advanced indexing under kiln::compile: index/index_put with None entries in their index list
// trace and replay (an undefined list element is a None argument of the node), and nonzero,
// whose result size depends on the data, is a graph break that names it (a bool mask index goes
// through it), in piecewise mode too.
#include <gtest/gtest.h>

#include "kiln/compile/compile.h"
#include "kiln/ops/indexing.h"

namespace kiln {
namespace {

Tensor rnd(IntArrayRef sizes, uint64_t seed) {
  Generator g(seed);
  return randn(sizes, &g, kFloat32);
}
void expect_equal(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
}

TensorList gather_and_scatter(const Tensor& x, const Tensor& idx) {
  Tensor picked = index(x, TensorList{Tensor(), idx});  // x[:, idx]
  Tensor back = index_put(zeros_like(x), TensorList{Tensor(), idx}, mul(picked, 2.0), true);
  return {picked, back};
}

TEST(CompileIndexing, IndexWithNoneReplaysWithNewIndexValues) {
  CompiledFunction f =
      compile([](const Tensor& x, const Tensor& idx) { return gather_and_scatter(x, idx); });
  for (int i = 0; i < 3; ++i) {
    Tensor x = rnd({3, 5}, 10 + i);
    Tensor idx = from_vector<int64_t>({i, 4 - i, -1, i}, {4});
    TensorList got = f({x, idx}), want = gather_and_scatter(x, idx);
    expect_equal(got[0], want[0]);
    expect_equal(got[1], want[1]);
  }
  EXPECT_EQ(f.entries().size(), 1u);
  EXPECT_NE(f.graph_str().find("None"), std::string::npos) << f.graph_str();
}

TEST(CompileIndexing, NonzeroIsAGraphBreakNamingIt) {
  CompiledFunction f = compile([](const Tensor& x) { return nonzero(gt(x, 0.0)); }, {.name = "nz"});
  try {
    f({rnd({4}, 1)});
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[compile] 'nz': graph break"), std::string::npos) << m;
    EXPECT_NE(m.find("nonzero() of %"), std::string::npos) << m;
  }
}

TEST(CompileIndexing, MaskIndexIsAGraphBreakThroughNonzero) {
  CompiledFunction f = compile(
      [](const Tensor& x) {
        using namespace kiln::indexing;
        return x.index({gt(x, 0.0)});
      },
      {.name = "masked"});
  try {
    f({rnd({6}, 2)});
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("nonzero() of %"), std::string::npos) << m;
  }
}

// piecewise cannot help: the ops after nonzero would replay the traced count.
TEST(CompileIndexing, MaskIndexFailsUnderPiecewiseToo) {
  CompiledFunction f = compile([](const Tensor& x) { return exp(x.index({gt(x, 0.0)})); },
                               {.name = "masked", .piecewise = true});
  try {
    f({rnd({8}, 3)});
    FAIL() << "expected a CompileError";
  } catch (const CompileError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("a result's size depends on tensor values"), std::string::npos) << m;
    EXPECT_NE(m.find("nonzero() of %"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace kiln
