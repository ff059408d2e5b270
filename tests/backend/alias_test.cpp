// Device aliasing (Note [Aliased types] in kiln/core/device.cpp): code written for "cuda" runs
// on sim, and however a device was spelled, and whenever it was made, it is one device: a
// compiled function compiles exactly once. Each test runs in its own process (an alias is for
// good), so every order of "default device, alias, compile, call" is checked from scratch.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <unordered_set>

#include "kiln/compile/compile.h"
#include "kiln/io/safetensors.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/ops.h"
#include "tests/backend/sim_util.h"
#include "tests/core/test_util.h"

namespace kiln::test {
namespace {

// A function that makes a tensor on the default device and one on a device it stored.
struct Step {
  Device stored;
  Tensor operator()(const Tensor& x) const {
    return add(mul(x, ones({4})), full({4}, 2.0, kFloat32, stored));
  }
};

// Calls `f` with inputs made from every spelling; all hit one cache entry.
void expect_one_compile(CompiledFunction& f, const Step& step) {
  std::vector<Device> spellings = {Device("cuda"), Device("cuda:0"), Device("cuda", 0),
                                   Device(kCUDA),  Device(kCUDA, 0), Device::from_index(0),
                                   Device("sim"),  Device("sim:0"),  default_device()};
  for (const Device& d : spellings) {
    Tensor x = arange(0, 4, 1, kFloat32).to(d);
    Tensor got = f({x})[0];
    EXPECT_EQ(got.device(), Device("sim")) << d.str();
    EXPECT_EQ(got.to_vector<float>(), step(x).to_vector<float>()) << d.str();
  }
  EXPECT_EQ(f.entries().size(), 1u) << f.explain();
  EXPECT_TRUE(f.miss_reasons().empty());
}

TEST(Alias, DefaultDeviceBeforeAlias) {
  sim();
  set_default_device(Device("cuda"));  // no CUDA backend here: a type without one
  alias_device("cuda", "sim");
  EXPECT_EQ(default_device(), Device("sim"));
  EXPECT_EQ(default_device().str(), "sim:0");
  Step step{Device("cuda")};
  CompiledFunction f = compile(step);
  expect_one_compile(f, step);
}

TEST(Alias, DefaultDeviceAfterAlias) {
  sim();
  alias_device("cuda", "sim");
  set_default_device(Device("cuda"));
  EXPECT_EQ(default_device(), Device("sim"));
  Step step{Device("cuda:0")};
  CompiledFunction f = compile(step);
  expect_one_compile(f, step);
}

TEST(Alias, EverySpellingIsOneDevice) {
  sim();
  alias_device("cuda", "sim");
  alias_device("cuda", "sim");  // again: nothing changes
  set_default_device(Device("sim"));
  const Device canon("sim:0");
  for (const Device& d : {Device("cuda"), Device("cuda:0"), Device("cuda", 0), Device(kCUDA),
                          Device(kCUDA, 0), Device::from_index(0)}) {
    EXPECT_EQ(d, canon);
    EXPECT_EQ(std::hash<Device>()(d), std::hash<Device>()(canon));
    EXPECT_EQ(d.str(), "sim:0");
    EXPECT_EQ(fmt::format("{}", d), "sim:0");
    EXPECT_EQ(d.type(), canon.type());
    EXPECT_EQ(d.dispatch_key(), canon.dispatch_key());
    EXPECT_EQ(ones({2}, kFloat32, d).device(), canon);
  }
  EXPECT_EQ(Device("cuda:1"), Device("sim:1"));
  EXPECT_NE(Device("cuda:1"), canon);
  Step step{Device(kCUDA)};
  CompiledFunction f = compile(step);
  expect_one_compile(f, step);
}

TEST(Alias, CompileThenAliasThenCall) {
  sim();
  Step step{Device("cuda")};  // stored before the alias
  CompiledFunction f = compile(step);
  alias_device("cuda", "sim");
  set_default_device(Device::from_index(0));
  expect_one_compile(f, step);
}

TEST(Alias, DevicesMadeBeforeTheAlias) {
  sim();
  Device early("cuda:1"), early_type(kCUDA);
  std::unordered_set<Device> set{early, early_type};
  alias_device("cuda", "sim");
  EXPECT_EQ(early, Device("sim:1"));
  EXPECT_EQ(early_type, Device("sim"));
  EXPECT_EQ(early.str(), "sim:1");
  EXPECT_TRUE(set.count(Device("sim:1")));  // hashes follow the alias too
  Tensor t = ones({3}, kFloat32, early);
  EXPECT_EQ(t.device(), Device("sim:1"));
  EXPECT_EQ(device_interface(early.type()), device_interface(Device("sim").type()));
}

TEST(Alias, CheckpointsLoadOntoTheAlias) {
  sim();
  alias_device("cuda", "sim");
  Generator g(3);
  nn::Linear a(4, 3, true, nn::Init{.gen = &g}), b(4, 3, true, nn::Init{.gen = &g});
  a.to(Device("cuda"));
  b.to(Device("cuda:0"));
  auto path = std::filesystem::temp_directory_path() /
              ("kiln_alias_ckpt_" + std::to_string(getpid()) + ".safetensors");
  io::save_safetensors(a.state_dict(), path.string());
  b.load_state_dict(io::load_safetensors(path.string()));
  std::filesystem::remove(path);
  auto pa = a.state_dict(), pb = b.state_dict();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pb[i].second.device(), Device("sim"));
    EXPECT_EQ(pb[i].second.device().str(), "sim:0");
    EXPECT_EQ(pb[i].second.to_vector<float>(), pa[i].second.to_vector<float>());
  }
}

TEST(Alias, AliasesChain) {
  sim();
  // "npu" has no backend; aliased to "cuda" first, then "cuda" to "sim": both are sim.
  register_device_type("npu", DispatchKey::PrivateUse2, nullptr, false);
  Device early("npu:1");
  alias_device("npu", "cuda");
  EXPECT_EQ(early, Device("cuda:1"));
  alias_device("cuda", "sim");
  EXPECT_EQ(early, Device("sim:1"));
  EXPECT_EQ(Device("npu:1"), Device("sim:1"));
  EXPECT_EQ(early.dispatch_key(), Device("sim").dispatch_key());
}

TEST(Alias, AliasErrors) {
  sim();
  alias_device("cuda", "sim");
  EXPECT_THROW_PREFIX(alias_device("cuda", "cpu"), DeviceError,
                      "[alias_device] 'cuda' is already an alias of 'sim'");
  EXPECT_THROW_PREFIX(alias_device("sim", "cpu"), DeviceError,
                      "[alias_device] 'sim' has a backend of its own");
  alias_device("accel", "cuda");  // an alias of an alias is the target
  EXPECT_EQ(Device("accel:1"), Device("sim:1"));
  EXPECT_THROW_PREFIX(alias_device("accel", "meta"), DeviceError,
                      "[alias_device] 'accel' is already an alias of 'sim'");
  EXPECT_THROW_PREFIX(set_device_interface(kCUDA, nullptr), DeviceError,
                      "[device registry] 'cuda' is aliased to 'sim'");
}

}  // namespace
}  // namespace kiln::test
