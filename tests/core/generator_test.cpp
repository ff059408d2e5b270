// Tests for kiln/core/generator.h: Philox known answers, (seed, offset) state, and the
// reproducibility of draws made through it.
#include "kiln/core/generator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <set>
#include <thread>
#include <vector>

#include "kiln/ops/ops.h"

namespace kiln {
namespace {

uint64_t pack(uint32_t lo, uint32_t hi) { return uint64_t{lo} | uint64_t{hi} << 32; }

// Known-answer vectors from Random123 (kat_vectors, philox4x32 with 10 rounds). The counter
// words c0..c3 are packed as lo = c0 | c1 << 32 and hi = c2 | c3 << 32, the key as k0 | k1 << 32.
TEST(PhiloxTest, Random123KnownAnswers) {
  struct Kat {
    std::array<uint32_t, 4> ctr;
    std::array<uint32_t, 2> key;
    std::array<uint32_t, 4> out;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    auto got =
        philox4x32(pack(k.ctr[0], k.ctr[1]), pack(k.ctr[2], k.ctr[3]), pack(k.key[0], k.key[1]));
    EXPECT_EQ(got, k.out) << std::hex << "counter " << k.ctr[0] << " " << k.ctr[1] << " "
                          << k.ctr[2] << " " << k.ctr[3] << " key " << k.key[0] << " " << k.key[1];
  }
}

TEST(PhiloxTest, PureFunctionOfCounterAndKey) {
  EXPECT_EQ(philox4x32(5, 6, 7), philox4x32(5, 6, 7));
  EXPECT_NE(philox4x32(5, 6, 7), philox4x32(6, 6, 7));
  EXPECT_NE(philox4x32(5, 6, 7), philox4x32(5, 7, 7));
  EXPECT_NE(philox4x32(5, 6, 7), philox4x32(5, 6, 8));
}

TEST(GeneratorTest, SeedAndOffset) {
  Generator d;
  EXPECT_EQ(d.seed(), 0u);
  EXPECT_EQ(d.offset(), 0u);
  Generator g(42);
  EXPECT_EQ(g.seed(), 42u);
  EXPECT_EQ(g.offset(), 0u);
  g.set_offset(100);
  EXPECT_EQ(g.offset(), 100u);
  EXPECT_EQ(g.seed(), 42u);
  g.set_seed(7);  // reseeding restarts the stream
  EXPECT_EQ(g.seed(), 7u);
  EXPECT_EQ(g.offset(), 0u);
}

TEST(GeneratorTest, AdvanceReservesWholeBlocksOfFour) {
  Generator g(1);
  EXPECT_EQ(g.advance(1), 0u);  // 1 draw: 1 block
  EXPECT_EQ(g.offset(), 1u);
  EXPECT_EQ(g.advance(4), 1u);  // 4 draws: 1 block
  EXPECT_EQ(g.offset(), 2u);
  EXPECT_EQ(g.advance(5), 2u);  // 5 draws: 2 blocks
  EXPECT_EQ(g.offset(), 4u);
  EXPECT_EQ(g.advance(0), 4u);  // nothing reserved
  EXPECT_EQ(g.offset(), 4u);
  EXPECT_EQ(g.advance(4000), 4u);
  EXPECT_EQ(g.offset(), 1004u);
}

TEST(GeneratorTest, ConcurrentAdvancesReserveDisjointBlocks) {
  Generator g(3);
  constexpr int kThreads = 4, kPerThread = 5000;
  std::vector<std::vector<uint64_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) got[t].push_back(g.advance(8));
    });
  for (auto& t : threads) t.join();
  std::set<uint64_t> starts;
  for (const auto& v : got) starts.insert(v.begin(), v.end());
  EXPECT_EQ(starts.size(), size_t{kThreads * kPerThread});
  EXPECT_EQ(g.offset(), uint64_t{kThreads * kPerThread * 2});
}

TEST(GeneratorTest, ManualSeedResetsTheDefaultGenerator) {
  manual_seed(1234);
  EXPECT_EQ(default_generator().seed(), 1234u);
  EXPECT_EQ(default_generator().offset(), 0u);
  default_generator().advance(40);
  EXPECT_EQ(default_generator().offset(), 10u);
  manual_seed(1234);
  EXPECT_EQ(default_generator().offset(), 0u);
  manual_seed(0);
}

TEST(GeneratorTest, SameSeedSameDraws) {
  Generator a(123), b(123), c(124);
  Tensor x = rand({1000}, &a), y = rand({1000}, &b), z = rand({1000}, &c);
  EXPECT_EQ(x.to_vector<float>(), y.to_vector<float>());
  EXPECT_NE(x.to_vector<float>(), z.to_vector<float>());
  EXPECT_EQ(a.offset(), b.offset());
  // A second draw continues the stream instead of repeating it.
  Tensor x2 = rand({1000}, &a);
  EXPECT_NE(x.to_vector<float>(), x2.to_vector<float>());
}

TEST(GeneratorTest, ManualSeedReproducesDefaultGeneratorDraws) {
  manual_seed(5);
  auto x = rand({64}).to_vector<float>();
  auto n = randn({64}).to_vector<float>();
  manual_seed(5);
  EXPECT_EQ(rand({64}).to_vector<float>(), x);
  EXPECT_EQ(randn({64}).to_vector<float>(), n);
  manual_seed(0);
}

TEST(GeneratorTest, Float32DrawAdvancesOneBlockPerFourValues) {
  Generator g(9);
  rand({33}, &g);
  EXPECT_EQ(g.offset(), 9u);  // ceil(33 / 4)
  rand({4}, &g);
  EXPECT_EQ(g.offset(), 10u);
}

TEST(GeneratorTest, SavingAndRestoringStateReplaysADraw) {
  Generator g(77);
  rand({7}, &g);  // move away from the start of the stream
  uint64_t seed = g.seed(), offset = g.offset();
  auto a = rand({33}, &g).to_vector<float>();
  auto an = randn({17}, &g, kFloat64).to_vector<double>();
  auto ai = randint(0, 1000, {25}, &g).to_vector<int64_t>();
  g.set_seed(seed);
  g.set_offset(offset);
  EXPECT_EQ(rand({33}, &g).to_vector<float>(), a);
  EXPECT_EQ(randn({17}, &g, kFloat64).to_vector<double>(), an);
  EXPECT_EQ(randint(0, 1000, {25}, &g).to_vector<int64_t>(), ai);

  // A fresh generator given the same pair replays too.
  Generator h(seed);
  h.set_offset(offset);
  EXPECT_EQ(rand({33}, &h).to_vector<float>(), a);
}

// Element i of a float32 draw uses block (offset + i / 4), lane i % 4.
TEST(GeneratorTest, Float32DrawLayout) {
  Generator g(11);
  auto full = rand({40}, &g).to_vector<float>();
  // Starting one block later drops the first four elements.
  g.set_offset(1);
  auto shifted = rand({36}, &g).to_vector<float>();
  EXPECT_EQ(shifted, std::vector<float>(full.begin() + 4, full.end()));
  // A shorter draw is a prefix of a longer one.
  g.set_offset(0);
  auto prefix = rand({7}, &g).to_vector<float>();
  EXPECT_EQ(prefix, std::vector<float>(full.begin(), full.begin() + 7));
  // Within a block, the values order like the Philox lanes they come from.
  for (int b = 0; b < 10; ++b) {
    auto lanes = philox4x32(static_cast<uint64_t>(b), 0, 11);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        if ((lanes[i] >> 8) < (lanes[j] >> 8)) {
          EXPECT_LT(full[4 * b + i], full[4 * b + j])
              << "block " << b << " lanes " << i << "," << j;
        }
      }
    }
  }
}

TEST(GeneratorTest, LargeDrawsDoNotDependOnThreading) {
  // Large enough to be split across threads; its prefix equals a small single-threaded draw.
  Generator g(2024);
  auto big = rand({200000}, &g).to_vector<float>();
  g.set_offset(0);
  auto small = rand({100}, &g).to_vector<float>();
  EXPECT_EQ(small, std::vector<float>(big.begin(), big.begin() + 100));
  g.set_offset(40000);  // block 40000 holds elements 160000..160003
  auto tail = rand({8}, &g).to_vector<float>();
  EXPECT_EQ(tail, std::vector<float>(big.begin() + 160000, big.begin() + 160008));
  auto [lo, hi] = std::minmax_element(big.begin(), big.end());
  EXPECT_GE(*lo, 0.0f);
  EXPECT_LT(*hi, 1.0f);
  double mean = 0;
  for (float x : big) mean += x;
  mean /= static_cast<double>(big.size());
  EXPECT_NEAR(mean, 0.5, 0.01);
}

TEST(GeneratorTest, UniformValuesStayBelowOneInEveryFloatType) {
  for (DType t : {kFloat16, kBFloat16, kFloat32, kFloat64}) {
    Generator g(5);
    auto v = rand({50000}, &g, t).to_vector<double>();
    auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    EXPECT_GE(*lo, 0.0) << name(t);
    EXPECT_LT(*hi, 1.0) << name(t);
  }
}

}  // namespace
}  // namespace kiln
