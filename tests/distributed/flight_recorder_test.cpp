// The flight recorder (kiln/distributed/flight_recorder.h) in one process: the ring of the
// last N calls, their states, the text it writes. The multi-rank faults that write it are in
// fault_test.cpp (Note [Fault tests]).
#include "kiln/distributed/flight_recorder.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kiln::distributed {
namespace {

// Fills the whole ring with calls of op "filler" (seq 1..capacity, completed), so that a test
// sees only its own calls after them whatever ran before it in this process.
void fill_ring() {
  FlightRecorder& fr = FlightRecorder::get();
  for (size_t i = 0; i < FlightRecorder::capacity(); ++i)
    fr.finish(fr.start("filler", "world", i + 1, 1, DType::Float32, -1), CallState::Completed);
}

std::vector<uint64_t> seqs(const std::vector<FlightEntry>& es) {
  std::vector<uint64_t> s;
  for (const FlightEntry& e : es) s.push_back(e.seq);
  return s;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(FlightRecorder, KeepsTheLastCapacityCallsOldestFirst) {
  FlightRecorder& fr = FlightRecorder::get();
  const size_t n = FlightRecorder::capacity();
  ASSERT_GE(n, 2u);
  for (size_t i = 0; i < n + 3; ++i)
    fr.start("all_reduce", "world", 1000 + i, 4, DType::Float32, -1);
  std::vector<FlightEntry> es = fr.entries();
  ASSERT_EQ(es.size(), n);
  std::vector<uint64_t> want;
  for (size_t i = 3; i < n + 3; ++i) want.push_back(1000 + i);
  EXPECT_EQ(seqs(es), want);
}

TEST(FlightRecorder, RecordsEachCallAndItsState) {
  fill_ring();
  FlightRecorder& fr = FlightRecorder::get();
  uint64_t a = fr.start("all_reduce_", "world", 7, 1024, DType::BFloat16, -1);
  uint64_t b = fr.start("broadcast_", "group1", 8, 3, DType::Int64, 1);
  uint64_t c = fr.start("barrier", "world", 9, 0, DType::Float32, -1);
  fr.finish(a, CallState::Completed);
  fr.finish(b, CallState::Failed);
  std::vector<FlightEntry> es = fr.entries();
  ASSERT_GE(es.size(), 3u);
  const FlightEntry& ea = es[es.size() - 3];
  const FlightEntry& eb = es[es.size() - 2];
  const FlightEntry& ec = es.back();
  EXPECT_EQ(ea.op, "all_reduce_");
  EXPECT_EQ(ea.group, "world");
  EXPECT_EQ(ea.seq, 7u);
  EXPECT_EQ(ea.numel, 1024);
  EXPECT_EQ(ea.dtype, DType::BFloat16);
  EXPECT_EQ(ea.peer, -1);
  EXPECT_EQ(ea.state, CallState::Completed);
  EXPECT_GE(ea.ended_s, ea.started_s);
  EXPECT_EQ(eb.op, "broadcast_");
  EXPECT_EQ(eb.group, "group1");
  EXPECT_EQ(eb.peer, 1);
  EXPECT_EQ(eb.state, CallState::Failed);
  EXPECT_EQ(ec.op, "barrier");
  EXPECT_EQ(ec.state, CallState::Started);
  EXPECT_EQ(ec.ended_s, 0);
  fr.finish(c, CallState::Completed);
  EXPECT_EQ(fr.entries().back().state, CallState::Completed);
}

TEST(FlightRecorder, FinishingAnOverwrittenCallLeavesItsSlotAlone) {
  FlightRecorder& fr = FlightRecorder::get();
  uint64_t old = fr.start("all_reduce", "world", 1, 4, DType::Float32, -1);
  for (size_t i = 0; i < FlightRecorder::capacity(); ++i)
    fr.start("all_gather_into_tensor", "world", 2 + i, 4, DType::Float32, -1);
  // `old`'s slot now holds the newest call, which is still running.
  fr.finish(old, CallState::Failed);
  std::vector<FlightEntry> es = fr.entries();
  ASSERT_EQ(es.size(), FlightRecorder::capacity());
  for (const FlightEntry& e : es) {
    EXPECT_EQ(e.op, "all_gather_into_tensor");
    EXPECT_EQ(e.state, CallState::Started) << "seq " << e.seq;
  }
}

TEST(FlightRecorder, FormatsOneLinePerCall) {
  FlightEntry e;
  e.op = "broadcast_";
  e.group = "group1";
  e.seq = 3;
  e.numel = 8;
  e.dtype = DType::BFloat16;
  e.peer = 1;
  e.state = CallState::Completed;
  e.started_s = 1.5;
  e.ended_s = 2.25;
  EXPECT_EQ(FlightRecorder::format(e),
            "broadcast_ group group1 seq 3 numel 8 bfloat16 peer 1 completed 1.500000s-2.250000s");
  e.peer = -1;
  e.state = CallState::Started;
  EXPECT_EQ(FlightRecorder::format(e),
            "broadcast_ group group1 seq 3 numel 8 bfloat16 started at 1.500000s");
}

TEST(FlightRecorder, DumpWritesEveryEntryToTheDumpDirectory) {
  namespace fs = std::filesystem;
  fill_ring();
  FlightRecorder& fr = FlightRecorder::get();
  fr.finish(fr.start("all_reduce_", "world", 41, 4, DType::Float32, -1), CallState::Completed);
  fr.start("all_reduce_", "world", 42, 4, DType::Float32, -1);
  fs::path dir = fs::temp_directory_path() / ("kiln_flight_test_" + std::to_string(getpid()));
  fs::create_directories(dir);
  ASSERT_EQ(setenv("KILN_DIST_DUMP_DIR", dir.c_str(), 1), 0);
  std::string path = fr.dump(5);
  unsetenv("KILN_DIST_DUMP_DIR");
  EXPECT_EQ(path, (dir / "kiln_flight_rank5.txt").string());
  std::string text = read_file(path);
  std::vector<FlightEntry> es = fr.entries();
  std::string want = "# kiln flight recorder, rank 5: the last " + std::to_string(es.size()) +
                     " collectives, oldest first; times in seconds from this process's first "
                     "collective\n";
  for (const FlightEntry& e : es) want += FlightRecorder::format(e) + "\n";
  EXPECT_EQ(text, want);
  EXPECT_NE(text.find("all_reduce_ group world seq 41 numel 4 float32 completed"),
            std::string::npos);
  EXPECT_NE(text.find("all_reduce_ group world seq 42 numel 4 float32 started"), std::string::npos);
  fs::remove_all(dir);
}

TEST(FlightRecorder, DumpIntoAMissingDirectoryReturnsNoPath) {
  ASSERT_EQ(setenv("KILN_DIST_DUMP_DIR", "/nonexistent/kiln_flight_test", 1), 0);
  std::string path = FlightRecorder::get().dump(0);
  unsetenv("KILN_DIST_DUMP_DIR");
  EXPECT_EQ(path, "");
}

}  // namespace
}  // namespace kiln::distributed
