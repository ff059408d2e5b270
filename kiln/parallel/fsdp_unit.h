#pragma once
// Internal to kiln/parallel: the state of one fully_shard call (a unit) and what runs around its
// module's calls: the gathers, their backward, resharding after forward and prefetching. See
// Note [FSDP units] in fsdp.cpp and the Notes in fsdp_unit.cpp.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/distributed/collectives.h"
#include "kiln/dtensor/device_mesh.h"
#include "kiln/dtensor/spec.h"
#include "kiln/nn/module.h"
#include "kiln/parallel/fsdp.h"

namespace kiln::parallel::fsdp_detail {

struct Unit;

// Parameters of one dtype, laid out in one flat buffer of `numel` elements per rank: parameter
// k of `params` at `offsets[k]`, padded to `lengths[k]` (ceil(rows / N) rows). The buffer is
// gathered in `gather_dtype` and the gradients reduce-scattered in `reduce_dtype` (both `dtype`
// without a mixed-precision policy; Note [FSDP mixed precision]).
struct Bucket {
  DType dtype, gather_dtype, reduce_dtype;
  std::vector<size_t> params;
  std::vector<int64_t> offsets, lengths;
  int64_t numel = 0;
};

// What the gather and its backward need; fixed at fully_shard, shared with the nodes. On a 1-D
// mesh the parameters are gathered in buckets; on a 2-D one (Note [FSDP and tensor parallel])
// one by one, from `specs` to `gathered`, and a tensor-parallel parameter is handed to the
// forward as a DTensor with its own spec on the tensor-parallel mesh (`tp_specs`; null for a
// plain parameter).
struct Layout {
  const dtensor::DeviceMesh* mesh;
  std::vector<const dtensor::DTensorSpec*> specs;  // each parameter's sharded spec on `mesh`
  std::vector<DType> gathered_dtypes;              // each gathered parameter's dtype
  std::vector<Bucket> buckets;
  std::vector<const dtensor::DTensorSpec*> gathered, tp_specs;
  bool two_d() const { return mesh->ndim() == 2; }
  int64_t parts() const { return mesh->size(0); }
};

// One call's gathered parameters: plain aliases (no autograd) of the whole tensors the forward
// got (their local tensors on a 2-D mesh), so their bytes can be freed and filled again while
// the tensors that backward formulas saved keep their storages. Note [FSDP reshards after
// forward].
struct Gathered {
  TensorList data;
  bool freed = false;
  void free();
};

// A gather in flight (Note [FSDP prefetch]): the buffers the all-gathers write, the shards'
// storage versions when it started (a changed shard makes it stale) and the call it is for.
struct Pending {
  std::vector<distributed::Work> works;
  TensorList buffers;  // 1-D: one per bucket, [N * numel]
  TensorList whole;    // 2-D: each parameter's gathered local tensor
  std::vector<uint64_t> versions;
  const Gathered* target = nullptr;  // the backward re-gather it is for; null: the next forward
  void wait();
};

// The units of one root forward in the order they ran, built by the hooks (a root unit is one
// under no other unit; Note [FSDP prefetch]).
struct ForwardSession {
  std::vector<Unit*> order;  // in forward pre-hook order
  struct Done {
    Unit* unit;
    std::shared_ptr<Gathered> gathered;
  };
  std::vector<Done> finished;  // in forward post-hook order
};

struct Unit {
  nn::Module* module;
  FullyShardOptions options;
  std::vector<std::string> names;  // relative to `module`
  std::vector<Tensor*> slots;
  TensorList shards;  // the DTensor leaves, what the slots hold between calls
  std::shared_ptr<const Layout> layout;

  // Run-time state, touched by the hooks on the thread that runs the model.
  std::optional<Pending> pending;                   // a prefetched gather
  std::vector<std::shared_ptr<Gathered>> in_calls;  // calls under way (innermost last)
  std::vector<bool> calls_root;                     // whether each started a session
  std::shared_ptr<ForwardSession> session;          // root: the forward under way
  std::vector<Unit*> last_order;                    // root: the last forward's units
  uint64_t root_generation = 0;                     // when is_root was computed
  bool root = false;

  ~Unit();
};

// The unit made by fully_shard(m), or nullptr.
Unit* find_unit(const nn::Module& m);
// Registers `unit` (its module must have none) and installs its hooks on `module`.
void install(const std::shared_ptr<Unit>& unit, nn::UnaryModule& module);

}  // namespace kiln::parallel::fsdp_detail
