#include "kiln/parallel/fsdp_unit.h"

#include <map>
#include <mutex>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"
#include "kiln/core/error.h"
#include "kiln/dispatch/op.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/ops/ops.h"

namespace kiln::parallel::fsdp_detail {

namespace dt = kiln::dtensor;

// Note [FSDP reshards after forward]
// The backward formulas of a unit's forward save the gathered parameters they need (a Linear
// its weight, for its input's gradient). Keeping them alive until backward would hold every
// unit's parameters whole at the forward's peak, as DDP does. So, as PyTorch's FSDP2 does with
// `untyped_storage().resize_(0)`, when a unit's forward returns its gathered tensors' bytes are
// freed (StorageImpl::free_data) while the storages, and the tensors the nodes saved, stay; a
// hook on the module's output (its gradient arrives before any of the module's backward nodes
// runs) allocates the bytes again and gathers into them before the module's backward. The
// refill writes through a second, borrowed storage over the same bytes, so the saved tensors'
// version counters do not move (they would read as modified in place). After the unit's
// gradients are reduce-scattered (GatherBackward) the bytes are freed again. Only the unit owns
// these storages; nothing else may read them between forward and backward. A root unit (one
// under no other unit, usually the whole model) keeps its parameters after forward: its
// backward starts right after. Under kiln::compile's trace nothing is freed (the trace records
// ops, not storages; the graph's own memory plan applies).

// Note [FSDP prefetch]
// Each unit's gather is an all-gather that compute has to wait for. A root unit's forward opens
// a session that records the units in the order their forwards start; the next forward, each
// unit, once it has its own parameters, starts the asynchronous all-gather of the unit that
// followed it last time (all_gather_into_tensor_async), so its communication overlaps this
// unit's compute (on a device with streams; on the CPU Open MPI advances it at the wait). In
// backward the units run in the reverse order of their forwards' ends: each unit's hook, after
// gathering its own parameters again, starts the re-gather of the unit whose forward ended
// just before its own. A gather is taken by its unit only if it was started for that call and
// the shards did not change since (their storage versions); a stale one is waited for and
// dropped. Every rank runs the same forward, so every rank starts the same gathers in the same
// order. At most two units are whole at once, plus the root.

// Note [FSDP mixed precision]
// PyTorch FSDP2's MixedPrecisionPolicy. The shards stay in their dtype (float32: the master
// weights the optimizer updates). With param_dtype set, a bucket's flat buffer is made in
// param_dtype and each shard cast into it before the all-gather, so half the bytes move for
// bfloat16, and the whole parameters the forward gets are param_dtype tensors: forward and
// backward compute in it. The unit's floating input is cast to param_dtype too (a Linear takes
// one dtype), the cast recorded by autograd like any op, and output_dtype casts its floating
// output. In backward each whole gradient (param_dtype) is cast to reduce_dtype before the
// bucket's reduce-scatter, and the reduced bucket is cast to the parameters' dtype, so every
// .grad is a float32 Shard(0) DTensor for the optimizer. Unset, each dtype is the parameter's
// own: reduce_dtype defaults to float32 here where PyTorch's defaults to param_dtype, trading
// the reduce-scatter's bytes for float32 sums. Integer parameters are gathered as they are. A
// GradScaler needs nothing more: the scaled float16 gradients are reduced (in reduce_dtype)
// before its unscale_, which reads the float32 sharded ones and all-reduces found_inf over the
// ranks. Resharding, prefetching, re-gathers for a retained graph's second backward and
// compile's trace run on the param_dtype buffers unchanged. Policies are 1-D only: a 2-D mesh
// gathers through redistribute, whose specs carry the parameter's dtype.

void Gathered::free() {
  if (freed) return;
  for (const Tensor& t : data) t.impl()->storage()->free_data();
  freed = true;
}

void Pending::wait() {
  for (distributed::Work& w : works) w.wait();
  works.clear();
}

namespace {

bool tracing() { return local_dispatch_state().included.has(DispatchKey::Trace); }

std::mutex g_mutex;
std::map<const nn::Module*, Unit*> g_units;
uint64_t g_generation = 1;  // bumped when units come or go (is_root's cache)

thread_local std::weak_ptr<ForwardSession> tls_session;

const Tensor& local_of(const Tensor& shard) { return dt::sharded_meta(shard).local; }

// The rows of a parameter's dim 0 as ceil-sized chunks of every rank, padded: [N c, rest...].
int64_t padded_rows(const dt::DTensorSpec& s, int64_t parts) {
  return dt::chunk_size(s.shape()[0], parts) * parts;
}

// Starts gathering the unit's shards: asynchronously where `async` (1-D meshes), else blocking.
Pending start_gather(const Unit& u, bool async, const Gathered* target) {
  const Layout& l = *u.layout;
  const int64_t n = l.parts();
  autograd::NoGradGuard no_grad;
  Pending p;
  p.target = target;
  for (const Tensor& s : u.shards) p.versions.push_back(local_of(s).impl()->storage()->version());
  for (size_t i = 0; i < l.gathered.size(); ++i)
    p.whole.push_back(dt::run_redistribute(local_of(u.shards[i]),
                                           *dt::plan_redistribute(*l.specs[i], *l.gathered[i])));
  for (const Bucket& b : l.buckets) {
    Tensor flat = zeros({b.numel}, b.gather_dtype, l.mesh->device());
    for (size_t k = 0; k < b.params.size(); ++k) {
      const Tensor& local = local_of(u.shards[b.params[k]]);
      if (local.numel() > 0)
        narrow(flat, 0, b.offsets[k], local.numel()).copy_(local.reshape({-1}));
    }
    if (n == 1) {
      p.buffers.push_back(flat);
    } else if (async) {
      Tensor all = empty({n * b.numel}, b.gather_dtype, l.mesh->device());
      p.works.push_back(distributed::all_gather_into_tensor_async(all, flat, &l.mesh->group(0)));
      p.buffers.push_back(all);
    } else {
      p.buffers.push_back(distributed::all_gather_into_tensor(flat, &l.mesh->group(0)));
    }
  }
  return p;
}

// Waits for `p` and writes each whole parameter into `into` (its gathered local shape).
void finish_gather(const Unit& u, Pending& p, const TensorList& into) {
  const Layout& l = *u.layout;
  const int64_t n = l.parts();
  autograd::NoGradGuard no_grad;
  p.wait();
  for (size_t i = 0; i < p.whole.size(); ++i) {
    Tensor dst = into[i];
    dst.copy_(p.whole[i]);
  }
  for (size_t bi = 0; bi < l.buckets.size(); ++bi) {
    const Bucket& b = l.buckets[bi];
    for (size_t k = 0; k < b.params.size(); ++k) {
      const dt::DTensorSpec& s = *l.specs[b.params[k]];
      const Tensor& whole = into[b.params[k]];
      const int64_t rows = s.shape()[0], row_numel = rows ? whole.numel() / rows : 0;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t len = dt::chunk_length(rows, n, r);
        if (len == 0) continue;
        Shape piece(s.shape());
        piece[0] = len;
        Tensor src = narrow(p.buffers[bi], 0, r * b.numel + b.offsets[k], len * row_numel);
        narrow(whole, 0, dt::chunk_offset(rows, n, r), len).copy_(src.view(piece));
      }
    }
  }
}

// Fresh tensors for a call's whole parameters (each in a storage of its own, so it can be freed).
TensorList fresh_whole(const Unit& u) {
  const Layout& l = *u.layout;
  TensorList out;
  for (size_t i = 0; i < u.shards.size(); ++i) {
    const dt::DTensorSpec& s = l.two_d() ? *l.gathered[i] : *l.specs[i];
    out.push_back(empty(l.two_d() ? s.local_shape() : s.shape(),
                        l.two_d() ? s.dtype() : l.gathered_dtypes[i], l.mesh->device()));
  }
  return out;
}

// A tensor over t's bytes through a storage of its own, so writing it leaves t's version alone.
Tensor borrowed_alias(const Tensor& t) {
  StorageImpl* st = t.impl()->storage();
  auto storage = make_ref<StorageImpl>(st->data(), st->nbytes(), st->device());
  return Tensor(make_ref<TensorImpl>(std::move(storage), t.dtype(), t.sizes(), t.strides(),
                                     t.storage_offset()));
}

bool same_versions(const Unit& u, const Pending& p) {
  for (size_t i = 0; i < u.shards.size(); ++i)
    if (local_of(u.shards[i]).impl()->storage()->version() != p.versions[i]) return false;
  return true;
}

// Gathers the unit's parameters into `into`, from its prefetched gather where that was started
// for `target` and is still current.
void gather_into(Unit& u, const Gathered* target, const TensorList& into) {
  std::optional<Pending> p = std::move(u.pending);
  u.pending.reset();
  if (p && (p->target != target || !same_versions(u, *p))) {
    p->wait();  // stale: every rank started it, so every rank drops it
    p.reset();
  }
  if (!p) p = start_gather(u, false, target);
  finish_gather(u, *p, into);
}

// Starts unit v's gather for `target` unless one is already in flight.
void prefetch(Unit& v, const Gathered* target) {
  if (!v.options.prefetch || v.layout->two_d() || v.layout->parts() == 1) return;
  if (v.pending) {
    if (v.pending->target == target) return;
    v.pending->wait();
    v.pending.reset();
  }
  v.pending = start_gather(v, true, target);
}

// Gathers a freed call's parameters again (Note [FSDP reshards after forward]).
void regather(Unit& u, Gathered& g) {
  if (!g.freed) return;
  TensorList into;
  for (const Tensor& t : g.data) {
    t.impl()->storage()->reallocate_data();
    into.push_back(borrowed_alias(t));
  }
  g.freed = false;
  gather_into(u, &g, into);
}

// See Note [FSDP units] in fsdp.cpp: the gradients of the gathered parameters, reduce-scattered.
class GatherBackward final : public autograd::Node {
 public:
  GatherBackward(std::shared_ptr<const Layout> layout, std::shared_ptr<Gathered> gathered)
      : layout_(std::move(layout)), gathered_(std::move(gathered)) {
    num_outputs = static_cast<uint32_t>(layout_->specs.size());
  }
  std::string name() const override { return "FSDPGatherBackward"; }
  TensorList apply(TensorList&& grads) override {
    TensorList out = reduce_scatter(std::move(grads));
    if (gathered_) gathered_->free();  // whole again only if a later backward gathers it
    return out;
  }

 private:
  TensorList reduce_scatter(TensorList&& grads);
  std::shared_ptr<const Layout> layout_;
  std::shared_ptr<Gathered> gathered_;  // null under a trace
};

bool same_placements(ArrayRef<dt::Placement> a, ArrayRef<dt::Placement> b) {
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

TensorList GatherBackward::reduce_scatter(TensorList&& grads) {
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
      g = g.defined() ? g.to(b.reduce_dtype) : zeros(s.shape(), b.reduce_dtype, l.mesh->device());
      const int64_t padded = padded_rows(s, n);
      if (padded != s.shape()[0]) {
        Shape pad(s.shape());
        pad[0] = padded - s.shape()[0];
        g = cat({g, zeros(pad, b.reduce_dtype, g.device())}, 0);
      }
      pieces.push_back(g.reshape({n, b.lengths[k]}));
    }
    Tensor flat = pieces.size() == 1 ? pieces[0].contiguous() : cat(pieces, 1);
    flat = flat.reshape({n * b.numel});
    Tensor mine = n == 1 ? flat
                         : distributed::reduce_scatter_tensor(flat, distributed::ReduceOp::Avg,
                                                              &l.mesh->group(0));
    mine = mine.to(b.dtype);
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

// Whether no other unit's module contains u's (cached until units change).
bool is_root(Unit& u) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (u.root_generation == g_generation) return u.root;
  u.root = true;
  for (const auto& [m, other] : g_units) {
    if (other == &u) continue;
    for (const auto& [path, sub] : other->module->named_modules())
      if (sub == u.module) u.root = false;
  }
  u.root_generation = g_generation;
  return u.root;
}

// The forward pre-hook: the whole parameters into the members, recorded for backward.
void before_forward(Unit& u) {
  const bool trace = tracing();
  const bool root = !trace && is_root(u);
  if (root) {
    u.session = std::make_shared<ForwardSession>();
    tls_session = u.session;
  }
  std::shared_ptr<ForwardSession> session = trace ? nullptr : tls_session.lock();
  bool record = false;
  for (const Tensor& p : u.shards) record = record || p.requires_grad();
  record = record && autograd::is_grad_enabled();

  auto g = std::make_shared<Gathered>();
  TensorList whole = fresh_whole(u);
  gather_into(u, nullptr, whole);
  const Layout& l = *u.layout;
  TensorList out(whole.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    g->data.push_back(whole[i].detach());
    out[i] =
        l.tp_specs.size() && l.tp_specs[i] ? dt::make_dtensor(whole[i], l.tp_specs[i]) : whole[i];
  }
  if (record) {
    auto node = make_ref<GatherBackward>(u.layout, trace ? nullptr : g);
    for (const Tensor& p : u.shards) node->next_edges.push_back(autograd::gradient_edge(p));
    for (size_t i = 0; i < out.size(); ++i)
      autograd::set_history(out[i], node, static_cast<uint32_t>(i));
  }
  for (size_t i = 0; i < u.slots.size(); ++i) *u.slots[i] = out[i];
  u.in_calls.push_back(g);
  u.calls_root.push_back(root);

  if (session) {
    const size_t at = session->order.size();
    session->order.push_back(&u);
    // The unit that came next in the last forward (the root's record), if this one ran as then.
    const std::vector<Unit*>* last = nullptr;
    if (!session->order.empty()) last = &session->order.front()->last_order;
    if (last && at + 1 < last->size() && (*last)[at] == &u) prefetch(*(*last)[at + 1], nullptr);
  }
}

// The forward hook: the shards back into the members; reshard; the pre-backward hook.
Tensor after_forward(const std::shared_ptr<Unit>& unit, const Tensor& y) {
  Unit& u = *unit;
  for (size_t i = 0; i < u.slots.size(); ++i) *u.slots[i] = u.shards[i];
  if (u.in_calls.empty()) return y;  // the pre-hook did not run (a hook added mid-call)
  std::shared_ptr<Gathered> g = std::move(u.in_calls.back());
  const bool root = u.calls_root.back();
  u.in_calls.pop_back();
  u.calls_root.pop_back();
  if (tracing()) return y;
  std::shared_ptr<ForwardSession> session = tls_session.lock();
  // The unit whose backward follows this one's: the one whose forward ended just before.
  std::optional<ForwardSession::Done> next_in_backward;
  if (session && !session->finished.empty()) next_in_backward = session->finished.back();
  if (y.defined() && y.requires_grad()) {
    autograd::register_hook(y, [unit, g, next_in_backward](const Tensor&) {
      regather(*unit, *g);
      if (next_in_backward && next_in_backward->gathered->freed)
        prefetch(*next_in_backward->unit, next_in_backward->gathered.get());
      return Tensor();
    });
  }
  if (session) session->finished.push_back({&u, g});
  if (root) {
    if (session) u.last_order = session->order;
    tls_session.reset();
    u.session.reset();
  } else if (u.options.reshard_after_forward) {
    g->free();
  }
  return y;
}

// x cast to `dtype` where both are set and x is floating (Note [FSDP mixed precision]).
Tensor cast_floating(const Tensor& x, std::optional<DType> dtype) {
  if (!dtype || !x.defined() || !is_floating(x.dtype()) || x.dtype() == *dtype) return x;
  return x.to(*dtype);
}

}  // namespace

Unit::~Unit() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_units.erase(module);
  ++g_generation;
}

Unit* find_unit(const nn::Module& m) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_units.find(&m);
  return it == g_units.end() ? nullptr : it->second;
}

void install(const std::shared_ptr<Unit>& unit, nn::UnaryModule& module) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_units[unit->module] = unit.get();
    ++g_generation;
  }
  module.register_forward_pre_hook([unit](const Tensor& x) {
    before_forward(*unit);
    const MixedPrecisionPolicy& mp = unit->options.mp;
    return mp.cast_forward_inputs ? cast_floating(x, mp.param_dtype) : x;
  });
  module.register_forward_hook([unit](const Tensor& y) {
    return cast_floating(after_forward(unit, y), unit->options.mp.output_dtype);
  });
}

}  // namespace kiln::parallel::fsdp_detail
