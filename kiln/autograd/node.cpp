#include "kiln/autograd/node.h"

#include <atomic>

#include "kiln/autograd/op_node.h"
#include "kiln/ops/ops.h"

namespace kiln::autograd {

namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};

std::string describe(const Tensor& t) {
  return fmt::format("[{}] {}", fmt::join(t.sizes(), ", "), name(t.dtype()));
}

// Offset one past the last element a geometry reaches (its offset when it has no elements).
int64_t extent(IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  int64_t end = offset + 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return offset;
    end += (sizes[i] - 1) * strides[i];
  }
  return end;
}

// Whether two elements of the geometry may share a memory location.
bool may_overlap(IntArrayRef sizes, IntArrayRef strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims with size > 1
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 1) dims.emplace_back(strides[i], sizes[i]);
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // largest offset reachable by the dims so far
  for (auto [stride, size] : dims) {
    if (stride <= reach) return true;
    reach += (size - 1) * stride;
  }
  return false;
}
}  // namespace

Node::Node() : sequence_nr(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

SavedTensor::SavedTensor(const Tensor& t, bool is_output)
    : data_(is_output ? Tensor(make_ref<TensorImpl>(*t.impl())) : t),
      version_(t.version()),
      is_output_(is_output) {}

Tensor SavedTensor::unpack(const Node& owner, size_t index) const {
  const char* what = is_output_ ? "output" : "input";
  if (released_)
    KILN_THROW(Value,
               "[autograd] {} needs its saved {} {}, which an earlier backward freed: pass "
               "retain_graph=true to the first backward to backpropagate through the graph "
               "twice",
               owner.name(), what, index);
  KILN_ASSERT(data_.defined(), "{} reads {} {}, which it did not save", owner.name(), what, index);
  uint64_t now = data_.version();
  KILN_CHECK(now == version_,
             "[autograd] {} needs {} {} ({}) as it was when saved (version {}), but an in-place "
             "op has modified it since (version {}); clone the tensor before modifying it",
             owner.name(), what, index, describe(data_), version_, now);
  return data_;
}

AutogradMeta& ensure_meta(const Tensor& t) {
  if (auto* m = meta_of(t)) return *m;
  auto m = std::make_unique<AutogradMeta>();
  AutogradMeta& ref = *m;
  t.impl()->set_autograd_meta(std::move(m));
  return ref;
}

namespace {
// A tensor's hooks see the gradient of its current value: when an in-place op (or a view's
// regeneration) gives it a new grad_fn, they move there from the old one.
void move_hooks(AutogradMeta& m, Node* to, uint32_t nr) {
  if (!m.hooks) return;
  if (m.grad_fn)
    std::erase_if(m.grad_fn->pre_hooks, [&](const auto& h) { return h.second == m.hooks; });
  to->pre_hooks.emplace_back(nr, m.hooks);
}
}  // namespace

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& m = ensure_meta(t);
  if (m.view_base.defined() && m.view_version != t.version()) {
    auto n = make_ref<ViewBackward>(ViewGeometry::of(m.view_base), ViewGeometry::of(t));
    n->next_edges.push_back(gradient_edge(m.view_base));
    move_hooks(m, n.get(), 0);
    m.grad_fn = n;
    m.output_nr = 0;
    m.view_version = t.version();
  }
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  return {make_ref<AccumulateGrad>(t), 0};
}

void set_history(const Tensor& t, const Ref<Node>& fn, uint32_t nr) {
  AutogradMeta& m = ensure_meta(t);
  move_hooks(m, fn.get(), nr);
  m.grad_fn = fn;
  m.output_nr = nr;
  t.impl()->add_key(DispatchKey::Autograd);
}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  accumulate_grad(variable, std::move(grads[0]));
  return {};
}

namespace {
GradLayoutHook g_grad_layout = nullptr;
}  // namespace
void set_grad_layout_hook(GradLayoutHook hook) { g_grad_layout = hook; }

void accumulate_grad(const Tensor& variable, Tensor g) {
  if (!g.defined()) return;
  if (g_grad_layout && variable.key_set().has(DispatchKey::Sharded))
    g = g_grad_layout(variable, std::move(g));
  AutogradMeta& m = ensure_meta(variable);
  if (m.grad.defined()) {
    add_(m.grad, g);  // in place: the gradient keeps its address (graph capture relies on it)
  } else if (g.is_contiguous() && g.impl()->use_count() == 1 &&
             g.impl()->storage()->use_count() == 1 && g.storage_offset() == 0) {
    m.grad = std::move(g);  // nobody else sees this buffer: adopt it
  } else {
    m.grad = empty_like(variable);
    m.grad.copy_(g);
  }
}

Tensor GradHooks::run(Tensor g) {
  for (const GradHook& fn : fns) {
    Tensor r = fn(g);
    if (!r.defined()) continue;
    KILN_CHECK(r.sizes() == g.sizes(),
               "[register_hook] a hook returned a gradient of shape [{}] for one of shape [{}]",
               fmt::join(r.sizes(), ", "), fmt::join(g.sizes(), ", "));
    g = r.dtype() == g.dtype() ? r : r.to(g.dtype());
  }
  if (retain) retained = retained.defined() ? add(retained, g) : clone(g);
  return g;
}

void register_hook(const Tensor& t, GradHook hook) {
  KILN_CHECK(t.defined() && t.requires_grad(),
             "[register_hook] the tensor does not require grad, so no gradient will reach it");
  KILN_CHECK(static_cast<bool>(hook), "[register_hook] the hook is empty");
  AutogradMeta& m = ensure_meta(t);
  if (!m.hooks) {
    m.hooks = std::make_shared<GradHooks>();
    if (m.grad_fn) m.grad_fn->pre_hooks.emplace_back(m.output_nr, m.hooks);
  }
  m.hooks->fns.push_back(std::move(hook));
}

void register_post_accumulate_grad_hook(const Tensor& leaf, PostAccumulateGradHook hook) {
  KILN_CHECK(leaf.defined() && leaf.requires_grad(),
             "[register_post_accumulate_grad_hook] the tensor does not require grad, so no "
             "gradient will reach it");
  KILN_CHECK(leaf.is_leaf(),
             "[register_post_accumulate_grad_hook] the tensor is not a leaf (it has grad_fn {}): "
             "only leaves accumulate a gradient",
             leaf.grad_fn_name());
  KILN_CHECK(static_cast<bool>(hook), "[register_post_accumulate_grad_hook] the hook is empty");
  AutogradMeta& m = ensure_meta(leaf);
  if (!m.hooks) m.hooks = std::make_shared<GradHooks>();
  m.hooks->post.push_back(std::move(hook));
}

Tensor as_strided_backward(const Tensor& g, IntArrayRef base_sizes, IntArrayRef base_strides,
                           int64_t base_offset, IntArrayRef sizes, IntArrayRef strides,
                           int64_t offset) {
  int64_t n =
      std::max(extent(base_sizes, base_strides, base_offset), extent(sizes, strides, offset));
  Tensor flat = zeros({n}, g.dtype(), g.device());
  if (!may_overlap(sizes, strides)) {
    as_strided(flat, sizes, strides, offset).copy_(g);
  } else {
    Tensor idx = as_strided(arange(n, kInt64, g.device()), sizes, strides, offset).reshape({-1});
    index_add_(flat, 0, idx, g.reshape({-1}));
  }
  return as_strided(flat, base_sizes, base_strides, base_offset);
}

TensorList ViewBackward::apply(TensorList&& grads) {
  return {as_strided_backward(grads[0], base.sizes, base.strides, base.offset, view.sizes,
                              view.strides, view.offset)};
}

TensorList CopySlices::apply(TensorList&& grads) {
  const Tensor& g = grads[0];
  int64_t n = std::max(extent(base.sizes, base.strides, base.offset),
                       extent(view.sizes, view.strides, view.offset));
  Tensor flat = zeros({n}, g.dtype(), g.device());
  Tensor result = as_strided(flat, base.sizes, base.strides, base.offset);
  result.copy_(g);
  Tensor slice = as_strided(flat, view.sizes, view.strides, view.offset);
  TensorList res = fn->apply({slice.clone()});
  if (res[0].defined())
    slice.copy_(res[0]);
  else
    slice.zero_();
  res[0] = result;
  return res;
}

}  // namespace kiln::autograd
