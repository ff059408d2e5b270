#include "kiln/dtensor/dtensor.h"

#include <fmt/ranges.h>

#include <cstring>

#include "kiln/autograd/grad_mode.h"
#include "kiln/dispatch/op.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/dtensor_autograd.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/ops/ops.h"

namespace kiln::dtensor {

// Note [DTensor impls]
// A DTensor's impl has the global sizes and strides, the dtype and device of its local tensor,
// and a storage of its own with no bytes (a borrowed null buffer of size 0 on that device): an
// op that reached it without going through the Sharded layer could only see an empty buffer,
// never the local shard read with the global geometry; data_ptr() refuses it. Its key set is the
// device's backend key plus Sharded, so every op on it dispatches to the Sharded key first (below
// Autograd and Autocast). The local tensor and the spec live in a ShardedMeta in the impl's
// sharded_meta() slot: the hot path gets both with two loads, and compares specs by pointer.
//
// Ops on DTensors run through the Sharded layer: Note [The Sharded layer] in sharded_layer.cpp.

namespace {

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  if (is_dtensor(t)) return "DTensor " + sharded_meta(t).spec->str();
  return fmt::format("Tensor([{}], {}, {})", fmt::join(t.sizes(), ", "), t.dtype(), t.device());
}

void check_device(const Tensor& t, const DeviceMesh& mesh, const char* op) {
  KILN_CHECK_DEVICE(t.device() == mesh.device(),
                    "[{}] the tensor is on {} but the mesh {} is on {}", op, t.device(), mesh.str(),
                    mesh.device());
}

Placements all_replicate(int64_t n) { return Placements(static_cast<size_t>(n), Replicate()); }

}  // namespace

const DTensorSpec* spec_of(const Tensor& t) {
  KILN_CHECK_TYPE(is_dtensor(t), "[spec_of] expected a DTensor, got {}", describe(t));
  return sharded_meta(t).spec;
}

Tensor to_local(const Tensor& t) {
  KILN_CHECK_TYPE(is_dtensor(t), "[to_local] expected a DTensor, got {}", describe(t));
  const Tensor& local = sharded_meta(t).local;
  return records_grad(t) ? record_to_local(t, local) : local;
}

Tensor make_dtensor(Tensor local, const DTensorSpec* spec) {
  KILN_CHECK(local.defined(), "[make_dtensor] the local tensor is undefined");
  KILN_CHECK_TYPE(!is_dtensor(local), "[make_dtensor] the local tensor is itself a DTensor: {}",
                  describe(local));
  KILN_CHECK(local.sizes() == spec->local_shape(),
             "[make_dtensor] local shape [{}] on rank {} but {} gives this rank [{}]",
             fmt::join(local.sizes(), ", "), distributed::rank(), spec->str(),
             fmt::join(spec->local_shape(), ", "));
  KILN_CHECK_TYPE(local.dtype() == spec->dtype(),
                  "[make_dtensor] local dtype {} but the spec's is {}", local.dtype(),
                  spec->dtype());
  check_device(local, spec->mesh(), "make_dtensor");
  // See Note [DTensor impls].
  auto storage = make_ref<StorageImpl>(nullptr, 0, local.device());
  auto impl =
      make_ref<TensorImpl>(std::move(storage), spec->dtype(), spec->shape(), spec->strides(), 0);
  impl->add_key(DispatchKey::Sharded);
  impl->set_sharded_meta(std::make_unique<ShardedMeta>(std::move(local), spec));
  return Tensor(std::move(impl));
}

namespace {
constexpr int64_t kMaxCheckedDims = 32;
void check_shapes(const Tensor& local, const DTensorSpec& spec, bool whole, const char* what);
}  // namespace

Tensor distribute_tensor(const Tensor& t, const DeviceMesh& mesh, ArrayRef<Placement> placements) {
  KILN_CHECK(t.defined(), "[distribute_tensor] the tensor is undefined");
  KILN_CHECK_TYPE(!is_dtensor(t), "[distribute_tensor] the tensor is already a DTensor: {}",
                  describe(t));
  check_device(t, mesh, "distribute_tensor");
  autograd::NoGradGuard no_grad;
  Shape strides = contiguous_strides(t.sizes());
  const DTensorSpec* target =
      intern_spec(mesh, placements, t.sizes(), strides, t.dtype(), "distribute_tensor");
  const DTensorSpec* replicated = with_placements(*target, all_replicate(mesh.ndim()));
  KILN_CHECK(t.dim() <= kMaxCheckedDims, "[distribute_tensor] takes at most {} dims, got {}",
             kMaxCheckedDims, t.dim());
  check_shapes(t, *target, true, "[distribute_tensor] ranks passed different tensors for");
  // Rank 0's values win: broadcast along each mesh dim from coordinate 0.
  Tensor whole = t.contiguous();
  bool copied = false;
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    if (mesh.size(d) == 1) continue;
    whole = distributed::broadcast(whole, 0, &mesh.group(d));
    copied = true;
  }
  if (!copied) whole = whole.clone();
  Tensor out =
      make_dtensor(run_redistribute(whole, *plan_redistribute(*replicated, *target)), target);
  // A leaf of its own, as PyTorch's: a parameter distributed once, trained as a DTensor.
  if (t.requires_grad()) out.requires_grad_(true);
  return out;
}

namespace {

// Sums `x` (CPU int64) over every rank of the mesh: an all-reduce along each mesh dim.
Tensor sum_over_mesh(Tensor x, const DeviceMesh& mesh) {
  for (int64_t d = 0; d < mesh.ndim(); ++d)
    if (mesh.size(d) > 1) x = distributed::all_reduce(x, ReduceOp::Sum, &mesh.group(d));
  return x;
}

int64_t linear_index(const DeviceMesh& mesh, IntArrayRef coord) {
  int64_t idx = 0;
  for (int64_t d = 0; d < mesh.ndim(); ++d) idx = idx * mesh.shape()[d] + coord[d];
  return idx;
}

Shape coordinate_of(const DeviceMesh& mesh, int64_t idx) {
  Shape c(static_cast<size_t>(mesh.ndim()));
  for (int64_t d = mesh.ndim(); d-- > 0;) {
    c[d] = idx % mesh.shape()[d];
    idx /= mesh.shape()[d];
  }
  return c;
}

// Every rank learns every rank's shape and dtype (one row each, summed over the mesh into a zero
// table) and raises the same error when one differs from what `spec` gives that rank: its local
// shape, or with `whole` the global shape.
void check_shapes(const Tensor& local, const DTensorSpec& spec, bool whole, const char* what) {
  const DeviceMesh& mesh = spec.mesh();
  const int64_t cols = 2 + kMaxCheckedDims, me = linear_index(mesh, mesh.coordinate());
  Tensor table = zeros({mesh.size(), cols}, kInt64);
  int64_t* row = table.data<int64_t>() + me * cols;
  row[0] = local.dim();
  row[1] = static_cast<int64_t>(local.dtype()) + 1;
  for (int64_t i = 0; i < local.dim(); ++i) row[2 + i] = local.size(i);
  table = sum_over_mesh(table, mesh);
  const int64_t* all = table.data<int64_t>();
  std::vector<std::string> bad;
  for (int64_t idx = 0; idx < mesh.size(); ++idx) {
    const int64_t* r = all + idx * cols;
    Shape expected = whole ? Shape(spec.shape()) : spec.local_shape_at(coordinate_of(mesh, idx));
    bool ok = r[0] == spec.ndim() && r[1] == static_cast<int64_t>(spec.dtype()) + 1;
    for (int64_t i = 0; ok && i < spec.ndim(); ++i) ok = r[2 + i] == expected[i];
    if (ok) continue;
    std::vector<int64_t> got(r + 2, r + 2 + std::min<int64_t>(r[0], kMaxCheckedDims));
    bad.push_back(fmt::format("rank {} has [{}] {} where [{}] {} is expected", mesh.ranks()[idx],
                              fmt::join(got, ", "),
                              r[1] > 0 ? fmt::format("{}", static_cast<DType>(r[1] - 1)) : "?",
                              fmt::join(expected, ", "), spec.dtype()));
  }
  KILN_CHECK(bad.empty(), "{} {}: {}", what, spec.str(), fmt::join(bad, "; "));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  Tensor x = a.to(Device(kCPU)).contiguous(), y = b.to(Device(kCPU)).contiguous();
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// Along each Replicate mesh dim, every rank compares its values with coordinate 0's (broadcast
// to it) and marks itself in a per-rank table summed over the mesh.
void check_replicas(const Tensor& local, const DTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh();
  const int64_t me = linear_index(mesh, mesh.coordinate());
  Tensor differs = zeros({mesh.ndim(), mesh.size()}, kInt64);
  bool any = false;
  for (int64_t d = 0; d < mesh.ndim(); ++d) {
    if (!spec.placement(d).is_replicate() || mesh.size(d) == 1) continue;
    any = true;
    Tensor first = distributed::broadcast(local.contiguous(), 0, &mesh.group(d));
    if (!same_bytes(first, local)) differs.data<int64_t>()[d * mesh.size() + me] = 1;
  }
  if (!any) return;
  differs = sum_over_mesh(differs, mesh);
  const int64_t* f = differs.data<int64_t>();
  std::vector<std::string> bad;
  for (int64_t d = 0; d < mesh.ndim(); ++d)
    for (int64_t idx = 0; idx < mesh.size(); ++idx) {
      if (!f[d * mesh.size() + idx]) continue;
      Shape c = coordinate_of(mesh, idx);
      c[d] = 0;
      bad.push_back(fmt::format("rank {} differs from rank {} along mesh dim {} ('{}')",
                                mesh.ranks()[idx], mesh.world_rank_at(c), d, mesh.dim_names()[d]));
    }
  KILN_CHECK(bad.empty(), "[from_local] run_check: Replicate values disagree ({}): {}", spec.str(),
             fmt::join(bad, "; "));
}

}  // namespace

Tensor from_local(const Tensor& local, const DeviceMesh& mesh, ArrayRef<Placement> placements,
                  bool run_check, IntArrayRef shape, IntArrayRef strides) {
  KILN_CHECK(local.defined(), "[from_local] the local tensor is undefined");
  KILN_CHECK_TYPE(!is_dtensor(local), "[from_local] the local tensor is already a DTensor: {}",
                  describe(local));
  check_device(local, mesh, "from_local");
  KILN_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(),
             "[from_local] {} placements {} for a {}-d mesh {}", placements.size(),
             placements_str(placements), mesh.ndim(), mesh.str());
  Shape global;
  if (!shape.empty() || local.dim() == 0) {
    global = Shape(shape);
  } else {
    global = Shape(local.sizes());
    for (size_t i = 0; i < placements.size(); ++i) {
      const Placement& p = placements[i];
      if (!p.is_shard()) continue;
      // Out-of-range dims are reported by intern_spec below.
      int64_t d = p.dim() < 0 ? p.dim() + local.dim() : p.dim();
      if (d >= 0 && d < local.dim()) global[d] *= mesh.shape()[i];
    }
  }
  Shape st = strides.empty() ? contiguous_strides(global) : Shape(strides);
  const DTensorSpec* spec = intern_spec(mesh, placements, global, st, local.dtype(), "from_local");
  if (run_check) {
    KILN_CHECK(local.dim() <= kMaxCheckedDims,
               "[from_local] run_check takes at most {} dims, got {}", kMaxCheckedDims,
               local.dim());
    check_shapes(local, *spec, false, "[from_local] run_check: local shards disagree with");
    check_replicas(local, *spec);
  }
  // A DTensor's local tensor never requires grad (Note [Gradients of DTensors]): the DTensor
  // carries the history, and ops below the Sharded layer record nothing.
  Tensor out = make_dtensor(local.requires_grad() ? local.detach() : local, spec);
  if (records_grad(local)) record_from_local(local, out);
  return out;
}

Tensor full_tensor(const Tensor& t) {
  const DTensorSpec* spec = spec_of(t);
  if (records_grad(t)) return to_local(redistribute(t, all_replicate(spec->mesh().ndim())));
  if (spec->is_replicated()) return sharded_meta(t).local;
  const DTensorSpec* replicated = with_placements(*spec, all_replicate(spec->mesh().ndim()));
  return run_redistribute(sharded_meta(t).local, *plan_redistribute(*spec, *replicated));
}

void copy_whole_into(Tensor& dst, const Tensor& src) {
  autograd::NoGradGuard no_grad;
  if (!is_dtensor(dst) || is_dtensor(src)) {
    dst.copy_(src);
    return;
  }
  // The whole tensor taken as replicated: the copy's rule keeps its own chunk (Note [Implicit
  // replication] in sharded_layer.cpp), with no communication.
  ImplicitReplication implicit;
  dst.copy_(src.device() == dst.device() ? src : src.to(dst.device()));
}

}  // namespace kiln::dtensor
