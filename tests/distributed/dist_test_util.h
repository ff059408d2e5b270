#pragma once
// Helpers shared by the collectives' tests (tests/distributed): the devices and groups they run
// over, values that depend on the rank (so that a wrong rank order shows), expected results
// computed locally, and bitwise comparisons. Every rank runs the same tests in the same order,
// so every rank makes the same groups and calls the same collectives; a test must never skip
// or return early on some ranks only (the others would wait for it until the deadline).
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/distributed/distributed.h"
#include "kiln/distributed/flight_recorder.h"
#include "kiln/distributed/shm_allreduce.h"
#include "kiln/ops/ops.h"
#include "tests/backend/sim_util.h"
#include "tests/core/test_util.h"

namespace kiln::test {

namespace dist = kiln::distributed;

// ---------------------------------------------------------------- devices

// The devices every collective is tested on: CPU tensors (MPI on the caller's thread) and sim
// tensors (host tasks on the sim stream, Note [Collectives as host tasks] in mpi_backend.cpp).
inline const std::vector<std::string>& device_names() {
  static const std::vector<std::string> names = {"cpu", "sim"};
  return names;
}
inline Device device_named(const std::string& name) { return name == "sim" ? sim() : Device(kCPU); }

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> t = {kBool,    kUInt8,    kInt32,   kInt64,
                                       kFloat16, kBFloat16, kFloat32, kFloat64};
  return t;
}

inline const std::vector<dist::ReduceOp>& all_reduce_ops() {
  using R = dist::ReduceOp;
  static const std::vector<R> ops = {R::Sum, R::Avg, R::Max, R::Min, R::Product};
  return ops;
}
// Avg needs a floating dtype; every other reduction takes every dtype.
inline bool reduce_allowed(dist::ReduceOp op, DType t) {
  return op != dist::ReduceOp::Avg || is_floating(t);
}

// ---------------------------------------------------------------- groups

// A group the tests run over, as every rank knows it: `members` (world ranks in group-rank
// order) is known on every rank, `group` only on members (null elsewhere).
struct GroupCase {
  std::string label;  // "world", "new_group", "split"
  std::shared_ptr<dist::ProcessGroup> owned;
  const dist::ProcessGroup* group = nullptr;
  std::vector<int> members;

  bool member() const { return group != nullptr; }
  int size() const { return static_cast<int>(members.size()); }
  int rank() const { return group ? group->rank() : -1; }
};

// The world; new_group of the world in reverse order without rank 1 (with 2 ranks: [1, 0];
// in a world of one: [0]); split_group by parity with key -rank, so each half lists its ranks
// in descending order. Made once, the first time a test asks (the same test on every rank).
inline const std::vector<GroupCase>& test_groups() {
  static const std::vector<GroupCase> groups = [] {
    const int n = dist::world_size(), me = dist::rank();
    std::vector<GroupCase> g;
    g.push_back({"world", nullptr, &dist::world(), {}});
    for (int r = 0; r < n; ++r) g.back().members.push_back(r);

    std::vector<int> sub;
    for (int r = n - 1; r >= 0; --r)
      if (r != 1 || n == 2) sub.push_back(r);
    auto made = dist::new_group(sub);
    g.push_back({"new_group", made, made.get(), sub});

    std::vector<int> half;
    for (int r = n - 1; r >= 0; --r)
      if (r % 2 == me % 2) half.push_back(r);
    auto split = dist::split_group(dist::world(), me % 2, -me);
    g.push_back({"split", split, split.get(), half});
    return g;
  }();
  return groups;
}

// ---------------------------------------------------------------- values

// Element k of world rank r's input for the collectives that move data (gather, broadcast,
// all-to-all, send): the rank in the high part, so a block from the wrong rank shows. Exact in
// every dtype (at most 63 with 4 ranks); bool gets a pattern of its own per rank.
inline double tag_value(DType t, int r, int64_t k) {
  if (t == kBool) return (k + r) % (r + 2) == 0 ? 1 : 0;
  return r * 16 + k % 16;
}
// Element k of world rank r's input for the reductions: 1 to 3 (3.5 for floats), so that
// sums, products and averages of up to 4 ranks are exact in float32 and fit in uint8.
inline double reduce_value(DType t, int r, int64_t k) {
  if (t == kBool) return (k + r) % (r + 2) == 0 ? 1 : 0;
  double v = 1 + (2 * r + k) % 3;
  return is_floating(t) ? v + 0.5 * static_cast<double>(k % 2) : v;
}

using ValueFn = std::function<double(int rank, int64_t k)>;

// A tensor of `sizes` whose element k (row-major) is f(r, k).
inline Tensor make_tensor(IntArrayRef sizes, DType t, Device d, int r, const ValueFn& f) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) v[k] = f(r, k);
  return from_vector(v, sizes).to(t).to(d);
}
inline Tensor tagged(IntArrayRef sizes, DType t, Device d, int r) {
  return make_tensor(sizes, t, d, r, [t](int rr, int64_t k) { return tag_value(t, rr, k); });
}

// The reduction of f(r, offset + k) over `ranks` for k < numel, as `t` gets it: integers in
// int64, bool as any (sum, max) or all (min, product), floats in their accumulation type
// (float64 for float64, else float32, as MPI reduces 16-bit floats) rounded once to `t`;
// avg divides the sum by the number of ranks in that type.
inline Tensor expected_reduce(IntArrayRef sizes, DType t, dist::ReduceOp op,
                              const std::vector<int>& ranks, const ValueFn& f, int64_t offset = 0) {
  using R = dist::ReduceOp;
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  std::vector<double> out(static_cast<size_t>(numel));
  for (int64_t k = 0; k < numel; ++k) {
    std::vector<double> v;
    for (int r : ranks) v.push_back(f(r, offset + k));
    if (t == kBool) {
      bool any = false, all = true;
      for (double x : v) any |= x != 0, all &= x != 0;
      out[k] = (op == R::Sum || op == R::Max) ? any : all;
    } else if (!is_floating(t)) {
      int64_t acc = static_cast<int64_t>(v[0]);
      for (size_t i = 1; i < v.size(); ++i) {
        auto x = static_cast<int64_t>(v[i]);
        acc = op == R::Sum   ? acc + x
              : op == R::Max ? std::max(acc, x)
              : op == R::Min ? std::min(acc, x)
                             : acc * x;
      }
      out[k] = static_cast<double>(acc);
    } else {
      auto fold = [&](auto zero) {
        using A = decltype(zero);
        A acc = static_cast<A>(v[0]);
        for (size_t i = 1; i < v.size(); ++i) {
          A x = static_cast<A>(v[i]);
          acc = (op == R::Sum || op == R::Avg) ? acc + x
                : op == R::Max                 ? std::max(acc, x)
                : op == R::Min                 ? std::min(acc, x)
                                               : acc * x;
        }
        if (op == R::Avg) acc /= static_cast<A>(v.size());
        return static_cast<double>(acc);
      };
      out[k] = t == kFloat64 ? fold(0.0) : fold(0.0f);
    }
  }
  if (t == kFloat16 || t == kBFloat16) {  // round the float32 value once
    std::vector<float> f32(out.begin(), out.end());
    return from_vector(f32, sizes).to(t);
  }
  return from_vector(out, sizes).to(t);
}

// ---------------------------------------------------------------- comparisons

// The bytes of `t` (copied to the host, row-major).
inline std::vector<uint8_t> bytes_of(const Tensor& t) {
  Tensor c = t.to(Device(kCPU)).contiguous();
  std::vector<uint8_t> b(c.nbytes());
  if (!b.empty()) std::memcpy(b.data(), c.data_ptr(), b.size());
  return b;
}
// Same dtype, sizes and bytes; prints both tensors otherwise.
inline ::testing::AssertionResult bitwise_equal(const Tensor& got, const Tensor& want) {
  if (got.dtype() == want.dtype() && got.sizes() == want.sizes() && bytes_of(got) == bytes_of(want))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "got " << got.to(Device(kCPU)).str() << "\nwant " << want.to(Device(kCPU)).str();
}

// Whether every rank of `g` holds the same bytes in `t` (all-gathered over the group).
inline bool same_on_every_rank(const Tensor& t, const dist::ProcessGroup* g) {
  Tensor all = dist::all_gather_into_tensor(t.reshape({-1}), g).to(Device(kCPU));
  std::vector<uint8_t> b = bytes_of(all);
  size_t block = t.nbytes();
  for (int r = 1; r < g->size(); ++r)
    if (std::memcmp(b.data(), b.data() + r * block, block) != 0) return false;
  return true;
}

// A short description of where an expectation failed: rank, group, device, dtype.
inline std::string where(const GroupCase& g, Device d, DType t, std::string_view what = {}) {
  return fmt::format("rank {} of {}, group {} (group rank {} of {}), {}, {}{}{}", dist::rank(),
                     dist::world_size(), g.label, g.rank(), g.size(), d, name(t),
                     what.empty() ? "" : ", ", what);
}

// The number of collectives named `op` that started on this process since `since` (a value
// of calls_mark()), from the flight recorder; sim's run on its stream, so synchronise first.
inline double calls_mark() {
  auto e = dist::FlightRecorder::get().entries();
  return e.empty() ? -1.0 : e.back().started_s;
}
// The collectives since `since`, one per line, for failure messages.
inline std::string calls_str(double since) {
  std::string s;
  for (const auto& e : dist::FlightRecorder::get().entries())
    if (e.started_s > since) s += dist::FlightRecorder::format(e) + "\n";
  return s;
}
inline int calls_since(double since, std::string_view op) {
  int n = 0;
  for (const auto& e : dist::FlightRecorder::get().entries())
    if (e.started_s > since && e.op == op) ++n;
  return n;
}

// ---------------------------------------------------------------- the custom all-reduce

// What CUDA's custom all-reduce tests (tests/backend/cuda_custom_allreduce_test.cpp) and its
// shared-memory mirror's (tests/distributed/shm_allreduce_test.cpp) share.

// Sets the custom all-reduce's mode for one scope, on every rank alike, and restores Auto.
class CustomModeGuard {
 public:
  explicit CustomModeGuard(dist::CustomAllReduceMode m) { dist::set_custom_all_reduce_mode(m); }
  ~CustomModeGuard() { dist::set_custom_all_reduce_mode(dist::CustomAllReduceMode::Auto); }
  CustomModeGuard(const CustomModeGuard&) = delete;
  CustomModeGuard& operator=(const CustomModeGuard&) = delete;
};

inline std::vector<int> world_ranks() {
  std::vector<int> r(dist::world_size());
  for (int i = 0; i < dist::world_size(); ++i) r[i] = i;
  return r;
}

// Element k of call `call`'s input on world rank r: multiples of 0.5 in [-4, 5], exact in every
// floating dtype, so any order of the sum gives the same bits.
inline double custom_value(int call, int r, int64_t k) {
  return 0.5 * static_cast<double>((r * 7 + k * 3 + call * 5) % 19) - 4.0;
}
inline Tensor custom_input(int call, IntArrayRef sizes, DType t, Device d) {
  return make_tensor(sizes, t, d, dist::rank(),
                     [call](int r, int64_t k) { return custom_value(call, r, k); });
}
// What every rank should get from all-reducing call `call`'s inputs over the world.
inline Tensor custom_reference(int call, IntArrayRef sizes, DType t,
                               dist::ReduceOp op = dist::ReduceOp::Sum) {
  return expected_reduce(sizes, t, op, world_ranks(),
                         [call](int r, int64_t k) { return custom_value(call, r, k); });
}

inline std::string sizes_str(IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

// A graph captured by hand through the device interface of `device`: on `stream` (0: a stream
// of its own) into a pool of its own, `body` run while capturing, then instantiated. Whatever
// it made is destroyed with it, and the current stream is restored even when the capture
// throws (end_capture raises what the custom all-reduce's exchange raised).
class HandCapture {
 public:
  HandCapture(Device device, const std::function<void()>& body, uint64_t stream = 0)
      : di_(*device_interface(device.type())), index_(device.index()) {
    own_stream_ = stream == 0;
    stream_ = own_stream_ ? di_.create_stream(index_) : stream;
    pool_ = di_.create_pool(index_);
    const uint64_t previous = di_.current_stream(index_);
    di_.set_current_stream(index_, stream_);
    try {
      di_.begin_capture(index_, stream_, pool_);
      try {
        body();
      } catch (...) {
        try {
          (void)di_.end_capture(index_, stream_);
        } catch (...) {  // NOLINT: body's error is the one to report
        }
        throw;
      }
      graph_ = di_.end_capture(index_, stream_);
      di_.set_current_stream(index_, previous);
      exec_ = di_.instantiate(index_, graph_);
    } catch (...) {
      di_.set_current_stream(index_, previous);
      release();
      throw;
    }
  }
  ~HandCapture() { release(); }
  HandCapture(const HandCapture&) = delete;
  HandCapture& operator=(const HandCapture&) = delete;

  // Replays the graph on `stream` (default: the device's default stream).
  void launch(uint64_t stream = 0) { di_.launch(index_, exec_, stream); }

 private:
  void release() {
    if (exec_) {
      try {
        di_.synchronize(index_);  // no replay still running while its graph and pool go
      } catch (...) {             // NOLINT: a failed replay was reported by the test already
      }
      di_.destroy_exec(index_, exec_);
    }
    if (graph_) di_.destroy_graph(index_, graph_);
    exec_ = graph_ = 0;
    if (pool_) di_.release_pool(index_, pool_);
    pool_ = 0;
    if (own_stream_ && stream_) {
      di_.synchronize_stream(index_, stream_);
      di_.destroy_stream(index_, stream_);
    }
    stream_ = 0;
  }

  DeviceInterface& di_;
  int index_;
  bool own_stream_ = true;
  uint64_t stream_ = 0, pool_ = 0, graph_ = 0, exec_ = 0;
};

}  // namespace kiln::test
