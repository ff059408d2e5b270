// Every op has a sharding rule or an explicit exclusion with its reason (kiln/dtensor/
// sharding_rule.h, rule_exclusions.cpp): a new op without either fails here, naming it.
#include <gtest/gtest.h>

#include <string>

#include "kiln/dtensor/sharding_rule.h"
#include "kiln/ops/op_list.h"
#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

TEST(ShardingCoverage, EveryOpHasARuleOrAReason) {
  std::string missing, both;
  for (const OpDef* op : ops::all_ops()) {
    const bool rule = dt::sharding_rule_of(*op) != nullptr;
    const bool excluded = !dt::sharding_exclusion_of(*op).empty();
    if (!rule && !excluded) missing += (missing.empty() ? "" : ", ") + std::string(op->name());
    if (rule && excluded) both += (both.empty() ? "" : ", ") + std::string(op->name());
  }
  EXPECT_EQ(missing, "") << "ops with neither a sharding rule nor an exclusion";
  EXPECT_EQ(both, "") << "ops with a sharding rule and an exclusion";
}

TEST(ShardingCoverage, EveryRuleIsNamed) {
  for (const OpDef* op : ops::all_ops())
    if (const dt::ShardingRule* r = dt::sharding_rule_of(*op)) {
      EXPECT_FALSE(r->name.empty()) << op->name();
      EXPECT_NE(r->fn, nullptr) << op->name();
    }
}

// An excluded op on a DTensor is a NotImplementedError that names it and gives the reason.
TEST(ShardingCoverage, AnExcludedOpGivesItsReason) {
  const Device d(kCPU);
  Tensor a = dt::distribute_tensor(global_tensor({4, 6}, kFloat32, d), mesh_1d(d), {dt::Shard(0)});
  EXPECT_THROW_CONTAINS(
      dist::all_reduce(a), NotImplementedError,
      "[all_reduce] has no sharding rule: a collective works on this rank's local tensor");
  EXPECT_EQ(dt::sharding_exclusion_of(ops::op_rand.def).substr(0, 36),
            "a factory takes no tensor, so a call");
}

}  // namespace
}  // namespace kiln::test
