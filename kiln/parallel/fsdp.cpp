#include "kiln/parallel/fsdp.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/ops/ops.h"
#include "kiln/parallel/fsdp_unit.h"

namespace kiln::parallel {

namespace dt = kiln::dtensor;
using dt::Placement;

// Note [FSDP units]
// fully_shard(module) makes a unit: the parameters under `module` that no unit made before
// manages (so submodules are sharded first, then their parents, as in PyTorch's FSDP2). Each
// becomes a Shard(0) DTensor leaf in its module's member (Module::named_parameter_slots), so
// parameters(), optimizers and state dicts see the shards. The unit's forward pre-hook puts the
// gathered, whole parameters (plain tensors) into those members for the duration of the call
// and its forward hook puts the shards back, so the module's forward runs unchanged on plain
// activations: each rank's own share of the batch, as under DDP. The gather is one
// all_gather_into_tensor per unit and dtype of a flat buffer in which every parameter's shard
// is padded to the ceil-sized chunk (the collective needs equal sizes), then cut back into the
// parameters; its backward (GatherBackward) is the mirror: every whole gradient padded and laid
// out rank-major into one buffer, one reduce_scatter_tensor(avg), cut into each parameter's
// local Shard(0) gradient. Averaging makes the sharded gradient the gradient of the mean of the
// ranks' losses: with equal shares of a batch and a mean loss, the whole batch's gradient. The
// gradients arrive as DTensors with the parameters' spec, so autograd's grad layout hook leaves
// them as they are. Units register themselves by module (the registry entry lives as long as
// the unit, which the module's hooks own), which is how fully_shard finds units under a module
// and refuses a second call on one. Collectives run in the same order on every rank because
// every rank runs the same forward and the engine orders backward nodes by creation. Between a
// unit's forward and its backward its gathered parameters' bytes are freed (Note [FSDP reshards
// after forward]) and gathers are started ahead of the unit that needs them (Note [FSDP
// prefetch]); both, the gather and its backward live in fsdp_unit.cpp.

// Note [FSDP and tensor parallel]
// On a 2-D mesh [dp, tp] the parameters that tensor parallel made DTensors on the mesh's second
// dim (parallelize_module on mesh.submesh({tp}) first) keep their tensor-parallel placement on
// that dim, and each rank's tensor-parallel piece is sharded over dp: a 2-D DTensor [S(k), P]
// on the whole mesh; plain parameters become [S(0), R]. k is 0 unless the tensor-parallel
// placement shards dim 0 too (a column-sharded weight, a vocab-parallel embedding), where two
// mesh dims splitting one tensor dim would nest the other way round (the later mesh dim splits
// the earlier one's chunk, so dp's chunk would be cut by tp, not tp's by dp): then k is 1, and a
// 1-D parameter sharded by tp along its only dim (a column-sharded bias) stays replicated over
// dp. The gather redistributes [S(k), P] to [R, P], an all_gather over dp, and hands the forward
// the tensor-parallel DTensor with the parameter's own tensor-parallel spec (a plain tensor for
// a plain parameter), so the tensor-parallel styles run as without FSDP. Backward takes its
// gradient to P on the tp mesh, reads the local tensor as [Partial(avg), P] and redistributes
// it to [S(k), P]: a reduce_scatter over dp (an all_reduce for a dp-replicated bias). The
// parameters are gathered one by one, not in buckets.

namespace {

using fsdp_detail::Bucket;
using fsdp_detail::find_unit;
using fsdp_detail::Layout;
using fsdp_detail::Unit;

std::string describe(const nn::Module& m) {
  if (m.path().empty()) return fmt::format("module {}", m.type_name());
  return fmt::format("module '{}' ({})", m.path(), m.type_name());
}

// The data-parallel placement of a parameter whose tensor-parallel one is `tp` (Replicate for a
// plain parameter). See Note [FSDP and tensor parallel].
Placement data_parallel_placement(Placement tp, int64_t dim) {
  if (!tp.is_shard(0)) return dt::Shard(0);
  if (dim >= 2) return dt::Shard(1);
  return dt::Replicate();
}

// A plain or tensor-parallel parameter sharded over the data-parallel dim of the 2-D `mesh`;
// records its specs in `l`. See Note [FSDP and tensor parallel].
Tensor shard_2d(const Tensor& param, const dt::DeviceMesh& mesh, Layout& l) {
  const dt::DTensorSpec* tp = dt::is_dtensor(param) ? dt::spec_of(param) : nullptr;
  const Placement tp_placement = tp ? tp->placements()[0] : Placement(dt::Replicate());
  const Placement dp = data_parallel_placement(tp_placement, param.dim());
  const dt::DTensorSpec* s =
      dt::intern_spec(mesh, {dp, tp_placement}, param.sizes(), contiguous_strides(param.sizes()),
                      param.dtype(), "fully_shard");
  l.specs.push_back(s);
  l.gathered.push_back(dt::with_placements(*s, {dt::Replicate(), tp_placement}));
  l.tp_specs.push_back(tp);
  // This rank's tensor-parallel piece (the whole for a plain parameter), rank 0's along the
  // data-parallel dim, then its data-parallel chunk.
  Tensor piece = tp ? dt::sharded_meta(param).local : param.detach();
  if (mesh.size(0) > 1) piece = distributed::broadcast(piece.contiguous(), 0, &mesh.group(0));
  if (dp.is_shard()) {
    const int64_t n = piece.size(dp.dim()), parts = mesh.size(0), c = mesh.coordinate(0);
    piece = narrow(piece, dp.dim(), dt::chunk_offset(n, parts, c), dt::chunk_length(n, parts, c));
  }
  return dt::make_dtensor(piece.contiguous().clone(), s);
}

// Adds parameter i (with spec `s`) to its dtype's bucket, whose gather and reduce dtypes follow
// `mp` (Note [FSDP mixed precision] in fsdp_unit.cpp).
void add_to_bucket(Layout& l, std::map<DType, size_t>& bucket_of, size_t i,
                   const MixedPrecisionPolicy& mp) {
  const dt::DTensorSpec& s = *l.specs[i];
  const DType t = s.dtype();
  auto [it, fresh] = bucket_of.emplace(t, l.buckets.size());
  if (fresh) {
    const bool mixed = is_floating(t);
    l.buckets.push_back(Bucket{t,
                               mixed ? mp.param_dtype.value_or(t) : t,
                               mixed ? mp.reduce_dtype.value_or(t) : t,
                               {},
                               {},
                               {},
                               0});
  }
  Bucket& b = l.buckets[it->second];
  l.gathered_dtypes.push_back(b.gather_dtype);
  int64_t len = dt::chunk_size(s.shape()[0], l.parts());
  for (size_t d = 1; d < s.shape().size(); ++d) len *= s.shape()[d];
  b.params.push_back(i);
  b.offsets.push_back(b.numel);
  b.lengths.push_back(len);
  b.numel += len;
}

}  // namespace

void fully_shard(nn::Module& module, const dt::DeviceMesh& mesh, FullyShardOptions options) {
  KILN_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2,
             "[fully_shard] takes a 1-D mesh (data parallel) or a 2-D one (data parallel, "
             "tensor parallel), got {}",
             mesh.str());
  const MixedPrecisionPolicy& mp = options.mp;
  for (auto [what, t] : {std::pair{"param_dtype", mp.param_dtype},
                         {"reduce_dtype", mp.reduce_dtype},
                         {"output_dtype", mp.output_dtype}})
    KILN_CHECK(!t || is_floating(*t), "[fully_shard] mp.{} must be a floating dtype, got {}", what,
               *t);
  KILN_CHECK(mesh.ndim() == 1 || (!mp.param_dtype && !mp.reduce_dtype && !mp.output_dtype),
             "[fully_shard] a mixed-precision policy takes a 1-D mesh, got {}", mesh.str());
  KILN_CHECK(!find_unit(module), "[fully_shard] {} is already sharded", describe(module));
  auto* unary = dynamic_cast<nn::UnaryModule*>(&module);
  KILN_CHECK_TYPE(unary != nullptr,
                  "[fully_shard] {} is not a UnaryModule: its calls run no hooks, so its "
                  "parameters cannot be gathered around them",
                  describe(module));
  const bool two_d = mesh.ndim() == 2;
  const dt::DeviceMesh* tp_mesh = two_d ? &mesh.submesh({mesh.dim_names()[1]}) : nullptr;
  // Parameters of units under `module`, which this unit leaves to them.
  std::set<const Tensor*> taken;
  for (auto& [path, sub] : module.named_modules()) {
    if (sub == &module) continue;
    if (const Unit* u = find_unit(*sub)) taken.insert(u->slots.begin(), u->slots.end());
  }
  auto unit = std::make_shared<Unit>();
  unit->module = &module;
  unit->options = options;
  for (auto& [name, slot] : module.named_parameter_slots()) {
    if (taken.count(slot)) continue;
    if (dt::is_dtensor(*slot)) {
      const dt::DTensorSpec& s = *dt::spec_of(*slot);
      KILN_CHECK(&s.mesh() == tp_mesh,
                 "[fully_shard] parameter '{}' of {} is already a DTensor ({}): {}", name,
                 describe(module), s.str(),
                 two_d ? fmt::format("only tensor-parallel parameters on the mesh's second dim "
                                     "({}) can be sharded further",
                                     tp_mesh->str())
                       : std::string("a parent is sharded before this submodule, or tensor "
                                     "parallel was applied (pass the 2-D mesh: data parallel, "
                                     "tensor parallel)"));
      KILN_CHECK(!s.has_partial(), "[fully_shard] parameter '{}' of {} is a Partial DTensor ({})",
                 name, describe(module), s.str());
    }
    KILN_CHECK(slot->dim() >= 1, "[fully_shard] parameter '{}' of {} is 0-d: FSDP shards dim 0",
               name, describe(module));
    unit->names.push_back(name);
    unit->slots.push_back(slot);
  }
  // Everything is checked; now shard (collective: broadcast from rank 0, then chunks).
  auto layout = std::make_shared<Layout>();
  layout->mesh = &mesh;
  std::map<DType, size_t> bucket_of;
  for (size_t i = 0; i < unit->slots.size(); ++i) {
    Tensor& param = *unit->slots[i];
    Tensor d;
    {
      autograd::NoGradGuard no_grad;
      if (!two_d) {
        d = dt::distribute_tensor(param.detach(), mesh, {dt::Shard(0)});
        // The shard in a storage of its own (the redistribute's chunk may view the whole).
        d = dt::make_dtensor(dt::to_local(d).clone(), dt::spec_of(d));
      } else {
        d = shard_2d(param, mesh, *layout);
      }
    }
    d.requires_grad_(true);
    param = d;
    unit->shards.push_back(d);
    if (!two_d) {
      layout->specs.push_back(dt::spec_of(d));
      add_to_bucket(*layout, bucket_of, i, options.mp);
    }
  }
  unit->layout = layout;
  fsdp_detail::install(unit, *unary);
}

bool is_fully_sharded(const nn::Module& module) { return find_unit(module) != nullptr; }

std::vector<std::string> fully_sharded_parameters(const nn::Module& module) {
  const Unit* u = find_unit(module);
  return u ? u->names : std::vector<std::string>{};
}

}  // namespace kiln::parallel
