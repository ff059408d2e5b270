// Tests for kiln/core/dispatch_key.h: the key order and key-set operations.
// See Note [Dispatch key order] in kiln/dispatch/op.h.
#include "kiln/core/dispatch_key.h"

#include <gtest/gtest.h>

#include <string>

#include "core/test_util.h"

namespace kiln {
namespace {

using K = DispatchKey;

DispatchKeySet set_of(std::initializer_list<K> keys) {
  DispatchKeySet s;
  for (K k : keys) s = s.add(k);
  return s;
}

TEST(DispatchKeySetTest, HighestFollowsTheDesignOrder) {
  // DESIGN.md, highest first: Autograd, Sharded, Trace, Profile, Meta, then the backends.
  DispatchKeySet s = set_of({K::CPU, K::Meta, K::Profile, K::Trace, K::Sharded, K::Autograd});
  const K order[] = {K::Autograd, K::Sharded, K::Trace, K::Profile, K::Meta, K::CPU};
  for (K k : order) {
    EXPECT_EQ(s.highest(), k) << key_name(k);
    s = s.remove(k);
  }
  EXPECT_EQ(s.highest(), K::Undefined);
  EXPECT_TRUE(s.empty());
}

TEST(DispatchKeySetTest, EveryLayerOutranksEveryBackend) {
  for (K layer : {K::Meta, K::Profile, K::Trace, K::Sharded, K::Autograd}) {
    for (K backend : {K::CPU, K::CUDA, K::PrivateUse1, K::PrivateUse2, K::PrivateUse3}) {
      EXPECT_EQ(set_of({layer, backend}).highest(), layer)
          << key_name(layer) << " vs " << key_name(backend);
    }
  }
  EXPECT_EQ(set_of({K::Autograd, K::Trace}).highest(), K::Autograd);
  EXPECT_EQ(set_of({K::Trace, K::Profile}).highest(), K::Trace);
  EXPECT_EQ(set_of({K::Sharded, K::Trace}).highest(), K::Sharded);
}

TEST(DispatchKeySetTest, SingleKeys) {
  for (int i = 1; i < kNumDispatchKeys; ++i) {
    K k = static_cast<K>(i);
    DispatchKeySet s(k);
    EXPECT_EQ(s.highest(), k);
    EXPECT_TRUE(s.has(k));
    EXPECT_FALSE(s.empty());
    EXPECT_TRUE(s.remove(k).empty());
  }
}

TEST(DispatchKeySetTest, SetOperations) {
  DispatchKeySet a = set_of({K::CPU, K::Profile});
  DispatchKeySet b = set_of({K::Profile, K::Trace});
  EXPECT_EQ(a | b, set_of({K::CPU, K::Profile, K::Trace}));
  EXPECT_EQ(a & b, DispatchKeySet(K::Profile));
  EXPECT_EQ(a - b, DispatchKeySet(K::CPU));
  EXPECT_EQ(a.add(K::CPU), a);  // idempotent
  EXPECT_EQ(a.remove(K::Meta), a);
  EXPECT_TRUE(a.has(K::CPU));
  EXPECT_FALSE(a.has(K::Trace));
  EXPECT_EQ(DispatchKeySet::from_bits(a.bits()), a);
  EXPECT_TRUE(DispatchKeySet().empty());
  EXPECT_EQ(DispatchKeySet().highest(), K::Undefined);
  EXPECT_TRUE(DispatchKeySet(K::Undefined).empty());  // Undefined does not count as a key
}

TEST(DispatchKeySetTest, KeyNames) {
  EXPECT_EQ(key_name(K::Undefined), "Undefined");
  EXPECT_EQ(key_name(K::CPU), "CPU");
  EXPECT_EQ(key_name(K::CUDA), "CUDA");
  EXPECT_EQ(key_name(K::PrivateUse1), "PrivateUse1");
  EXPECT_EQ(key_name(K::PrivateUse3), "PrivateUse3");
  EXPECT_EQ(key_name(K::Meta), "Meta");
  EXPECT_EQ(key_name(K::Profile), "Profile");
  EXPECT_EQ(key_name(K::Trace), "Trace");
  EXPECT_EQ(key_name(K::Sharded), "Sharded");
  EXPECT_EQ(key_name(K::Autograd), "Autograd");
}

}  // namespace
}  // namespace kiln
