// The collectives of kiln/distributed/collectives.h on CPU tensors (MPI on the caller's thread)
// and sim tensors (host tasks on the sim stream), over the world, a new_group and the halves of
// a split_group: every op in its functional and in-place or out= forms, every dtype, values
// that depend on the rank, results computed locally and compared bitwise. Bad input raises on
// every rank before anything is sent (the flight recorder shows no call); meta tensors give
// the result's shape without communicating. Runs as a world of one and on 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include <fmt/ranges.h>

#include <numeric>

#include "kiln/core/stream.h"
#include "kiln/ops/op_list.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using dist::ReduceOp;
using kiln_test::contains;
using kiln_test::message_of;

const Device kHost(kCPU);

class CollectiveOps : public ::testing::TestWithParam<std::string> {
 protected:
  Device dev() const { return device_named(GetParam()); }
};
INSTANTIATE_TEST_SUITE_P(Devices, CollectiveOps, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

ValueFn reduce_fn(DType t) {
  return [t](int r, int64_t k) { return reduce_value(t, r, k); };
}

// ---------------------------------------------------------------- groups

TEST(CollectiveGroups, MembersAndRankOrder) {
  const int n = dist::world_size(), me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    bool listed = std::find(g.members.begin(), g.members.end(), me) != g.members.end();
    EXPECT_EQ(g.member(), listed) << g.label;
    if (!g.member()) continue;
    EXPECT_EQ(g.group->world_ranks(), g.members) << g.label;
    EXPECT_EQ(g.group->size(), g.size()) << g.label;
    EXPECT_EQ(g.members.at(g.group->rank()), me) << g.label;
    EXPECT_EQ(g.group->group_rank_of(me), g.group->rank()) << g.label;
    EXPECT_EQ(&dist::group_by_id(g.group->id(), "test"), g.group) << g.label;
  }
  EXPECT_EQ(dist::world().size(), n);
  EXPECT_EQ(dist::world().rank(), me);
  EXPECT_EQ(dist::world().name(), "world");
}

TEST(CollectiveGroups, BadRankListsRaiseOnEveryRank) {
  const int n = dist::world_size();
  EXPECT_THROW_PREFIX(dist::new_group({n}), ValueError,
                      fmt::format("[new_group] rank {} is outside the world of {} ranks", n, n));
  EXPECT_THROW_PREFIX(dist::new_group({0, 0}), ValueError, "[new_group] rank 0 is listed twice");
  EXPECT_THROW_PREFIX(dist::new_group({}), ValueError, "[new_group] the rank list is empty");
}

// ---------------------------------------------------------------- all_reduce

TEST_P(CollectiveOps, AllReduceEveryOpAndDtype) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;  // the group's collectives involve its members only
    for (DType t : all_dtypes())
      for (ReduceOp op : all_reduce_ops()) {
        if (!reduce_allowed(op, t)) continue;
        std::string at = where(g, d, t, dist::reduce_op_name(op));
        Tensor x = make_tensor({2, 3}, t, d, me, reduce_fn(t));
        Tensor before = x.clone();
        Tensor want = expected_reduce({2, 3}, t, op, g.members, reduce_fn(t));
        Tensor y = dist::all_reduce(x, op, g.group);
        EXPECT_EQ(y.device(), d) << at;
        EXPECT_TRUE(bitwise_equal(y, want)) << at;
        EXPECT_TRUE(bitwise_equal(x, before)) << at << ": the functional form wrote its input";
        Tensor z = x.clone();
        dist::all_reduce_(z, op, g.group);
        EXPECT_TRUE(bitwise_equal(z, want)) << at << " (in place)";
      }
  }
}

// 16-bit floats are reduced in float32 and rounded once, so every rank gets the same bits
// whatever order MPI adds in. Values in [1, 2) on the type's grid make float32 sums of up to 4
// ranks exact; rounding each partial sum to 16 bits instead would differ (checked at 3 ranks
// and more, where there are two additions).
TEST_P(CollectiveOps, SixteenBitFloatsReduceInFloat32AndAgreeBitwise) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    for (DType t : {kFloat16, kBFloat16}) {
      const int grid = t == kFloat16 ? 1024 : 128;
      ValueFn f = [grid](int r, int64_t k) {
        return 1.0 + static_cast<double>((r * 389 + k * 97) % grid) / grid;
      };
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
        std::string at = where(g, d, t, dist::reduce_op_name(op));
        Tensor x = make_tensor({64}, t, d, me, f);
        Tensor want = expected_reduce({64}, t, op, g.members, f);
        Tensor y = dist::all_reduce(x, op, g.group);
        EXPECT_TRUE(bitwise_equal(y, want)) << at;
        EXPECT_TRUE(same_on_every_rank(y, g.group)) << at;
        Tensor rs =
            dist::reduce_scatter_tensor(make_tensor({64 * g.size()}, t, d, me, f), op, g.group);
        EXPECT_TRUE(bitwise_equal(rs, expected_reduce({64}, t, op, g.members, f, 64 * g.rank())))
            << at << " (reduce_scatter)";
      }
      if (g.size() >= 3) {  // the test can tell: 16-bit partial sums give other bits
        Tensor naive = make_tensor({64}, t, kHost, g.members[0], f);
        for (int i = 1; i < g.size(); ++i)
          naive = add(naive, make_tensor({64}, t, kHost, g.members[i], f));
        EXPECT_FALSE(bitwise_equal(naive, expected_reduce({64}, t, ReduceOp::Sum, g.members, f)));
      }
    }
  }
}

// ---------------------------------------------------------------- all_gather, reduce_scatter

TEST_P(CollectiveOps, AllGatherEveryDtypeInGroupRankOrder) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    for (DType t : all_dtypes()) {
      std::string at = where(g, d, t);
      std::vector<Tensor> blocks, scalars, transposed;
      for (int r : g.members) {
        blocks.push_back(tagged({2, 3}, t, kHost, r));
        scalars.push_back(tagged({}, t, kHost, r).reshape({1}));
        transposed.push_back(transpose(tagged({3, 2}, t, kHost, r), 0, 1).contiguous());
      }
      Tensor want = cat(blocks, 0);
      Tensor x = tagged({2, 3}, t, d, me);
      EXPECT_TRUE(bitwise_equal(dist::all_gather_into_tensor(x, g.group), want)) << at;
      Tensor out = empty({2 * g.size(), 3}, t, d);
      dist::all_gather_into_tensor_out(out, x, g.group);
      EXPECT_TRUE(bitwise_equal(out, want)) << at << " (out=)";
      // A 0-d tensor gathers into one element per rank; a non-contiguous one is read in order.
      Tensor s = dist::all_gather_into_tensor(tagged({}, t, d, me), g.group);
      EXPECT_TRUE(bitwise_equal(s, cat(scalars, 0))) << at << " (0-d)";
      Tensor nc = transpose(tagged({3, 2}, t, d, me), 0, 1);
      EXPECT_TRUE(bitwise_equal(dist::all_gather_into_tensor(nc, g.group), cat(transposed, 0)))
          << at << " (non-contiguous)";
    }
  }
}

TEST_P(CollectiveOps, ReduceScatterEveryOpAndDtype) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    const int n = g.size();
    for (DType t : all_dtypes())
      for (ReduceOp op : all_reduce_ops()) {
        if (!reduce_allowed(op, t)) continue;
        std::string at = where(g, d, t, dist::reduce_op_name(op));
        // Rank r's input is n blocks of [2, 3]; group rank a keeps the reduction of block a.
        Tensor x = make_tensor({2 * n, 3}, t, d, me, reduce_fn(t));
        Tensor want = expected_reduce({2, 3}, t, op, g.members, reduce_fn(t), 6 * g.rank());
        EXPECT_TRUE(bitwise_equal(dist::reduce_scatter_tensor(x, op, g.group), want)) << at;
        Tensor out = empty({2, 3}, t, d);
        dist::reduce_scatter_tensor_out(out, x, op, g.group);
        EXPECT_TRUE(bitwise_equal(out, want)) << at << " (out=)";
      }
  }
}

// ---------------------------------------------------------------- broadcast

TEST_P(CollectiveOps, BroadcastFromEverySourceEveryDtype) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    for (DType t : all_dtypes())
      for (int src = 0; src < g.size(); ++src) {
        std::string at = where(g, d, t, fmt::format("src {}", src));
        Tensor x = tagged({2, 3}, t, d, me);
        Tensor want = tagged({2, 3}, t, kHost, g.members[src]);
        Tensor y = dist::broadcast(x, src, g.group);
        EXPECT_TRUE(bitwise_equal(y, want)) << at;
        EXPECT_TRUE(bitwise_equal(x, tagged({2, 3}, t, kHost, me))) << at << ": input written";
        dist::broadcast_(x, src, g.group);
        EXPECT_TRUE(bitwise_equal(x, want)) << at << " (in place)";
        // The functional form takes a non-contiguous tensor.
        Tensor nc = transpose(tagged({3, 2}, t, d, me), 0, 1);
        Tensor wnc = transpose(tagged({3, 2}, t, kHost, g.members[src]), 0, 1);
        EXPECT_TRUE(bitwise_equal(dist::broadcast(nc, src, g.group), wnc)) << at;
      }
  }
}

// ---------------------------------------------------------------- all_to_all_single

TEST_P(CollectiveOps, AllToAllEqualSplitsEveryDtype) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    const int n = g.size(), a = g.rank();
    for (DType t : all_dtypes()) {
      std::string at = where(g, d, t);
      // Rank j sends rows [2a, 2a + 2) of its input to group rank a.
      std::vector<Tensor> parts;
      for (int r : g.members) parts.push_back(narrow(tagged({2 * n, 3}, t, kHost, r), 0, 2 * a, 2));
      Tensor want = cat(parts, 0);
      Tensor x = tagged({2 * n, 3}, t, d, me);
      EXPECT_TRUE(bitwise_equal(dist::all_to_all_single(x, {}, {}, g.group), want)) << at;
      std::vector<int64_t> equal(n, 2);
      EXPECT_TRUE(bitwise_equal(dist::all_to_all_single(x, equal, equal, g.group), want)) << at;
      Tensor out = empty({2 * n, 3}, t, d);
      ops::op_all_to_all_single_out(out, x, IntArrayRef(), IntArrayRef(), g.group->id());
      EXPECT_TRUE(bitwise_equal(out, want)) << at << " (out=)";
    }
  }
}

// Uneven splits, some of them empty: group rank a sends split(a, j) rows to group rank j.
int64_t split(int a, int j) { return (a + 2 * j + 1) % 3; }

TEST_P(CollectiveOps, AllToAllUnevenSplitsEveryDtype) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    const int n = g.size(), a = g.rank();
    std::vector<int64_t> in_splits, out_splits;
    for (int j = 0; j < n; ++j) {
      in_splits.push_back(split(a, j));
      out_splits.push_back(split(j, a));
    }
    const int64_t in_rows = std::accumulate(in_splits.begin(), in_splits.end(), int64_t{0});
    const int64_t out_rows = std::accumulate(out_splits.begin(), out_splits.end(), int64_t{0});
    for (DType t : all_dtypes()) {
      std::string at = where(g, d, t, fmt::format("in {} out {}", in_splits, out_splits));
      std::vector<Tensor> parts;
      for (int j = 0; j < n; ++j) {
        int64_t rows_j = 0, offset = 0;
        for (int i = 0; i < n; ++i) rows_j += split(j, i);
        for (int i = 0; i < a; ++i) offset += split(j, i);
        parts.push_back(
            narrow(tagged({rows_j, 2}, t, kHost, g.members[j]), 0, offset, split(j, a)));
      }
      Tensor want = cat(parts, 0);
      Tensor x = tagged({in_rows, 2}, t, d, me);
      Tensor y = dist::all_to_all_single(x, out_splits, in_splits, g.group);
      EXPECT_TRUE(bitwise_equal(y, want)) << at;
      Tensor out = empty({out_rows, 2}, t, d);
      ops::op_all_to_all_single_out(out, x, out_splits, in_splits, g.group->id());
      EXPECT_TRUE(bitwise_equal(out, want)) << at << " (out=)";
    }
  }
}

// ---------------------------------------------------------------- send, recv, barrier

// A ring in each group of two or more: group rank a sends to a + 1 and receives from a - 1
// (even ranks send first, so that no cycle of blocking sends forms).
TEST_P(CollectiveOps, SendRecvRingEveryDtype) {
  if (dist::world_size() == 1) GTEST_SKIP() << "a world of one has no peer";
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member() || g.size() < 2) continue;
    const int n = g.size(), a = g.rank(), dst = (a + 1) % n, src = (a + n - 1) % n;
    for (DType t : all_dtypes()) {
      std::string at = where(g, d, t, fmt::format("dst {} src {}", dst, src));
      Tensor x = tagged({2, 3}, t, d, me);
      Tensor got = zeros({2, 3}, t, d);
      if (a % 2 == 0) {
        dist::send(x, dst, g.group);
        dist::recv_(got, src, g.group);
      } else {
        dist::recv_(got, src, g.group);
        dist::send(x, dst, g.group);
      }
      EXPECT_TRUE(bitwise_equal(got, tagged({2, 3}, t, kHost, g.members[src]))) << at;
    }
    // send takes a non-contiguous tensor.
    Tensor nc = transpose(tagged({3, 2}, kFloat32, d, me), 0, 1);
    Tensor got = zeros({2, 3}, kFloat32, d);
    if (a % 2 == 0) {
      dist::send(nc, dst, g.group);
      dist::recv_(got, src, g.group);
    } else {
      dist::recv_(got, src, g.group);
      dist::send(nc, dst, g.group);
    }
    EXPECT_TRUE(
        bitwise_equal(got, transpose(tagged({3, 2}, kFloat32, kHost, g.members[src]), 0, 1)))
        << where(g, d, kFloat32, "non-contiguous send");
  }
}

TEST_P(CollectiveOps, BarrierOnEveryGroup) {
  const Device d = dev();
  const double mark = calls_mark();
  int expected = 0;
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    dist::barrier(g.group, d);
    ++expected;  // recorded unless the world is one process (then MPI is never called)
  }
  if (!d.is_cpu()) Stream::current(d).synchronize();
  if (dist::world_size() > 1) {
    EXPECT_EQ(calls_since(mark, "barrier"), expected);
  }
}

TEST_P(CollectiveOps, AsyncAllReduceCompletesAtWait) {
  const Device d = dev();
  const int me = dist::rank();
  for (const GroupCase& g : test_groups()) {
    if (!g.member()) continue;
    Tensor x = make_tensor({1000}, kFloat32, d, me, reduce_fn(kFloat32));
    Tensor want = expected_reduce({1000}, kFloat32, ReduceOp::Avg, g.members, reduce_fn(kFloat32));
    dist::Work w = dist::all_reduce_async(x, ReduceOp::Avg, g.group);
    EXPECT_TRUE(w.defined());
    w.wait();
    EXPECT_TRUE(bitwise_equal(x, want)) << where(g, d, kFloat32);
    EXPECT_TRUE(w.is_completed());
  }
}

// ---------------------------------------------------------------- bad input

class CollectiveErrors : public CollectiveOps {};
INSTANTIATE_TEST_SUITE_P(Devices, CollectiveErrors, ::testing::ValuesIn(device_names()),
                         [](const auto& info) { return info.param; });

// `f` raises E with a message that starts with `prefix` and contains each of `parts`.
template <class E, class F>
void expect_error(F&& f, std::string_view prefix, std::initializer_list<std::string> parts = {}) {
  std::string msg = message_of<E>(f);
  EXPECT_TRUE(kiln_test::starts_with(msg, prefix)) << msg;
  for (const std::string& p : parts) EXPECT_TRUE(contains(msg, p)) << msg << "\nlacks: " << p;
}

// Every rank makes the same bad call, so that none waits for another; afterwards the flight
// recorder shows that nothing was sent, and a good collective still pairs up across ranks.
class NothingSent {
 public:
  explicit NothingSent(Device d) : d_(d), mark_(calls_mark()) {}
  ~NothingSent() {
    if (!d_.is_cpu()) Stream::current(d_).synchronize();
    for (const auto& e : dist::FlightRecorder::get().entries())
      EXPECT_FALSE(e.started_s > mark_) << "a bad call sent something: " << e.op;
    const int n = dist::world_size();
    Tensor y = dist::all_reduce(ones({3}, kInt64, d_));
    EXPECT_EQ(y.to_vector<int64_t>(), std::vector<int64_t>(3, n));
  }

 private:
  Device d_;
  double mark_;
};

std::string world_at() {
  return fmt::format("group world (rank {} of {})", dist::rank(), dist::world_size());
}

TEST_P(CollectiveErrors, NonContiguousInPlace) {
  const Device d = dev();
  NothingSent check(d);
  Tensor nc = transpose(zeros({3, 2}, kFloat32, d), 0, 1);
  expect_error<ValueError>([&] { dist::all_reduce_(nc); }, "[all_reduce_] self must be contiguous",
                           {"sizes [2, 3]", "strides [1, 2]", world_at()});
  expect_error<ValueError>([&] { dist::broadcast_(nc, 0); }, "[broadcast_] self must be contiguous",
                           {world_at()});
  if (dist::world_size() > 1)
    expect_error<ValueError>([&] { dist::recv_(nc, (dist::rank() + 1) % dist::world_size()); },
                             "[recv_] self must be contiguous", {world_at()});
}

TEST_P(CollectiveErrors, OutOfTheWrongSizeDtypeOrDevice) {
  const Device d = dev(), other = d.is_cpu() ? sim() : kHost;
  const int n = dist::world_size();
  NothingSent check(d);
  Tensor x = zeros({2, 3}, kFloat32, d);
  expect_error<ValueError>(
      [&] {
        dist::all_gather_into_tensor_out(empty({2 * n + 1, 3}, kFloat32, d), x);
      },
      "[all_gather_into_tensor] out has sizes",
      {fmt::format("[{}, 3]", 2 * n + 1), fmt::format("expected [{}, 3]", 2 * n)});
  expect_error<TypeError>(
      [&] {
        dist::all_gather_into_tensor_out(empty({2 * n, 3}, kInt32, d), x);
      },
      "[all_gather_into_tensor] out is int32 but self is float32");
  expect_error<DeviceError>(
      [&] {
        dist::all_gather_into_tensor_out(empty({2 * n, 3}, kFloat32, other), x);
      },
      "[all_gather_into_tensor");
  Tensor rs_in = zeros({2 * n, 3}, kFloat32, d);
  expect_error<ValueError>(
      [&] {
        dist::reduce_scatter_tensor_out(empty({3, 3}, kFloat32, d), rs_in);
      },
      "[reduce_scatter_tensor] out has sizes [3, 3], expected [2, 3]");
  expect_error<TypeError>(
      [&] {
        dist::reduce_scatter_tensor_out(empty({2, 3}, kFloat64, d), rs_in);
      },
      "[reduce_scatter_tensor] out is float64 but self is float32");
  expect_error<DeviceError>(
      [&] {
        dist::reduce_scatter_tensor_out(empty({2, 3}, kFloat32, other), rs_in);
      },
      "[reduce_scatter_tensor");
  expect_error<ValueError>(
      [&] {
        ops::op_all_to_all_single_out(empty({2 * n + 2, 3}, kFloat32, d), rs_in, IntArrayRef(),
                                      IntArrayRef(), dist::world().id());
      },
      "[all_to_all_single]");
}

TEST_P(CollectiveErrors, PeerOutsideTheGroup) {
  const Device d = dev();
  const int n = dist::world_size(), me = dist::rank();
  NothingSent check(d);
  Tensor x = zeros({4}, kFloat32, d);
  expect_error<ValueError>([&] { dist::broadcast(x, n); }, "[broadcast] src", {std::to_string(n)});
  expect_error<ValueError>([&] { dist::broadcast_(x, -1); }, "[broadcast_] src", {"-1"});
  expect_error<ValueError>([&] { dist::send(x, n); }, "[send] dst",
                           {fmt::format("dst {} is outside {}", n, world_at())});
  expect_error<ValueError>([&] { dist::recv_(x, n + 3); }, "[recv_] src",
                           {fmt::format("src {} is outside {}", n + 3, world_at())});
  expect_error<ValueError>([&] { dist::send(x, me); }, "[send] dst",
                           {fmt::format("dst {} is this rank", me)});
  expect_error<ValueError>([&] { dist::recv_(x, me); }, "[recv_] src",
                           {fmt::format("src {} is this rank", me)});
  // A rank outside a sub-group: the world rank is not its group rank.
  for (const GroupCase& g : test_groups())
    if (g.member() && g.label == "split")
      expect_error<ValueError>([&] { dist::broadcast(x, g.size(), g.group); }, "[broadcast] src",
                               {fmt::format("(rank {} of {})", g.rank(), g.size())});
}

TEST_P(CollectiveErrors, GroupSizeThatIsNotTheGroups) {
  const Device d = dev();
  const int n = dist::world_size();
  const int64_t id = dist::world().id();
  NothingSent check(d);
  Tensor x = zeros({2 * n + 2, 3}, kFloat32, d);
  std::string want = fmt::format("group_size is {} but {} has {} ranks", n + 1, world_at(), n);
  expect_error<ValueError>([&] { ops::op_all_gather_into_tensor(x, n + 1, id); },
                           "[all_gather_into_tensor] " + want);
  expect_error<ValueError>([&] { ops::op_reduce_scatter_tensor(x, 0, n + 1, id); },
                           "[reduce_scatter_tensor] " + want);
  expect_error<ValueError>(
      [&] {
        ops::op_all_gather_into_tensor_out(empty({(2 * n + 2) * (n + 1), 3}, kFloat32, d), x, n + 1,
                                           id);
      },
      "[all_gather_into_tensor] " + want);
}

TEST_P(CollectiveErrors, ReduceScatterOfAnIndivisibleSize) {
  const Device d = dev();
  const int n = dist::world_size();
  NothingSent check(d);
  expect_error<ValueError>([&] { dist::reduce_scatter_tensor(zeros({}, kFloat32, d)); },
                           "[reduce_scatter_tensor] self must have at least one dimension");
  if (n > 1)
    expect_error<ValueError>(
        [&] {
          dist::reduce_scatter_tensor(zeros({2 * n + 1, 3}, kFloat32, d));
        },
        "[reduce_scatter_tensor] dim 0 of self",
        {fmt::format("[{}, 3]", 2 * n + 1), fmt::format("not divisible by the group's {} ranks", n),
         world_at()});
}

TEST_P(CollectiveErrors, AvgOnAnIntegerDtypeAndUnknownReductions) {
  const Device d = dev();
  const int64_t id = dist::world().id();
  NothingSent check(d);
  for (DType t : {kBool, kUInt8, kInt32, kInt64}) {
    Tensor x = zeros({4 * dist::world_size()}, t, d);
    std::string want = fmt::format("avg needs a floating dtype, got {}", name(t));
    expect_error<TypeError>([&] { dist::all_reduce(x, ReduceOp::Avg); }, "[all_reduce] " + want);
    expect_error<TypeError>([&] { dist::all_reduce_(x, ReduceOp::Avg); }, "[all_reduce_] " + want);
    expect_error<TypeError>([&] { dist::reduce_scatter_tensor(x, ReduceOp::Avg); },
                            "[reduce_scatter_tensor] " + want);
  }
  Tensor f = zeros({4}, kFloat32, d);
  expect_error<ValueError>([&] { ops::op_all_reduce(f, 5, id); },
                           "[all_reduce] reduce_op 5 is not a ReduceOp");
  expect_error<ValueError>([&] { ops::op_all_reduce_(f, -1, id); },
                           "[all_reduce_] reduce_op -1 is not a ReduceOp");
}

TEST_P(CollectiveErrors, OverlappingInAndOut) {
  const Device d = dev();
  const int n = dist::world_size();
  NothingSent check(d);
  Tensor buf = zeros({4 * n}, kFloat32, d);
  expect_error<ValueError>([&] { dist::all_gather_into_tensor_out(buf, narrow(buf, 0, 0, 4)); },
                           "[all_gather_into_tensor] out overlaps self", {world_at()});
  Tensor rs = zeros({2 * n}, kFloat32, d);
  expect_error<ValueError>(
      [&] { dist::reduce_scatter_tensor_out(narrow(rs, 0, 2 * n - 2, 2), rs); },
      "[reduce_scatter_tensor] out overlaps self");
  Tensor a2a = zeros({2 * n, 3}, kFloat32, d);
  expect_error<ValueError>(
      [&] {
        ops::op_all_to_all_single_out(a2a, a2a, IntArrayRef(), IntArrayRef(), dist::world().id());
      },
      "[all_to_all_single] out overlaps self");
}

TEST_P(CollectiveErrors, AGroupThatDoesNotExist) {
  const Device d = dev();
  NothingSent check(d);
  Tensor x = zeros({4}, kFloat32, d);
  std::string want = fmt::format("group 12345 does not exist on rank {}", dist::rank());
  expect_error<ValueError>([&] { ops::op_all_reduce(x, 0, 12345); }, "[all_reduce] " + want);
  expect_error<ValueError>([&] { ops::op_broadcast_(x, 0, -2); }, "[broadcast_] group -2");
  expect_error<ValueError>([&] { ops::op_barrier(d, 999); }, "[barrier] group 999");
}

TEST_P(CollectiveErrors, SplitSizesThatDoNotSumToDimZero) {
  const Device d = dev();
  const int n = dist::world_size();
  NothingSent check(d);
  Tensor x = zeros({2 * n, 3}, kFloat32, d);
  std::vector<int64_t> short_by_one(n, 2), ok(n, 2), too_few(n + 1, 1), negative(n, 2);
  short_by_one[0] = 1;
  negative[0] = -1;
  if (n > 1) negative[1] += 3;  // the sum is right, one entry is not
  expect_error<ValueError>(
      [&] { dist::all_to_all_single(x, ok, short_by_one); },
      "[all_to_all_single] input_split_sizes",
      {fmt::format("sum to {} but dim 0 of self is {}", 2 * n - 1, 2 * n), world_at()});
  expect_error<ValueError>([&] { dist::all_to_all_single(x, ok, too_few); }, "[all_to_all_single]",
                           {"input_split_sizes"});
  expect_error<ValueError>([&] { dist::all_to_all_single(x, too_few, ok); }, "[all_to_all_single]",
                           {"output_split_sizes"});
  expect_error<ValueError>([&] { dist::all_to_all_single(x, ok, negative); },
                           "[all_to_all_single] input_split_sizes", {"negative"});
  expect_error<ValueError>(
      [&] {
        ops::op_all_to_all_single_out(empty({2 * n + 1, 3}, kFloat32, d), x, ok, ok,
                                      dist::world().id());
      },
      "[all_to_all_single]");
  if (n > 1)
    expect_error<ValueError>([&] { dist::all_to_all_single(zeros({2 * n + 1}, kFloat32, d)); },
                             "[all_to_all_single]", {"not divisible"});
}

TEST(CollectiveTimeouts, TimeoutGuardNeedsAPositiveTimeout) {
  EXPECT_THROW_PREFIX(dist::TimeoutGuard(std::chrono::milliseconds(0)), ValueError,
                      "[TimeoutGuard] the timeout must be positive, got 0 ms");
  {
    dist::TimeoutGuard guard(std::chrono::milliseconds(1234));
    EXPECT_EQ(dist::timeout_for(dist::world()).count(), 1234);
  }
  EXPECT_EQ(dist::timeout_for(dist::world()).count(), dist::world().timeout().count());
}

// ---------------------------------------------------------------- meta tensors

TEST(CollectiveMeta, FunctionalFormsGiveShapesWithoutCommunicating) {
  const int n = dist::world_size();
  const Device meta(kMeta);
  const double mark = calls_mark();
  Tensor x = empty({2 * n, 3}, kFloat32, meta);
  auto sizes = [](const Tensor& t) {
    EXPECT_TRUE(t.device().is_meta());
    return kiln_test::vec(t.sizes());
  };
  using V = std::vector<int64_t>;
  for (ReduceOp op : all_reduce_ops()) {
    EXPECT_EQ(sizes(dist::all_reduce(x, op)), (V{2 * n, 3}));
    EXPECT_EQ(sizes(dist::reduce_scatter_tensor(x, op)), (V{2, 3}));
  }
  EXPECT_EQ(sizes(dist::all_gather_into_tensor(x)), (V{2 * n * n, 3}));
  EXPECT_EQ(sizes(dist::all_gather_into_tensor(empty({}, kInt64, meta))), (V{n}));
  EXPECT_EQ(sizes(dist::broadcast(x, 0)), (V{2 * n, 3}));
  EXPECT_EQ(sizes(dist::all_to_all_single(x)), (V{2 * n, 3}));
  std::vector<int64_t> in(n, 2), out(n, 5);
  EXPECT_EQ(sizes(dist::all_to_all_single(x, out, in)), (V{5 * n, 3}));
  EXPECT_EQ(dist::all_gather_into_tensor(empty({2}, kBFloat16, meta)).dtype(), kBFloat16);
  // In-place and out= forms check and write nothing.
  dist::all_reduce_(x);
  dist::broadcast_(x, 0);
  dist::all_gather_into_tensor_out(empty({2 * n * n, 3}, kFloat32, meta), x);
  dist::reduce_scatter_tensor_out(empty({2, 3}, kFloat32, meta), x);
  // Shape errors are found on meta tensors too.
  EXPECT_THROW_PREFIX(dist::all_reduce(empty({2}, kInt32, meta), ReduceOp::Avg), TypeError,
                      "[all_reduce] avg needs a floating dtype, got int32");
  EXPECT_THROW_PREFIX(
      ops::op_reduce_scatter_tensor(empty({2 * n + 1}, kFloat32, meta), 0, 2 * n + 2, 0),
      ValueError, "[reduce_scatter_tensor] dim 0 of self");
  EXPECT_THROW_PREFIX(dist::all_to_all_single(x, out, std::vector<int64_t>(n, 1)), ValueError,
                      "[all_to_all_single] input_split_sizes");
  for (const auto& e : dist::FlightRecorder::get().entries())
    EXPECT_FALSE(e.started_s > mark) << "meta tensors communicated: " << e.op;
}

}  // namespace
}  // namespace kiln::test
