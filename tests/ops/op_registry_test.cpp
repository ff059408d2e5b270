// Every op in kiln::ops::all_ops() is complete: a meta function and kernels for the CPU and
// Meta dispatch keys (see kiln/ops/op_list.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kiln/dtensor/sharding_rule.h"
#include "kiln/ops/op_list.h"

namespace kiln {
namespace {

// The ops among all_ops() for which `missing` holds, comma-separated.
template <class Pred>
std::string ops_where(Pred missing) {
  std::string out;
  for (const OpDef* op : ops::all_ops()) {
    if (!missing(*op)) continue;
    if (!out.empty()) out += ", ";
    out += op->name();
  }
  return out;
}

TEST(OpRegistryTest, ListIsNotEmpty) { EXPECT_GT(ops::all_ops().size(), 100u); }

TEST(OpRegistryTest, EveryOpHasAMetaFunction) {
  EXPECT_EQ(ops_where([](const OpDef& op) { return !op.has_meta(); }), "")
      << "ops without a meta function";
}

TEST(OpRegistryTest, EveryOpHasACpuKernel) {
  EXPECT_EQ(ops_where([](const OpDef& op) { return !op.has_kernel(DispatchKey::CPU); }), "")
      << "ops without a CPU kernel";
}

TEST(OpRegistryTest, EveryOpHasAMetaKernel) {
  EXPECT_EQ(ops_where([](const OpDef& op) { return !op.has_kernel(DispatchKey::Meta); }), "")
      << "ops without a Meta kernel";
}

TEST(OpRegistryTest, EveryOpIsFoundByName) {
  for (const OpDef* op : ops::all_ops()) EXPECT_EQ(ops::find_op(op->name()), op) << op->name();
}

bool registered(const OpDef* op) {
  return std::ranges::find(ops::all_ops(), op) != ops::all_ops().end();
}

// Note [Op variants] in kiln/dispatch/op.h: the forms of one op point at each other, and a
// form's name is its functional form's plus "_" or "_out".
TEST(OpRecordTest, VariantsPointAtEachOther) {
  int families = 0;
  for (const OpDef* op : ops::all_ops()) {
    const OpDef* f = op->functional_variant();
    if (!f) {
      EXPECT_EQ(op->inplace_variant(), nullptr) << op->name();
      EXPECT_EQ(op->out_variant(), nullptr) << op->name();
      continue;
    }
    SCOPED_TRACE(std::string(op->name()));
    EXPECT_TRUE(registered(f));
    EXPECT_EQ(f->kind(), OpKind::Functional);
    EXPECT_EQ(f->functional_variant(), f);
    EXPECT_EQ(op->inplace_variant(), f->inplace_variant());
    EXPECT_EQ(op->out_variant(), f->out_variant());
    // A family has an in-place form, an out= form or both (all_reduce has no out=).
    ASSERT_TRUE(f->out_variant() || f->inplace_variant());
    if (const OpDef* o = f->out_variant()) {
      EXPECT_TRUE(registered(o));
      EXPECT_EQ(o->kind(), OpKind::Out);
      EXPECT_EQ(o->name(), std::string(f->name()) + "_out");
    }
    if (const OpDef* i = f->inplace_variant()) {
      EXPECT_TRUE(registered(i));
      EXPECT_EQ(i->kind(), OpKind::InPlace);
      EXPECT_EQ(i->name(), std::string(f->name()) + "_");
    }
    if (op == f) ++families;
  }
  EXPECT_EQ(ops::op_add.def.inplace_variant(), &ops::op_add_.def);
  EXPECT_EQ(ops::op_sum.def.out_variant(), &ops::op_sum_out.def);
  EXPECT_EQ(ops::op_sum.def.inplace_variant(), nullptr);
  EXPECT_GT(families, 50);
}

// Note [Op record fields for later layers] in kiln/dispatch/op.h: a field that no op sets yet is
// pending (its issue fills it in); from the first op that sets it on, every op must set it or
// be listed in `exempt` with a reason.
template <class IsSet>
void expect_all_or_none(const char* field, IsSet is_set,
                        const std::vector<std::string_view>& exempt = {}) {
  std::string missing = ops_where([&](const OpDef& op) {
    return !is_set(op) && std::ranges::find(exempt, op.name()) == exempt.end();
  });
  if (missing.size() > 0 && ops_where([&](const OpDef& op) { return is_set(op); }).empty())
    GTEST_SKIP() << "no op has a " << field << " yet";
  EXPECT_EQ(missing, "") << "ops without a " << field;
}

// An op without a rule has one on purpose: its reason is kiln/dtensor's (rule_exclusions.cpp;
// tests/dtensor/sharding_coverage_test.cpp checks the reasons too).
TEST(OpRecordTest, ShardingRuleCoverage) {
  expect_all_or_none("sharding rule or exclusion", [](const OpDef& op) {
    return op.sharding_rule() || !dtensor::sharding_exclusion_of(op).empty();
  });
}

TEST(OpRecordTest, AutocastPolicyCoverage) {
  expect_all_or_none("mixed-precision policy",
                     [](const OpDef& op) { return op.autocast_policy() != AutocastPolicy::Unset; });
}

TEST(OpRecordTest, PythonExposureCoverage) {
  expect_all_or_none("Python exposure",
                     [](const OpDef& op) { return op.python_exposure() != PythonExposure::Unset; });
}

}  // namespace
}  // namespace kiln
