// SyncBatchNorm and convert_sync_batchnorm.
#include "kiln/nn/sync_batch_norm.h"

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/ops/ops.h"

namespace kiln::nn {

// Note [Synchronised batch statistics]
// Training on a group of G > 1 ranks, rank r holding n_r of the N = sum n_r samples (times the
// spatial size), the per-channel statistics are those of the whole batch:
//   mean = all_reduce(sum_r x) / all_reduce(n_r)
//   var  = all_reduce(sum_r (x - mean)^2) / N            (biased: what normalises)
//   y    = (x - mean) * rsqrt(var + eps) * weight + bias
// as a composite of differentiable ops and the functional all_reduce, whose backward
// all-reduces the gradient: autograd then yields each rank's slice of the whole-batch input
// gradient, and weight/bias gradients that DDP's (or FSDP's) reduction sums into the
// whole-batch ones. Two passes (mean, then squared deviations from the global mean) rather
// than sum and sum of squares: the latter cancels catastrophically when |mean| >> std. The
// sums and counts travel in one all_reduce; the counts are tensors so ranks may hold
// different batch sizes. The running stats move towards the global mean and the unbiased
// global variance (var * N / (N - 1)) under no_grad, as native batch norm's do, so every rank
// keeps identical buffers. 16-bit inputs are normalised in float32 and cast back.
// Everywhere else (eval, a group of one) the module is BatchNorm itself: native batch norm,
// bitwise.

SyncBatchNorm::SyncBatchNorm(int64_t num_features, const BatchNormOptions& options,
                             const distributed::ProcessGroup* group, const Init& init)
    : BatchNormNd("SyncBatchNorm", 2, std::numeric_limits<int64_t>::max(), num_features, options,
                  init),
      group_(group) {}

Tensor SyncBatchNorm::forward(const Tensor& x) {
  KILN_CHECK(x.defined() && x.dim() >= 2,
             "[SyncBatchNorm] expected an input [N, C, *] of rank "
             ">= 2, got shape {}",
             x.defined() ? x.sizes() : IntArrayRef());
  KILN_CHECK(x.size(1) == num_features,
             "[SyncBatchNorm] expected {} channels (dim 1), got shape {}", num_features, x.sizes());
  const bool training = is_training();
  const distributed::ProcessGroup* group = group_;
  if (group == nullptr && distributed::is_initialized()) group = &distributed::world();
  if (!training || group == nullptr || group->size() == 1) return BatchNormNd::forward(x);

  // See Note [Synchronised batch statistics].
  const int64_t channels = num_features;
  std::vector<int64_t> dims{0}, bshape(x.dim(), 1);
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  bshape[1] = channels;
  const bool reduced = x.dtype() == kFloat16 || x.dtype() == kBFloat16;
  const Tensor xf = reduced ? x.to(kFloat32) : x;
  const int64_t local_count = x.numel() / channels;
  const Tensor count = full({channels}, static_cast<double>(local_count), xf.dtype(), xf.device());
  const Tensor stats =
      distributed::all_reduce(cat({sum(xf, dims), count}), distributed::ReduceOp::Sum, group);
  const Tensor total = narrow(stats, 0, channels, channels);
  // As native batch norm, one value per channel is refused (its unbiased variance is 0/0).
  // Only ranks holding at most one can see a global count of one, and then every rank does:
  // all raise together, before the running stats change.
  if (local_count <= 1) {
    const double n = select(total, 0, 0).item<double>();
    KILN_CHECK(n > 1,
               "[SyncBatchNorm] Expected more than 1 value per channel across group {} when "
               "training, got {} (input size {} on rank {})",
               group->name(), n, x.sizes(), group->rank());
  }
  const Tensor mean = narrow(stats, 0, 0, channels) / total;
  const Tensor diff = xf - mean.view(bshape);
  const Tensor var =
      distributed::all_reduce(sum(diff * diff, dims), distributed::ReduceOp::Sum, group) / total;
  Tensor y = diff * rsqrt(var + options.eps).view(bshape);
  if (options.affine) y = y * weight.view(bshape) + bias.view(bshape);

  if (options.track_running_stats) {
    autograd::NoGradGuard no_grad;
    add_(num_batches_tracked, 1);
    const Tensor t = total.detach();
    const Tensor unbiased = var.detach() * t / (t - 1);
    lerp_(running_mean, mean.detach().to(running_mean.dtype()), options.momentum);
    lerp_(running_var, unbiased.to(running_var.dtype()), options.momentum);
  }
  return reduced ? y.to(x.dtype()) : y;
}

std::shared_ptr<Module> convert_sync_batchnorm(std::shared_ptr<Module> module,
                                               const distributed::ProcessGroup* group) {
  KILN_CHECK(module != nullptr, "[convert_sync_batchnorm] the module is null");
  auto convert = [&](BatchNormNd& bn) {
    auto sync = std::make_shared<SyncBatchNorm>(bn.num_features, bn.options, group,
                                                Init{.dtype = kFloat32});
    // The same tensors: registered slots of the new module, sharing the old one's storage.
    sync->weight = bn.weight;
    sync->bias = bn.bias;
    sync->running_mean = bn.running_mean;
    sync->running_var = bn.running_var;
    sync->num_batches_tracked = bn.num_batches_tracked;
    sync->train(bn.is_training());
    return sync;
  };
  auto is_plain = [](Module* m) {
    return dynamic_cast<BatchNormNd*>(m) != nullptr && dynamic_cast<SyncBatchNorm*>(m) == nullptr;
  };
  if (is_plain(module.get())) return convert(static_cast<BatchNormNd&>(*module));
  // Parents by path, then the swaps; the walk's pointers stay valid (the parents are kept).
  std::vector<std::pair<std::string, Module*>> modules = module->named_modules();
  std::vector<std::tuple<Module*, std::string, BatchNormNd*>> swaps;
  for (const auto& [path, m] : modules) {
    if (path.empty() || !is_plain(m)) continue;
    const size_t dot = path.rfind('.');
    const std::string parent_path = dot == std::string::npos ? "" : path.substr(0, dot);
    for (const auto& [p, parent] : modules)
      if (p == parent_path)
        swaps.emplace_back(parent, path.substr(dot + 1), static_cast<BatchNormNd*>(m));
  }
  for (auto& [parent, name, bn] : swaps) parent->replace_module(name, convert(*bn));
  return module;
}

}  // namespace kiln::nn
