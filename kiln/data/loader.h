#pragma once
// A data loader: batches of samples from a Source, in a new shuffled order each epoch, gathered
// and converted on a background thread that keeps the next batches ready. Generic over the
// source's tensors ([N, ...] each); nothing here knows a data set. See Note [The loader thread]
// in loader.cpp.
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::data {

// One tensor per field of the samples (inputs, labels, ...), each [batch, ...].
using Batch = std::vector<Tensor>;

// What a loader reads: size() samples, any of which gather() stacks into a batch. gather() runs
// on the loader's thread (one call at a time) and may throw: the loader re-raises the exception
// to its consumer.
class Source {
 public:
  virtual ~Source() = default;
  virtual int64_t size() const = 0;
  // The samples at `indices` (each in [0, size())), one [indices.size(), ...] tensor per field.
  virtual Batch gather(std::span<const int64_t> indices) const = 0;
};

// Tensors that share their first dim N, sample i being row i of each (cpu; made contiguous).
// ValueError when there are none, when one is 0-d or not on the cpu, or when their first dims
// differ.
class TensorSource : public Source {
 public:
  explicit TensorSource(std::vector<Tensor> tensors);
  int64_t size() const override { return size_; }
  Batch gather(std::span<const int64_t> indices) const override;

 private:
  std::vector<Tensor> tensors_;
  int64_t size_ = 0;
};

// Field 0 converted to float32 as torchvision's ToTensor and Normalize do it:
// (x / scale - mean) / std, each step in float32.
struct Normalize {
  double scale = 255;
  double mean = 0;
  double std = 1;
};

struct LoaderOptions {
  int64_t batch_size = 64;
  // A new order each epoch, a pure function of (seed, epoch); false: 0, 1, 2, ... every epoch.
  bool shuffle = true;
  uint64_t seed = 0;
  // Leaves out the last batch when it would be short of batch_size.
  bool drop_last = false;
  std::optional<Normalize> normalize;
  // Batches the background thread keeps ready; 0 gathers each batch in next(), on the caller's
  // thread, with no background thread.
  int prefetch = 2;
  // OpenMP threads of the ops the loader's thread runs (its own count; the caller's is left
  // alone). With prefetch 0 the caller's thread and count do the work.
  int threads = 1;
};

// The order of epoch `epoch`'s samples: a permutation of [0, n) drawn from Philox4x32 under key
// `seed` (Note [Epoch permutations] in loader.cpp); the same for the same (n, seed, epoch).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// Batches of a Source, epoch by epoch:
//   for (int64_t e = 0; e < epochs; ++e) {
//     loader.start_epoch(e);
//     while (std::optional<Batch> b = loader.next()) ...
//   }
// Not thread-safe: one consumer. The destructor stops the background thread, mid-epoch or not.
class DataLoader {
 public:
  // ValueError on a batch_size below 1, a negative prefetch, threads below 1, or a Normalize
  // whose scale or std is 0.
  DataLoader(std::shared_ptr<const Source> source, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t size() const { return size_; }
  int64_t batches_per_epoch() const;
  const LoaderOptions& options() const { return options_; }

  // Begins epoch `epoch` at its batch `first_batch` (a resumed run's position), dropping what
  // was prefetched of the previous one. ValueError on a negative epoch or a first_batch outside
  // [0, batches_per_epoch()].
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The epoch's next batch, or nullopt once it is done. An exception raised while gathering it
  // (by the source, or converting it) is raised here, and again by every later call until the
  // next start_epoch. ValueError before the first start_epoch.
  std::optional<Batch> next();

 private:
  struct State;
  Batch make_batch(int64_t b) const;
  void stop();

  std::shared_ptr<const Source> source_;
  LoaderOptions options_;
  int64_t size_;
  int64_t epoch_ = -1;
  int64_t next_batch_ = 0;  // with prefetch 0: the next batch to gather
  std::vector<int64_t> order_;
  std::exception_ptr error_;  // with prefetch 0: the epoch's error, raised again
  std::unique_ptr<State> state_;
};

}  // namespace kiln::data
