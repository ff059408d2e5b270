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
// every rank runs the same forward and the engine orders backward nodes by creation.

// Note [What FSDP keeps for backward]
// PyTorch's FSDP2 frees the gathered parameters after the forward (reshard_after_forward) and
// gathers them again before the module's backward. Here the gathered tensors that the forward's
// backward formulas save (a Linear's weight, for its input's gradient) stay alive until the
// backward releases them: the forward's peak holds the whole of every parameter that is used,
// as DDP would, while the parameters, their gradients and the optimizer state between steps are
// 1/N per rank. There is no prefetch either: a unit's all-gather runs when its forward starts
// (the collectives are blocking; an eager prefetch would start the next unit's gather with
// all_gather_into_tensor_async in the pre-hook, in the order recorded by the first forward).

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

std::string describe(const nn::Module& m) {
  if (m.path().empty()) return fmt::format("module {}", m.type_name());
  return fmt::format("module '{}' ({})", m.path(), m.type_name());
}

// Parameters of one dtype, laid out in one flat buffer of `numel` elements per rank: parameter
// k of `params` at `offsets[k]`, padded to `lengths[k]` (ceil(rows / N) rows).
struct Bucket {
  DType dtype;
  std::vector<size_t> params;
  std::vector<int64_t> offsets, lengths;
  int64_t numel = 0;
};

// What the gather and its backward need; fixed at fully_shard, shared with the nodes. On a 1-D
// mesh the parameters are gathered in buckets; on a 2-D one (Note [FSDP and tensor parallel])
// one by one, from `specs` to `gathered`, and a tensor-parallel parameter is handed to the
// forward as a DTensor with its own spec on the tensor-parallel mesh (`tp_specs`; null for a
// plain parameter).
struct Layout {
  const dt::DeviceMesh* mesh;
  std::vector<const dt::DTensorSpec*> specs;  // each parameter's sharded spec on `mesh`
  std::vector<Bucket> buckets;
  std::vector<const dt::DTensorSpec*> gathered, tp_specs;
  bool two_d() const { return mesh->ndim() == 2; }
  int64_t parts() const { return mesh->size(0); }
};

bool same_placements(ArrayRef<Placement> a, ArrayRef<Placement> b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end());
}

// 2-D: parameter i's gradient, as the forward's tensor got it (plain, or a DTensor on the
// tensor-parallel mesh), averaged over the data-parallel ranks into the sharded spec.
Tensor scatter_2d(const Layout& l, size_t i, Tensor g) {
  const dt::DTensorSpec* s = l.specs[i];
  if (l.tp_specs[i]) {
    if (!g.defined())
      g = zeros(l.tp_specs[i]->local_shape(), s->dtype(), l.mesh->device());
    else if (!same_placements(dt::spec_of(g)->placements(), l.tp_specs[i]->placements()))
      g = dt::redistribute(g, l.tp_specs[i]->placements());
    if (dt::is_dtensor(g)) g = dt::sharded_meta(g).local;
  } else if (!g.defined()) {
    g = zeros(s->shape(), s->dtype(), l.mesh->device());
  }
  const dt::DTensorSpec* partial = dt::with_placements(
      *l.gathered[i], {dt::Partial(distributed::ReduceOp::Avg), l.gathered[i]->placements()[1]});
  return dt::make_dtensor(run_redistribute(g.contiguous(), *dt::plan_redistribute(*partial, *s)),
                          s);
}

// The rows of a parameter's dim 0 as ceil-sized chunks of every rank, padded: [N c, rest...].
Shape padded_shape(const dt::DTensorSpec& s, int64_t parts) {
  Shape out(s.shape());
  out[0] = dt::chunk_size(s.shape()[0], parts) * parts;
  return out;
}

// See Note [FSDP units]: the gradients of the gathered parameters, reduce-scattered.
class GatherBackward final : public autograd::Node {
 public:
  explicit GatherBackward(std::shared_ptr<const Layout> layout) : layout_(std::move(layout)) {
    num_outputs = static_cast<uint32_t>(layout_->specs.size());
  }
  std::string name() const override { return "FSDPGatherBackward"; }
  TensorList apply(TensorList&& grads) override {
    autograd::NoGradGuard no_grad;
    const Layout& l = *layout_;
    const int64_t n = l.parts();
    TensorList out(grads.size());
    if (l.two_d()) {
      for (size_t i = 0; i < grads.size(); ++i) {
        const bool defined = grads[i].defined();
        Tensor g = scatter_2d(l, i, std::move(grads[i]));
        if (defined) out[i] = g;
      }
      return out;
    }
    for (const Bucket& b : l.buckets) {
      TensorList pieces;
      for (size_t k = 0; k < b.params.size(); ++k) {
        const dt::DTensorSpec& s = *l.specs[b.params[k]];
        Tensor g = grads[b.params[k]];
        if (!g.defined()) g = zeros(s.shape(), b.dtype, l.mesh->device());
        const Shape padded = padded_shape(s, n);
        if (padded[0] != s.shape()[0]) {
          Shape pad(s.shape());
          pad[0] = padded[0] - s.shape()[0];
          g = cat({g, zeros(pad, b.dtype, g.device())}, 0);
        }
        pieces.push_back(g.reshape({n, b.lengths[k]}));
      }
      Tensor flat = pieces.size() == 1 ? pieces[0].contiguous() : cat(pieces, 1);
      flat = flat.reshape({n * b.numel});
      Tensor mine = n == 1 ? flat
                           : distributed::reduce_scatter_tensor(flat, distributed::ReduceOp::Avg,
                                                                &l.mesh->group(0));
      for (size_t k = 0; k < b.params.size(); ++k) {
        const size_t i = b.params[k];
        if (!grads[i].defined()) continue;
        const dt::DTensorSpec* s = l.specs[i];
        int64_t numel = 1;
        for (int64_t d : s->local_shape()) numel *= d;
        out[i] = dt::make_dtensor(narrow(mine, 0, b.offsets[k], numel).view(s->local_shape()), s);
      }
    }
    return out;
  }

 private:
  std::shared_ptr<const Layout> layout_;
};

struct Unit;
std::mutex g_mutex;
std::map<const nn::Module*, Unit*> g_units;

struct Unit {
  nn::Module* module;
  std::vector<std::string> names;  // relative to `module`
  std::vector<Tensor*> slots;
  TensorList shards;  // the DTensor leaves, what the slots hold between calls
  std::shared_ptr<const Layout> layout;

  ~Unit() {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_units.erase(module);
  }

  // The whole parameters, gathered; outputs of one GatherBackward when a gradient is wanted.
  TensorList gather() const {
    const Layout& l = *layout;
    const int64_t n = l.parts();
    bool record = false;
    for (const Tensor& p : shards) record = record || p.requires_grad();
    record = record && autograd::is_grad_enabled();
    autograd::NoGradGuard no_grad;
    TensorList out(shards.size());
    for (size_t i = 0; i < l.gathered.size(); ++i) {
      Tensor whole = dt::run_redistribute(dt::sharded_meta(shards[i]).local,
                                          *dt::plan_redistribute(*l.specs[i], *l.gathered[i]));
      out[i] = l.tp_specs[i] ? dt::make_dtensor(whole, l.tp_specs[i]) : whole;
    }
    for (const Bucket& b : l.buckets) {
      Tensor flat = zeros({b.numel}, b.dtype, l.mesh->device());
      for (size_t k = 0; k < b.params.size(); ++k) {
        const Tensor& local = dt::sharded_meta(shards[b.params[k]]).local;
        if (local.numel() > 0)
          narrow(flat, 0, b.offsets[k], local.numel()).copy_(local.reshape({-1}));
      }
      Tensor all = n == 1 ? flat : distributed::all_gather_into_tensor(flat, &l.mesh->group(0));
      Tensor rows = all.view({n, b.numel});
      for (size_t k = 0; k < b.params.size(); ++k) {
        const dt::DTensorSpec& s = *l.specs[b.params[k]];
        Tensor whole = narrow(rows, 1, b.offsets[k], b.lengths[k]).reshape(padded_shape(s, n));
        if (whole.size(0) != s.shape()[0]) whole = narrow(whole, 0, 0, s.shape()[0]).contiguous();
        out[b.params[k]] = whole;
      }
    }
    if (record) {
      auto node = make_ref<GatherBackward>(layout);
      for (const Tensor& p : shards) node->next_edges.push_back(autograd::gradient_edge(p));
      for (size_t i = 0; i < out.size(); ++i)
        autograd::set_history(out[i], node, static_cast<uint32_t>(i));
    }
    return out;
  }

  void put(const TensorList& tensors) const {
    for (size_t i = 0; i < slots.size(); ++i) *slots[i] = tensors[i];
  }
};

Unit* find_unit(const nn::Module& m) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_units.find(&m);
  return it == g_units.end() ? nullptr : it->second;
}

}  // namespace

namespace {

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

// Adds parameter i (with spec `s`) to its dtype's bucket.
void add_to_bucket(Layout& l, std::map<DType, size_t>& bucket_of, size_t i) {
  const dt::DTensorSpec& s = *l.specs[i];
  auto [it, fresh] = bucket_of.emplace(s.dtype(), l.buckets.size());
  if (fresh) l.buckets.push_back(Bucket{s.dtype(), {}, {}, {}, 0});
  Bucket& b = l.buckets[it->second];
  int64_t len = 1;
  for (int64_t x : padded_shape(s, l.parts())) len *= x;
  len /= l.parts();
  b.params.push_back(i);
  b.offsets.push_back(b.numel);
  b.lengths.push_back(len);
  b.numel += len;
}

}  // namespace

void fully_shard(nn::Module& module, const dt::DeviceMesh& mesh) {
  KILN_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2,
             "[fully_shard] takes a 1-D mesh (data parallel) or a 2-D one (data parallel, "
             "tensor parallel), got {}",
             mesh.str());
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
      add_to_bucket(*layout, bucket_of, i);
    }
  }
  unit->layout = layout;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_units[&module] = unit.get();
  }
  if (unit->slots.empty()) {
    // Nothing to gather; the hook keeps the unit (and its registry entry) alive with the module.
    unary->register_forward_hook([unit](const Tensor& y) { return y; });
    return;
  }
  unary->register_forward_pre_hook([unit](const Tensor& x) {
    unit->put(unit->gather());
    return x;
  });
  unary->register_forward_hook([unit](const Tensor& y) {
    unit->put(unit->shards);
    return y;
  });
}

bool is_fully_sharded(const nn::Module& module) { return find_unit(module) != nullptr; }

std::vector<std::string> fully_sharded_parameters(const nn::Module& module) {
  const Unit* u = find_unit(module);
  return u ? u->names : std::vector<std::string>{};
}

}  // namespace kiln::parallel
