#include "kiln/parallel/tensor_parallel.h"

#include <fnmatch.h>

#include <set>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"

namespace kiln::parallel {

namespace dt = kiln::dtensor;

// Note [Tensor parallel styles]
// A style does two things to a module, as PyTorch's do: it replaces parameters by DTensors on
// the mesh (distribute_tensor from rank 0's values, leaves that require grad, so the module's
// registered pointers now reach DTensors and optimizers see them), and it registers forward
// hooks (nn::Module::register_forward_pre_hook / register_forward_hook, run by
// UnaryModule::operator()) that convert what goes in and comes out. A plain input is taken as
// this rank's local tensor with the declared layout (from_local, no communication); a DTensor
// input is redistributed to the layout the style wants; the output is redistributed to the
// declared output layout and, with use_local_output, handed out as its local tensor (so the
// code around the module keeps working on plain tensors, the way Megatron-LM's does).
// Everything between is the Sharded layer's business: a colwise Linear's linear(x R, W S(0))
// gives S(-1) without communication, a rowwise one's linear(x S(-1), W S(1)) a Partial(sum)
// that the output layout all-reduces. Gradients follow from autograd through DTensors (Note
// [Gradients of DTensors]): from_local's backward all-reduces a Partial gradient of a Replicate
// input (Megatron's "f"), and a Replicate parameter's Partial gradient (a norm weight under
// sequence parallel) is all-reduced into its .grad.

// Note [Fused column shards]
// A fused projection (GPT's c_attn: q, k and v in one [3C, C] weight) column-sharded as is
// would give rank 0 all of q and half of k. With fused_chunks = k the out dim is taken as k
// equal blocks and rank r holds chunk r of each, so its local output is [q_r, k_r, v_r]: the
// heads of rank r, and the attention runs on them locally. The DTensor is still Shard(0) of a
// [k n, in] tensor, whose global rows are the module's reordered rank-major, [q_0, k_0, v_0,
// q_1, ...]; fused_rows_to_module_order undoes the order of a gathered tensor. Each block's
// rows must divide evenly by the mesh size.

namespace {

std::string describe(const nn::Module& m) {
  if (m.path().empty()) return fmt::format("module {}", m.type_name());
  return fmt::format("module '{}' ({})", m.path(), m.type_name());
}

Placement normalized(Placement p, int64_t ndim) {
  if (p.is_shard() && p.dim() < 0) return dt::Shard(p.dim() + ndim);
  return p;
}

// A plain `x` taken as this rank's local tensor with `layout`; a DTensor as it is.
Tensor as_dtensor(const Tensor& x, const DeviceMesh& mesh, Placement layout, const char* who) {
  if (!dt::is_dtensor(x)) return dt::from_local(x, mesh, {normalized(layout, x.dim())});
  KILN_CHECK(&dt::spec_of(x)->mesh() == &mesh,
             "[{}] input is a DTensor on {}, the style's mesh is {}", who,
             dt::spec_of(x)->mesh().str(), mesh.str());
  return x;
}

Tensor redistributed(const Tensor& x, Placement p) {
  const dt::DTensorSpec* s = dt::spec_of(x);
  const Placement want = normalized(p, s->ndim());
  if (s->placements()[0] == want) return x;
  return dt::redistribute(x, {want});
}

Tensor finish(const Tensor& y, Placement layout, bool local) {
  Tensor out = redistributed(y, layout);
  return local ? dt::to_local(out) : out;
}

// Replaces a parameter by a DTensor leaf with `p` (nothing for an undefined bias).
void distribute_param(Tensor& param, const DeviceMesh& mesh, Placement p) {
  if (!param.defined()) return;
  autograd::NoGradGuard no_grad;
  Tensor d = dt::distribute_tensor(param.detach(), mesh, {p});
  d.requires_grad_(true);
  param = d;
}

// See Note [Fused column shards].
void distribute_fused(Tensor& param, const DeviceMesh& mesh, int64_t chunks) {
  if (!param.defined()) return;
  autograd::NoGradGuard no_grad;
  Shape blocks{chunks, param.size(0) / chunks};
  for (int64_t d = 1; d < param.dim(); ++d) blocks.push_back(param.size(d));
  Tensor pieces = dt::distribute_tensor(param.detach().reshape(blocks), mesh, {dt::Shard(1)});
  Shape local{-1};
  for (int64_t d = 1; d < param.dim(); ++d) local.push_back(param.size(d));
  Tensor rows = dt::to_local(pieces).reshape(local).contiguous();
  Tensor d = dt::from_local(rows, mesh, {dt::Shard(0)}, false, param.sizes());
  d.requires_grad_(true);
  param = d;
}

void check_not_parallel(const Tensor& param, const nn::Module& m, const char* who) {
  KILN_CHECK(!param.defined() || !dt::is_dtensor(param),
             "[{}] {} is already parallelized (its parameters are DTensors)", who, describe(m));
}

nn::UnaryModule& unary(nn::Module& m, const char* who) {
  auto* u = dynamic_cast<nn::UnaryModule*>(&m);
  KILN_CHECK_TYPE(u != nullptr,
                  "[{}] {} is not a UnaryModule: its calls run no hooks, so its input and output "
                  "cannot be converted",
                  who, describe(m));
  return *u;
}

bool atoms_match(const std::string& pattern, const std::string& path) {
  if (pattern.empty() || path.empty()) return pattern == path;
  size_t p0 = 0, s0 = 0;
  while (true) {
    const size_t p1 = pattern.find('.', p0), s1 = path.find('.', s0);
    const std::string pa = pattern.substr(p0, p1 - p0), sa = path.substr(s0, s1 - s0);
    if (fnmatch(pa.c_str(), sa.c_str(), 0) != 0) return false;
    if (p1 == std::string::npos || s1 == std::string::npos)
      return p1 == std::string::npos && s1 == std::string::npos;
    p0 = p1 + 1;
    s0 = s1 + 1;
  }
}

bool shards_parameters(const ParallelStyle& s) {
  return dynamic_cast<const PrepareModuleInput*>(&s) == nullptr &&
         dynamic_cast<const PrepareModuleOutput*>(&s) == nullptr;
}

}  // namespace

// ---------------------------------------------------------------- ColwiseParallel

ColwiseParallel::ColwiseParallel(ColwiseOptions o) : options(std::move(o)) {
  KILN_CHECK(options.fused_chunks >= 1, "[ColwiseParallel] fused_chunks must be positive, got {}",
             options.fused_chunks);
}

void ColwiseParallel::check(nn::Module& m, const DeviceMesh& mesh) const {
  if (auto* lin = dynamic_cast<nn::Linear*>(&m)) {
    check_not_parallel(lin->weight, m, "ColwiseParallel");
    const int64_t out = lin->weight.size(0), k = options.fused_chunks;
    KILN_CHECK(k == 1 || (out % k == 0 && (out / k) % mesh.size() == 0),
               "[ColwiseParallel] {}: fused_chunks {} needs out features ({}) in {} blocks whose "
               "size divides by the mesh size {}",
               describe(m), k, out, k, mesh.size());
    return;
  }
  if (auto* emb = dynamic_cast<nn::Embedding*>(&m)) {
    check_not_parallel(emb->weight, m, "ColwiseParallel");
    KILN_CHECK(options.fused_chunks == 1,
               "[ColwiseParallel] {}: fused_chunks applies to Linear only, got {}", describe(m),
               options.fused_chunks);
    return;
  }
  KILN_CHECK_TYPE(false, "[ColwiseParallel] {} is not a Linear or an Embedding", describe(m));
}

void ColwiseParallel::apply(nn::Module& m, const DeviceMesh& mesh) const {
  check(m, mesh);
  if (auto* lin = dynamic_cast<nn::Linear*>(&m)) {
    if (options.fused_chunks > 1) {
      distribute_fused(lin->weight, mesh, options.fused_chunks);
      distribute_fused(lin->bias, mesh, options.fused_chunks);
    } else {
      distribute_param(lin->weight, mesh, dt::Shard(0));
      distribute_param(lin->bias, mesh, dt::Shard(0));
    }
  } else {
    distribute_param(dynamic_cast<nn::Embedding&>(m).weight, mesh, dt::Shard(1));
  }
  const DeviceMesh* mp = &mesh;
  const Placement in = options.input_layouts.value_or(dt::Replicate());
  const Placement out = options.output_layouts.value_or(dt::Shard(-1));
  const bool local = options.use_local_output;
  m.register_forward_pre_hook([mp, in](const Tensor& x) {
    return redistributed(as_dtensor(x, *mp, in, "ColwiseParallel"), dt::Replicate());
  });
  m.register_forward_hook([out, local](const Tensor& y) { return finish(y, out, local); });
}

// ---------------------------------------------------------------- RowwiseParallel

RowwiseParallel::RowwiseParallel(RowwiseOptions o) : options(std::move(o)) {}

void RowwiseParallel::check(nn::Module& m, const DeviceMesh&) const {
  if (auto* lin = dynamic_cast<nn::Linear*>(&m))
    return check_not_parallel(lin->weight, m, "RowwiseParallel");
  if (auto* emb = dynamic_cast<nn::Embedding*>(&m))
    return check_not_parallel(emb->weight, m, "RowwiseParallel");
  KILN_CHECK_TYPE(false, "[RowwiseParallel] {} is not a Linear or an Embedding", describe(m));
}

void RowwiseParallel::apply(nn::Module& m, const DeviceMesh& mesh) const {
  check(m, mesh);
  Placement desired = dt::Shard(-1);
  if (auto* lin = dynamic_cast<nn::Linear*>(&m)) {
    distribute_param(lin->weight, mesh, dt::Shard(1));
    distribute_param(lin->bias, mesh, dt::Replicate());
  } else {
    distribute_param(dynamic_cast<nn::Embedding&>(m).weight, mesh, dt::Shard(0));
    desired = dt::Replicate();
  }
  const DeviceMesh* mp = &mesh;
  const Placement in = options.input_layouts.value_or(desired);
  const Placement out = options.output_layouts.value_or(dt::Replicate());
  const bool local = options.use_local_output;
  m.register_forward_pre_hook([mp, in, desired](const Tensor& x) {
    return redistributed(as_dtensor(x, *mp, in, "RowwiseParallel"), desired);
  });
  m.register_forward_hook([out, local](const Tensor& y) { return finish(y, out, local); });
}

// ---------------------------------------------------------------- SequenceParallel

SequenceParallel::SequenceParallel(SequenceParallelOptions o) : options(std::move(o)) {}

void SequenceParallel::check(nn::Module& m, const DeviceMesh&) const {
  if (auto* ln = dynamic_cast<nn::LayerNorm*>(&m))
    return check_not_parallel(ln->weight, m, "SequenceParallel");
  if (auto* rms = dynamic_cast<nn::RMSNorm*>(&m))
    return check_not_parallel(rms->weight, m, "SequenceParallel");
  KILN_CHECK_TYPE(dynamic_cast<nn::Dropout*>(&m) != nullptr,
                  "[SequenceParallel] {} is not a LayerNorm, an RMSNorm or a Dropout", describe(m));
}

void SequenceParallel::apply(nn::Module& m, const DeviceMesh& mesh) const {
  check(m, mesh);
  if (auto* ln = dynamic_cast<nn::LayerNorm*>(&m)) {
    distribute_param(ln->weight, mesh, dt::Replicate());
    distribute_param(ln->bias, mesh, dt::Replicate());
  } else if (auto* rms = dynamic_cast<nn::RMSNorm*>(&m)) {
    distribute_param(rms->weight, mesh, dt::Replicate());
  }
  const DeviceMesh* mp = &mesh;
  const Placement seq = dt::Shard(options.sequence_dim);
  const bool local = options.use_local_output;
  m.register_forward_pre_hook([mp, seq](const Tensor& x) {
    return redistributed(as_dtensor(x, *mp, seq, "SequenceParallel"), seq);
  });
  m.register_forward_hook([seq, local](const Tensor& y) { return finish(y, seq, local); });
}

// ---------------------------------------------------------------- PrepareModuleInput/Output

PrepareModuleInput::PrepareModuleInput(PrepareInputOptions o) : options(std::move(o)) {
  KILN_CHECK(options.input_layouts.has_value() == options.desired_input_layouts.has_value(),
             "[PrepareModuleInput] input_layouts and desired_input_layouts go together, got {} "
             "and {}",
             options.input_layouts ? options.input_layouts->str() : "none",
             options.desired_input_layouts ? options.desired_input_layouts->str() : "none");
}

void PrepareModuleInput::check(nn::Module& m, const DeviceMesh&) const {
  unary(m, "PrepareModuleInput");
}

void PrepareModuleInput::apply(nn::Module& m, const DeviceMesh& mesh) const {
  check(m, mesh);
  if (!options.input_layouts) return;
  const DeviceMesh* mp = &mesh;
  const Placement in = *options.input_layouts, want = *options.desired_input_layouts;
  const bool local = options.use_local_output;
  m.register_forward_pre_hook([mp, in, want, local](const Tensor& x) {
    return finish(as_dtensor(x, *mp, in, "PrepareModuleInput"), want, local);
  });
}

PrepareModuleOutput::PrepareModuleOutput(PrepareOutputOptions o) : options(std::move(o)) {
  KILN_CHECK(options.output_layouts.has_value() == options.desired_output_layouts.has_value(),
             "[PrepareModuleOutput] output_layouts and desired_output_layouts go together, got "
             "{} and {}",
             options.output_layouts ? options.output_layouts->str() : "none",
             options.desired_output_layouts ? options.desired_output_layouts->str() : "none");
}

void PrepareModuleOutput::check(nn::Module& m, const DeviceMesh&) const {
  unary(m, "PrepareModuleOutput");
}

void PrepareModuleOutput::apply(nn::Module& m, const DeviceMesh& mesh) const {
  check(m, mesh);
  if (!options.output_layouts) return;
  const DeviceMesh* mp = &mesh;
  const Placement out = *options.output_layouts, want = *options.desired_output_layouts;
  const bool local = options.use_local_output;
  m.register_forward_hook([mp, out, want, local](const Tensor& y) {
    return finish(as_dtensor(y, *mp, out, "PrepareModuleOutput"), want, local);
  });
}

// ---------------------------------------------------------------- parallelize_module

void apply_parallel_styles(const std::vector<StyleTarget>& targets, const DeviceMesh& mesh) {
  KILN_CHECK(mesh.ndim() == 1,
             "[parallelize_module] expected a 1-D mesh, got {} (pass its tensor-parallel "
             "submesh, mesh.submesh({{\"tp\"}}))",
             mesh.str());
  std::set<nn::Module*> sharded;
  for (const auto& t : targets) {
    KILN_CHECK(t.style != nullptr && t.module != nullptr,
               "[parallelize_module] plan path '{}' has no style", t.pattern);
    KILN_CHECK(!shards_parameters(*t.style) || sharded.insert(t.module).second,
               "[parallelize_module] {} ('{}') is matched by more than one style that shards "
               "parameters (the second: '{}', {})",
               describe(*t.module), t.path, t.pattern, t.style->name());
  }
  for (const auto& t : targets) t.style->check(*t.module, mesh);
  for (const auto& t : targets) t.style->apply(*t.module, mesh);
}

void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan) {
  const auto modules = module.named_modules();
  std::vector<StyleTarget> targets;
  for (const auto& [pattern, style] : plan) {
    KILN_CHECK(style != nullptr, "[parallelize_module] plan path '{}' has no style", pattern);
    bool matched = false;
    for (const auto& [path, m] : modules) {
      if (!atoms_match(pattern, path)) continue;
      matched = true;
      targets.push_back({path, pattern, m, style});
    }
    if (!matched) {
      std::vector<std::string> paths;
      for (const auto& [path, m] : modules)
        if (!path.empty() && paths.size() < 12) paths.push_back(path);
      KILN_CHECK(false,
                 "[parallelize_module] plan path '{}' matches no submodule of {} (its "
                 "submodules: {}{})",
                 pattern, module.type_name(), fmt::join(paths, ", "),
                 modules.size() > paths.size() + 1 ? ", ..." : "");
    }
  }
  apply_parallel_styles(targets, mesh);
}

// ---------------------------------------------------------------- loss parallel

// Note [Loss parallel cross-entropy]
// cross_entropy is log_softmax then nll_loss, and on logits sharded over the classes both stay
// sharded in the Sharded layer: log_softmax all-reduces the rows' maxima and sums of
// exponentials ([N, 1] each; Note [Sharded softmax] in rules_reduction.cpp) and nll_loss of
// class-sharded log-probabilities with replicated targets is Partial(sum), each rank summing
// its own classes' terms (Note [Loss parallel] in rules_nn.cpp). Their backward formulas stay
// sharded as well. So loss parallel is kiln::cross_entropy with the targets taken as replicated
// (LossParallel: dtensor::ImplicitReplication, which wraps them below autograd, so the backward
// formulas meet the plain targets again and must run in the scope too, as in PyTorch), and
// loss_parallel_cross_entropy is cross_entropy on targets made replicated DTensors up front,
// plus the all-reduce of the loss to Replicate. What moves is [N, 1] twice and a scalar, against an
// all-gather of [N, C].
LossParallel::LossParallel() : implicit_(std::make_unique<dt::ImplicitReplication>()) {}
LossParallel::~LossParallel() = default;

Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& target,
                                   int64_t ignore_index) {
  if (!dt::is_dtensor(logits)) return cross_entropy(logits, target, ignore_index);
  KILN_CHECK(logits.dim() == 2,
             "[loss_parallel_cross_entropy] expected logits of shape [N, C], got [{}]",
             fmt::join(logits.sizes(), ", "));
  KILN_CHECK(target.dim() == 1 && target.size(0) == logits.size(0),
             "[loss_parallel_cross_entropy] expected targets of shape [{}], got [{}]",
             logits.size(0), fmt::join(target.sizes(), ", "));
  const DeviceMesh& mesh = dt::spec_of(logits)->mesh();
  const dt::Placements replicate(mesh.ndim(), dt::Replicate());
  // The target made a DTensor here, above autograd, so that backward (outside any scope) finds
  // DTensors only.
  Tensor tgt = dt::is_dtensor(target) ? target : dt::from_local(target, mesh, replicate);
  return dt::redistribute(cross_entropy(logits, tgt, ignore_index), replicate);
}

Tensor fused_rows_to_module_order(const Tensor& whole, int64_t chunks, int64_t parts) {
  KILN_CHECK(chunks >= 1 && parts >= 1 && whole.dim() >= 1 && whole.size(0) % (chunks * parts) == 0,
             "[fused_rows_to_module_order] {} rows do not split into {} chunks of {} parts",
             whole.dim() ? whole.size(0) : 0, chunks, parts);
  Shape split{parts, chunks, whole.size(0) / (chunks * parts)};
  for (int64_t d = 1; d < whole.dim(); ++d) split.push_back(whole.size(d));
  return transpose(whole.reshape(split), 0, 1).reshape(whole.sizes());
}

// ---------------------------------------------------------------- GPT

ParallelizePlan gpt_tensor_parallel_plan(const nn::GPTConfig& config, const DeviceMesh& mesh) {
  KILN_CHECK(mesh.ndim() == 1, "[gpt_tensor_parallel_plan] expected a 1-D mesh, got {}",
             mesh.str());
  KILN_CHECK(config.heads % mesh.size() == 0,
             "[gpt_tensor_parallel_plan] {} heads do not divide over a mesh of {} ranks",
             config.heads, mesh.size());
  auto colwise = std::make_shared<ColwiseParallel>();
  auto rowwise = std::make_shared<RowwiseParallel>();
  return {
      {"transformer.wte", rowwise},
      {"transformer.h.*.attn.c_attn",
       std::make_shared<ColwiseParallel>(ColwiseOptions{.fused_chunks = 3})},
      {"transformer.h.*.attn.c_proj", rowwise},
      {"transformer.h.*.mlp.c_fc", colwise},
      {"transformer.h.*.mlp.c_proj", rowwise},
      {"transformer.ln_f", std::make_shared<PrepareModuleOutput>(
                               PrepareOutputOptions{.output_layouts = dt::Replicate(),
                                                    .desired_output_layouts = dt::Replicate(),
                                                    .use_local_output = false})},
  };
}

}  // namespace kiln::parallel
