// The CPU allocator (kiln/core/storage.h): alignment and the cache of large blocks.
#include <gtest/gtest.h>

#include <cstdint>

#include "kiln/kiln.h"

namespace kiln {
namespace {

TEST(StorageTest, BlocksAreAligned) {
  for (size_t n : {1, 7, 100, 4096, 70000, 1 << 20}) {
    void* p = cpu_allocator()->allocate(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << n;
    cpu_allocator()->deallocate(p, n);
  }
  EXPECT_EQ(cpu_allocator()->allocate(0), nullptr);
}

TEST(StorageTest, LargeBlocksAreReused) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the cache is off under AddressSanitizer";
#endif
  release_cached_cpu_memory();
  void* p = zeros({1 << 18}).data_ptr();  // 1 MiB, freed at the end of the statement
  Tensor t = zeros({1 << 18});
  EXPECT_EQ(t.data_ptr(), p);  // the freed block came back
  EXPECT_EQ(t.to_vector<float>()[12345], 0.0f);
  t = Tensor();
  EXPECT_GE(release_cached_cpu_memory(), size_t{1} << 20);
  EXPECT_EQ(release_cached_cpu_memory(), 0u);
}

TEST(StorageTest, SizesRoundUpToAClassAndStillFit) {
  Tensor a = full({70001}, 3.0f);  // 280004 bytes, a class of 327680
  EXPECT_EQ(a.to_vector<float>()[70000], 3.0f);
  a = Tensor();
  Tensor b = full({70002}, 4.0f);  // same class: may reuse a's block, and must fit
  EXPECT_EQ(b.to_vector<float>()[70001], 4.0f);
}

TEST(StorageTest, ErrorsAreClear) {
  EXPECT_THROW(cpu_allocator()->allocate(size_t{1} << 63), ValueError);
}

}  // namespace
}  // namespace kiln
