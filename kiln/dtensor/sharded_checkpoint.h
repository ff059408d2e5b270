#pragma once
// Sharded checkpoints of DTensors (issue 15): every rank writes its own shards to
// `rank{r}.safetensors` in one directory and rank 0 writes `index.json`, which says where every
// piece of every global tensor lives; a load reads only the pieces that overlap this rank's
// target shard, so a checkpoint saved on one mesh loads onto any other (4 ranks to 2 or 1, and
// back). See Note [Sharded checkpoint format] in sharded_checkpoint.cpp and docs/dtensor.md.
#include <map>
#include <string>

#include "kiln/io/safetensors.h"

namespace kiln::dtensor {

using io::StateDict;

// Saves `tensors` (DTensors and plain tensors, by name) to the directory `dir` (made if missing;
// every rank must see the same directory). Collective over the world: every rank calls it with
// the same names, in the same order, with the same global shapes, dtypes, meshes and placements
// (checked first; a difference is the same ValueError on every rank, naming the ranks). A
// DTensor's Partial placements are reduced first (an all_reduce along those mesh dims) and its
// value is saved; of the ranks that hold the same shard only one writes it. A plain tensor is
// rank 0's (as in distribute_tensor). A failure on any rank is the same ValueError on every
// rank; index.json is written last, so a checkpoint without one is incomplete.
void save_sharded(const std::string& dir, const StateDict& tensors,
                  const std::map<std::string, std::string>& metadata = {});

// Loads the checkpoint in `dir` into `targets` in place: a DTensor target gets its own shard of
// the saved value (by its spec: any mesh, any placements; a Partial(sum) target holds the value
// on coordinate 0 of that mesh dim and zeros elsewhere, as distribute_tensor does), a plain
// target the whole tensor. Names, dtypes and global shapes must match the checkpoint's. Every
// file is untrusted: anything malformed is a ValueError "[load_sharded] ..." naming the file and
// the tensor. Collective over the world: a failure on any rank is the same error on every rank,
// and no target is written unless every rank read all of its targets. Fills `metadata` (the
// save's) when given.
void load_sharded(const std::string& dir, const StateDict& targets,
                  std::map<std::string, std::string>* metadata = nullptr);

}  // namespace kiln::dtensor
