#pragma once
// Tensor parallel on DTensors (DESIGN.md "Distributed"; docs/dtensor.md "Tensor parallel"),
// after PyTorch's torch.distributed.tensor.parallel: styles that turn a module's parameters into
// DTensors on a 1-D mesh and convert its input and output through forward hooks, a plan that
// names submodules by path, and cross-entropy over class-sharded logits. See Note [Tensor
// parallel styles] in tensor_parallel.cpp.
//
//   const auto& mesh = dtensor::init_device_mesh(Device(kCPU), {world}, {"tp"});
//   parallel::parallelize_module(mlp, mesh, {{"c_fc", std::make_shared<ColwiseParallel>()},
//                                            {"c_proj", std::make_shared<RowwiseParallel>()}});
//   Tensor y = mlp(x);  // x and y plain, replicated on every rank; one all-reduce inside
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/placement.h"
#include "kiln/nn/module.h"
#include "kiln/nn/transformer.h"

namespace kiln::dtensor {
class ImplicitReplication;
}

namespace kiln::parallel {

using dtensor::DeviceMesh;
using dtensor::Placement;

// How one module is parallelized. check() raises (before anything changes) when the style does
// not apply to `module`; apply() replaces parameters by DTensors and registers hooks.
class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  virtual std::string name() const = 0;
  virtual void check(nn::Module& module, const DeviceMesh& mesh) const = 0;
  virtual void apply(nn::Module& module, const DeviceMesh& mesh) const = 0;
};

// Linear: weight [out, in] Shard(0), bias Shard(0); Embedding: weight [num, dim] Shard(1). The
// input (plain: taken as `input_layouts`, default Replicate) is redistributed to Replicate; the
// output (Shard(-1)) is redistributed to `output_layouts` (default Shard(-1)), and handed out as
// its local tensor when `use_local_output`.
struct ColwiseOptions {
  std::optional<Placement> input_layouts = std::nullopt;
  std::optional<Placement> output_layouts = std::nullopt;
  bool use_local_output = true;
  // Linear only: the out dim is `fused_chunks` equal blocks (a fused q, k, v projection: 3)
  // and each rank holds its chunk of every block, so its local output is [q_r, k_r, v_r]. The
  // DTensor's global rows are then in rank-major order: fused_rows_to_module_order maps them
  // back. Note [Fused column shards].
  int64_t fused_chunks = 1;
};
class ColwiseParallel final : public ParallelStyle {
 public:
  explicit ColwiseParallel(ColwiseOptions options = {});
  std::string name() const override { return "ColwiseParallel"; }
  void check(nn::Module& module, const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const DeviceMesh& mesh) const override;
  const ColwiseOptions options;
};

// Linear: weight [out, in] Shard(1), bias Replicate, input redistributed to Shard(-1) (plain:
// taken as `input_layouts`, default Shard(-1)); Embedding (vocab parallel): weight Shard(0),
// input to Replicate (default Replicate). The output (Partial) is redistributed to
// `output_layouts` (default Replicate) and handed out local when `use_local_output`.
struct RowwiseOptions {
  std::optional<Placement> input_layouts = std::nullopt;
  std::optional<Placement> output_layouts = std::nullopt;
  bool use_local_output = true;
};
class RowwiseParallel final : public ParallelStyle {
 public:
  explicit RowwiseParallel(RowwiseOptions options = {});
  std::string name() const override { return "RowwiseParallel"; }
  void check(nn::Module& module, const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const DeviceMesh& mesh) const override;
  const RowwiseOptions options;
};

// LayerNorm, RMSNorm or Dropout on activations sharded along `sequence_dim`: parameters become
// Replicate DTensors (their gradients, Partial over the sequence shards, are all-reduced into
// them); a plain input is this rank's sequence shard of an even split (the global length is
// taken as the local one times the mesh size, with no communication, as PyTorch's from_local
// without run_check: pass a DTensor where the length does not divide), a DTensor input is
// redistributed to Shard(sequence_dim); the output stays Shard(sequence_dim) (a DTensor unless
// use_local_output). The same holds for a plain input whose declared layout is a Shard.
struct SequenceParallelOptions {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
};
class SequenceParallel final : public ParallelStyle {
 public:
  explicit SequenceParallel(SequenceParallelOptions options = {});
  std::string name() const override { return "SequenceParallel"; }
  void check(nn::Module& module, const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const DeviceMesh& mesh) const override;
  const SequenceParallelOptions options;
};

// Converts a unary module's input: a plain input becomes a DTensor with `input_layouts` (no
// communication), a DTensor keeps its placements; then it is redistributed to
// `desired_input_layouts` and handed in local when `use_local_output`. No input_layouts: the
// input passes unchanged.
struct PrepareInputOptions {
  std::optional<Placement> input_layouts = std::nullopt;
  std::optional<Placement> desired_input_layouts = std::nullopt;
  bool use_local_output = false;
};
class PrepareModuleInput final : public ParallelStyle {
 public:
  explicit PrepareModuleInput(PrepareInputOptions options);
  std::string name() const override { return "PrepareModuleInput"; }
  void check(nn::Module& module, const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const DeviceMesh& mesh) const override;
  const PrepareInputOptions options;
};

// The same for a unary module's output (use_local_output defaults to true, as PyTorch's).
struct PrepareOutputOptions {
  std::optional<Placement> output_layouts = std::nullopt;
  std::optional<Placement> desired_output_layouts = std::nullopt;
  bool use_local_output = true;
};
class PrepareModuleOutput final : public ParallelStyle {
 public:
  explicit PrepareModuleOutput(PrepareOutputOptions options);
  std::string name() const override { return "PrepareModuleOutput"; }
  void check(nn::Module& module, const DeviceMesh& mesh) const override;
  void apply(nn::Module& module, const DeviceMesh& mesh) const override;
  const PrepareOutputOptions options;
};

// (path pattern, style) pairs, applied in order. A pattern is a dotted submodule path relative
// to the module given to parallelize_module ("" for the module itself); a "*" in an atom
// matches any characters within it ("transformer.h.*.attn.c_attn"), as fnmatch does.
using ParallelizePlan = std::vector<std::pair<std::string, std::shared_ptr<const ParallelStyle>>>;

// Applies `plan` to `module` on `mesh` (1-D; for a 2-D mesh pass its tensor-parallel submesh).
// Every pattern must match at least one submodule and every style must apply to what it
// matches; all of it is checked (ValueError / TypeError naming the path) before any module
// changes. Collective: every rank of the mesh calls it with the same plan (parameters are
// distributed from rank 0's values).
void parallelize_module(nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan);

// One resolved plan entry: the style and the module it applies to (with the path and the
// pattern that matched, for messages).
struct StyleTarget {
  std::string path;
  std::string pattern;
  nn::Module* module = nullptr;
  std::shared_ptr<const ParallelStyle> style;
};
// parallelize_module's second half, for plans resolved elsewhere (the Python module resolves
// paths through Python submodules): checks that no module is matched by two styles that shard
// parameters and that every style applies, then applies them in order.
void apply_parallel_styles(const std::vector<StyleTarget>& targets, const DeviceMesh& mesh);

// Loss parallel as a scope (PyTorch's `with loss_parallel():`): while one lives on this thread,
// plain targets beside DTensor logits are taken as replicated (dtensor::ImplicitReplication),
// so kiln::cross_entropy, and with it GPT::loss, on logits sharded over the classes runs without
// gathering them. The loss comes out Partial(sum) (full_tensor or redistribute to read it).
// Run its backward in the scope too (the targets are still plain there), as PyTorch requires.
// Note [Loss parallel cross-entropy].
//   { parallel::LossParallel scope; loss = model.loss(idx, targets); loss.backward(); }
class LossParallel {
 public:
  LossParallel();
  ~LossParallel();
  LossParallel(const LossParallel&) = delete;
  LossParallel& operator=(const LossParallel&) = delete;

 private:
  std::unique_ptr<dtensor::ImplicitReplication> implicit_;
};

// The mean cross-entropy of logits [N, C] (a DTensor, typically Shard(1) over the classes)
// against targets [N] (plain and the same on every rank, or a DTensor) under LossParallel, all-
// reduced to a Replicate DTensor scalar; differentiable. Plain logits give kiln::cross_entropy.
Tensor loss_parallel_cross_entropy(const Tensor& logits, const Tensor& target,
                                   int64_t ignore_index = -100);

// A fused ColwiseParallel weight or bias gathered whole ([chunks * n, ...] in rank-major order,
// what full_tensor gives) put back in the module's order (block-major), for `parts` ranks.
Tensor fused_rows_to_module_order(const Tensor& whole, int64_t chunks, int64_t parts);

// Megatron-style tensor parallel for nn::GPT on `mesh` (1-D): q, k, v column-sharded by heads
// (fused_chunks 3) and the attention's c_proj row-sharded, the MLP's c_fc column- and c_proj
// row-sharded, the token embedding vocab-parallel (RowwiseParallel: Shard(0), its lookup a
// Partial all-reduced), and ln_f's output a Replicate DTensor so the tied head gives logits
// [B, T, vocab] sharded over the vocabulary, for loss_parallel_cross_entropy. The residual
// stream, the LayerNorms and the position embedding stay plain and replicated. The heads must
// divide by the mesh size (a ValueError otherwise).
ParallelizePlan gpt_tensor_parallel_plan(const nn::GPTConfig& config, const DeviceMesh& mesh);

}  // namespace kiln::parallel
