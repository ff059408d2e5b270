// Every op in kiln::ops::all_ops() is complete: a meta function and kernels for the CPU and
// Meta dispatch keys (see kiln/ops/op_list.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

}  // namespace
}  // namespace kiln
