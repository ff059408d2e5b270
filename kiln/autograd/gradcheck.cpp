#include "kiln/autograd/gradcheck.h"

#include <cmath>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/ops/ops.h"

namespace kiln::autograd {

namespace {
// Row-major element `i` of a tensor as a double (a host read).
double element(const Tensor& t, int64_t i) {
  return select(t.contiguous().reshape({-1}), 0, i).to(kFloat64).item<double>();
}
// A float64 copy (never a view: an output may alias the input being perturbed).
Tensor flat_copy(const Tensor& t) { return clone(t.detach()).to(kFloat64).reshape({-1}); }
}  // namespace

bool gradcheck(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
               const GradcheckOptions& o, std::string* why) {
  TensorList outputs = fn(inputs);
  std::vector<size_t> wrt;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) wrt.push_back(i);
  KILN_CHECK(!wrt.empty(), "[gradcheck] no input requires grad");

  // analytical[out][in]: [out numel, in numel], one backward per output element.
  std::vector<std::vector<std::vector<double>>> analytical(outputs.size());
  for (size_t oi = 0; oi < outputs.size(); ++oi) {
    const Tensor& out = outputs[oi];
    analytical[oi].assign(wrt.size(), std::vector<double>());
    if (!out.requires_grad() || !is_floating(out.dtype())) continue;
    for (size_t w = 0; w < wrt.size(); ++w)
      analytical[oi][w].assign(out.numel() * inputs[wrt[w]].numel(), 0.0);
    for (int64_t j = 0; j < out.numel(); ++j) {
      Tensor seed = zeros({out.numel()}, out.dtype(), out.device());
      select(seed, 0, j).fill_(1.0);
      TensorList ins;
      for (size_t w : wrt) ins.push_back(inputs[w]);
      TensorList g = grad({out}, ins, {seed.reshape(out.sizes())}, true, true);
      for (size_t w = 0; w < wrt.size(); ++w) {
        if (!g[w].defined()) continue;
        Tensor flat = flat_copy(g[w]);
        const double* p = flat.data<double>();
        for (int64_t k = 0; k < flat.numel(); ++k) analytical[oi][w][j * flat.numel() + k] = p[k];
      }
    }
  }

  NoGradGuard no_grad;
  for (size_t w = 0; w < wrt.size(); ++w) {
    const Tensor& in = inputs[wrt[w]];
    Tensor flat_in = in.reshape({-1});
    KILN_CHECK(flat_in.impl()->storage() == in.impl()->storage(),
               "[gradcheck] input {} must be viewable as 1-D (make it contiguous)", wrt[w]);
    for (int64_t k = 0; k < in.numel(); ++k) {
      double x = element(in, k);
      Tensor slot = select(flat_in, 0, k);
      // Outputs are copied at once: one may be a view of the input being perturbed.
      auto eval_at = [&](double value) {
        slot.fill_(value);
        TensorList outs = fn(inputs);
        for (Tensor& t : outs) t = flat_copy(t);
        return outs;
      };
      TensorList plus = eval_at(x + o.eps);
      TensorList minus = eval_at(x - o.eps);
      slot.fill_(x);
      for (size_t oi = 0; oi < outputs.size(); ++oi) {
        if (analytical[oi][w].empty()) continue;
        const Tensor &fp = plus[oi], &fm = minus[oi];
        const double *pp = fp.data<double>(), *pm = fm.data<double>();
        for (int64_t j = 0; j < fp.numel(); ++j) {
          double numerical = (pp[j] - pm[j]) / (2 * o.eps);
          double a = analytical[oi][w][j * in.numel() + k];
          if (std::abs(a - numerical) <= o.atol + o.rtol * std::abs(numerical)) continue;
          if (why)
            *why = fmt::format(
                "[gradcheck] output {} element {} w.r.t. input {} element {}: analytical {}, "
                "numerical {}",
                oi, j, wrt[w], k, a, numerical);
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace kiln::autograd
