#include "kiln/data/loader.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <numeric>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/generator.h"
#include "kiln/ops/ops.h"

namespace kiln::data {

// Note [Epoch permutations]
// Epoch e's order is a Fisher-Yates shuffle of 0..n-1 whose step i (i from n-1 down to 1, swap
// position i with a j drawn uniformly from [0, i]) takes 64 random bits from Philox4x32 under
// key `seed`, counter (low: i / 2, high: e), lanes 2 (i % 2) and 2 (i % 2) + 1, and maps them to
// [0, i] by a 64x64 -> 128-bit multiply-high (Lemire's method without its rejection step: the
// bias is below (i + 1) / 2^64, far under anything a training run could see). So the order is a
// pure function of (n, seed, e): no generator state to save, any epoch can be recomputed
// directly (a resumed run calls start_epoch(e, first_batch)), and epochs are independent
// streams (a different counter_hi each).

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  KILN_CHECK(n >= 0 && epoch >= 0, "[DataLoader] epoch_permutation of n {} at epoch {}", n, epoch);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::array<uint32_t, 4> block{};
  for (int64_t i = n - 1; i >= 1; --i) {
    auto u = static_cast<uint64_t>(i);
    if (i == n - 1 || u % 2 == 1) block = philox4x32(u / 2, static_cast<uint64_t>(epoch), seed);
    unsigned lane = 2 * static_cast<unsigned>(u % 2);
    uint64_t r = uint64_t{block[lane]} << 32 | block[lane + 1];
    auto j = static_cast<int64_t>((static_cast<unsigned __int128>(r) * (u + 1)) >> 64);
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

// ---------------------------------------------------------------- TensorSource

TensorSource::TensorSource(std::vector<Tensor> tensors) {
  KILN_CHECK(!tensors.empty(), "[TensorSource] needs at least one tensor");
  for (size_t f = 0; f < tensors.size(); ++f) {
    const Tensor& t = tensors[f];
    KILN_CHECK(t.defined() && t.dim() >= 1, "[TensorSource] tensor {} must be [N, ...], got {}", f,
               t.defined() ? fmt::format("{}-d", t.dim()) : "an undefined tensor");
    KILN_CHECK(t.device() == Device(kCPU), "[TensorSource] tensor {} is on {}, expected cpu", f,
               t.device());
    KILN_CHECK(t.size(0) == tensors[0].size(0),
               "[TensorSource] tensor {} has {} samples (sizes {}), tensor 0 has {} (sizes {})", f,
               t.size(0), t.sizes(), tensors[0].size(0), tensors[0].sizes());
    tensors_.push_back(t.contiguous());
  }
  size_ = tensors_[0].size(0);
}

Batch TensorSource::gather(std::span<const int64_t> indices) const {
  Tensor index =
      from_vector(std::vector<int64_t>(indices.begin(), indices.end()), {}, Device(kCPU));
  Batch batch;
  batch.reserve(tensors_.size());
  for (const Tensor& t : tensors_) batch.push_back(index_select(t, 0, index));
  return batch;
}

// ---------------------------------------------------------------- DataLoader

// Note [The loader thread]
// With prefetch > 0, start_epoch starts one thread for the epoch. It gathers batch after batch
// (Source::gather, then the Normalize ops) and queues each, waiting while `prefetch` batches are
// queued; next() takes the oldest. What it raises is queued in order after the batches made
// before it and ends the epoch. stop() (start_epoch, the destructor) sets `stop`, wakes it and
// joins: a thread waiting for room returns at once; one inside gather() returns when that call
// does. The thread runs Kiln ops: its dispatch state is its own (a new thread's: no trace, no
// autocast), and it sets its own OpenMP thread count (LoaderOptions::threads, default 1), so
// its small ops neither start a second full OpenMP team beside the training thread's on a busy
// machine nor change the caller's count.

struct DataLoader::State {
  struct Item {
    Batch batch;
    std::exception_ptr error;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Item> queue;
  bool stop = false;
  bool done = false;  // the thread has queued its last item
  std::thread thread;
};

DataLoader::DataLoader(std::shared_ptr<const Source> source, LoaderOptions options)
    : source_(std::move(source)), options_(options) {
  KILN_CHECK(source_, "[DataLoader] the source is null");
  KILN_CHECK(options_.batch_size >= 1, "[DataLoader] batch_size must be at least 1, got {}",
             options_.batch_size);
  KILN_CHECK(options_.prefetch >= 0, "[DataLoader] prefetch must be at least 0, got {}",
             options_.prefetch);
  KILN_CHECK(options_.threads >= 1, "[DataLoader] threads must be at least 1, got {}",
             options_.threads);
  if (options_.normalize)
    KILN_CHECK(options_.normalize->scale != 0 && options_.normalize->std != 0,
               "[DataLoader] Normalize divides by scale {} and std {}: neither may be 0",
               options_.normalize->scale, options_.normalize->std);
  size_ = source_->size();
  KILN_CHECK(size_ >= 0, "[DataLoader] the source has {} samples", size_);
}

DataLoader::~DataLoader() { stop(); }

int64_t DataLoader::batches_per_epoch() const {
  int64_t b = options_.batch_size;
  return options_.drop_last ? size_ / b : (size_ + b - 1) / b;
}

void DataLoader::stop() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  state_.reset();
}

Batch DataLoader::make_batch(int64_t b) const {
  int64_t first = b * options_.batch_size;
  int64_t count = std::min(options_.batch_size, size_ - first);
  std::span<const int64_t> indices(order_.data() + first, static_cast<size_t>(count));
  Batch batch = source_->gather(indices);
  KILN_CHECK(!batch.empty(), "[DataLoader] the source gathered no tensors for batch {}", b);
  for (size_t f = 0; f < batch.size(); ++f)
    KILN_CHECK(batch[f].defined() && batch[f].dim() >= 1 && batch[f].size(0) == count,
               "[DataLoader] the source gathered {} for field {} of batch {}, expected [{}, ...]",
               batch[f].defined() ? fmt::format("{}", batch[f].sizes()) : "nothing", f, b, count);
  if (options_.normalize) {
    const Normalize& n = *options_.normalize;
    Tensor x = div(batch[0].to(kFloat32), n.scale);
    batch[0] = div(sub(x, n.mean), n.std);
  }
  return batch;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  KILN_CHECK(epoch >= 0, "[DataLoader] epoch must be at least 0, got {}", epoch);
  int64_t batches = batches_per_epoch();
  KILN_CHECK(first_batch >= 0 && first_batch <= batches,
             "[DataLoader] first_batch {} is outside [0, {}] (the epoch's batches)", first_batch,
             batches);
  stop();
  error_ = nullptr;
  epoch_ = epoch;
  next_batch_ = first_batch;
  if (options_.shuffle) {
    order_ = epoch_permutation(size_, options_.seed, epoch);
  } else {
    order_.resize(static_cast<size_t>(size_));
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
  if (options_.prefetch == 0) return;

  // See Note [The loader thread].
  state_ = std::make_unique<State>();
  State* s = state_.get();
  s->thread = std::thread([this, s, first_batch, batches] {
    auto finish = [s](std::exception_ptr error) {
      {
        std::lock_guard<std::mutex> lock(s->mu);
        if (error) s->queue.push_back({{}, error});
        s->done = true;
      }
      s->cv.notify_all();
    };
    try {
      set_num_threads(options_.threads);
      for (int64_t b = first_batch; b < batches; ++b) {
        Batch batch = make_batch(b);
        std::unique_lock<std::mutex> lock(s->mu);
        s->cv.wait(lock, [&] {
          return s->stop || static_cast<int64_t>(s->queue.size()) < options_.prefetch;
        });
        if (s->stop) return;
        s->queue.push_back({std::move(batch), nullptr});
        lock.unlock();
        s->cv.notify_all();
      }
      finish(nullptr);
    } catch (...) {
      finish(std::current_exception());
    }
  });
}

std::optional<Batch> DataLoader::next() {
  KILN_CHECK(epoch_ >= 0, "[DataLoader] next() before the first start_epoch()");
  if (error_) std::rethrow_exception(error_);
  if (options_.prefetch == 0) {
    if (next_batch_ >= batches_per_epoch()) return std::nullopt;
    try {
      return make_batch(next_batch_++);
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }
  State* s = state_.get();
  State::Item item;
  {
    std::unique_lock<std::mutex> lock(s->mu);
    s->cv.wait(lock, [&] { return !s->queue.empty() || s->done; });
    if (s->queue.empty()) return std::nullopt;
    item = std::move(s->queue.front());
    s->queue.pop_front();
  }
  s->cv.notify_all();
  if (item.error) {
    error_ = item.error;
    std::rethrow_exception(error_);
  }
  return std::move(item.batch);
}

}  // namespace kiln::data
