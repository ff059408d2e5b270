// kiln/data/loader.h: every sample once per epoch, per-epoch orders from (seed, epoch),
// drop_last, resuming mid-epoch, normalisation, and the prefetch thread: shutdown mid-epoch and
// errors from the source raised to the consumer.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/data/fashion_mnist.h"
#include "kiln/data/loader.h"
#include "kiln/ops/ops.h"

namespace kiln::data {
namespace {

std::vector<int64_t> vec(IntArrayRef s) { return {s.begin(), s.end()}; }

// N samples: field 0 is [N, 2] int64 rows (i, -i), field 1 is [N] float32 2i.
std::shared_ptr<TensorSource> numbered(int64_t n) {
  Tensor rows = stack({arange(n), neg(arange(n))}, 1);
  return std::make_shared<TensorSource>(std::vector<Tensor>{rows, mul(arange(n, kFloat32), 2.0)});
}

// The sample ids of an epoch's batches (checking each batch's fields agree), and their sizes.
struct Epoch {
  std::vector<int64_t> ids;
  std::vector<int64_t> batch_sizes;
};
Epoch run_epoch(DataLoader& loader, int64_t epoch, int64_t first_batch = 0) {
  loader.start_epoch(epoch, first_batch);
  Epoch e;
  while (std::optional<Batch> b = loader.next()) {
    EXPECT_EQ(b->size(), 2u);
    std::vector<int64_t> rows = (*b)[0].to_vector<int64_t>();
    std::vector<float> twice = (*b)[1].to_vector<float>();
    EXPECT_EQ(rows.size(), 2 * twice.size());
    for (size_t i = 0; i < twice.size(); ++i) {
      EXPECT_EQ(rows[2 * i + 1], -rows[2 * i]);
      EXPECT_EQ(twice[i], 2.0f * static_cast<float>(rows[2 * i]));
      e.ids.push_back(rows[2 * i]);
    }
    e.batch_sizes.push_back((*b)[1].size(0));
  }
  EXPECT_FALSE(loader.next().has_value());  // stays done
  return e;
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

LoaderOptions opts(int64_t batch, int prefetch = 2) {
  LoaderOptions o;
  o.batch_size = batch;
  o.prefetch = prefetch;
  o.seed = 1234;
  return o;
}

template <class F>
void expect_value_error(F f, const std::string& msg) {
  try {
    f();
    ADD_FAILURE() << "no error, expected " << msg;
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()), msg);
  }
}

TEST(EpochPermutation, IsAPermutationFixedBySeedAndEpoch) {
  for (int64_t n : {0, 1, 2, 3, 7, 1000}) {
    std::vector<int64_t> p = epoch_permutation(n, 5, 0);
    EXPECT_EQ(sorted(p), iota(n));
    EXPECT_EQ(p, epoch_permutation(n, 5, 0));
  }
  std::vector<int64_t> a = epoch_permutation(1000, 5, 0);
  EXPECT_NE(a, epoch_permutation(1000, 5, 1));
  EXPECT_NE(a, epoch_permutation(1000, 6, 0));
  EXPECT_NE(a, iota(1000));
}

TEST(EpochPermutation, EveryPositionIsReachable) {
  // Over many epochs, sample 0 lands in each of 8 positions, each about 1/8 of the time.
  std::vector<int> where(8, 0);
  for (int64_t e = 0; e < 800; ++e) {
    std::vector<int64_t> p = epoch_permutation(8, 9, e);
    ++where[static_cast<size_t>(std::find(p.begin(), p.end(), 0) - p.begin())];
  }
  for (int w : where) {
    EXPECT_GT(w, 50);
    EXPECT_LT(w, 150);
  }
}

class Loader : public ::testing::TestWithParam<int> {};  // the prefetch depth

TEST_P(Loader, EverySampleOncePerEpochInANewOrder) {
  DataLoader loader(numbered(103), opts(10, GetParam()));
  EXPECT_EQ(loader.batches_per_epoch(), 11);
  Epoch e0 = run_epoch(loader, 0), e1 = run_epoch(loader, 1);
  EXPECT_EQ(sorted(e0.ids), iota(103));
  EXPECT_EQ(sorted(e1.ids), iota(103));
  EXPECT_NE(e0.ids, e1.ids);
  EXPECT_NE(e0.ids, iota(103));
  std::vector<int64_t> sizes(10, 10);
  sizes.push_back(3);
  EXPECT_EQ(e0.batch_sizes, sizes);
  // The order is epoch_permutation's.
  EXPECT_EQ(e1.ids, epoch_permutation(103, 1234, 1));
}

TEST_P(Loader, SameSeedSameOrder) {
  DataLoader a(numbered(50), opts(8, GetParam())), b(numbered(50), opts(8, GetParam()));
  EXPECT_EQ(run_epoch(a, 3).ids, run_epoch(b, 3).ids);
  // Epoch 0 again after epoch 3 is epoch 0's order.
  EXPECT_EQ(run_epoch(a, 0).ids, run_epoch(b, 0).ids);
  LoaderOptions other = opts(8, GetParam());
  other.seed = 99;
  DataLoader c(numbered(50), other);
  EXPECT_NE(run_epoch(c, 0).ids, run_epoch(a, 0).ids);
}

TEST_P(Loader, NoShuffleKeepsTheSourceOrder) {
  LoaderOptions o = opts(4, GetParam());
  o.shuffle = false;
  DataLoader loader(numbered(10), o);
  EXPECT_EQ(run_epoch(loader, 0).ids, iota(10));
  EXPECT_EQ(run_epoch(loader, 1).ids, iota(10));
}

TEST_P(Loader, DropLast) {
  LoaderOptions o = opts(10, GetParam());
  o.drop_last = true;
  DataLoader loader(numbered(103), o);
  EXPECT_EQ(loader.batches_per_epoch(), 10);
  Epoch e = run_epoch(loader, 0);
  EXPECT_EQ(e.batch_sizes, std::vector<int64_t>(10, 10));
  EXPECT_EQ(std::set<int64_t>(e.ids.begin(), e.ids.end()).size(), 100u);
  // The dropped samples are the permutation's last three.
  std::vector<int64_t> p = epoch_permutation(103, 1234, 0);
  EXPECT_EQ(e.ids, std::vector<int64_t>(p.begin(), p.begin() + 100));
  // An exact multiple drops nothing; fewer samples than a batch give no batch at all.
  DataLoader exact(numbered(100), o), tiny(numbered(9), o);
  EXPECT_EQ(run_epoch(exact, 0).ids.size(), 100u);
  EXPECT_EQ(tiny.batches_per_epoch(), 0);
  EXPECT_TRUE(run_epoch(tiny, 0).ids.empty());
}

TEST_P(Loader, EmptySource) {
  DataLoader loader(numbered(0), opts(4, GetParam()));
  EXPECT_EQ(loader.batches_per_epoch(), 0);
  EXPECT_TRUE(run_epoch(loader, 0).ids.empty());
}

TEST_P(Loader, StartsMidEpoch) {
  DataLoader loader(numbered(103), opts(10, GetParam()));
  std::vector<int64_t> whole = run_epoch(loader, 2).ids;
  Epoch tail = run_epoch(loader, 2, 7);
  EXPECT_EQ(tail.ids, std::vector<int64_t>(whole.begin() + 70, whole.end()));
  EXPECT_TRUE(run_epoch(loader, 2, 11).ids.empty());
}

TEST_P(Loader, RestartingAnEpochMidwayDropsWhatWasPrefetched) {
  DataLoader loader(numbered(103), opts(10, GetParam()));
  loader.start_epoch(0);
  std::vector<int64_t> first = (*loader.next())[0].to_vector<int64_t>();
  loader.next();
  Epoch e1 = run_epoch(loader, 1);
  EXPECT_EQ(sorted(e1.ids), iota(103));
  EXPECT_EQ(e1.ids, epoch_permutation(103, 1234, 1));
}

TEST_P(Loader, Normalizes) {
  Tensor x = arange(0, 256, 1, kInt64).to(kUInt8).reshape({64, 2, 2});
  LoaderOptions o = opts(16, GetParam());
  o.shuffle = false;
  o.normalize = Normalize{255, kFashionMnistMean, kFashionMnistStd};
  DataLoader loader(std::make_shared<TensorSource>(std::vector<Tensor>{x}), o);
  loader.start_epoch(0);
  std::optional<Batch> b = loader.next();
  ASSERT_TRUE(b);
  const Tensor& y = (*b)[0];
  EXPECT_EQ(y.dtype(), kFloat32);
  EXPECT_EQ(vec(y.sizes()), (std::vector<int64_t>{16, 2, 2}));
  std::vector<float> v = y.to_vector<float>();
  for (int i = 0; i < 64; ++i) {
    // torchvision's ToTensor then Normalize, in float32.
    float want = (static_cast<float>(i) / 255.0f - static_cast<float>(kFashionMnistMean)) /
                 static_cast<float>(kFashionMnistStd);
    EXPECT_NEAR(v[static_cast<size_t>(i)], want, 1e-6f) << i;
  }
}

TEST_P(Loader, LeavesTheCallersThreadCountAlone) {
  int before = get_num_threads();
  set_num_threads(2);
  {
    LoaderOptions o = opts(10, GetParam());
    o.threads = 1;
    DataLoader loader(numbered(50), o);
    run_epoch(loader, 0);
    EXPECT_EQ(get_num_threads(), 2);
  }
  set_num_threads(before);
}

// A source that counts its gathers, can throw at one of them and can be slow.
class Probe : public Source {
 public:
  explicit Probe(int64_t n, int throw_at = -1, int sleep_ms = 0)
      : inner_(numbered(n)), throw_at_(throw_at), sleep_ms_(sleep_ms) {}
  int64_t size() const override { return inner_->size(); }
  Batch gather(std::span<const int64_t> indices) const override {
    int call = calls_++;
    if (sleep_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    if (call == throw_at_) throw ValueError("[probe] gather number 3 failed");
    return inner_->gather(indices);
  }
  int calls() const { return calls_.load(); }

 private:
  std::shared_ptr<TensorSource> inner_;
  int throw_at_, sleep_ms_;
  mutable std::atomic<int> calls_{0};
};

TEST_P(Loader, SourceErrorsReachTheConsumerAfterTheBatchesBeforeThem) {
  auto probe = std::make_shared<Probe>(100, /*throw_at=*/3);
  DataLoader loader(probe, opts(10, GetParam()));
  loader.start_epoch(0);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(loader.next().has_value());
  expect_value_error([&] { loader.next(); }, "[probe] gather number 3 failed");
  // Raised again until the next epoch starts.
  expect_value_error([&] { loader.next(); }, "[probe] gather number 3 failed");
  EXPECT_EQ(probe->calls(), 4);  // nothing gathered after the failure
  Epoch e = run_epoch(loader, 1);
  EXPECT_EQ(sorted(e.ids), iota(100));
}

TEST_P(Loader, ASourceGatheringTheWrongCountIsAnError) {
  class Short : public Source {
   public:
    int64_t size() const override { return 10; }
    Batch gather(std::span<const int64_t>) const override { return {zeros({1, 3})}; }
  };
  DataLoader loader(std::make_shared<Short>(), opts(4, GetParam()));
  loader.start_epoch(0);
  expect_value_error([&] { loader.next(); },
                     "[DataLoader] the source gathered [1, 3] for field 0 of batch 0, expected "
                     "[4, ...]");
}

TEST_P(Loader, StopsMidEpoch) {
  // Destroyed after one batch of 100, with the thread waiting for room or inside a slow gather:
  // the destructor returns, having gathered at most the batch taken, the queue's and one more.
  for (int sleep_ms : {0, 20}) {
    auto probe = std::make_shared<Probe>(1000, -1, sleep_ms);
    {
      DataLoader loader(probe, opts(10, GetParam()));
      loader.start_epoch(0);
      EXPECT_TRUE(loader.next().has_value());
    }
    EXPECT_LE(probe->calls(), 1 + GetParam() + 1);
    // Destroyed before taking anything, and without starting an epoch.
    { DataLoader loader(probe, opts(10, GetParam())); }
    {
      DataLoader loader(probe, opts(10, GetParam()));
      loader.start_epoch(0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Prefetch, Loader, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return fmt::format("depth{}", info.param); });

// ---------------------------------------------------------------- errors

TEST(LoaderErrors, Options) {
  auto src = numbered(10);
  auto make = [&](LoaderOptions o) { DataLoader loader(src, o); };
  LoaderOptions o;
  o.batch_size = 0;
  expect_value_error([&] { make(o); }, "[DataLoader] batch_size must be at least 1, got 0");
  o = {};
  o.prefetch = -1;
  expect_value_error([&] { make(o); }, "[DataLoader] prefetch must be at least 0, got -1");
  o = {};
  o.threads = 0;
  expect_value_error([&] { make(o); }, "[DataLoader] threads must be at least 1, got 0");
  o = {};
  o.normalize = Normalize{255, 0.5, 0};
  expect_value_error([&] { make(o); },
                     "[DataLoader] Normalize divides by scale 255 and std 0: neither may be 0");
  expect_value_error([&] { DataLoader loader(nullptr, {}); }, "[DataLoader] the source is null");
}

TEST(LoaderErrors, Epochs) {
  DataLoader loader(numbered(25), opts(10));
  expect_value_error([&] { loader.next(); }, "[DataLoader] next() before the first start_epoch()");
  expect_value_error([&] { loader.start_epoch(-1); },
                     "[DataLoader] epoch must be at least 0, got -1");
  expect_value_error([&] { loader.start_epoch(0, 4); },
                     "[DataLoader] first_batch 4 is outside [0, 3] (the epoch's batches)");
}

TEST(LoaderErrors, TensorSource) {
  expect_value_error([] { TensorSource s({}); }, "[TensorSource] needs at least one tensor");
  expect_value_error(
      [] {
        TensorSource s({arange(3), scalar_tensor(1.0)});
      },
      "[TensorSource] tensor 1 must be [N, ...], got 0-d");
  expect_value_error(
      [] {
        TensorSource s({zeros({3, 2}), zeros({4})});
      },
      "[TensorSource] tensor 1 has 4 samples (sizes [4]), tensor 0 has 3 (sizes "
      "[3, 2])");
}

// ---------------------------------------------------------------- Fashion-MNIST

TEST(LoaderFashionMnist, OneEpochOfTheRealTrainingSet) {
  if (!std::filesystem::is_directory(kFashionMnistDir))
    GTEST_SKIP() << kFashionMnistDir << " is absent (Debian's dataset-fashion-mnist package)";
  FashionMnist d = load_fashion_mnist();
  LoaderOptions o;
  o.batch_size = 64;
  o.seed = 0;
  o.normalize = Normalize{255, kFashionMnistMean, kFashionMnistStd};
  DataLoader loader(
      std::make_shared<TensorSource>(std::vector<Tensor>{d.train.inputs, d.train.labels}), o);
  EXPECT_EQ(loader.batches_per_epoch(), 938);  // 937 of 64 and one of 32
  loader.start_epoch(0);
  int64_t n = 0;
  double total = 0;
  std::vector<int64_t> per_class(10, 0);
  while (std::optional<Batch> b = loader.next()) {
    EXPECT_EQ((*b)[0].dtype(), kFloat32);
    EXPECT_EQ((*b)[0].size(1), 28);
    EXPECT_EQ((*b)[1].dtype(), kInt64);
    n += (*b)[0].size(0);
    total += sum((*b)[0].to(kFloat64)).item<double>();
    for (int64_t l : (*b)[1].to_vector<int64_t>()) ++per_class[static_cast<size_t>(l)];
  }
  EXPECT_EQ(n, 60000);
  EXPECT_EQ(per_class, std::vector<int64_t>(10, 6000));
  // Normalised by the set's own mean: the epoch's mean is 0.
  EXPECT_NEAR(total / (60000.0 * 784), 0.0, 1e-5);
}

}  // namespace
}  // namespace kiln::data
