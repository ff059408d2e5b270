// Executable::build(): a Graph (after the passes) lowered to steps. Each node gets a lowering
// (how it runs at replay, Note [Replay] in executable.cpp), which decides the buffers its
// kernel fills in place; then buffers get storage (planned intermediates in one arena, Note
// [Memory planning]), values get slots over them, and nodes become bound kernel calls.
#include <optional>

#include "kiln/compile/executable_impl.h"
#include "kiln/ops/op_list.h"

namespace kiln::compiler {
namespace {

DispatchKey backend_key(const Stack& stack) {
  DispatchKey k = (detail::key_set_of_stack(stack) & kBackendKeys).highest();
  KILN_ASSERT(k != DispatchKey::Undefined, "compile: a step has no device to run on");
  return k;
}

}  // namespace

Allocator* allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  DeviceInterface* iface = device_interface(d.type());
  KILN_CHECK_DEVICE(iface != nullptr, "[compile] no backend is loaded for device {}", d);
  return iface->allocator(d.index());
}

// How each node runs, and for Out the out= variant it runs.
struct Executable::Lowered {
  enum class How : uint8_t { Skip, Same, Out, Fill, Copy, Result, HostRead };
  std::vector<How> how;
  std::vector<const OpDef*> out_op;
};

void Executable::build() {
  const Graph& g = graph_;
  const size_t nb = g.buffers.size(), nv = g.values.size();
  in_buffer_.assign(nb, {});
  for (size_t v = 0; v < nv; ++v) in_buffer_[g.values[v].buffer].push_back(static_cast<int>(v));
  const Lowered lowered = lower_nodes();
  make_buffers(lowered);
  make_slots();
  bind_traced_inputs();
  make_steps(lowered);
}

Executable::Lowered Executable::lower_nodes() const {
  using How = Lowered::How;
  const Graph& g = graph_;
  Lowered l{std::vector<How>(g.nodes.size()), std::vector<const OpDef*>(g.nodes.size(), nullptr)};
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.host_read) {
      l.how[i] = How::HostRead;
      continue;
    }
    switch (n.op->kind()) {
      case OpKind::View:
        l.how[i] = How::Skip;
        break;
      case OpKind::InPlace:
      case OpKind::Out:
        l.how[i] = How::Same;
        break;
      case OpKind::Functional:
      case OpKind::Factory: {
        bool own_buffers = true;  // a kernel may hand back a view of what it was given
        for (int o : n.outputs)
          own_buffers =
              own_buffers && g.buffers[g.values[o].buffer].producer == static_cast<int>(i);
        if (!own_buffers) {
          l.how[i] = How::Skip;
        } else if (n.op->uninitialized()) {  // empty, empty_strided: a buffer, no step
          l.how[i] = How::Skip;
        } else if (n.op == &ops::op_full.def) {
          l.how[i] = How::Fill;
        } else if (n.op == &ops::op_to_copy.def) {
          l.how[i] = How::Copy;
        } else if (const OpDef* o = n.random ? nullptr : n.op->out_variant()) {
          l.how[i] = How::Out;
          l.out_op[i] = o;
        } else {
          l.how[i] = How::Result;
        }
        break;
      }
    }
  }
  return l;
}

void Executable::make_buffers(const Lowered& lowered) {
  using How = Lowered::How;
  const Graph& g = graph_;
  const size_t nb = g.buffers.size();
  const std::vector<How>& how = lowered.how;
  // Buffers: which are outputs, which the arena holds.
  std::vector<bool> is_output(nb, false);
  for (int v : g.outputs) is_output[g.values[v].buffer] = true;
  std::vector<bool> in_arena(nb, false);
  std::optional<Device> arena_device;  // one arena, on the device of the first planned buffer
  for (size_t b = 0; b < nb; ++b) {
    const Buffer& buf = g.buffers[b];
    if (buf.kind != BufferKind::Intermediate || is_output[b] || buf.producer < 0) continue;
    if (!arena_device) arena_device = buf.device;
    if (buf.device != *arena_device) continue;
    How l = how[buf.producer];
    in_arena[b] = l == How::Out || l == How::Fill || l == How::Copy ||
                  (l == How::Skip && g.nodes[buf.producer].op->kind() != OpKind::View);
  }
  MemoryPlan plan = plan_memory(g, in_arena);
  stats_.arena_bytes = plan.arena_bytes;
  stats_.unplanned_bytes = plan.sum_bytes;

  // Storage per buffer.
  storage_.assign(nb, Ref<StorageImpl>());
  if (plan.arena_bytes > 0)
    arena_ = make_ref<StorageImpl>(plan.arena_bytes, *arena_device, allocator_for(*arena_device));
  for (size_t b = 0; b < nb; ++b) {
    const Buffer& buf = g.buffers[b];
    if (plan.offset[b] != SIZE_MAX) {
      storage_[b] = make_ref<StorageImpl>(static_cast<char*>(arena_->data()) + plan.offset[b],
                                          buf.nbytes, buf.device);
    } else if (buf.kind == BufferKind::Intermediate && buf.producer >= 0 &&
               how[buf.producer] != How::Result) {
      // Outputs, and intermediates on a second device: buffers of their own.
      storage_[b] = make_ref<StorageImpl>(buf.nbytes, buf.device, allocator_for(buf.device));
      if (is_output[b]) {
        owned_outputs_.push_back(static_cast<int>(b));
        stats_.output_bytes += buf.nbytes;
      }
    } else if (buf.kind == BufferKind::Intermediate && buf.producer >= 0) {
      // Filled by a kernel that allocates (a Result step); a placeholder until the first run.
      storage_[b] = make_ref<StorageImpl>(buf.nbytes, buf.device, allocator_for(buf.device));
    } else if (buf.kind == BufferKind::Input && !buf.storage) {
      // A derived graph (Note [Dynamic dims]) has no traced input: bound at the first run.
      storage_[b] = make_ref<StorageImpl>(nullptr, buf.nbytes, buf.device);
    } else {
      storage_[b] = buf.storage;  // inputs (rebound per call), free tensors, constants
    }
  }
}

void Executable::make_slots() {
  const Graph& g = graph_;
  const size_t nv = g.values.size();
  // Slots: free tensors and constants are themselves; everything else is a fresh impl.
  slots_.assign(nv, Tensor());
  for (size_t v = 0; v < nv; ++v) {
    const Value& x = g.values[v];
    BufferKind k = g.buffers[x.buffer].kind;
    if ((k == BufferKind::Free || k == BufferKind::Constant) && x.producer < 0) {
      slots_[v] = x.traced;
    } else if (!storage_[x.buffer]) {
      continue;  // made by a node the passes removed
    } else {
      slots_[v] = Tensor(make_ref<TensorImpl>(storage_[x.buffer], x.dtype, x.sizes.span(),
                                              x.strides.span(), x.offset));
    }
  }
}

void Executable::bind_traced_inputs() {
  Graph& g = graph_;
  const size_t nb = g.buffers.size();
  // Inputs: the first input of each buffer binds it.
  input_buffers_.assign(g.inputs.size(), -1);
  bound_offset_.assign(nb, 0);
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    const Value& x = g.values[g.inputs[i]];
    if (g.buffers[x.buffer].input == static_cast<int>(i)) input_buffers_[i] = x.buffer;
  }
  // The graph no longer needs what it saw while tracing, except free tensors and constants.
  for (Value& x : g.values) {
    BufferKind k = g.buffers[x.buffer].kind;
    if (k != BufferKind::Free && k != BufferKind::Constant) x.traced = Tensor();
  }
  for (size_t b = 0; b < nb; ++b) {
    const Buffer& buf = g.buffers[b];
    bool keep = buf.kind == BufferKind::Input && buf.input >= 0 &&
                static_cast<size_t>(buf.input) < is_static_.size() && is_static_[buf.input];
    if (buf.kind == BufferKind::Input && !keep) g.buffers[b].storage = Ref<StorageImpl>();
  }
}

void Executable::make_steps(const Lowered& lowered) {
  using How = Lowered::How;
  const Graph& g = graph_;
  auto slot_args = [&](const Node& n) { return node_args(n, slots_); };
  // Binds a stack, counting the tensor handles the bound call keeps.
  DispatchKey last_key = DispatchKey::Undefined;
  auto bind = [&](const OpDef& op, Stack& s) {
    for (const IValue& v : s) {
      if (auto* t = std::get_if<Tensor>(&v); t && t->defined()) ++bound_refs_[t->impl()];
      if (auto* l = std::get_if<TensorList>(&v))
        for (const Tensor& x : *l)
          if (x.defined()) ++bound_refs_[x.impl()];
    }
    last_key = backend_key(s);
    return op.bind(last_key, s);
  };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    auto step = std::make_unique<Step>();
    step->node = static_cast<int>(i);
    switch (lowered.how[i]) {
      case How::Skip:
        continue;
      case How::HostRead:
        step->kind = Step::Kind::HostRead;
        step->read_value = n.args[0].value;
        step->name = n.host_read;
        ++stats_.host_reads;
        ++stats_.segments;
        break;
      case How::Same: {
        Stack s = slot_args(n);
        step->call = bind(*n.op, s);
        step->name = n.op->name();
        break;
      }
      case How::Out: {
        const OpDef* out_op = lowered.out_op[i];
        Stack s = slot_args(n);
        s.insert(s.begin(), slots_[n.outputs.at(0)]);
        step->call = bind(*out_op, s);
        step->name = out_op->name();
        break;
      }
      case How::Fill: {
        // full(size, value, dtype, device) -> fill_(out, value)
        Stack s{slots_[n.outputs.at(0)], n.args.at(1).attr};
        step->call = bind(ops::op_fill_.def, s);
        step->name = "fill_";
        break;
      }
      case How::Copy: {
        Stack s{slots_[n.outputs.at(0)], slots_[n.args.at(0).value]};
        step->call = bind(ops::op_copy_.def, s);
        step->name = "copy_";
        break;
      }
      case How::Result: {
        Stack s = slot_args(n);
        step->kind = Step::Kind::Result;
        step->call = bind(*n.op, s);
        step->name = n.op->name();
        for (int o : n.outputs) step->result_buffers.push_back(g.values[o].buffer);
        ++stats_.allocating_steps;
        break;
      }
    }
    step->key = last_key;
    last_key = DispatchKey::Undefined;
    steps_.push_back(std::move(step));
  }
  stats_.steps = static_cast<int>(steps_.size());
}

}  // namespace kiln::compiler
