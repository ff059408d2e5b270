#include "kiln/dtensor/sharding_rule.h"

#include <mutex>
#include <unordered_map>

namespace kiln::dtensor {

namespace {

std::mutex& exclusions_mu() {
  static auto* m = new std::mutex();
  return *m;
}
std::unordered_map<const OpDef*, std::string>& exclusions() {
  static auto* m = new std::unordered_map<const OpDef*, std::string>();
  return *m;
}

}  // namespace

void set_sharding_rule(const OpDef& op, const ShardingRule* rule) {
  const_cast<OpDef&>(op).set_sharding_rule(rule);
}
const ShardingRule* sharding_rule_of(const OpDef& op) {
  return static_cast<const ShardingRule*>(op.sharding_rule());
}
void set_sharding_exclusion(const OpDef& op, std::string_view reason) {
  std::lock_guard<std::mutex> lock(exclusions_mu());
  exclusions()[&op] = std::string(reason);
}
std::string_view sharding_exclusion_of(const OpDef& op) {
  std::lock_guard<std::mutex> lock(exclusions_mu());
  auto it = exclusions().find(&op);
  return it == exclusions().end() ? std::string_view() : std::string_view(it->second);
}

int64_t ShardingCall::input_at(size_t pos) const {
  for (size_t i = 0; i < positions_.size(); ++i)
    if (positions_[i] == pos) return static_cast<int64_t>(i);
  return -1;
}
int64_t ShardingCall::int_arg(size_t pos) const { return std::get<int64_t>(args_[pos]); }
bool ShardingCall::bool_arg(size_t pos) const { return std::get<bool>(args_[pos]); }
IntArrayRef ShardingCall::ints_arg(size_t pos) const { return std::get<Shape>(args_[pos]).span(); }
bool ShardingCall::is_none(size_t pos) const {
  return std::holds_alternative<std::monostate>(args_[pos]);
}
int64_t ShardingCall::tensor_ndim(size_t pos) const {
  const Tensor& t = std::get<Tensor>(args_[pos]);
  return t.defined() ? t.dim() : 0;
}

// Bus bytes, as nccl-tests count them, of the collective that moves a shard (L bytes, the
// average over the ranks) from its placement to `to` along a mesh dim of n ranks.
double redistribute_bytes(const DTensorSpec& spec, int64_t mesh_dim, const Placement& to) {
  const Placement& from = spec.placement(mesh_dim);
  const double n = static_cast<double>(spec.mesh().size(mesh_dim));
  if (from == to || n == 1) return 0;
  // The average shard, not this rank's: every rank must price (and so decide) alike, and
  // uneven chunks differ between ranks.
  double local = static_cast<double>(itemsize(spec.dtype()));
  for (int64_t s : spec.shape()) local *= static_cast<double>(s);
  for (int64_t k = 0; k < spec.mesh().ndim(); ++k)
    if (spec.placement(k).is_shard()) local /= static_cast<double>(spec.mesh().size(k));
  const double gather = (n - 1) * local;          // Shard -> Replicate
  const double reduce = 2 * (n - 1) / n * local;  // Partial -> Replicate
  if (from.is_replicate()) return 0;              // a local chunk or a local partial
  if (from.is_shard()) {
    if (to.is_replicate()) return gather;
    if (to.is_shard()) return (n - 1) / n * local;  // all_to_all
    return gather;                                  // through Replicate
  }
  if (to.is_shard()) return (n - 1) / n * local;  // reduce_scatter
  return reduce;                                  // to Replicate, or through it
}

}  // namespace kiln::dtensor
