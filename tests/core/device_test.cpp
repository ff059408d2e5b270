// Tests for kiln/core/device.h: parsing, canonical identity, aliases, the registry.
#include "kiln/core/device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/test_util.h"
#include "kiln/core/error.h"
#include "kiln/core/storage.h"

namespace kiln {
namespace {

// Restores the default device when a test ends, even if it fails.
struct DefaultDeviceGuard {
  Device saved = default_device();
  ~DefaultDeviceGuard() { set_default_device(saved); }
};

TEST(DeviceTest, ParsesBuiltinTypes) {
  Device cpu("cpu");
  EXPECT_EQ(cpu.type(), kCPU);
  EXPECT_EQ(cpu.index(), 0);
  EXPECT_TRUE(cpu.is_cpu());
  EXPECT_FALSE(cpu.is_meta());
  EXPECT_EQ(cpu.str(), "cpu");
  EXPECT_EQ(cpu.dispatch_key(), DispatchKey::CPU);

  Device cpu0("cpu:0");
  EXPECT_EQ(cpu0, cpu);
  EXPECT_EQ(cpu0.str(), "cpu");

  Device meta("meta");
  EXPECT_EQ(meta.type(), kMeta);
  EXPECT_EQ(meta.index(), 0);
  EXPECT_TRUE(meta.is_meta());
  EXPECT_EQ(meta.str(), "meta");
  EXPECT_EQ(meta.dispatch_key(), DispatchKey::Meta);

  Device cuda("cuda");
  EXPECT_EQ(cuda.type(), kCUDA);
  EXPECT_EQ(cuda.index(), 0);  // the type's default index
  EXPECT_EQ(cuda, Device("cuda:0"));
  EXPECT_EQ(cuda.str(), "cuda:0");
  EXPECT_EQ(cuda.dispatch_key(), DispatchKey::CUDA);

  Device cuda1("cuda:1");
  EXPECT_EQ(cuda1.type(), kCUDA);
  EXPECT_EQ(cuda1.index(), 1);
  EXPECT_EQ(cuda1.str(), "cuda:1");
  EXPECT_NE(cuda1, cuda);
  EXPECT_EQ(Device("cuda:32767").index(), 32767);
}

TEST(DeviceTest, RejectsBadStrings) {
  for (const char* bad :
       {"cuda:x", "cuda:-1", "nope", "cpu:1", "", "cuda:", "cuda:1x", "cuda:+1", "cuda: 1", " cpu",
        "CPU", "cuda:1:2", "cuda:32768", "cuda:99999999999", ":0", "meta:1"}) {
    EXPECT_THROW_PREFIX(Device{std::string_view(bad)}, DeviceError, "[device]")
        << "input: '" << bad << "'";
  }
  // Messages carry the offending string.
  EXPECT_THROW_CONTAINS(Device("nope"), DeviceError, "'nope'");
  EXPECT_THROW_CONTAINS(Device("cuda:x"), DeviceError, "'cuda:x'");
}

TEST(DeviceTest, RejectsBadTypeAndIndex) {
  EXPECT_THROW_PREFIX(Device(kCPU, 1), DeviceError, "[device]");
  EXPECT_THROW_PREFIX(Device(kMeta, 3), DeviceError, "[device]");
  EXPECT_THROW_PREFIX(Device(kCUDA, -2), DeviceError, "[device]");
  EXPECT_THROW_PREFIX(Device(kCUDA, 1 << 20), DeviceError, "[device]");
  EXPECT_THROW_PREFIX(Device(static_cast<DeviceType>(kMaxDeviceTypes - 1)), DeviceError,
                      "[device]");
}

TEST(DeviceTest, CanonicalIdentity) {
  Device a("cpu"), b(kCPU), c(kCPU, 0), d("cpu:0"), e(kCPU, -1), f;
  for (const Device& x : {b, c, d, e, f}) {
    EXPECT_EQ(x, a);
    EXPECT_EQ(std::hash<Device>()(x), std::hash<Device>()(a));
    EXPECT_EQ(x.str(), "cpu");
    EXPECT_EQ(x.type(), kCPU);
    EXPECT_EQ(x.index(), 0);
  }
  std::unordered_set<Device> set{a, b, c, d, e, f};
  EXPECT_EQ(set.size(), 1u);

  EXPECT_EQ(Device("cuda"), Device(kCUDA));
  EXPECT_EQ(Device("cuda:2"), Device(kCUDA, 2));
  EXPECT_EQ(std::hash<Device>()(Device("cuda")), std::hash<Device>()(Device(kCUDA, 0)));
  EXPECT_EQ(Device(kCUDA).str(), Device("cuda").str());
}

TEST(DeviceTest, DistinctDevicesDiffer) {
  std::unordered_set<Device> set{Device("cpu"), Device("meta"), Device("cuda:0"), Device("cuda:1"),
                                 Device("cuda:2")};
  EXPECT_EQ(set.size(), 5u);
  EXPECT_NE(Device("cpu"), Device("meta"));
  EXPECT_NE(std::hash<Device>()(Device("cuda:0")), std::hash<Device>()(Device("cuda:1")));
}

TEST(DeviceTest, Formatting) {
  EXPECT_EQ(fmt::format("{}", Device("cuda:1")), "cuda:1");
  EXPECT_EQ(fmt::format("on {}", Device("meta")), "on meta");
  EXPECT_EQ(device_type_name(kCPU), "cpu");
  EXPECT_EQ(device_type_name(kMeta), "meta");
  EXPECT_EQ(device_type_name(kCUDA), "cuda");
}

TEST(DeviceTest, AliasResolvesAtParseTime) {
  alias_device("gpu_alias_test", "cpu");
  Device d("gpu_alias_test");
  EXPECT_EQ(d, Device("cpu"));
  EXPECT_EQ(d, Device(kCPU));
  EXPECT_EQ(d.type(), kCPU);
  EXPECT_EQ(d.str(), "cpu");
  EXPECT_EQ(fmt::format("{}", d), "cpu");
  EXPECT_EQ(std::hash<Device>()(d), std::hash<Device>()(Device("cpu")));
  EXPECT_EQ(Device("gpu_alias_test:0"), Device("cpu"));
  EXPECT_THROW_PREFIX(Device("gpu_alias_test:1"), DeviceError, "[device]");
  EXPECT_TRUE(d.is_cpu());
  EXPECT_EQ(d.dispatch_key(), DispatchKey::CPU);
}

TEST(DeviceTest, AliasOfAnAliasResolvesToTheTarget) {
  alias_device("gpu_alias_test", "cpu");
  alias_device("gpu_alias_test2", "gpu_alias_test");
  EXPECT_EQ(Device("gpu_alias_test2"), Device("cpu"));
  EXPECT_EQ(Device("gpu_alias_test2").str(), "cpu");
}

TEST(DeviceTest, AliasErrors) {
  EXPECT_THROW_PREFIX(alias_device("x_alias_test", "no_such_device"), DeviceError,
                      "[alias_device]");
  EXPECT_THROW_PREFIX(alias_device("meta", "meta"), DeviceError, "[alias_device]");
  EXPECT_THROW_PREFIX(Device("x_alias_test"), DeviceError, "[device]");  // nothing was added
}

TEST(DeviceTest, RegisterRejectsTakenNames) {
  EXPECT_THROW_CONTAINS(register_device_type("cpu", DispatchKey::PrivateUse2, nullptr, false),
                        Error, "already registered");
  EXPECT_THROW_PREFIX(register_device_type("cuda", DispatchKey::PrivateUse2, nullptr, false), Error,
                      "[device registry]");
  alias_device("gpu_alias_test", "cpu");
  EXPECT_THROW_PREFIX(
      register_device_type("gpu_alias_test", DispatchKey::PrivateUse2, nullptr, false), Error,
      "[device registry]");
}

TEST(DeviceTest, RegisterRejectsAKeyInUse) {
  EXPECT_THROW_CONTAINS(
      register_device_type("kiln_test_key_taken", DispatchKey::CPU, nullptr, false), Error,
      "dispatch key CPU is already used by 'cpu'");
  // The failed registration added nothing.
  EXPECT_THROW_PREFIX(Device("kiln_test_key_taken"), DeviceError, "[device]");
}

// Registers "kiln_test_accel" once per process (the registry is global).
DeviceType test_accel() {
  static DeviceType t =
      register_device_type("kiln_test_accel", DispatchKey::PrivateUse3, nullptr, false);
  return t;
}

TEST(DeviceTest, RegisterNewType) {
  DeviceType t = test_accel();
  EXPECT_GT(t, kCUDA);
  EXPECT_LT(t, kMaxDeviceTypes);
  EXPECT_EQ(device_type_name(t), "kiln_test_accel");
  EXPECT_EQ(device_interface(t), nullptr);
  Device d("kiln_test_accel:2");
  EXPECT_EQ(d.type(), t);
  EXPECT_EQ(d.index(), 2);
  EXPECT_EQ(d.str(), "kiln_test_accel:2");
  EXPECT_EQ(d, Device(t, 2));
  EXPECT_EQ(d.dispatch_key(), DispatchKey::PrivateUse3);
  EXPECT_EQ(Device("kiln_test_accel"), Device(t, 0));
  EXPECT_THROW_PREFIX(
      register_device_type("kiln_test_accel", DispatchKey::PrivateUse2, nullptr, true), Error,
      "[device registry]");
}

TEST(DeviceTest, BuiltinInterfaces) {
  ASSERT_NE(device_interface(kCPU), nullptr);
  EXPECT_EQ(device_interface(kCPU)->allocator(0), cpu_allocator());
  EXPECT_EQ(device_interface(kCPU)->device_count(), 1);
  ASSERT_NE(device_interface(kMeta), nullptr);
  EXPECT_EQ(device_interface(kMeta)->allocator(0), nullptr);  // meta has no memory
  EXPECT_EQ(device_interface(kCUDA), nullptr);                // until a CUDA backend installs one
}

TEST(DeviceTest, DefaultDevice) {
  DefaultDeviceGuard guard;
  EXPECT_EQ(default_device(), Device("cpu"));
  set_default_device(Device("meta"));
  EXPECT_EQ(default_device(), Device("meta"));
  EXPECT_EQ(default_device().str(), "meta");
  set_default_device(Device(kCPU));
  EXPECT_EQ(default_device(), Device("cpu"));
}

TEST(DeviceTest, ParsingFromManyThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&] {
      for (int j = 0; j < 2000; ++j)
        if (Device("cuda:3") != Device(kCUDA, 3) || Device("cpu") != Device(kCPU)) ++bad;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace kiln
