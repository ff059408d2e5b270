// The sim device's kernels: every op without a kernel of its own runs its meta function on
// the calling thread, then its CPU kernel on the stream over CPU views of the sim storages;
// copy_ and to_copy within a device, between devices and to or from the host.
#include <algorithm>
#include <optional>

#include "kiln/backend/sim/sim_impl.h"
#include "kiln/core/storage.h"
#include "kiln/core/tensor_impl.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"
#include "kiln/ops/other_meta.h"

namespace kiln::sim {
namespace {

bool is_sim(Device d) { return d.dispatch_key() == g_key; }

// `impl` as a tensor standing for `t`: the wrapped-number flag carries over.
Tensor like(Ref<TensorImpl> impl, const Tensor& t) {
  impl->set_wrapped_number(t.impl()->is_wrapped_number());
  return Tensor(std::move(impl));
}
bool on_sim(const Tensor& t) { return t.defined() && is_sim(t.device()); }
// A sim Device argument as `to` (cpu for the CPU kernel, meta for the meta function).
IValue device_as(const IValue& v, Device to) {
  auto* d = std::get_if<Device>(&v);
  return d && is_sim(*d) ? IValue(to) : v;
}
IValue cpu_for_sim(const IValue& v) { return device_as(v, Device(kCPU)); }

// CPU tensors over the bytes of sim storages, one CPU storage per sim storage so that
// arguments which alias still alias for the CPU kernel's overlap checks.
struct Wrapper {
  std::unordered_map<const StorageImpl*, Ref<StorageImpl>> storages;
  Tensor operator()(const Tensor& t) {
    if (!on_sim(t)) return t;
    const TensorImpl* i = t.impl();
    Ref<StorageImpl>& s = storages[i->storage()];
    if (!s) s = make_ref<StorageImpl>(i->storage()->data(), i->storage()->nbytes(), Device(kCPU));
    return like(make_ref<TensorImpl>(s, i->dtype(), i->sizes(), i->strides(), i->storage_offset()),
                t);
  }
  // A 0-d cpu tensor by value; a wrapped number stays one (it promotes like a Scalar).
  static Tensor copy(const Tensor& t) { return like(t.clone().impl_ref(), t); }
  // The stack the CPU kernel runs on: sim tensors wrapped, sim devices made cpu, 0-d cpu
  // tensors copied (a launch takes host values by value, as CUDA's do).
  // The default generator (a null Generator*) becomes the device's own.
  Stack stack(const Stack& in, Generator* device_generator) {
    return detail::map_stack(
        in, [&](const Tensor& t) { return on_sim(t) || !t.defined() ? (*this)(t) : copy(t); },
        [&](const IValue& v) -> IValue {
          if (auto* g = std::get_if<Generator*>(&v)) return *g ? *g : device_generator;
          return cpu_for_sim(v);
        });
  }
};

// Meta twins of the arguments (one meta storage per storage), to run the op's meta function.
struct Twins {
  std::unordered_map<const StorageImpl*, Ref<StorageImpl>> storages;
  std::vector<std::pair<const StorageImpl*, StorageImpl*>> pairs;  // original, twin
  Tensor operator()(const Tensor& t) {
    if (!t.defined()) return t;
    const TensorImpl* i = t.impl();
    Ref<StorageImpl>& s = storages[i->storage()];
    if (!s) {
      s = make_ref<StorageImpl>(i->storage()->nbytes(), Device(kMeta), nullptr);
      pairs.push_back({i->storage(), s.get()});
    }
    return like(make_ref<TensorImpl>(s, i->dtype(), i->sizes(), i->strides(), i->storage_offset()),
                t);
  }
};

Device check_devices(const OpDef& op, const Stack& stack) {
  std::optional<Device> dev;
  auto see = [&](Device d) {
    if (!dev) dev = d;
    KILN_CHECK_DEVICE(*dev == d,
                      "[{}] expected all tensors to be on the same device, but found {} and {}",
                      op.name(), *dev, d);
  };
  auto look = [&](const Tensor& t) {
    if (!t.defined() || (t.dim() == 0 && t.device().is_cpu())) return;
    see(t.device());
  };
  for (const IValue& v : stack) {
    if (auto* t = std::get_if<Tensor>(&v)) look(*t);
    if (auto* l = std::get_if<TensorList>(&v))
      for (const Tensor& t : *l) look(t);
    if (auto* d = std::get_if<Device>(&v)) see(*d);
  }
  KILN_ASSERT(dev && is_sim(*dev), "[sim] {}: a sim kernel was called without a sim device",
              op.name());
  return *dev;
}

}  // namespace

// See Note [The sim device] in sim.cpp.
void fallback(const OpDef& op, DispatchKey, Stack& stack) {
  const Device dev = check_devices(op, stack);
  SimDevice& d = device_state(dev.index());

  // 1. The meta function on twins: validation, result geometry, what is written.
  Twins twins;
  std::vector<const Tensor*> originals;
  std::vector<const TensorImpl*> twin_impls;
  auto twin = [&](const Tensor& t) {
    Tensor m = twins(t);
    originals.push_back(&t);
    twin_impls.push_back(m.impl());
    return m;
  };
  Stack meta =
      detail::map_stack(stack, twin, [](const IValue& v) { return device_as(v, Device(kMeta)); });
  op.call_boxed_at(DispatchKey::Meta, meta);

  // 2. Results: an argument itself, a view of an argument's storage, or a fresh buffer.
  std::vector<Tensor> fresh;
  std::vector<size_t> fresh_at;  // position of each fresh result among the tensor results
  size_t position = 0;
  auto result = [&](const Tensor& m) -> Tensor {
    size_t at = position++;
    if (!m.defined()) return m;
    for (size_t i = 0; i < twin_impls.size(); ++i)
      if (twin_impls[i] == m.impl()) return *originals[i];
    const TensorImpl* mi = m.impl();
    for (auto [orig, tw] : twins.pairs)
      if (tw == mi->storage())
        for (const Tensor* o : originals)
          if (o->impl()->storage() == orig)
            return Tensor(make_ref<TensorImpl>(o->impl()->storage_ref(), mi->dtype(), mi->sizes(),
                                               mi->strides(), mi->storage_offset()));
    auto s = make_ref<StorageImpl>(mi->storage()->nbytes(), dev, d.allocator());
    Tensor t(make_ref<TensorImpl>(std::move(s), mi->dtype(), mi->sizes(), mi->strides(),
                                  mi->storage_offset()));
    fresh.push_back(t);
    fresh_at.push_back(at);
    return t;
  };
  Stack results = detail::map_stack(meta, result, detail::same_value);
  // What the meta function wrote, the kernel will write: the version moves now, on the host.
  for (auto [orig, tw] : twins.pairs)
    if (tw->version() != 0) const_cast<StorageImpl*>(orig)->bump_version();

  // 3. The launch: the CPU kernel over wrapped arguments, on the stream.
  if (op.uninitialized()) {
    stack = std::move(results);
    return;
  }
  Wrapper wrap;
  Stack args = wrap.stack(stack, &d.generator());
  const bool random = std::any_of(stack.begin(), stack.end(), [](const IValue& v) {
    return std::holds_alternative<Generator*>(v);
  });
  // A draw from a generator of the caller's: its state is read when the kernel runs, and the
  // caller may drop it as soon as the op returns, so the op runs now, in order (a draw from
  // the default generator, which lives for good, is queued like any kernel).
  const bool user_generator = std::any_of(stack.begin(), stack.end(), [](const IValue& v) {
    auto* g = std::get_if<Generator*>(&v);
    return g && *g != nullptr;
  });
  if (user_generator) {
    d.forbid_in_capture(
        fmt::format("{} with a generator of the caller's (its state would be read at replay)",
                    op.name())
            .c_str(),
        "cudaErrorStreamCaptureUnsupported");
    d.synchronize_current();
  }
  const OpDef* out_op = nullptr;
  if (!random && fresh.size() == 1 && results.size() == 1 && op.kind() == OpKind::Functional)
    out_op = op.out_variant();
  // The CPU kernel bound to its arguments once (OpDef::bind): a graph runs a node many times.
  std::function<void()> fn;
  if (fresh.empty()) {
    std::shared_ptr<BoundCall> call = op.bind(DispatchKey::CPU, args);
    fn = [call] { call->run(); };
  } else if (out_op) {
    args.insert(args.begin(), wrap(fresh[0]));
    std::shared_ptr<BoundCall> call = out_op->bind(DispatchKey::CPU, args);
    fn = [call] { call->run(); };
  } else {
    TensorList outs;
    for (const Tensor& f : fresh) outs.push_back(wrap(f));
    std::shared_ptr<BoundCall> call = op.bind(DispatchKey::CPU, args);
    fn = [call, outs = std::move(outs), at = std::move(fresh_at)] {
      call->run();
      TensorList got;  // the results, in order; the fresh ones are copied over
      for (const IValue& v : call->results) {
        if (auto* t = std::get_if<Tensor>(&v)) got.push_back(*t);
        if (auto* l = std::get_if<TensorList>(&v)) got.insert(got.end(), l->begin(), l->end());
      }
      for (size_t k = 0; k < outs.size(); ++k)
        ops::op_copy_.call_at(DispatchKey::CPU, outs[k], got.at(at[k]));
      call->results.clear();
    };
  }
  if (user_generator)
    fn();
  else
    d.launch(op.name(), std::move(fn));
  stack = std::move(results);
}

void copy_(const Tensor& self, const Tensor& src) {
  meta::copy_(self, src);
  const bool ds = on_sim(self), ss = on_sim(src);
  Wrapper wrap;
  Tensor dst = wrap(self), from = wrap(src);
  if (ds && ss && self.device() == src.device()) {
    device_state(self.device().index()).launch("copy_", [dst, from] {
      ops::op_copy_.call_at(DispatchKey::CPU, dst, from);
    });
  } else {  // through the host: waits for the streams, as a pageable cudaMemcpy does
    for (const Tensor* t : {&self, &src}) {
      if (!on_sim(*t)) continue;
      SimDevice& d = device_state(t->device().index());
      d.forbid_in_capture("a copy between host and device", "cudaErrorStreamCaptureUnsupported");
      d.synchronize();
    }
    ops::op_copy_.call_at(DispatchKey::CPU, dst, from);
  }
  self.impl()->storage()->bump_version();
}

Tensor to_copy(const Tensor& self, DType dtype, Device device) {
  TensorSpec s = meta::to_copy(self, dtype, device);
  Tensor out = empty(s.sizes, dtype, device);
  copy_(out, self);
  return out;
}

Tensor nonzero(const Tensor& self) {
  return ops::op_nonzero(self.to(Device(kCPU))).to(self.device());
}

}  // namespace kiln::sim
