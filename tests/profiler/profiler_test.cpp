// kiln/profiler: events of eager ops, compiles, guard misses and replays, and the Chrome trace.
#include "kiln/profiler/profiler.h"

#include <cstdio>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kiln/compile/compile.h"
#include "kiln/ops/ops.h"

namespace kiln {
namespace {

TEST(Profiler, ChromeTraceHasTheExpectedEvents) {
  std::string path = testing::TempDir() + "kiln_profile.json";
  CompiledFunction f = compile([](const Tensor& x) { return exp(neg(x)); }, {.name = "twice"});
  {
    profiler::Session session;
    Tensor x = ones({4});
    Tensor y = add(x, x);  // eager
    f({x});                // compile (traced ops run eagerly)
    f({x});                // replay
    f({ones({5})});        // guard miss, compile
    session.save_chrome_trace(path);
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good());
  nlohmann::json j = nlohmann::json::parse(in);  // throws if it is not JSON
  ASSERT_TRUE(j.contains("traceEvents"));
  std::multiset<std::string> seen;
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_TRUE(e.contains("ts") && e.contains("pid") && e.contains("tid"));
    seen.insert(e["cat"].get<std::string>() + ":" + e["name"].get<std::string>());
  }
  EXPECT_TRUE(seen.count("op:add")) << "eager op";
  EXPECT_TRUE(seen.count("op:neg")) << "traced op, run for real";
  EXPECT_EQ(seen.count("compile:compile twice"), 2u);
  EXPECT_EQ(seen.count("guard:guard miss"), 1u);
  EXPECT_EQ(seen.count("replay:twice"), 1u);
  EXPECT_TRUE(seen.count("replay:neg_out")) << "a replayed step";
  EXPECT_TRUE(seen.count("replay:exp_out"));
  for (const auto& e : j["traceEvents"]) {
    if (e["cat"] == "guard") {
      EXPECT_NE(e["args"]["reason"].get<std::string>().find("size mismatch at dim 0"),
                std::string::npos);
    }
  }
  std::remove(path.c_str());
}

TEST(Profiler, OffWithoutASession) {
  EXPECT_FALSE(profiler::enabled());
  {
    profiler::Session s;
    EXPECT_TRUE(profiler::enabled());
    EXPECT_THROW(profiler::Session again, ValueError);
    Tensor a = ones({1});
    add(a, a);
    ASSERT_FALSE(s.events().empty());
    EXPECT_EQ(s.events().back().name, "add");
    EXPECT_EQ(s.events().back().category, "op");
  }
  EXPECT_FALSE(profiler::enabled());
  profiler::Session s;
  EXPECT_TRUE(s.events().empty()) << "a new session starts empty";
}

TEST(Profiler, UnwritablePathIsAnError) {
  profiler::Session s;
  try {
    s.save_chrome_trace("/nonexistent-dir/trace.json");
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[profiler] cannot write /nonexistent-dir/trace.json"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace kiln
