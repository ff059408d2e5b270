// Sharding rules of the view ops: view, as_strided, permute, transpose, slice, select, expand,
// squeeze, unsqueeze, alias, detach. See Note [View placements] and Note [Views that merge or
// split sharded dims].
#include <algorithm>
#include <limits>

#include "kiln/dtensor/rule_options.h"
#include "kiln/ops/op_list.h"
#include "kiln/ops/views.h"

namespace kiln::dtensor {
namespace {

// Note [View placements]
// A view relabels the elements of its input, so along each mesh dim a Shard of an input dim
// becomes a Shard of the result dim that input dim turns into, when each rank's local view of
// its chunk is exactly its chunk of the global view; otherwise the input dim is gathered first
// (Replicate). Replicate stays Replicate, and Partial stays Partial of the same reduction: a view
// moves each rank's term without combining terms (even expand, whose copies of one term are
// each reduced on their own). Per op:
//   - permute, transpose, unsqueeze, alias, detach: every input dim maps to one result dim, so
//     every placement survives (renumbered).
//   - slice: a sharded dim survives only when the slice is the whole dim (the local slice is
//     then the whole local chunk); other dims are untouched.
//   - select: the selected dim is gone, so a shard of it replicates first; others renumber.
//   - squeeze: a sharded size-1 dim that goes replicates first (its one element lives on the
//     first rank only); others renumber. Locally it squeezes the dims the global op drops, no
//     more (a chunk can have size 1 where the whole does not).
//   - expand: input dim j is result dim j + (new leading dims); a size-1 dim that broadcasts
//     replicates first. The local op's size is the result's local shape
//     (ShardingDecision::local_shape_args).
//   - as_strided: its sizes and strides address the global storage, which no rank holds, so
//     every shard is gathered first; Partial terms keep their (global) layout and stay.
//   - view: Note [Views that merge or split sharded dims].

// What happens to one input dim's shard: the result dim it becomes, or -1 (replicate first).
using DimMap = std::vector<int64_t>;

// Fills `d` for a view whose one input's shards move by `map`; Partial and Replicate stay.
void by_dim_map(const ShardingCall& call, ShardingDecision& d, const DimMap& map) {
  const DTensorSpec& s = call.input(0);
  Placements in(s.placements().begin(), s.placements().end()), out = in;
  for (size_t m = 0; m < in.size(); ++m) {
    if (!in[m].is_shard()) continue;
    const int64_t r = map[in[m].dim()];
    if (r < 0)
      in[m] = out[m] = Replicate();
    else
      out[m] = Shard(r);
  }
  d.inputs = {std::move(in)};
  d.outputs = {std::move(out)};
}

DimMap identity_map(int64_t ndim) {
  DimMap map(static_cast<size_t>(ndim));
  for (int64_t k = 0; k < ndim; ++k) map[k] = k;
  return map;
}

// Every dim but `gone` (-1: none), renumbered; `gone` replicates.
DimMap dropping(int64_t ndim, int64_t gone) {
  DimMap map(static_cast<size_t>(ndim));
  for (int64_t k = 0; k < ndim; ++k) map[k] = k == gone ? -1 : k - (gone >= 0 && k > gone);
  return map;
}

void same_rule(const ShardingCall& call, ShardingDecision& d) {
  by_dim_map(call, d, identity_map(call.input(0).ndim()));
}

// as_strided(self, size, stride, storage_offset).
void as_strided_rule(const ShardingCall& call, ShardingDecision& d) {
  by_dim_map(call, d, DimMap(static_cast<size_t>(call.input(0).ndim()), -1));
}

// permute(self, dims): result dim j is input dim dims[j].
void permute_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t nd = call.input(0).ndim();
  IntArrayRef dims = call.ints_arg(1);
  DimMap map(static_cast<size_t>(nd), -1);
  if (static_cast<int64_t>(dims.size()) == nd)  // else the op's own check raises
    for (int64_t j = 0; j < nd; ++j) map[wrap_dim(dims[j], nd, "permute")] = j;
  by_dim_map(call, d, map);
}

// transpose(self, dim0, dim1).
void transpose_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t nd = call.input(0).ndim();
  DimMap map = identity_map(nd);
  if (nd > 0) {
    const int64_t a = wrap_dim(call.int_arg(1), nd, "transpose");
    const int64_t b = wrap_dim(call.int_arg(2), nd, "transpose");
    std::swap(map[a], map[b]);
  }
  by_dim_map(call, d, map);
}

// slice(self, dim, start, end, step): the slice_kernel's normalisation, then whole or not.
void slice_rule(const ShardingCall& call, ShardingDecision& d) {
  const DTensorSpec& s = call.input(0);
  const int64_t nd = s.ndim();
  if (nd == 0) return by_dim_map(call, d, {});  // the op raises
  const int64_t dim = wrap_dim(call.int_arg(1), nd, "slice");
  const int64_t n = s.shape()[dim], step = call.int_arg(4);
  int64_t start = call.int_arg(2), end = call.int_arg(3);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  const int64_t len = end == start || step <= 0 ? 0 : (end - start - 1) / step + 1;
  const bool whole = start == 0 && len == n;
  DimMap map = identity_map(nd);
  if (!whole) map[dim] = -1;
  by_dim_map(call, d, map);
  // A whole slice of a sharded dim takes each rank's whole chunk.
  if (whole && step > 0)
    for (const Placement& p : d.inputs[0])
      if (p.is_shard(dim)) {
        // emplace_back, not a braced list (GCC 12's -Wmaybe-uninitialized under the sanitizers).
        d.local_args.emplace_back(2, IValue(int64_t{0}));
        d.local_args.emplace_back(3, IValue(std::numeric_limits<int64_t>::max()));
        d.local_args.emplace_back(4, IValue(int64_t{1}));
        break;
      }
}

// select(self, dim, index).
void select_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t nd = call.input(0).ndim();
  by_dim_map(call, d, dropping(nd, nd == 0 ? -1 : wrap_dim(call.int_arg(1), nd, "select")));
}

// squeeze(self, dim?): drops the size-1 dims (all of them, or `dim` if it has size 1). A
// chunk may have size-1 dims where the whole has none (4 rows over 4 ranks), so the local op
// squeezes exactly the dims the global one drops.
void squeeze_rule(const ShardingCall& call, ShardingDecision& d) {
  const DTensorSpec& s = call.input(0);
  const int64_t nd = s.ndim();
  int64_t only = -1;
  if (!call.is_none(1) && nd > 0) only = wrap_dim(call.int_arg(1), nd, "squeeze");
  DimMap map(static_cast<size_t>(nd), -1);
  std::vector<int64_t> dropped;
  int64_t r = 0;
  for (int64_t k = 0; k < nd; ++k) {
    const bool drop = s.shape()[k] == 1 && (call.is_none(1) || k == only);
    if (drop)
      dropped.insert(dropped.begin(), k);  // last first, so the earlier ones keep their index
    else
      map[k] = r++;
  }
  by_dim_map(call, d, map);
  d.local_run = [dropped](Stack& stack) {
    Tensor t = std::get<Tensor>(stack[0]);
    if (dropped.empty()) t = ops::op_alias(t);
    for (int64_t k : dropped) t = ops::op_squeeze(t, k);
    stack.clear();
    stack.emplace_back(std::move(t));
  };
}

// squeeze_dims(self, dims): squeeze of the listed dims that have size 1, as squeeze_rule.
void squeeze_dims_rule(const ShardingCall& call, ShardingDecision& d) {
  const DTensorSpec& s = call.input(0);
  const int64_t nd = s.ndim();
  std::vector<bool> listed(static_cast<size_t>(nd), false);
  for (int64_t k : call.ints_arg(1)) {
    const int64_t w = k < 0 ? k + nd : k;
    if (w >= 0 && w < nd) listed[w] = true;
  }
  DimMap map(static_cast<size_t>(nd), -1);
  std::vector<int64_t> dropped;
  int64_t r = 0;
  for (int64_t k = 0; k < nd; ++k) {
    if (listed[k] && s.shape()[k] == 1)
      dropped.insert(dropped.begin(), k);  // last first, so the earlier ones keep their index
    else
      map[k] = r++;
  }
  by_dim_map(call, d, map);
  d.local_run = [dropped](Stack& stack) {
    Tensor t = std::get<Tensor>(stack[0]);
    if (dropped.empty()) t = ops::op_alias(t);
    for (int64_t k : dropped) t = ops::op_squeeze(t, k);
    stack.clear();
    stack.emplace_back(std::move(t));
  };
}

// diagonal(self, offset, dim1, dim2): dim1 and dim2 become the diagonal, so their shards are
// gathered first; the other dims renumber.
void diagonal_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t nd = call.input(0).ndim();
  const int64_t d1 = call.int_arg(2) < 0 ? call.int_arg(2) + nd : call.int_arg(2);
  const int64_t d2 = call.int_arg(3) < 0 ? call.int_arg(3) + nd : call.int_arg(3);
  DimMap map(static_cast<size_t>(nd), -1);
  int64_t r = 0;
  for (int64_t k = 0; k < nd; ++k)
    if (k != d1 && k != d2) map[k] = r++;
  by_dim_map(call, d, map);
}

// unsqueeze(self, dim).
void unsqueeze_rule(const ShardingCall& call, ShardingDecision& d) {
  const int64_t nd = call.input(0).ndim();
  const int64_t at = wrap_dim(call.int_arg(1), nd + 1, "unsqueeze");
  DimMap map(static_cast<size_t>(nd));
  for (int64_t k = 0; k < nd; ++k) map[k] = k < at ? k : k + 1;
  by_dim_map(call, d, map);
}

// expand(self, size): new leading dims, and size-1 dims broadcast, are replicated.
void expand_rule(const ShardingCall& call, ShardingDecision& d) {
  const DTensorSpec& s = call.input(0);
  const int64_t nd = s.ndim();
  IntArrayRef size = call.ints_arg(1);
  const int64_t lead = static_cast<int64_t>(size.size()) - nd;
  DimMap map(static_cast<size_t>(nd), -1);
  if (lead >= 0)  // else the op's own check raises
    for (int64_t j = 0; j < nd; ++j) {
      const int64_t want = size[j + lead];
      const bool broadcast = s.shape()[j] == 1 && want != -1 && want != 1;
      map[j] = broadcast ? -1 : j + lead;
    }
  by_dim_map(call, d, map);
  d.local_shape_args = {1};
}

// Note [Views that merge or split sharded dims]
// view(self, size) pairs input and result dims into groups of equal element counts, walking
// both shapes from the left: a size-1 dim that the other side does not match is a group of its
// own (an input one is dropped, a result one is new), two size-1 dims pair up, and otherwise
// the side with the smaller product takes its next dim until both products agree. A group of
// one input and one result dim keeps its shard (the sizes are equal). In a group that merges or
// splits dims, rank r's chunk of the group's leading input dim is a contiguous block of the
// group's elements, the same block as its chunk of the leading result dim, exactly when both
// leading sizes divide by the mesh dim's size (PyTorch asks the same of a split; for a merge of
// [a, b] it is a % n == 0, which makes a * b divisible too). Then the shard moves to the
// leading result dim; otherwise, and for a shard of any other dim of the group, the dim is
// gathered first. Two mesh dims that shard the same leading dim nest (Note [Nested shards]):
// each in turn must divide what the earlier kept ones left. A dropped size-1 dim's shard
// replicates, as in squeeze. The local op's size is the result's local shape
// (ShardingDecision::local_shape_args), so -1 in `size` resolves globally.
void view_rule(const ShardingCall& call, ShardingDecision& d) {
  const DTensorSpec& s = call.input(0);
  IntArrayRef in = s.shape();
  int64_t numel = 1;
  for (int64_t x : in) numel *= x;
  const Shape out = detail::infer_size("view", call.ints_arg(1), numel);
  const auto nin = static_cast<int64_t>(in.size());
  const auto nout = static_cast<int64_t>(out.size());

  Placements pin(s.placements().begin(), s.placements().end()), pout = pin;
  auto replicate_shards_of = [&](int64_t k) {
    for (size_t m = 0; m < pin.size(); ++m)
      if (pin[m].is_shard(k)) pin[m] = pout[m] = Replicate();
  };
  if (numel == 0) {
    for (int64_t k = 0; k < nin; ++k) replicate_shards_of(k);
    d.inputs = {std::move(pin)};
    d.outputs = {std::move(pout)};
    d.local_shape_args = {1};
    return;
  }
  int64_t i = 0, o = 0;
  while (i < nin || o < nout) {
    const bool in_one = i < nin && in[i] == 1, out_one = o < nout && out[o] == 1;
    if (in_one && out_one) {  // a size-1 pair keeps its (trivial) shard
      for (size_t m = 0; m < pin.size(); ++m)
        if (pin[m].is_shard(i)) pout[m] = Shard(o);
      ++i, ++o;
      continue;
    }
    if (in_one || o == nout) {  // dropped
      replicate_shards_of(i++);
      continue;
    }
    if (out_one || i == nin) {  // new
      ++o;
      continue;
    }
    const int64_t i0 = i, o0 = o;
    int64_t pi = in[i++], po = out[o++];
    while (pi != po) {
      if (pi < po)
        pi *= in[i++];
      else
        po *= out[o++];
    }
    if (i - i0 == 1 && o - o0 == 1) {  // one dim to one dim of the same size
      for (size_t m = 0; m < pin.size(); ++m)
        if (pin[m].is_shard(i0)) pout[m] = Shard(o0);
      continue;
    }
    int64_t a = in[i0], b = out[o0];  // what the kept shards leave of the leading dims
    for (size_t m = 0; m < pin.size(); ++m) {
      if (!pin[m].is_shard(i0)) continue;
      const int64_t n = s.mesh().size(static_cast<int64_t>(m));
      if (a % n == 0 && b % n == 0) {
        pout[m] = Shard(o0);
        a /= n, b /= n;
      } else {
        pin[m] = pout[m] = Replicate();
      }
    }
    for (int64_t k = i0 + 1; k < i; ++k) replicate_shards_of(k);
  }
  d.inputs = {std::move(pin)};
  d.outputs = {std::move(pout)};
  d.local_shape_args = {1};
}

const ShardingRule kSame{"view (same placements)", &same_rule};
const ShardingRule kAsStrided{"as_strided (shards gathered first)", &as_strided_rule};
const ShardingRule kPermute{"permute (shards follow their dims)", &permute_rule};
const ShardingRule kTranspose{"transpose (shards follow their dims)", &transpose_rule};
const ShardingRule kSlice{"slice (a sliced sharded dim gathered first)", &slice_rule};
const ShardingRule kSelect{"select (the selected dim gathered first)", &select_rule};
const ShardingRule kSqueeze{"squeeze (a squeezed sharded dim gathered first)", &squeeze_rule};
const ShardingRule kUnsqueeze{"unsqueeze (shards follow their dims)", &unsqueeze_rule};
const ShardingRule kSqueezeDims{"squeeze.dims (a squeezed sharded dim gathered first)",
                                &squeeze_dims_rule};
const ShardingRule kDiagonal{"diagonal (the two diagonal dims gathered first)", &diagonal_rule};
const ShardingRule kExpand{"expand (broadcast dims gathered first)", &expand_rule};
const ShardingRule kView{
    "view (merged and split dims: Note [Views that merge or split sharded "
    "dims])",
    &view_rule};

const bool g_registered = [] {
  set_sharding_rule(ops::op_view.def, &kView);
  set_sharding_rule(ops::op_as_strided.def, &kAsStrided);
  set_sharding_rule(ops::op_permute.def, &kPermute);
  set_sharding_rule(ops::op_transpose.def, &kTranspose);
  set_sharding_rule(ops::op_slice.def, &kSlice);
  set_sharding_rule(ops::op_select.def, &kSelect);
  set_sharding_rule(ops::op_expand.def, &kExpand);
  set_sharding_rule(ops::op_squeeze.def, &kSqueeze);
  set_sharding_rule(ops::op_unsqueeze.def, &kUnsqueeze);
  set_sharding_rule(ops::op_squeeze_dims.def, &kSqueezeDims);
  set_sharding_rule(ops::op_diagonal.def, &kDiagonal);
  set_sharding_rule(ops::op_alias.def, &kSame);
  set_sharding_rule(ops::op_detach.def, &kSame);
  return true;
}();

}  // namespace
}  // namespace kiln::dtensor
