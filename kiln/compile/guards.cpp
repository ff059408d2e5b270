#include "kiln/compile/guards.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/autograd/grad_mode.h"

namespace kiln::compiler {

ModeState ModeState::current() {
  return {autograd::is_grad_enabled(), autograd::is_inference_mode_enabled(), kiln::default_dtype(),
          kiln::default_device()};
}

std::string input_label(size_t i, std::span<const std::string> names) {
  if (i < names.size() && !names[i].empty()) return fmt::format("input {} ('{}')", i, names[i]);
  return fmt::format("input {}", i);
}

namespace {

bool sizes_match(const InputGuard& g, IntArrayRef sizes) {
  if (sizes.size() != g.sizes.size()) return false;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] != g.sizes[d] && !(g.dynamic >> d & 1)) return false;
  return true;
}
bool strides_match(const InputGuard& g, const TensorImpl& t) {
  if (g.dynamic)
    return t.is_contiguous() == g.contiguous && (g.contiguous || t.strides() == g.strides.span());
  return t.strides() == g.strides.span();
}

}  // namespace

Guards::Guards(const Graph& graph, std::span<const Tensor> inputs, const ModeState& modes,
               std::span<const uint32_t> dynamic, const HeldRefs& held, std::vector<HostGuard> host)
    : modes_(modes), host_(std::move(host)) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorImpl& t = *inputs[i].impl();
    uint32_t mask = i < dynamic.size() ? dynamic[i] : 0;
    if (t.dim() < 32) mask &= (1u << t.dim()) - 1;
    has_dynamic_ = has_dynamic_ || mask != 0;
    InputGuard g{
        t.dtype(),         t.device(), Shape(t.sizes()), Shape(t.strides()), t.requires_grad(),
        t.is_contiguous(), mask};
    for (size_t j = 0; j < i; ++j) {
      if (inputs[j].impl()->storage() == t.storage()) {
        g.alias_of = static_cast<int>(j);
        g.alias_delta = t.storage_offset() - inputs[j].impl()->storage_offset();
        break;
      }
    }
    inputs_.push_back(std::move(g));
  }
  for (size_t v = 0; v < graph.values.size(); ++v) {
    const Value& x = graph.values[v];
    if (graph.buffers[x.buffer].kind != BufferKind::Free || x.producer >= 0 || !x.traced.defined())
      continue;
    std::string label =
        fmt::format("free tensor %{} ([{}] {})", v, fmt::join(x.sizes, ", "), name(x.dtype));
    // The entry's own references: its executables' and this guard's copy of a parameter.
    const bool param = x.traced.requires_grad() && x.traced.is_leaf();
    free_.push_back({x.traced.impl(), held(x.traced.impl()) + (param ? 1 : 0), label});
    if (param) grads_.push_back({x.traced, x.traced.grad().impl(), label});
  }
}

void Guards::add_held(const HeldRefs& held) {
  for (FreeGuard& f : free_) f.internal_refs += held(f.impl);
}

void Guards::dynamic_sizes(std::span<const Tensor> inputs, std::vector<int64_t>& out) const {
  out.clear();
  for (size_t i = 0; i < inputs_.size(); ++i) {
    uint32_t m = inputs_[i].dynamic;
    for (int d = 0; m; ++d, m >>= 1)
      if (m & 1) out.push_back(inputs[i].impl()->sizes()[d]);
  }
}

size_t Guards::size() const {
  return inputs_.size() + 1 + host_.size() + free_.size() + grads_.size();
}

bool Guards::check(std::span<const Tensor> inputs, const ModeState& modes) const {
  if (inputs.size() != inputs_.size() || !(modes == modes_)) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputGuard& g = inputs_[i];
    const TensorImpl* t = inputs[i].impl();
    if (!t || t->dtype() != g.dtype || t->device() != g.device ||
        t->requires_grad() != g.requires_grad || !sizes_match(g, t->sizes()) ||
        !strides_match(g, *t))
      return false;
    if (g.alias_of >= 0) {
      const TensorImpl* a = inputs[g.alias_of].impl();
      if (a->storage() != t->storage() ||
          t->storage_offset() - a->storage_offset() != g.alias_delta)
        return false;
    }
    // An input that shares storage with an earlier one where the trace saw none.
    if (g.alias_of < 0)
      for (size_t j = 0; j < i; ++j)
        if (inputs[j].impl()->storage() == t->storage()) return false;
  }
  for (const FreeGuard& f : free_)
    if (f.impl->use_count() <= f.internal_refs) return false;
  for (const GradGuard& g : grads_)
    if (g.param.grad().impl() != g.grad) return false;
  for (const HostGuard& h : host_)
    if (!h.passes()) return false;
  return true;
}

std::string Guards::why(std::span<const Tensor> inputs, const ModeState& modes,
                        std::span<const std::string> names) const {
  if (inputs.size() != inputs_.size())
    return fmt::format("expected {} inputs, got {}", inputs_.size(), inputs.size());
  if (modes.grad_enabled != modes_.grad_enabled)
    return fmt::format("grad mode: expected {}, got {}",
                       modes_.grad_enabled ? "enabled" : "disabled",
                       modes.grad_enabled ? "enabled" : "disabled");
  if (modes.inference != modes_.inference)
    return fmt::format("inference mode: expected {}, got {}", modes_.inference ? "on" : "off",
                       modes.inference ? "on" : "off");
  if (modes.default_dtype != modes_.default_dtype)
    return fmt::format("default dtype: expected {}, got {}", name(modes_.default_dtype),
                       name(modes.default_dtype));
  if (modes.default_device != modes_.default_device)
    return fmt::format("default device: expected {}, got {}", modes_.default_device,
                       modes.default_device);
  for (const HostGuard& h : host_)
    if (!h.passes()) return h.why();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const InputGuard& g = inputs_[i];
    const std::string who = input_label(i, names);
    if (!inputs[i].defined()) return fmt::format("{} is an undefined tensor", who);
    const TensorImpl& t = *inputs[i].impl();
    if (t.dtype() != g.dtype)
      return fmt::format("{} dtype mismatch: expected {}, got {}", who, name(g.dtype),
                         name(t.dtype()));
    if (t.device() != g.device)
      return fmt::format("{} device mismatch: expected {}, got {}", who, g.device, t.device());
    if (t.sizes().size() != g.sizes.size())
      return fmt::format("{} rank mismatch: expected {} dims [{}], got {} dims [{}]", who,
                         g.sizes.size(), fmt::join(g.sizes, ", "), t.sizes().size(),
                         fmt::join(t.sizes(), ", "));
    for (size_t d = 0; d < g.sizes.size(); ++d)
      if (t.sizes()[d] != g.sizes[d] && !(g.dynamic >> d & 1))
        return fmt::format("{} size mismatch at dim {}: expected {}, got {}", who, d, g.sizes[d],
                           t.sizes()[d]);
    if (!strides_match(g, t))
      return fmt::format("{} stride mismatch: expected [{}], got [{}]", who,
                         fmt::join(g.strides, ", "), fmt::join(t.strides(), ", "));
    if (t.requires_grad() != g.requires_grad)
      return fmt::format("{} requires_grad mismatch: expected {}, got {}", who, g.requires_grad,
                         t.requires_grad());
    if (g.alias_of >= 0) {
      const TensorImpl* a = inputs[g.alias_of].impl();
      if (a->storage() != t.storage() || t.storage_offset() - a->storage_offset() != g.alias_delta)
        return fmt::format("{} no longer shares storage with {} as when traced", who,
                           input_label(g.alias_of, names));
    } else {
      for (size_t j = 0; j < i; ++j)
        if (inputs[j].impl()->storage() == t.storage())
          return fmt::format("{} shares storage with {}; when traced they were separate", who,
                             input_label(j, names));
    }
  }
  for (const FreeGuard& f : free_)
    if (f.impl->use_count() <= f.internal_refs)
      return fmt::format(
          "{} is no longer referenced outside the compiled function (it was "
          "replaced or dropped)",
          f.label);
  for (const GradGuard& g : grads_)
    if (g.param.grad().impl() != g.grad)
      return fmt::format(
          "the .grad of {} is a different tensor than when traced (was it set to "
          "none, e.g. by zero_grad(true)?)",
          g.label);
  return "";
}

std::string Guards::str(std::span<const std::string> names) const {
  std::string s = fmt::format(
      "grad_mode == {}, inference_mode == {}, default_dtype == {}, "
      "default_device == {}\n",
      modes_.grad_enabled, modes_.inference, name(modes_.default_dtype), modes_.default_device);
  for (const HostGuard& h : host_) s += h.str() + "\n";
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const InputGuard& g = inputs_[i];
    std::vector<std::string> sizes;
    for (size_t d = 0; d < g.sizes.size(); ++d)
      sizes.push_back(g.dynamic >> d & 1 ? "*" : fmt::format("{}", g.sizes[d]));
    s += fmt::format("{}: {} [{}] strides [{}] on {}, requires_grad == {}", input_label(i, names),
                     name(g.dtype), fmt::join(sizes, ", "), fmt::join(g.strides, ", "), g.device,
                     g.requires_grad);
    if (g.alias_of >= 0) s += fmt::format(", shares storage with input {}", g.alias_of);
    s += "\n";
  }
  for (const FreeGuard& f : free_) s += fmt::format("{} is alive (identity)\n", f.label);
  for (const GradGuard& g : grads_) s += fmt::format("{}.grad is the traced tensor\n", g.label);
  return s;
}

}  // namespace kiln::compiler
