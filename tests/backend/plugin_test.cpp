// Backend registration and the plugin loader (kiln/backend/registry.cpp): each error leaves
// nothing registered; an op without a kernel names the op and the device; the opt-in CPU
// fallback runs ops on the CPU with copies.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/core/storage.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/process_group.h"
#include "kiln/ops/ops.h"
#include "tests/backend/sim_util.h"
#include "tests/core/test_util.h"

namespace kiln::test {
namespace {

using kiln_test::contains;

// A device whose memory is host memory (so a test can look at it), with no kernels.
struct HostMemory final : DeviceInterface {
  Allocator* allocator(int) override { return cpu_allocator(); }
  int device_count() const override { return 1; }
  void copy_bytes(void* dst, bool, const void* src, bool, size_t n, int) override {
    if (n) std::memcpy(dst, src, n);
  }
  void synchronize(int) override {}
};
HostMemory g_host_memory;

// Registered once per process: "nokernels" (no fallback) and "fallbackdev" (CPU fallback).
void register_test_backends() {
  static const bool done = [] {
    sim();  // PrivateUse1
    register_backend({.name = "nokernels",
                      .key = DispatchKey::PrivateUse2,
                      .interface = &g_host_memory,
                      .single_device = true,
                      .kernels = {},
                      .fallback = nullptr,
                      .cpu_fallback = false});
    register_backend({.name = "fallbackdev",
                      .key = DispatchKey::PrivateUse3,
                      .interface = &g_host_memory,
                      .single_device = true,
                      .kernels = {},
                      .fallback = nullptr,
                      .cpu_fallback = true});
    return true;
  }();
  (void)done;
}

// A tensor on `d` over host bytes, made without any kernel of the device.
Tensor on(Device d, const Tensor& cpu) {
  Tensor c = cpu.contiguous();
  auto s = make_ref<StorageImpl>(c.nbytes(), d, cpu_allocator());
  std::memcpy(s->data(), c.data_ptr(), c.nbytes());
  return Tensor(make_ref<TensorImpl>(std::move(s), c.dtype(), c.sizes(), c.strides(), 0));
}

TEST(PluginLoader, LoadsByNameOnceOnly) {
  sim();
  EXPECT_THROW_CONTAINS(load_backend(KILN_SIM_PLUGIN), ValueError,
                        "is already loaded (backend 'sim')");
  EXPECT_THROW_CONTAINS(load_backend("sim"), ValueError, "is already loaded");
}

TEST(PluginLoader, ACopyOfALoadedPluginIsANameTaken) {
  sim();
  auto dir = std::filesystem::temp_directory_path() /
             ("kiln_plugin_copy_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto copy = dir / "libkiln_sim_copy.so";
  std::filesystem::copy_file(KILN_SIM_PLUGIN, copy,
                             std::filesystem::copy_options::overwrite_existing);
  DispatchKey free_before = free_private_use_key();
  EXPECT_THROW_CONTAINS(load_backend(copy.string()), ValueError,
                        "device type 'sim' is already registered");
  EXPECT_EQ(free_private_use_key(), free_before);
  std::filesystem::remove_all(dir);
}

TEST(PluginLoader, ErrorsRegisterNothing) {
  sim();
  DispatchKey free_before = free_private_use_key();
  EXPECT_THROW_CONTAINS(load_backend("/no/such/libkiln_x.so"), ValueError, "cannot open");
  EXPECT_THROW_CONTAINS(load_backend("no_such_plugin_name"), ValueError,
                        "no plugin named 'no_such_plugin_name'");
  auto junk = std::filesystem::temp_directory_path() /
              ("kiln_not_a_library_" + std::to_string(getpid()) + ".so");
  std::ofstream(junk) << "not an ELF file";
  EXPECT_THROW_CONTAINS(load_backend(junk.string()), ValueError, "cannot load");
  std::filesystem::remove(junk);
  EXPECT_THROW_CONTAINS(load_backend(KILN_TEST_PLUGIN_NO_ENTRY), ValueError,
                        "has no entry point 'kiln_backend_entry'");
  EXPECT_THROW_CONTAINS(load_backend(KILN_TEST_PLUGIN_BAD_ABI), ValueError,
                        fmt::format("built for backend ABI version {}, this Kiln has version {}",
                                    KILN_BACKEND_ABI_VERSION + 998, KILN_BACKEND_ABI_VERSION));
  EXPECT_EQ(find_device_type("bad_abi"), -1);
  EXPECT_EQ(free_private_use_key(), free_before);
  // A failed load can be retried: it failed the same way, it did not become "already loaded".
  EXPECT_THROW_CONTAINS(load_backend(KILN_TEST_PLUGIN_BAD_ABI), ValueError, "ABI version");
}

// A plugin that fails to load leaves nothing registered, beyond the backend itself: the CUDA
// plugin once registered its collective backend when the library loaded, so on a machine
// without a GPU (its describe fails) every process group made afterwards set up NCCL for cuda
// tensors and its CPU collectives failed with a CUDA error.
TEST(PluginLoader, AFailedLoadLeavesCollectivesAlone) {
  try {
    load_backend("cuda");
    GTEST_SKIP() << "the CUDA backend loaded (a GPU is present)";
  } catch (const ValueError& e) {
    if (!std::strstr(e.what(), "failed to describe"))
      GTEST_SKIP() << "no CUDA plugin in this build: " << e.what();
  }
  distributed::init();
  auto group = distributed::new_group({0});
  Tensor t = ones({3});
  distributed::all_reduce_(t, distributed::ReduceOp::Sum, group.get());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 1, 1}));
}

TEST(RegisterBackend, RejectsBadSpecsWhole) {
  register_test_backends();
  HostMemory iface;
  auto rejected = [&](BackendSpec spec, const char* part) {
    std::string name = spec.name;
    EXPECT_THROW_CONTAINS(register_backend(spec), ValueError, part);
    if (!name.empty() && name != "sim" && name != "nokernels") {
      EXPECT_EQ(find_device_type(name), -1) << name;
    }
  };
  rejected({.name = "", .key = DispatchKey::PrivateUse3, .interface = &iface}, "has no name");
  rejected({.name = "x1", .key = DispatchKey::CPU, .interface = &iface},
           "key CPU is not one of PrivateUse1..3");
  rejected({.name = "x2", .key = DispatchKey::PrivateUse3, .interface = nullptr},
           "has no device interface");
  rejected({.name = "sim", .key = DispatchKey::PrivateUse3, .interface = &iface},
           "'sim' is already registered");
  rejected({.name = "x3", .key = DispatchKey::PrivateUse2, .interface = &iface},
           "key PrivateUse2 is already used by 'nokernels'");
  rejected({.name = "x4",
            .key = DispatchKey::PrivateUse3,
            .interface = &iface,
            .fallback = +[](const OpDef&, DispatchKey, Stack&) {},
            .cpu_fallback = true},
           "sets both");
  static TypedOp<Tensor(const Tensor&)> unregistered("kiln_test_unregistered", "",
                                                     OpKind::Functional);
  rejected({.name = "x5",
            .key = DispatchKey::PrivateUse3,
            .interface = &iface,
            .kernels = {backend_kernel(
                unregistered, +[](const Tensor& t) { return t; })}},
           "which is not a registered op");
}

TEST(NoKernel, NamesTheOpAndTheDevice) {
  register_test_backends();
  Tensor t = on(Device("nokernels"), ones({2, 2}));
  EXPECT_THROW_PREFIX(add(t, t), NotImplementedError,
                      "[add] no kernel for dispatch key PrivateUse2 (device 'nokernels': its "
                      "backend has no kernel for this op and its CPU fallback is off)");
  EXPECT_EQ(transpose(t, 0, 1).device(), Device("nokernels"));  // views need no kernel
}

TEST(CpuFallback, RunsOpsOnTheCpuWithCopies) {
  register_test_backends();
  Device d("fallbackdev");
  Tensor a = randn({3, 4}), b = randn({3, 4});
  Tensor da = on(d, a), db = on(d, b);
  int64_t calls = cpu_fallback_calls();
  testing::internal::CaptureStderr();
  Tensor sum_ab = add(da, db);
  Tensor again = add(da, db);
  std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(sum_ab.device(), d);
  EXPECT_EQ(cpu_fallback_calls(), calls + 2);
  EXPECT_TRUE(contains(log,
                       "[kiln] add: no kernel on device 'fallbackdev'; running it on the "
                       "CPU with copies"))
      << log;
  EXPECT_EQ(log.find("add:", log.find("add:") + 1), std::string::npos) << "logged twice: " << log;
  EXPECT_EQ(sum_ab.to(Device(kCPU)).to_vector<float>(), add(a, b).to_vector<float>());
  // In place: written back to the device's bytes; views of the argument stay views.
  Tensor r = mul_(da, db);
  EXPECT_TRUE(r.is_same(da));
  EXPECT_EQ(da.to(Device(kCPU)).to_vector<float>(), mul(a, b).to_vector<float>());
  Tensor row = select(da, 0, 1);
  row.fill_(7.0);
  EXPECT_EQ(select(da.to(Device(kCPU)), 0, 1).to_vector<float>(), std::vector<float>(4, 7.0f));
  // Factories and copies in both directions.
  Tensor z = zeros({2}, kFloat32, d);
  EXPECT_EQ(z.device(), d);
  EXPECT_EQ(z.to(Device(kCPU)).to_vector<float>(), (std::vector<float>{0, 0}));
  // Errors come from the CPU kernel's checks, before anything is copied back.
  Tensor keep = da.to(Device(kCPU));
  EXPECT_THROW_CONTAINS(add_(da, on(d, ones({5}))), ValueError, "not broadcastable");
  EXPECT_EQ(da.to(Device(kCPU)).to_vector<float>(), keep.to_vector<float>());
}

}  // namespace
}  // namespace kiln::test
