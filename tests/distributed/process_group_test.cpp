// ProcessGroup's set-up (kiln/distributed/process_group.h): a backend factory that fails is
// remembered and its error raised again, never retried behind the caller's back; a backend is
// never set up while its device's stream is capturing; a group's timeout reaches its
// communicators' set-up. Device types of the test's own (a fake interface whose `capturing`
// the test sets) keep the real backends of cpu and sim out of it. Runs as a world of one and
// on 2, 3 and 4 ranks.
#include <gtest/gtest.h>

#include <thread>

#include "kiln/distributed/collective_backend.h"
#include "kiln/distributed/mpi_comm.h"
#include "tests/distributed/dist_test_util.h"

namespace kiln::test {
namespace {

using kiln_test::message_of;

// A device with nothing behind it but a capture flag.
class FakeInterface final : public DeviceInterface {
 public:
  Allocator* allocator(int) override { return nullptr; }
  int device_count() const override { return 1; }
  void copy_bytes(void*, bool, const void*, bool, size_t, int) override {}
  void synchronize(int) override {}
  bool capturing(int) override { return capture; }
  bool capture = false;
};

class FakeBackend final : public dist::CollectiveBackend {
 public:
  std::string_view name() const override { return "fake"; }
  void all_reduce(const Tensor&, const Tensor&, const dist::Collective&) override {}
  void all_gather(const Tensor&, const Tensor&, const dist::Collective&) override {}
  void reduce_scatter(const Tensor&, const Tensor&, const dist::Collective&) override {}
  void broadcast(const Tensor&, const dist::Collective&) override {}
  void all_to_all(const Tensor&, const Tensor&, const dist::Collective&) override {}
  void send(const Tensor&, const dist::Collective&) override {}
  void recv(const Tensor&, const dist::Collective&) override {}
  void barrier(Device, const dist::Collective&) override {}
};

// Counts its calls; fails while `fail` is set. Never collective, so ranks may differ in how
// many groups they hold.
struct Factory {
  int calls = 0;
  bool fail = true;
  dist::BackendFactory make() {
    return [this](dist::ProcessGroup&) -> std::unique_ptr<dist::CollectiveBackend> {
      ++calls;
      if (fail) throw DistributedError("[test] the fabric is down");
      return std::make_unique<FakeBackend>();
    };
  }
};

TEST(ProcessGroupSetup, AFailedSetUpIsRememberedAndNotRetried) {
  static FakeInterface iface;
  static Factory factory;
  register_device_type("kiln_test_fabric", DispatchKey::PrivateUse3, &iface, false);
  const Device dev("kiln_test_fabric");
  // Every existing group tries, fails and keeps the error; registering does not raise.
  dist::register_collective_backend("kiln_test_fabric", factory.make());
  const int tried = factory.calls;
  EXPECT_GE(tried, 1);
  dist::ProcessGroup& w = dist::world();
  for (int i = 0; i < 2; ++i) {
    std::string msg = message_of<DistributedError>([&] { w.backend(dev, "all_reduce"); });
    const std::string head = fmt::format(
        "[all_reduce] group world (rank {} of {}) has no collective backend for "
        "kiln_test_fabric:0 tensors: its set-up failed and is not retried",
        w.rank(), w.size());
    EXPECT_EQ(msg.rfind(head, 0), 0u) << msg;
    EXPECT_NE(msg.find("[test] the fabric is down"), std::string::npos) << msg;
  }
  EXPECT_EQ(factory.calls, tried);
  // A group made now runs the factory at once, and its failure is the caller's.
  std::vector<int> everyone(w.size());
  for (int r = 0; r < w.size(); ++r) everyone[r] = r;
  EXPECT_THROW_CONTAINS(dist::new_group(everyone), DistributedError, "the fabric is down");
  EXPECT_EQ(factory.calls, tried + 1);
  // Registering again is the retry.
  factory.fail = false;
  dist::register_collective_backend("kiln_test_fabric", factory.make());
  EXPECT_EQ(w.backend(dev, "all_reduce").name(), "fake");
}

TEST(ProcessGroupSetup, NoSetUpWhileTheDeviceIsCapturing) {
  static FakeInterface iface;
  static Factory factory;
  factory.fail = false;
  // Registered before its device type exists: every group sets it up at first use.
  dist::register_collective_backend("kiln_test_capturing", factory.make());
  register_device_type("kiln_test_capturing", DispatchKey::PrivateUse2, &iface, false);
  const Device dev("kiln_test_capturing");
  dist::ProcessGroup& w = dist::world();
  iface.capture = true;
  EXPECT_THROW_CONTAINS(w.backend(dev, "all_reduce"), DistributedError,
                        "would set up its collective backend for kiln_test_capturing:0 tensors "
                        "while kiln_test_capturing:0's stream is capturing");
  EXPECT_EQ(factory.calls, 0);
  iface.capture = false;
  EXPECT_EQ(w.backend(dev, "all_reduce").name(), "fake");
  EXPECT_EQ(factory.calls, 1);
  EXPECT_EQ(&w.backend(dev, "all_reduce"), &w.backend(dev, "broadcast"));  // made once
  EXPECT_EQ(factory.calls, 1);
}

TEST(ProcessGroupSetup, TheGroupTimeoutIsTheSetUpDeadline) {
  dist::ProcessGroup& w = dist::world();
  const auto before = w.timeout();
  EXPECT_EQ(w.base_comm()->setup_timeout(), before);
  dist::MpiComm* mine = w.comm(dist::stream_key(Device(kCPU)));
  w.set_timeout(std::chrono::milliseconds(12'345));
  EXPECT_EQ(w.timeout().count(), 12'345);
  EXPECT_EQ(w.base_comm()->setup_timeout().count(), 12'345);
  EXPECT_EQ(mine->setup_timeout().count(), 12'345);
  // A communicator made later (another thread's first collective) inherits it.
  dist::MpiComm* other = nullptr;
  std::thread([&] { other = w.comm(dist::stream_key(Device(kCPU))); }).join();
  ASSERT_NE(other, mine);
  EXPECT_EQ(other->setup_timeout().count(), 12'345);
  EXPECT_THROW_PREFIX(w.set_timeout(std::chrono::milliseconds(0)), ValueError,
                      "[ProcessGroup] group world's timeout must be positive, got 0 ms");
  w.set_timeout(before);
  EXPECT_EQ(other->setup_timeout(), before);
}

}  // namespace
}  // namespace kiln::test
