#include "kiln/autograd/engine.h"

#include <cmath>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"
#include "kiln/ops/ops.h"

namespace kiln::autograd {

namespace {

// What grad() collects instead of accumulating into .grad.
struct Capture {
  // Per input: a leaf (matched by impl at AccumulateGrad) or a node input.
  std::vector<const TensorImpl*> leaf;
  std::vector<Edge> edge;
  TensorList result;
  void add(size_t i, const Tensor& g) {
    if (!g.defined()) return;
    result[i] = result[i].defined() ? add_grads(result[i], g) : g;
  }
  static Tensor add_grads(const Tensor& a, const Tensor& b) { return kiln::add(a, b); }
};

void check_finite(const Node& node, const TensorList& grads) {
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (!g.defined() || g.numel() == 0) continue;
    double m = amax(abs(g.to(kFloat64))).item<double>();
    KILN_CHECK(std::isfinite(m),
               "[autograd] anomaly: {} returned {} in its gradient for input {} (shape [{}])",
               node.name(), std::isnan(m) ? "nan" : "inf", i, fmt::join(g.sizes(), ", "));
  }
}

void accumulate(TensorList& buffer, uint32_t nr, Tensor g) {
  if (!buffer[nr].defined())
    buffer[nr] = std::move(g);
  else
    buffer[nr] = add(buffer[nr], g);
}

// The callbacks of the pass running on this thread (queue_callback), or null.
thread_local std::vector<std::function<void()>>* tls_callbacks = nullptr;

// Makes `list` this thread's callback queue while it lives (a hook may run a nested pass).
class CallbackScope {
 public:
  explicit CallbackScope(std::vector<std::function<void()>>& list) : saved_(tls_callbacks) {
    tls_callbacks = &list;
  }
  ~CallbackScope() { tls_callbacks = saved_; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;

 private:
  std::vector<std::function<void()>>* saved_;
};

// Note [Leaves finish early]
// A leaf can be reached through several AccumulateGrad nodes (gradient_edge makes one per use).
// The dependency pass counts them per leaf; when the last one has run, the leaf's gradient for
// this pass is complete, so its hooks run and it is accumulated into .grad right then, while
// the rest of the graph is still being differentiated. DDP relies on this: its
// post-accumulate hooks start a bucket's all-reduce as soon as the bucket's gradients are in,
// overlapping the communication with the rest of backward (as PyTorch's engine does). A
// leaf's sum is still formed in order of arrival, so the values are as before.
void execute(const std::vector<Edge>& roots, TensorList root_grads, bool retain_graph,
             Capture* capture) {
  // Backward formulas compute in the dtypes their forward saved (Note [Autocast]).
  ExcludeKeyGuard no_autocast(DispatchKey::Autocast);
  NoGradGuard no_grad;
  std::vector<std::function<void()>> callbacks;
  CallbackScope callback_scope(callbacks);
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> todo;
  // Per leaf: its AccumulateGrad nodes not yet run, and the gradient summed so far.
  std::unordered_map<const TensorImpl*, std::pair<int, Tensor>> leaves;
  auto discover = [&](Node* n) {
    if (!seen.insert(n).second) return;
    todo.push_back(n);
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) ++leaves[acc->variable.impl()].first;
  };
  for (const Edge& e : roots) discover(e.fn.get());
  while (!todo.empty()) {
    Node* n = todo.back();
    todo.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      ++deps[e.fn.get()];
      discover(e.fn.get());
    }
  }

  std::unordered_map<Node*, TensorList> buffers;
  auto buffer_of = [&](Node* n) -> TensorList& {
    TensorList& b = buffers[n];
    if (b.empty()) b.resize(n->num_outputs);
    return b;
  };
  for (size_t i = 0; i < roots.size(); ++i)
    accumulate(buffer_of(roots[i].fn.get()), roots[i].input_nr, std::move(root_grads[i]));

  auto later_first = [](Node* a, Node* b) { return a->sequence_nr < b->sequence_nr; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(later_first)> ready(later_first);
  std::unordered_set<Node*> queued;
  for (const Edge& e : roots)
    if (deps[e.fn.get()] == 0 && queued.insert(e.fn.get()).second) ready.push(e.fn.get());

  // See Note [Leaves finish early].
  auto finish_leaf = [&](const Tensor& variable, Tensor g) {
    AutogradMeta* m = meta_of(variable);
    if (m && m->hooks) g = m->hooks->run(std::move(g));
    if (capture) {  // grad() returns the gradients and leaves .grad alone
      for (size_t i = 0; i < capture->leaf.size(); ++i)
        if (capture->leaf[i] == variable.impl()) capture->add(i, g);
      return;
    }
    accumulate_grad(variable, std::move(g));
    if (m && m->hooks)
      for (const PostAccumulateGradHook& fn : m->hooks->post) fn(variable);
  };

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    TensorList grads = std::move(buffer_of(n));
    buffers.erase(n);
    TensorList outs;
    for (auto& [nr, hooks] : n->pre_hooks)
      if (grads[nr].defined()) grads[nr] = hooks->run(std::move(grads[nr]));
    if (capture) {
      for (size_t i = 0; i < capture->edge.size(); ++i)
        if (capture->edge[i].fn.get() == n) capture->add(i, grads[capture->edge[i].input_nr]);
    }
    if (auto* acc = dynamic_cast<AccumulateGrad*>(n)) {
      auto& [pending, sum] = leaves.at(acc->variable.impl());
      if (grads[0].defined()) sum = sum.defined() ? add(sum, grads[0]) : std::move(grads[0]);
      if (--pending == 0 && sum.defined()) finish_leaf(acc->variable, std::move(sum));
      continue;
    }
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    if (any) {
      outs = n->apply(std::move(grads));
      KILN_ASSERT(outs.size() == n->next_edges.size(), "{} returned {} gradients for {} edges",
                  n->name(), outs.size(), n->next_edges.size());
      if (is_anomaly_enabled()) check_finite(*n, outs);
    } else {
      outs.resize(n->next_edges.size());
    }
    if (!retain_graph) n->release_saved();
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.valid()) continue;
      if (outs[i].defined()) accumulate(buffer_of(e.fn.get()), e.input_nr, std::move(outs[i]));
      if (--deps[e.fn.get()] == 0) ready.push(e.fn.get());
    }
  }

  for (size_t i = 0; i < callbacks.size(); ++i) {  // a callback may queue more
    std::function<void()> fn = std::move(callbacks[i]);
    fn();
  }
}

// Root edges and seed gradients for a backward from `outputs`.
void prepare_roots(const char* op, const TensorList& outputs, const TensorList& grad_outputs,
                   std::vector<Edge>& edges, TensorList& seeds) {
  KILN_CHECK(grad_outputs.empty() || grad_outputs.size() == outputs.size(),
             "[{}] got {} outputs but {} gradients", op, outputs.size(), grad_outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    KILN_CHECK(out.defined(), "[{}] output {} is undefined", op, i);
    Edge e = gradient_edge(out);
    KILN_CHECK(e.valid(), "[{}] output {} does not require grad and has no grad_fn", op, i);
    Tensor seed = grad_outputs.empty() ? Tensor() : grad_outputs[i];
    if (!seed.defined()) {
      KILN_CHECK(out.numel() == 1,
                 "[{}] a gradient can be implied only for a single-element output, but output "
                 "{} has shape [{}]; pass its gradient",
                 op, i, fmt::join(out.sizes(), ", "));
      seed = ones_like(out);
    } else {
      KILN_CHECK(seed.sizes() == out.sizes(),
                 "[{}] the gradient for output {} has shape [{}], but the output has shape [{}]",
                 op, i, fmt::join(seed.sizes(), ", "), fmt::join(out.sizes(), ", "));
      KILN_CHECK_TYPE(is_floating(seed.dtype()),
                      "[{}] the gradient for output {} must be floating point, got {}", op, i,
                      name(seed.dtype()));
      seed = seed.detach();
      if (seed.dtype() != out.dtype()) seed = seed.to(out.dtype());
    }
    edges.push_back(std::move(e));
    seeds.push_back(std::move(seed));
  }
}

}  // namespace

void queue_callback(std::function<void()> fn) {
  KILN_CHECK(tls_callbacks != nullptr,
             "[queue_callback] no backward pass is running on this thread: call it from a hook");
  KILN_CHECK(static_cast<bool>(fn), "[queue_callback] the callback is empty");
  tls_callbacks->push_back(std::move(fn));
}

void backward(const TensorList& outputs, const TensorList& grad_outputs, bool retain_graph) {
  std::vector<Edge> edges;
  TensorList seeds;
  prepare_roots("backward", outputs, grad_outputs, edges, seeds);
  execute(edges, std::move(seeds), retain_graph, nullptr);
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                bool retain_graph, bool allow_unused) {
  std::vector<Edge> edges;
  TensorList seeds;
  prepare_roots("grad", outputs, grad_outputs, edges, seeds);
  Capture cap;
  cap.result.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    KILN_CHECK(in.defined() && in.requires_grad(), "[grad] input {} does not require grad", i);
    Edge e = gradient_edge(in);
    bool leaf = dynamic_cast<AccumulateGrad*>(e.fn.get()) != nullptr;
    cap.leaf.push_back(leaf ? in.impl() : nullptr);
    cap.edge.push_back(leaf ? Edge{} : e);
  }
  execute(edges, std::move(seeds), retain_graph, &cap);
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_CHECK(allow_unused || cap.result[i].defined(),
               "[grad] input {} was not used to compute the outputs; pass allow_unused=true "
               "to get an undefined gradient for it",
               i);
  }
  return std::move(cap.result);
}

}  // namespace kiln::autograd
