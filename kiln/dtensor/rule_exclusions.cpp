// The ops that have no sharding rule on purpose, each with the reason (sharding_rule.h:
// set_sharding_exclusion). The Sharded layer's NotImplementedError for such an op carries the
// reason, and the coverage test (tests/dtensor/sharding_coverage_test.cpp) requires every op to
// have a rule or a reason here.
#include "kiln/dtensor/sharding_rule.h"
#include "kiln/ops/op_list.h"

namespace kiln::dtensor {
namespace {

constexpr std::string_view kFactory =
    "a factory takes no tensor, so a call never reaches the Sharded layer; make a DTensor with "
    "the DTensor factories (kiln::dtensor::full/zeros/ones/empty, and rand/randn/randint, which "
    "draw each shard's global positions), distribute_tensor or from_local";
constexpr std::string_view kCollective =
    "a collective works on this rank's local tensor and a process group; a DTensor's "
    "collectives are redistribute (kiln::dtensor::redistribute, full_tensor)";

const bool g_registered = [] {
  for (const OpDef* op : {&ops::op_empty.def, &ops::op_full.def, &ops::op_arange.def,
                          &ops::op_linspace.def, &ops::op_rand.def, &ops::op_randn.def,
                          &ops::op_randint.def, &ops::op_randperm.def, &ops::op_empty_strided.def})
    set_sharding_exclusion(*op, kFactory);
  for (const OpDef* op :
       {&ops::op_all_reduce.def, &ops::op_all_reduce_.def, &ops::op_all_gather_into_tensor.def,
        &ops::op_all_gather_into_tensor_out.def, &ops::op_reduce_scatter_tensor.def,
        &ops::op_reduce_scatter_tensor_out.def, &ops::op_broadcast.def, &ops::op_broadcast_.def,
        &ops::op_all_to_all_single.def, &ops::op_all_to_all_single_out.def, &ops::op_send.def,
        &ops::op_recv_.def, &ops::op_barrier.def})
    set_sharding_exclusion(*op, kCollective);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor
