#include "kiln/dtensor/dtensor_autograd.h"

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/factories.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {

// Note [Gradients of DTensors]
// Autograd sits above the Sharded layer (DESIGN.md "Dispatch"): an op on DTensors is recorded
// like any op, its backward formula runs on DTensor gradients, and every op of that formula
// goes through the Sharded layer in turn. So a gradient is a DTensor whose global value is the
// gradient of the input's global value, whatever its placements; the redistributes the layer
// runs inside an op are below autograd and never differentiated. That is what keeps the
// placement bugs of "the reverse collective" out: a redistribute is the identity on global
// values, so its backward is the identity too, redistributed only to line the gradient up with
// the input (a Shard input gets a Shard gradient: a local chunk of a replicated gradient, a
// reduce-scatter only of a Partial one; a Replicate or Partial input keeps the gradient's
// placements, so a Partial gradient stays a set of terms until someone needs the sum). What
// does need care:
// - the seed and the buffers autograd makes with ones_like/zeros_like/empty_like are DTensors on
//   the tensor's mesh (a fill never gives Partial placements: every rank holding 1 would sum to
//   the mesh size), and the zeros a formula starts an input's gradient from (zeros_of) are
//   replicated DTensors, since the formula writes into a view of them;
// - a leaf's .grad has the leaf's placements (issue 15): the gradient is redistributed to them
//   before it is accumulated, so a replicated weight's Partial gradient is all-reduced there, a
//   sharded one's reduce-scattered, once per backward;
// - to_local and from_local cross between a DTensor and its local tensor: to_local's gradient
//   is the DTensor whose local tensor is the local gradient (Partial read as Replicate: the
//   local gradients of a Partial tensor's terms are the gradient of their sum), and from_local's
//   is this rank's piece of the DTensor gradient, laid out as the local tensor was.

namespace {

Placements partial_as_replicate(ArrayRef<Placement> ps) {
  Placements out(ps.begin(), ps.end());
  for (Placement& p : out)
    if (p.is_partial()) p = Replicate();
  return out;
}

const DTensorSpec* contiguous_spec(const DTensorSpec& s, ArrayRef<Placement> ps) {
  return intern_spec(s.mesh(), ps, s.shape(), contiguous_strides(s.shape()), s.dtype());
}

// empty_like and full_like of a DTensor (installed in kiln/ops with rand_like's and
// randn_like's), also from a saved layout.
Tensor sharded_full(const void* layout, const Scalar* fill) {
  const DTensorSpec& s = *static_cast<const DTensorSpec*>(layout);
  const Device device = s.mesh().device();
  if (!fill)
    return make_dtensor(empty(s.local_shape(), s.dtype(), device),
                        contiguous_spec(s, s.placements()));
  const DTensorSpec* spec = contiguous_spec(s, partial_as_replicate(s.placements()));
  return make_dtensor(full(spec->local_shape(), *fill, s.dtype(), device), spec);
}
Tensor sharded_like(const Tensor& like, const kiln::detail::LikeFill& fill) {
  using Kind = kiln::detail::LikeFill::Kind;
  if (fill.kind == Kind::kRand || fill.kind == Kind::kRandn)  // never Partial, like a fill
    return detail::random_like(like, partial_as_replicate(spec_of(like)->placements()),
                               fill.kind == Kind::kRandn, fill.gen);
  return sharded_full(spec_of(like), fill.kind == Kind::kFull ? fill.value : nullptr);
}
// Autograd's tensors for a DTensor input's gradient (zeros_of in kiln/autograd/formulas.cpp),
// made from its saved layout: replicated, because the formulas write the gradient into a view
// of them (slice_bw: slice(zeros).copy_(g)), and a view of a shard that must move data first is
// a new tensor, not a view, so the write would be lost.
Tensor autograd_full(const void* layout, const Scalar* fill) {
  const DTensorSpec& s = *static_cast<const DTensorSpec*>(layout);
  const DTensorSpec* spec =
      contiguous_spec(s, Placements(static_cast<size_t>(s.mesh().ndim()), Replicate()));
  return make_dtensor(
      full(spec->local_shape(), fill ? *fill : Scalar(0), s.dtype(), s.mesh().device()), spec);
}

// A leaf's gradient laid out like the leaf, before accumulation (installed in kiln/autograd).
Tensor grad_like_leaf(const Tensor& leaf, Tensor g) {
  KILN_CHECK_TYPE(is_dtensor(g),
                  "[backward] the gradient of a DTensor leaf ({}) is a plain tensor of shape {}; "
                  "a DTensor's gradient must be a DTensor",
                  spec_of(leaf)->str(), g.sizes());
  const DTensorSpec& want = *spec_of(leaf);
  const DTensorSpec& have = *spec_of(g);
  if (have.placements() == want.placements()) return g;
  autograd::NoGradGuard no_grad;
  return redistribute(g, want.placements());
}

class RedistributeBackward final : public autograd::Node {
 public:
  explicit RedistributeBackward(Placements from) : from_(std::move(from)) {}
  std::string name() const override { return "RedistributeBackward"; }
  TensorList apply(TensorList&& grads) override {
    Tensor& g = grads[0];
    if (!g.defined()) return {Tensor()};
    KILN_CHECK_TYPE(is_dtensor(g), "[redistribute] backward got a plain tensor gradient");
    Placements to(spec_of(g)->placements().begin(), spec_of(g)->placements().end());
    for (size_t m = 0; m < to.size(); ++m)
      if (from_[m].is_shard()) to[m] = from_[m];
    return {redistribute(g, to)};
  }

 private:
  Placements from_;
};

class ToLocalBackward final : public autograd::Node {
 public:
  explicit ToLocalBackward(const DTensorSpec* spec)
      : spec_(contiguous_spec(*spec, partial_as_replicate(spec->placements()))) {}
  std::string name() const override { return "ToLocalBackward"; }
  TensorList apply(TensorList&& grads) override {
    Tensor& g = grads[0];
    if (!g.defined()) return {Tensor()};
    return {make_dtensor(g.is_contiguous() ? g : g.contiguous(), spec_)};
  }

 private:
  const DTensorSpec* spec_;
};

class FromLocalBackward final : public autograd::Node {
 public:
  explicit FromLocalBackward(ArrayRef<Placement> ps) : to_(partial_as_replicate(ps)) {}
  std::string name() const override { return "FromLocalBackward"; }
  TensorList apply(TensorList&& grads) override {
    Tensor& g = grads[0];
    if (!g.defined()) return {Tensor()};
    KILN_CHECK_TYPE(is_dtensor(g), "[from_local] backward got a plain tensor gradient");
    return {sharded_meta(redistribute(g, to_)).local};
  }

 private:
  Placements to_;
};

void link(const Tensor& in, const Tensor& out, Ref<autograd::Node> node) {
  node->next_edges.push_back(autograd::gradient_edge(in));
  autograd::set_history(out, node, 0);
}

const bool g_installed = [] {
  kiln::detail::set_sharded_like_factory(&sharded_like);
  kiln::detail::set_sharded_layout_factory(&autograd_full);
  autograd::set_grad_layout_hook(&grad_like_leaf);
  return true;
}();

}  // namespace

bool records_grad(const Tensor& t) { return t.requires_grad() && autograd::is_grad_enabled(); }

void record_redistribute(const Tensor& in, const Tensor& out) {
  link(in, out,
       make_ref<RedistributeBackward>(
           Placements(spec_of(in)->placements().begin(), spec_of(in)->placements().end())));
}

Tensor record_to_local(const Tensor& dt, const Tensor& local) {
  Tensor out = ops::op_alias(local);
  link(dt, out, make_ref<ToLocalBackward>(spec_of(dt)));
  return out;
}

void record_from_local(const Tensor& local, const Tensor& out) {
  link(local, out, make_ref<FromLocalBackward>(spec_of(out)->placements()));
}

}  // namespace kiln::dtensor
