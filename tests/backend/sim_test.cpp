// The sim accelerator (kiln/backend/sim): its memory, streams, events and graphs behave like a
// GPU's, and ops on it give the CPU's results (the whole op table runs on sim in kiln_op_test).
#include <gtest/gtest.h>

#include "kiln/core/stream.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "kiln/optim/optimizer.h"
#include "tests/backend/sim_util.h"
#include "tests/core/test_util.h"

namespace kiln::test {
namespace {

using kiln_test::contains;
using kiln_test::message_of;

Tensor host(const Tensor& t) { return t.to(Device(kCPU)); }
std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

TEST(SimDevice, RegistersAsAPluginBackend) {
  Device d = sim();
  EXPECT_EQ(d.str(), "sim:0");
  EXPECT_EQ(Device("sim:1").index(), 1);
  EXPECT_GE(d.dispatch_key(), DispatchKey::PrivateUse1);
  EXPECT_LE(d.dispatch_key(), DispatchKey::PrivateUse3);
  DeviceCaps caps = sim_interface().caps();
  EXPECT_FALSE(caps.host_memory);
  EXPECT_TRUE(caps.async);
  EXPECT_TRUE(caps.graphs);
  EXPECT_EQ(sim_interface().device_count(), 2);
  EXPECT_THROW_CONTAINS(empty({2}, kFloat32, Device("sim:5")), DeviceError, "out of range");
}

TEST(SimDevice, MemoryIsReadOnlyThroughCopies) {
  Tensor c = arange(0, 6, 1, kFloat32).view({2, 3});
  Tensor s = c.to(sim());
  EXPECT_EQ(s.device(), sim());
  EXPECT_THROW_CONTAINS(s.data_ptr(), DeviceError, "copy it to cpu first");
  EXPECT_EQ(values(s), values(c));                   // to_vector copies
  EXPECT_EQ(sum(s).item<float>(), 15.0f);            // item copies
  EXPECT_TRUE(contains(s.str(), "[[0., 1., 2.],"));  // printing copies
  EXPECT_TRUE(contains(s.str(), "device='sim:0'")) << s.str();
  Tensor back = host(s);
  EXPECT_TRUE(back.device().is_cpu());
  EXPECT_EQ(values(back), values(c));
}

TEST(SimDevice, OpsMatchTheCpu) {
  manual_seed(3);
  Tensor a = randn({4, 5}), b = randn({5, 3}), v = randn({5});
  Device d = sim();
  Tensor sa = a.to(d), sb = b.to(d), sv = v.to(d);
  EXPECT_EQ(values(matmul(sa, sb)), values(matmul(a, b)));
  EXPECT_EQ(values(add(sa, sv)), values(add(a, v)));
  EXPECT_EQ(values(softmax(sa, 1)), values(softmax(a, 1)));
  EXPECT_EQ(values(sum(sa, {0})), values(sum(a, {0})));
  EXPECT_EQ(values(transpose(sa, 0, 1).contiguous()), values(transpose(a, 0, 1).contiguous()));
  auto [mv, mi] = max(sa, 1);
  auto [cv, ci] = max(a, 1);
  EXPECT_EQ(values(mv), values(cv));
  EXPECT_EQ(mi.to_vector<int64_t>(), ci.to_vector<int64_t>());
  // In place and out=: the same tensor comes back, written on the device.
  Tensor t = sa.clone();
  Tensor& r = add_(t, sv);
  EXPECT_TRUE(r.is_same(t));
  EXPECT_EQ(values(t), values(add(a, v)));
  Tensor out = empty({4, 3}, kFloat32, d);
  mm_out(out, sa, sb);
  EXPECT_EQ(values(out), values(matmul(a, b)));
  // A 0-d cpu tensor goes along with sim tensors, as on CUDA.
  EXPECT_EQ(values(mul(sa, scalar_tensor(2.0, kFloat32))), values(mul(a, 2.0)));
}

TEST(SimDevice, DeviceMismatchIsAnError) {
  Tensor s = ones({3}, kFloat32, sim()), c = ones({3});
  EXPECT_THROW_CONTAINS(add(s, c), DeviceError,
                        "[add] expected all tensors to be on the same device, but found");
  Tensor s1 = ones({3}, kFloat32, sim(1));
  EXPECT_THROW_CONTAINS(add(s, s1), DeviceError, "sim:0 and sim:1");
  // Copies cross devices.
  s1.copy_(mul(s, 3.0));
  EXPECT_EQ(values(s1), (std::vector<float>{3, 3, 3}));
  EXPECT_EQ(values(s.to(sim(1))), (std::vector<float>{1, 1, 1}));
}

TEST(SimDevice, BadArgumentsRaiseOnTheHostBeforeAnythingRuns) {
  Tensor a = ones({2, 3}, kFloat32, sim()), b = ones({4, 5}, kFloat32, sim());
  EXPECT_THROW_CONTAINS(matmul(a, b), ValueError, "size mismatch: a is [2, 3], b is [4, 5]");
  Tensor keep = a.clone();
  EXPECT_THROW(add_(a, b), ValueError);
  EXPECT_EQ(values(a), values(keep));
  EXPECT_THROW_CONTAINS(a.view({7}), ValueError, "[view]");
}

TEST(SimDevice, RandomNumbersFollowTheSeedInOrder) {
  manual_seed(11);
  Tensor a = randn({64}, nullptr, kFloat32, sim());
  Tensor a2 = rand({8}, nullptr, kFloat32, sim());
  manual_seed(11);  // waits for the draws queued above
  Tensor b = randn({64}, nullptr, kFloat32, sim());
  Tensor b2 = rand({8}, nullptr, kFloat32, sim());
  EXPECT_EQ(values(a), values(b));
  EXPECT_EQ(values(a2), values(b2));
  // sim has a generator of its own, as each CUDA device does: draws on the cpu (made on the
  // host at once) do not move it, whatever the sim draws still queued.
  manual_seed(11);
  Tensor c = randn({64});  // the Philox layout does not depend on the device
  Tensor s = randn({64}, nullptr, kFloat32, sim());
  Tensor c2 = rand({8});
  EXPECT_EQ(values(s), values(c));
  EXPECT_EQ(values(a), values(c));
  Tensor next = rand({8}, nullptr, kFloat32, sim());  // where a2 was drawn: the same numbers
  EXPECT_EQ(values(a2), values(next));
  EXPECT_EQ(values(c2), values(next));  // each generator made the same draws in its own order
  EXPECT_NE(values(next), values(rand({8}, nullptr, kFloat32, sim())));  // then fresh ones
}

TEST(SimDevice, FreesWaitForTheStreamThatOwnsTheBlock) {
  // a's size class is its own (256 KiB; b and its temporaries are 512 KiB), so a block of
  // that class freed too early is the one z would get.
  Device d = sim();
  const int64_t n = 65536;
  Tensor x = full({n}, 1.0f, kFloat32, d);
  Event ready(d), done(d);
  ready.record();
  Tensor a, b;
  Stream side = Stream::create(d);
  ready.wait(side);
  {
    StreamGuard guard(side);
    a = mul(x, 1.0);  // allocated while the side stream is current: its block is the side's
    b = zeros({2, n}, kFloat32, d);
    for (int i = 0; i < 100; ++i) b = add(b, a);  // queued: reads a for a while
    done.record();
  }
  a = Tensor();                             // freed while the default stream is current
  Stream::default_stream(d).synchronize();  // a free queued there would have run by now
  Tensor z = full({n}, 7.0f, kFloat32, d);  // must not get a's block before the adds ran
  done.wait(Stream::default_stream(d));
  EXPECT_EQ(values(b), std::vector<float>(2 * n, 100.0f));
  EXPECT_EQ(values(z), std::vector<float>(n, 7.0f));
}

// kiln::memory_stats counts live blocks by size class, their peak since reset_peak_memory, and
// what is cached beside them, as a GPU's caching allocator reports them. A device of its own,
// so that no other test's tensors come and go meanwhile.
TEST(SimDevice, MemoryStatsCountLiveBlocksAndTheirPeak) {
  Device d = sim(1);
  synchronize(d);
  const DeviceMemoryStats before = memory_stats(d);
  reset_peak_memory(d);
  EXPECT_EQ(memory_stats(d).peak_allocated, before.allocated);
  constexpr size_t kMiB = size_t{1} << 20;
  {
    Tensor a = empty({1 << 18}, kFloat32, d);  // 1 MiB each, a size class of its own
    Tensor b = full({1 << 18}, 2.0f, kFloat32, d);
    const DeviceMemoryStats two = memory_stats(d);
    EXPECT_EQ(two.allocated, before.allocated + 2 * kMiB);
    EXPECT_EQ(two.peak_allocated, two.allocated);
    EXPECT_GE(two.reserved, two.allocated);
  }
  synchronize(d);  // the frees are ordered on the stream; then the blocks are cached
  const DeviceMemoryStats after = memory_stats(d);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.peak_allocated, before.allocated + 2 * kMiB);
  EXPECT_GE(after.reserved, after.allocated + 2 * kMiB);
  reset_peak_memory(d);
  EXPECT_EQ(memory_stats(d).peak_allocated, after.allocated);
  EXPECT_THROW_PREFIX(memory_stats(Device(kCPU)), DeviceError,
                      "[memory_stats] cpu keeps no count of its memory");
  EXPECT_THROW_PREFIX(reset_peak_memory(Device(kMeta)), DeviceError,
                      "[reset_peak_memory] meta keeps no count of its memory");
}

TEST(SimDevice, DrawsFromACallersGeneratorRunInOrder) {
  // The generator dies when the op returns; the draw must already have used it.
  auto draw = [](Device d) {
    Generator g(77);
    return randn({256}, &g, kFloat32, d);
  };
  EXPECT_EQ(values(draw(sim())), values(draw(Device(kCPU))));
  // In a capture such a draw is an error (a replay would read a generator that may be gone).
  DeviceInterface& di = sim_interface();
  uint64_t s = di.create_stream(0), pool = di.create_pool(0);
  di.set_current_stream(0, s);
  di.begin_capture(0, s, pool);
  Generator g(1);
  EXPECT_THROW_CONTAINS(randn({4}, &g, kFloat32, sim()), DeviceError,
                        "a generator of the caller's");
  EXPECT_THROW(di.end_capture(0, s), DeviceError);
  di.set_current_stream(0, 0);
  di.destroy_stream(0, s);
  di.release_pool(0, pool);
}

TEST(SimDevice, AutogradAndAnOptimizerStepMatchTheCpu) {
  auto make = [] {
    Generator g(5);
    return std::make_shared<nn::Linear>(6, 4, true, nn::Init{.gen = &g});
  };
  auto cpu_m = make(), sim_m = make();
  sim_m->to(sim());
  optim::AdamW cpu_o(cpu_m->parameters(), {.lr = 0.1}), sim_o(sim_m->parameters(), {.lr = 0.1});
  Generator g(9);
  for (int s = 0; s < 3; ++s) {
    Tensor x = randn({5, 6}, &g), y = randint(0, 4, {5}, &g);
    cpu_o.zero_grad();
    sim_o.zero_grad();
    Tensor lc = cross_entropy(cpu_m->forward(x), y);
    Tensor ls = cross_entropy(sim_m->forward(x.to(sim())), y.to(sim()));
    lc.backward();
    ls.backward();
    cpu_o.step();
    sim_o.step();
    EXPECT_EQ(ls.item<float>(), lc.item<float>()) << "step " << s;
  }
  auto pc = cpu_m->parameters(), ps = sim_m->parameters();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_EQ(ps[i].device(), sim());
    EXPECT_EQ(values(ps[i]), values(pc[i]));
  }
}

// ---------------------------------------------------------------- streams and events

TEST(SimStreams, WorkOnASideStreamIsOrderedByEvents) {
  DeviceInterface& di = sim_interface();
  Device d = sim();
  Tensor x = arange(0, 1000, 1, kFloat32).to(d);
  uint64_t side = di.create_stream(0);
  uint64_t done = di.create_event(0);
  EXPECT_EQ(di.current_stream(0), 0u);
  di.set_current_stream(0, side);
  Tensor y = x;
  for (int i = 0; i < 50; ++i) y = add(y, 1.0);  // queued on the side stream
  di.record_event(0, done, side);
  di.set_current_stream(0, 0);
  di.stream_wait_event(0, 0, done);  // the default stream waits for the side stream
  Tensor z = mul(y, 2.0);
  di.synchronize_event(0, done);
  EXPECT_TRUE(di.query_event(0, done));
  std::vector<float> got = values(z);
  EXPECT_EQ(got[0], 100.0f);
  EXPECT_EQ(got[999], 2.0f * 1049.0f);
  di.destroy_event(0, done);
  // An event destroyed with work that uses it still queued: the work keeps it.
  uint64_t e = di.create_event(0);
  for (int i = 0; i < 20; ++i) y = add(y, 1.0);
  di.record_event(0, e, 0);
  di.stream_wait_event(0, side, e);
  di.destroy_event(0, e);
  synchronize(sim());
  EXPECT_THROW_CONTAINS(di.query_event(0, e), DeviceError, "no event");
  di.destroy_stream(0, side);
  EXPECT_THROW_CONTAINS(di.set_current_stream(0, side), DeviceError, "has no stream");
  EXPECT_THROW_CONTAINS(di.destroy_stream(0, 0), DeviceError, "default stream");
}

TEST(SimStreams, StreamAndEventHandles) {
  Device d = sim();
  Tensor x = full({256}, 1.0f, kFloat32, d);  // queued on the default stream
  Tensor y;
  Event done(d), ready(d);
  ready.record();  // the side stream must wait for x, as on CUDA
  {
    Stream side = Stream::create(d);
    ready.wait(side);
    StreamGuard guard(side);
    EXPECT_EQ(Stream::current(d), side);
    y = x;
    for (int i = 0; i < 30; ++i) y = add(y, 1.0);
    done.record();
    done.wait(Stream::default_stream(d));
  }  // the guard restores the default stream; the side stream finishes and goes
  EXPECT_EQ(Stream::current(d), Stream::default_stream(d));
  Tensor z = mul(y, 2.0);  // on the default stream, after the event
  Stream::default_stream(d).synchronize();
  EXPECT_TRUE(done.query());
  EXPECT_EQ(values(z), std::vector<float>(256, 62.0f));
  EXPECT_THROW_CONTAINS(done.record(Stream::default_stream(sim(1))), DeviceError,
                        "[Event::record] the event is on sim:0, the stream on sim:1");
  // The CPU is a synchronous device: the same calls work and everything has happened.
  Stream cs = Stream::create(Device(kCPU));
  Event ce{Device(kCPU)};
  ce.record(cs);
  ce.synchronize();
  EXPECT_TRUE(ce.query());
}

TEST(SimStreams, TheCurrentStreamIsPerThread) {
  DeviceInterface& di = sim_interface();
  uint64_t side = di.create_stream(0);
  di.set_current_stream(0, side);
  uint64_t other = 99;
  std::thread([&] { other = di.current_stream(0); }).join();
  EXPECT_EQ(other, 0u);
  EXPECT_EQ(di.current_stream(0), side);
  di.set_current_stream(0, 0);
  di.destroy_stream(0, side);
}

// ---------------------------------------------------------------- graphs

struct Captured {
  uint64_t stream, pool, graph;
};
// Captures `body` on a fresh side stream, in a fresh pool.
template <class F>
Captured capture(F&& body) {
  DeviceInterface& di = sim_interface();
  Captured c{di.create_stream(0), di.create_pool(0), 0};
  di.set_current_stream(0, c.stream);
  di.begin_capture(0, c.stream, c.pool);
  try {
    body();
  } catch (...) {
    try {
      di.end_capture(0, c.stream);
    } catch (...) {
    }
    di.set_current_stream(0, 0);
    throw;
  }
  c.graph = di.end_capture(0, c.stream);
  di.set_current_stream(0, 0);
  return c;
}

TEST(SimGraphs, CaptureRecordsReplayRuns) {
  DeviceInterface& di = sim_interface();
  Tensor x = arange(0, 4, 1, kFloat32).to(sim());
  Tensor y = zeros({4}, kFloat32, sim());
  Tensor t = zeros({4}, kFloat32, sim());
  synchronize(sim());
  Captured c = capture([&] {
    mul_out(t, x, x);
    add_out(y, t, x);
  });
  EXPECT_EQ(di.graph_nodes(0, c.graph), 2);
  EXPECT_EQ(values(y), (std::vector<float>{0, 0, 0, 0}));  // recorded, not run
  uint64_t exec = di.instantiate(0, c.graph);
  di.launch(0, exec, 0);
  EXPECT_EQ(values(y), (std::vector<float>{0, 2, 6, 12}));
  x.copy_(full({4}, 3.0f).to(sim()));  // new values at the same address
  di.launch(0, exec, 0);
  EXPECT_EQ(values(y), (std::vector<float>{12, 12, 12, 12}));
  di.destroy_exec(0, exec);
  di.destroy_graph(0, c.graph);
  di.release_pool(0, c.pool);
  di.destroy_stream(0, c.stream);
}

TEST(SimGraphs, LaunchesOfOneGraphOnTwoStreamsRunInOrder) {
  DeviceInterface& di = sim_interface();
  Tensor y = zeros({1024}, kFloat32, sim());
  synchronize(sim());
  Captured c = capture([&] { add_(y, 1.0); });
  uint64_t exec = di.instantiate(0, c.graph);
  uint64_t a = di.create_stream(0), b = di.create_stream(0);
  for (int i = 0; i < 30; ++i) di.launch(0, exec, i % 3 == 0 ? a : b);  // in place, on y
  synchronize(sim());
  EXPECT_EQ(values(y), std::vector<float>(1024, 30.0f));
  // A launch on b waits for the launch before it on a, which waits behind a's other work.
  Tensor w = ones({512, 512}, kFloat32, sim());
  uint64_t behind = di.create_event(0);
  di.set_current_stream(0, a);
  for (int i = 0; i < 3; ++i) w = mm(w, w);  // tens of milliseconds of work on a
  di.set_current_stream(0, 0);
  di.record_event(0, behind, a);
  di.launch(0, exec, a);
  di.launch(0, exec, b);
  di.synchronize_stream(0, b);
  EXPECT_TRUE(di.query_event(0, behind)) << "the launch on b did not wait for the one on a";
  di.destroy_event(0, behind);
  di.destroy_exec(0, exec);
  di.destroy_graph(0, c.graph);
  di.release_pool(0, c.pool);
  for (uint64_t s : {a, b, c.stream}) di.destroy_stream(0, s);
}

TEST(SimGraphs, UpdateAcceptsNewAddressesNotNewKernels) {
  DeviceInterface& di = sim_interface();
  Tensor a = ones({3}, kFloat32, sim()), b = full({3}, 5.0f, kFloat32, sim());
  Tensor out = zeros({3}, kFloat32, sim());
  Captured c1 = capture([&] { add_out(out, a, a); });
  Captured c2 = capture([&] { add_out(out, b, b); });
  Captured c3 = capture([&] { mul_out(out, b, b); });
  uint64_t exec = di.instantiate(0, c1.graph);
  EXPECT_TRUE(di.update(0, exec, c2.graph));
  di.launch(0, exec, 0);
  EXPECT_EQ(values(out), (std::vector<float>{10, 10, 10}));
  EXPECT_FALSE(di.update(0, exec, c3.graph));  // another kernel: refused, exec unchanged
  di.launch(0, exec, 0);
  EXPECT_EQ(values(out), (std::vector<float>{10, 10, 10}));
  for (const Captured& c : {c1, c2, c3}) {
    di.destroy_graph(0, c.graph);
    di.release_pool(0, c.pool);
    di.destroy_stream(0, c.stream);
  }
  di.destroy_exec(0, exec);
}

TEST(SimGraphs, CaptureErrorsLikeCuda) {
  DeviceInterface& di = sim_interface();
  Tensor x = ones({4}, kFloat32, sim());
  // The default stream cannot be captured.
  EXPECT_THROW_CONTAINS(di.begin_capture(0, 0, 0), DeviceError,
                        "cannot capture the default stream");
  // Synchronising, copying to the host and reading invalidate the capture.
  EXPECT_THROW_CONTAINS(capture([&] { synchronize(sim()); }), DeviceError,
                        "cudaErrorStreamCaptureUnsupported");
  EXPECT_THROW_CONTAINS(capture([&] { (void)x.to(Device(kCPU)); }), DeviceError,
                        "a copy between host and device is not permitted");
  EXPECT_THROW_CONTAINS(capture([&] { (void)sum(x).item(); }), DeviceError, "is capturing");
  // An error inside the body makes end_capture report the invalidation.
  DeviceInterface& d = di;
  uint64_t s = d.create_stream(0);
  d.set_current_stream(0, s);
  d.begin_capture(0, s, d.create_pool(0));
  EXPECT_THROW(synchronize(sim()), DeviceError);
  EXPECT_THROW_CONTAINS(d.end_capture(0, s), DeviceError, "cudaErrorStreamCaptureInvalidated");
  d.set_current_stream(0, 0);
  // Allocating without a pool.
  uint64_t s2 = d.create_stream(0);
  d.set_current_stream(0, s2);
  d.begin_capture(0, s2, 0);
  EXPECT_THROW_CONTAINS((void)mul(x, 2.0), DeviceError, "outside a graph memory pool");
  EXPECT_THROW(d.end_capture(0, s2), DeviceError);
  d.set_current_stream(0, 0);
  // Work on the default stream while capturing.
  uint64_t s3 = d.create_stream(0);
  d.begin_capture(0, s3, 0);
  EXPECT_THROW_CONTAINS(add_(x, 1.0), DeviceError, "cudaErrorStreamCaptureImplicit");
  EXPECT_THROW(d.end_capture(0, s3), DeviceError);
  EXPECT_THROW_CONTAINS(d.end_capture(0, s3), DeviceError, "not being captured");
  for (uint64_t st : {s, s2, s3}) d.destroy_stream(0, st);
  // Nothing ran: x is as it was, and the device works.
  EXPECT_EQ(values(x), (std::vector<float>{1, 1, 1, 1}));
}

// Note [Streams joining a capture] in kiln/backend/sim/sim_impl.h: a stream waiting for an
// event recorded in a capture joins it, its launches are recorded, and the capture must end with
// it joined back into the origin stream.
TEST(SimGraphs, AStreamForkedFromACaptureIsRecordedAndMustJoinIt) {
  DeviceInterface& di = sim_interface();
  Tensor x = arange(0, 4, 1, kFloat32).to(sim());
  Tensor a = zeros({4}, kFloat32, sim()), b = zeros({4}, kFloat32, sim());
  Tensor y = zeros({4}, kFloat32, sim());
  const uint64_t side = di.create_stream(0), fork = di.create_event(0), join = di.create_event(0);
  synchronize(sim());
  auto on = [&](uint64_t s) { di.set_current_stream(0, s); };
  Captured c = capture([&] {
    const uint64_t origin = di.current_stream(0);
    di.record_event(0, fork, origin);
    EXPECT_FALSE([&] {
      on(side);
      const bool before = di.capturing(0);
      on(origin);
      return before;
    }()) << "a stream that has not waited for a capture event is not capturing";
    di.stream_wait_event(0, side, fork);  // side joins the capture
    on(side);
    EXPECT_TRUE(di.capturing(0));
    mul_out(a, x, x);
    di.record_event(0, join, side);
    on(origin);
    add_out(b, x, x);
    di.stream_wait_event(0, origin, join);  // and joins back
    add_out(y, a, b);
  });
  EXPECT_EQ(di.graph_nodes(0, c.graph), 3);
  EXPECT_EQ(values(y), (std::vector<float>{0, 0, 0, 0}));  // recorded, not run
  const uint64_t exec = di.instantiate(0, c.graph);
  di.launch(0, exec, 0);
  EXPECT_EQ(values(y), (std::vector<float>{0, 3, 8, 15}));  // x*x + 2x
  di.destroy_exec(0, exec);
  di.destroy_graph(0, c.graph);
  di.release_pool(0, c.pool);
  di.destroy_stream(0, c.stream);

  // A stream that launched after its last joined event, or forked and never joined back.
  for (bool launches : {true, false}) {
    const uint64_t s = di.create_stream(0), pool = di.create_pool(0);
    on(s);
    di.begin_capture(0, s, pool);
    di.record_event(0, fork, s);
    di.stream_wait_event(0, side, fork);
    if (launches) {
      on(side);
      add_(a, 1.0);
      di.record_event(0, join, side);
      di.stream_wait_event(0, s, join);
      add_(a, 1.0);  // after the join
      on(s);
    }
    EXPECT_THROW_CONTAINS(di.end_capture(0, s), DeviceError, "cudaErrorStreamCaptureUnjoined");
    on(0);
    di.release_pool(0, pool);
    di.destroy_stream(0, s);
  }
  EXPECT_EQ(values(a), (std::vector<float>{0, 1, 4, 9})) << "a capture ran its launches";
  // A capturing stream may not wait for an event recorded outside the capture.
  di.record_event(0, fork, 0);
  EXPECT_THROW_CONTAINS(capture([&] { di.stream_wait_event(0, di.current_stream(0), fork); }),
                        DeviceError, "cudaErrorStreamCaptureIsolation");
  // Once the capture has ended, the side stream runs its work again.
  on(side);
  add_(a, 1.0);
  on(0);
  EXPECT_EQ(values(a), (std::vector<float>{1, 2, 5, 10}));
  di.destroy_event(0, fork);
  di.destroy_event(0, join);
  di.destroy_stream(0, side);
}

TEST(SimGraphs, AllocationsDuringCaptureComeFromThePool) {
  DeviceInterface& di = sim_interface();
  Tensor x = full({4}, 2.0f, kFloat32, sim());
  Tensor y;
  Captured c = capture([&] { y = add(mul(x, x), 1.0); });  // temporaries from the pool
  uint64_t exec = di.instantiate(0, c.graph);
  EXPECT_EQ(di.graph_nodes(0, c.graph), 2);
  di.launch(0, exec, 0);
  EXPECT_EQ(values(y), (std::vector<float>{5, 5, 5, 5}));
  x.fill_(3.0);
  di.launch(0, exec, 0);  // the temporary freed after the capture is still the graph's
  EXPECT_EQ(values(y), (std::vector<float>{10, 10, 10, 10}));
  di.destroy_exec(0, exec);
  di.destroy_graph(0, c.graph);
  y = Tensor();
  di.release_pool(0, c.pool);
  di.destroy_stream(0, c.stream);
}

}  // namespace
}  // namespace kiln::test
