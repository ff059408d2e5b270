#include "kiln/parallel/fsdp.h"

#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/ops/ops.h"

namespace kiln::parallel {

namespace dt = kiln::dtensor;

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

// What the gather and its backward need; fixed at fully_shard, shared with the nodes.
struct Layout {
  const dt::DeviceMesh* mesh;
  std::vector<const dt::DTensorSpec*> specs;  // each parameter's Shard(0) spec
  std::vector<Bucket> buckets;
  int64_t parts() const { return mesh->size(); }
};

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

void fully_shard(nn::Module& module, const dt::DeviceMesh& mesh) {
  KILN_CHECK(mesh.ndim() == 1,
             "[fully_shard] takes a 1-D mesh, got {} (FSDP+TP on a 2-D mesh is not done yet)",
             mesh.str());
  KILN_CHECK(!find_unit(module), "[fully_shard] {} is already sharded", describe(module));
  auto* unary = dynamic_cast<nn::UnaryModule*>(&module);
  KILN_CHECK_TYPE(unary != nullptr,
                  "[fully_shard] {} is not a UnaryModule: its calls run no hooks, so its "
                  "parameters cannot be gathered around them",
                  describe(module));
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
    KILN_CHECK(!dt::is_dtensor(*slot),
               "[fully_shard] parameter '{}' of {} is already a DTensor ({}): {}", name,
               describe(module), dt::spec_of(*slot)->str(),
               "a parent is sharded before this submodule, or tensor parallel was applied "
               "(FSDP+TP on a 2-D mesh is not done yet)");
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
      d = dt::distribute_tensor(param.detach(), mesh, {dt::Shard(0)});
      // The shard in a storage of its own (the redistribute's chunk may view the whole).
      d = dt::make_dtensor(dt::to_local(d).clone(), dt::spec_of(d));
    }
    d.requires_grad_(true);
    param = d;
    unit->shards.push_back(d);
    const dt::DTensorSpec* s = dt::spec_of(d);
    layout->specs.push_back(s);
    auto [it, fresh] = bucket_of.emplace(param.dtype(), layout->buckets.size());
    if (fresh) layout->buckets.push_back(Bucket{param.dtype(), {}, {}, {}, 0});
    Bucket& b = layout->buckets[it->second];
    int64_t len = 1;
    for (int64_t x : padded_shape(*s, mesh.size())) len *= x;
    len /= mesh.size();
    b.params.push_back(i);
    b.offsets.push_back(b.numel);
    b.lengths.push_back(len);
    b.numel += len;
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
