// The Sharded dispatch layer: one boxed fallback at the Sharded key runs every op on DTensors.
#include <fmt/ranges.h>

#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kiln/compile/trace.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/dtensor/sharding_rule.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {

// Note [The Sharded layer]
// DESIGN.md puts Sharded below Autograd and above Trace: autograd records ops on DTensors as on
// any tensor (their gradients are DTensors, computed by the same layer), and a traced step sees
// only local ops and collectives. One boxed fallback serves every op:
//   1. It collects the specs of the call's DTensor arguments (list elements too). Plain tensors
//      may not mix in, except numbers wrapped as 0-d tensors (`add(t, 2.0)`).
//   2. It looks the call up in the decision cache, keyed by the op, the input specs' ids and the
//      arguments the op's rule declares (Note [The decision cache]).
//   3. On a miss it runs the op's sharding rule (sharding_rule.h), interns the spec each input
//      must have and plans its redistribute, and gets the global result shapes from the op's
//      meta function on meta tensors of the global shapes; the result's specs are interned and
//      the whole decision cached. An op without a rule raises NotImplementedError naming it and
//      the input specs: never a silent gather.
//   4. It redistributes the inputs whose placements differ (collectives: every rank decides
//      alike, since ranks agree on specs and rules are deterministic), swaps every DTensor for
//      its local tensor, swaps in the local arguments (a view's local size), runs the op below
//      Sharded, and wraps each result as a DTensor of its cached spec.
// A written argument (in-place self, out=) is never redistributed: its local tensor is written
// in place and it keeps its spec, so a rule whose decision would change it is an error naming
// the placements.
//
// Note [The decision cache]
// An open-addressing table of atomic pointers to immutable entries: a lookup hashes the key
// where the call holds it, walks at most kProbe slots with acquire loads and compares in place,
// with no lock and no allocation (the key's scratch space is thread-local and kept). Inserting
// takes a mutex and publishes with a release store. Entries are never freed: the table is
// bounded (KILN_DTENSOR_MAX_DECISIONS, default 16384 entries in twice as many slots), and a
// decision that finds no free slot in its window is used once and not kept (counted in
// decision_cache_stats().uncached), so a program whose calls never repeat cannot grow it without
// end. Only declared arguments key it: foreach ops' scalar lists do not, so they cannot flood it.

namespace {

// ---------------------------------------------------------------- the key

// Appends what of an argument keys a decision (Note [What keys a decision] in
// sharding_rule.h): a tag, then its bits. DTensors key by their spec ids, elsewhere.
void encode(const IValue& v, std::vector<int64_t>& out) {
  out.push_back(static_cast<int64_t>(v.index()));
  if (auto* t = std::get_if<Tensor>(&v)) {
    if (t->defined() && !is_dtensor(*t)) out.push_back(static_cast<int64_t>(t->dtype()));
  } else if (auto* l = std::get_if<TensorList>(&v)) {
    out.push_back(static_cast<int64_t>(l->size()));
  } else if (auto* i = std::get_if<int64_t>(&v)) {
    out.push_back(*i);
  } else if (auto* b = std::get_if<bool>(&v)) {
    out.push_back(*b);
  } else if (auto* s = std::get_if<Shape>(&v)) {
    out.push_back(static_cast<int64_t>(s->size()));
    for (int64_t x : *s) out.push_back(x);
  } else if (auto* dt = std::get_if<DType>(&v)) {
    out.push_back(static_cast<int64_t>(*dt));
  } else if (auto* sc = std::get_if<Scalar>(&v)) {
    out.push_back(static_cast<int64_t>(sc->kind()));
  } else if (auto* dev = std::get_if<Device>(&v)) {
    out.push_back(static_cast<int64_t>(dev->type()) << 16 | dev->index());
  }
}

uint64_t mix(uint64_t h, uint64_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}

struct Entry {
  const OpDef* op = nullptr;
  uint64_t hash = 0;
  std::vector<uint32_t> in_ids;
  std::vector<int64_t> keyed;
  std::vector<std::shared_ptr<const RedistributePlan>> plans;  // per input; null: unchanged
  std::vector<const DTensorSpec*> outputs;
  std::vector<std::pair<size_t, IValue>> local_args;
  std::function<void(Stack&)> local_run;  // instead of the op, when set
  std::vector<size_t> written;            // inputs the op writes
};

// Where one DTensor input sits: stack position, and element index for a list (-1 otherwise).
struct Slot {
  uint32_t pos;
  int32_t elem;
};

// Note [Implicit replication]
// Under an ImplicitReplication guard, a call that mixes DTensors with plain tensors has each
// plain tensor argument (not a wrapped number, not requiring grad) made a Replicate DTensor over
// the same local tensor, on the first DTensor's mesh, before the call is keyed and decided: the
// decision is then the one for those specs, and the cache needs no flag of its own. Loss
// parallel uses it for the targets beside class-sharded logits.
thread_local bool t_implicit_replication = false;

// The calling thread's scratch space: kept between calls, so the hit path allocates nothing.
struct Scratch {
  bool plain = false;  // a plain tensor argument stands beside the DTensors (implicit replication)
  std::vector<const DTensorSpec*> specs;
  std::vector<Slot> slots;
  std::vector<int64_t> keyed;
};
// initial-exec: one load from the thread pointer, not a __tls_get_addr call per use (as the
// dispatcher's own state, op.cpp).
thread_local Scratch t_scratch __attribute__((tls_model("initial-exec")));

size_t max_decisions() {
  static const size_t n = [] {
    const char* e = std::getenv("KILN_DTENSOR_MAX_DECISIONS");
    long v = e ? std::atol(e) : 0;
    return v > 0 ? static_cast<size_t>(v) : size_t{16384};
  }();
  return n;
}

class DecisionCache {
 public:
  static constexpr size_t kProbe = 16;
  DecisionCache() {
    size_t n = 64;
    while (n < 2 * max_decisions()) n *= 2;
    mask_ = n - 1;
    slots_ = new std::atomic<const Entry*>[n]();
  }
  const Entry* find(const OpDef& op, uint64_t h, const Scratch& s) const {
    for (size_t k = 0; k < kProbe; ++k) {
      const Entry* e = slots_[(h + k) & mask_].load(std::memory_order_acquire);
      if (!e) return nullptr;
      if (e->hash == h && same(*e, op, s)) return e;
    }
    return nullptr;
  }
  // Publishes `e` (taking it) and returns it, or the entry another thread published for the
  // same key first; null when the window is full (the caller keeps `e`, uses it once, frees it).
  const Entry* insert(std::unique_ptr<Entry>& e, const Scratch& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (const Entry* found = find(*e->op, e->hash, s)) return found;
    if (count_ >= max_decisions()) return nullptr;
    for (size_t k = 0; k < kProbe; ++k) {
      auto& slot = slots_[(e->hash + k) & mask_];
      if (slot.load(std::memory_order_relaxed)) continue;
      ++count_;
      const Entry* raw = e.release();
      slot.store(raw, std::memory_order_release);
      return raw;
    }
    return nullptr;
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return count_;
  }

 private:
  static bool same(const Entry& e, const OpDef& op, const Scratch& s) {
    if (e.op != &op || e.in_ids.size() != s.specs.size() || e.keyed != s.keyed) return false;
    for (size_t i = 0; i < s.specs.size(); ++i)
      if (e.in_ids[i] != s.specs[i]->id()) return false;
    return true;
  }
  std::atomic<const Entry*>* slots_;
  size_t mask_;
  mutable std::mutex mu_;
  size_t count_ = 0;
};
DecisionCache& cache() {
  static auto* c = new DecisionCache();  // never destroyed: other threads may still dispatch
  return *c;
}
std::atomic<uint64_t> g_uncached{0}, g_misses{0};

// ---------------------------------------------------------------- collecting inputs

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  if (is_dtensor(t)) return sharded_meta(t).spec->str();
  return fmt::format("Tensor([{}], {}, {})", fmt::join(t.sizes(), ", "), t.dtype(), t.device());
}

std::string describe_inputs(const Stack& stack) {
  std::vector<std::string> parts;
  for (const IValue& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v)) {
      parts.push_back(describe(*t));
    } else if (auto* l = std::get_if<TensorList>(&v)) {
      std::vector<std::string> items;
      for (const Tensor& x : *l) items.push_back(describe(x));
      parts.push_back(fmt::format("[{}]", fmt::join(items, ", ")));
    }
  }
  return fmt::format("{}", fmt::join(parts, "; "));
}

// A tensor argument that may stand beside DTensors: undefined, or a number wrapped as 0-d.
bool passes_through(const Tensor& t) { return !t.defined() || t.impl()->is_wrapped_number(); }

[[noreturn]] void mixed(const OpDef& op, const Stack& stack, size_t pos, const Tensor& t) {
  throw ValueError(
      fmt::format("[{}] mixes DTensors with a plain tensor (argument {}: {}); make it a DTensor "
                  "(kiln::dtensor::from_local or distribute_tensor) or pass a number. Inputs: {}",
                  op.name(), pos, describe(t), describe_inputs(stack)));
}

// Fills s.specs and s.slots; false when no argument is a DTensor.
bool collect(const OpDef& op, const Stack& stack, Scratch& s) {
  s.specs.clear();
  s.slots.clear();
  bool plain = false;
  size_t plain_pos = 0;
  Tensor plain_t;
  for (size_t p = 0; p < stack.size(); ++p) {
    const IValue& v = stack[p];
    if (auto* t = std::get_if<Tensor>(&v)) {
      if (is_dtensor(*t)) {
        s.specs.push_back(sharded_meta(*t).spec);
        s.slots.push_back({static_cast<uint32_t>(p), -1});
      } else if (!passes_through(*t) && !plain) {
        plain = true, plain_pos = p, plain_t = *t;
      }
    } else if (auto* l = std::get_if<TensorList>(&v)) {
      for (size_t k = 0; k < l->size(); ++k) {
        const Tensor& x = (*l)[k];
        if (is_dtensor(x)) {
          s.specs.push_back(sharded_meta(x).spec);
          s.slots.push_back({static_cast<uint32_t>(p), static_cast<int32_t>(k)});
        } else if (!passes_through(x) && !plain) {
          plain = true, plain_pos = p, plain_t = x;
        }
      }
    }
  }
  if (s.specs.empty()) return false;
  s.plain = plain;
  if (plain && !t_implicit_replication) mixed(op, stack, plain_pos, plain_t);
  const DeviceMesh* mesh = &s.specs[0]->mesh();
  for (const DTensorSpec* sp : s.specs)
    if (&sp->mesh() != mesh)
      throw ValueError(
          fmt::format("[{}] its DTensors live on different meshes ({} and {}); "
                      "redistribute them onto one mesh first. Inputs: {}",
                      op.name(), mesh->str(), sp->mesh().str(), describe_inputs(stack)));
  return true;
}

uint64_t key_hash(const OpDef& op, const Stack& stack, Scratch& s) {
  s.keyed.clear();
  for (const IValue& v : stack) encode(v, s.keyed);
  uint64_t h = reinterpret_cast<uintptr_t>(&op);
  for (const DTensorSpec* sp : s.specs) h = mix(h, sp->id());
  h = mix(h, 0x5bd1e995);
  for (int64_t x : s.keyed) h = mix(h, static_cast<uint64_t>(x));
  return h;
}

Tensor& tensor_at(Stack& stack, const Slot& sl) {
  if (sl.elem < 0) return std::get<Tensor>(stack[sl.pos]);
  return std::get<TensorList>(stack[sl.pos])[static_cast<size_t>(sl.elem)];
}

// ---------------------------------------------------------------- deciding

// A meta tensor with `spec`'s global geometry.
Tensor meta_like(const DTensorSpec& spec) {
  int64_t extent = 1;
  for (int64_t d = 0; d < spec.ndim(); ++d)
    if (spec.shape()[d] == 0) extent = 0;
  if (extent != 0)
    for (int64_t d = 0; d < spec.ndim(); ++d) extent += (spec.shape()[d] - 1) * spec.strides()[d];
  Tensor base = empty({extent}, spec.dtype(), Device(kMeta));
  return as_strided(base, spec.shape(), spec.strides(), 0);
}

std::string placements_of(const ShardingDecision& d) {
  std::vector<std::string> in;
  for (const Placements& p : d.inputs) in.push_back(placements_str(p));
  return fmt::format("{}", fmt::join(in, ", "));
}

std::unique_ptr<Entry> decide(const OpDef& op, Stack& stack, const Scratch& s, uint64_t hash) {
  const ShardingRule* rule = sharding_rule_of(op);
  if (!rule) {
    std::string_view why = sharding_exclusion_of(op);
    throw NotImplementedError(
        fmt::format("[{}] has no sharding rule{}{}; inputs: {}. Compute on plain tensors "
                    "(kiln::dtensor::to_local or full_tensor) instead",
                    op.name(), why.empty() ? "" : ": ", why, describe_inputs(stack)));
  }
  const size_t n = s.specs.size();
  const std::vector<bool>& written_pos = compiler::written_args(op);
  std::vector<bool> written(n);
  std::vector<size_t> positions(n);
  for (size_t i = 0; i < n; ++i) {
    positions[i] = s.slots[i].pos;
    written[i] = s.slots[i].pos < written_pos.size() && written_pos[s.slots[i].pos];
  }
  ShardingCall call(op, stack, s.specs, positions, written);
  ShardingDecision d;
  rule->fn(call, d);
  KILN_ASSERT(d.inputs.size() == n, "[{}] rule '{}' decided {} input placements for {} inputs",
              op.name(), rule->name, d.inputs.size(), n);

  auto e = std::make_unique<Entry>();
  e->op = &op;
  e->hash = hash;
  e->keyed = s.keyed;
  e->in_ids.resize(n);
  e->plans.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const DTensorSpec& from = *s.specs[i];
    e->in_ids[i] = from.id();
    if (written[i]) e->written.push_back(i);
    const DTensorSpec* to = with_placements(from, d.inputs[i], std::string(op.name()).c_str());
    if (to == &from) continue;
    if (written[i])
      throw ValueError(fmt::format(
          "[{}] would have to redistribute the tensor it writes (argument {}) from {} to {}; an "
          "in-place or out= op keeps its placements: redistribute it first, or use the "
          "functional form. Inputs: {}",
          op.name(), positions[i], placements_str(from.placements()), placements_str(d.inputs[i]),
          describe_inputs(stack)));
    e->plans[i] = plan_redistribute(from, *to);
  }

  // The global results: the op's meta function on meta tensors of the global geometry.
  Stack meta = detail::map_stack(
      stack, [](const Tensor& t) { return is_dtensor(t) ? meta_like(*sharded_meta(t).spec) : t; },
      [](const IValue& v) {  // a device argument (to_copy's) names the local device
        return std::holds_alternative<Device>(v) ? IValue(Device(kMeta)) : v;
      });
  op.call_boxed_at(DispatchKey::Meta, meta);
  std::vector<const Tensor*> results;
  for (const IValue& v : meta) {
    if (auto* t = std::get_if<Tensor>(&v)) results.push_back(t);
    if (auto* l = std::get_if<TensorList>(&v))
      for (const Tensor& x : *l) results.push_back(&x);
  }
  KILN_ASSERT(results.size() == d.outputs.size(),
              "[{}] rule '{}' decided {} result placements for {} results", op.name(), rule->name,
              d.outputs.size(), results.size());
  const DeviceMesh& mesh = s.specs[0]->mesh();
  for (size_t r = 0; r < results.size(); ++r)  // a result left out (output_mask) stays undefined
    e->outputs.push_back(!results[r]->defined()
                             ? nullptr
                             : intern_spec(mesh, d.outputs[r], results[r]->sizes(),
                                           results[r]->strides(), results[r]->dtype(),
                                           std::string(op.name()).c_str()));
  e->local_args = std::move(d.local_args);
  e->local_run = std::move(d.local_run);
  for (size_t pos : d.local_shape_args) {
    KILN_ASSERT(!e->outputs.empty() && e->outputs[0],
                "[{}] a local shape argument without a result", op.name());
    e->local_args.emplace_back(pos, Shape(e->outputs[0]->local_shape()));
  }
  (void)placements_of;
  return e;
}

// ---------------------------------------------------------------- the fallback

void wrap_results(Stack& stack, const Entry& e) {
  size_t r = 0;
  for (IValue& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v)) {
      const DTensorSpec* spec = e.outputs[r++];
      if (spec) *t = make_dtensor(std::move(*t), spec);
    } else if (auto* l = std::get_if<TensorList>(&v)) {
      for (Tensor& x : *l) {
        const DTensorSpec* spec = e.outputs[r++];
        if (spec) x = make_dtensor(std::move(x), spec);
      }
    }
  }
}

void run(const OpDef& op, Stack& stack, const Entry& e, const Scratch& s) {
  // A written DTensor's own version moves with its shard's, so autograd sees a saved DTensor
  // modified in place (the kernel bumps only the local storage's).
  for (size_t i : e.written) tensor_at(stack, s.slots[i]).impl()->storage()->bump_version();
  for (size_t i = 0; i < s.slots.size(); ++i) {
    Tensor& t = tensor_at(stack, s.slots[i]);
    const Tensor& local = sharded_meta(t).local;
    t = e.plans[i] ? run_redistribute(local, *e.plans[i]) : local;
  }
  for (const auto& [pos, v] : e.local_args) stack[pos] = v;
  {
    ExcludeKeyGuard below(DispatchKey::Sharded);
    if (e.local_run)
      e.local_run(stack);
    else
      op.call_boxed(stack);
  }
  wrap_results(stack, e);
}

// See Note [Implicit replication]: every plain tensor argument made a Replicate DTensor.
void replicate_plain(const OpDef& op, Stack& stack, const DeviceMesh& mesh) {
  auto wrap = [&](Tensor& t, size_t pos) {
    if (passes_through(t) || is_dtensor(t)) return;
    if (t.requires_grad())
      throw ValueError(fmt::format(
          "[{}] argument {} ({}) is a plain tensor that requires grad: implicit replication "
          "takes only tensors without gradients (its gradient would be a DTensor); make it a "
          "DTensor (kiln::dtensor::from_local)",
          op.name(), pos, describe(t)));
    if (t.device() != mesh.device())
      throw ValueError(fmt::format(
          "[{}] argument {} ({}) is a plain tensor on {}, the DTensors' mesh is on {}: implicit "
          "replication keeps the tensor where it is",
          op.name(), pos, describe(t), t.device(), mesh.device()));
    t = make_dtensor(t, intern_spec(mesh, replicated(mesh.ndim()), t.sizes(), t.strides(),
                                    t.dtype(), "implicit replication"));
  };
  for (size_t p = 0; p < stack.size(); ++p) {
    if (auto* t = std::get_if<Tensor>(&stack[p])) {
      wrap(*t, p);
    } else if (auto* l = std::get_if<TensorList>(&stack[p])) {
      for (Tensor& x : *l) wrap(x, p);
    }
  }
}

void sharded_fallback(const OpDef& op, DispatchKey, Stack& stack) {
  Scratch& s = t_scratch;
  if (!collect(op, stack, s)) {
    // Sharded included thread-locally over plain tensors: nothing to do at this layer.
    ExcludeKeyGuard below(DispatchKey::Sharded);
    return op.call_boxed(stack);
  }
  if (s.plain) {  // under ImplicitReplication
    replicate_plain(op, stack, s.specs[0]->mesh());
    collect(op, stack, s);
  }
  const uint64_t h = key_hash(op, stack, s);
  if (const Entry* e = cache().find(op, h, s)) return run(op, stack, *e, s);
  g_misses.fetch_add(1, std::memory_order_relaxed);
  std::unique_ptr<Entry> made = decide(op, stack, s, h);
  if (const Entry* kept = cache().insert(made, s)) return run(op, stack, *kept, s);
  g_uncached.fetch_add(1, std::memory_order_relaxed);  // no room: used for this call only
  run(op, stack, *made, s);
}

const bool g_registered = [] {
  register_fallback(DispatchKey::Sharded, &sharded_fallback);
  return true;
}();

}  // namespace

ImplicitReplication::ImplicitReplication() : previous_(t_implicit_replication) {
  t_implicit_replication = true;
}
ImplicitReplication::~ImplicitReplication() { t_implicit_replication = previous_; }

DecisionCacheStats decision_cache_stats() {
  return {cache().size(), g_misses.load(), g_uncached.load()};
}

}  // namespace kiln::dtensor
