#include "kiln/autograd/op_node.h"

#include <cctype>

#include "kiln/ops/ops.h"

namespace kiln::autograd {

// "log_softmax_" -> "LogSoftmaxBackward", as PyTorch names its nodes.
std::string OpNode::name() const {
  std::string out;
  bool upper = true;
  for (char ch : op.name()) {
    if (ch == '_') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(ch))) : ch;
    upper = false;
  }
  return out + "Backward";
}

void OpNode::release_saved() {
  for (SavedTensor& s : inputs)
    if (s.defined()) s.reset();
  for (SavedTensor& s : outputs)
    if (s.defined()) s.reset();
}

TensorList OpNode::apply(TensorList&& grads) {
  TensorList out(geometry.size());
  derivative.fn(BackwardCtx(*this), grads, out);
  for (size_t k = 0; k < out.size(); ++k) {
    Tensor& g = out[k];
    if (!needs[k]) {
      g = Tensor();
      continue;
    }
    if (!g.defined()) continue;
    const TensorGeometry& geo = geometry[k];
    if (g.sizes() != IntArrayRef(geo.sizes)) {
      KILN_ASSERT(g.dim() >= static_cast<int64_t>(geo.sizes.size()),
                  "{} returned a gradient of shape [{}] for argument {} of shape [{}]", name(),
                  fmt::join(g.sizes(), ", "), k, fmt::join(geo.sizes, ", "));
      g = sum_to(g, geo.sizes);
    }
    if (g.dtype() != geo.dtype || g.device() != geo.device) g = g.to(geo.device).to(geo.dtype);
  }
  return out;
}

const IValue& BackwardCtx::arg(size_t pos) const {
  KILN_ASSERT(pos < node_.args.size(), "{} reads argument {} of {}", node_.name(), pos,
              node_.args.size());
  return node_.args[pos];
}
Tensor BackwardCtx::input(size_t slot) const {
  KILN_ASSERT(slot < node_.inputs.size(), "{} reads tensor {}", node_.name(), slot);
  if (!node_.geometry[slot].defined) return Tensor();
  return node_.inputs[slot].unpack(node_, slot);
}
Tensor BackwardCtx::output(size_t i) const {
  KILN_ASSERT(i < node_.outputs.size(), "{} reads output {}", node_.name(), i);
  return node_.outputs[i].unpack(node_, i);
}
const TensorGeometry& BackwardCtx::geometry(size_t slot) const { return node_.geometry.at(slot); }
bool BackwardCtx::needs(size_t slot) const { return node_.needs.at(slot); }
size_t BackwardCtx::num_slots() const { return node_.geometry.size(); }

Tensor sum_to(const Tensor& g, IntArrayRef sizes) {
  int64_t lead = g.dim() - static_cast<int64_t>(sizes.size());
  Shape dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] == 1 && g.size(lead + static_cast<int64_t>(i)) != 1) dims.push_back(lead + i);
  Tensor r = dims.empty() ? g : sum(g, dims, true);
  return r.sizes() == sizes ? r : r.reshape(sizes);
}

}  // namespace kiln::autograd
