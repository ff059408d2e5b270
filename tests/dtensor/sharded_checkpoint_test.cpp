// Sharded checkpoints (kiln/dtensor/sharded_checkpoint.h): round trips from every layout to every
// layout on this world's meshes, checkpoints saved by another world size (ShardedCheckpointWorlds:
// ctest saves on 1, 2 and 4 ranks, then each world loads the others'), and one test per
// malformed index or shard file. Every rank runs every test, in the same order.
#include "kiln/dtensor/sharded_checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/dtensor/dtensor_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;
using dt::Partial;
using dt::Replicate;
using dt::Shard;
using io::StateDict;
using json = nlohmann::json;
using R = dist::ReduceOp;

// Bitwise equality of two tensors' dtypes, sizes and bytes (on the cpu).
::testing::AssertionResult same_bits(const Tensor& got, const Tensor& want) {
  Tensor a = got.to(Device(kCPU)).contiguous(), b = want.to(Device(kCPU)).contiguous();
  if (a.dtype() != b.dtype() || !(a.sizes() == b.sizes()))
    return ::testing::AssertionFailure() << a.str() << " vs " << b.str();
  if (a.nbytes() > 0 && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << "values differ: " << a.str() << " vs " << b.str();
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------- the layouts

// A layout: a mesh (1-D "x" or 2-D "dp" x "tp") and its placements; no mesh means a plain tensor.
struct Layout {
  int mesh_dims;  // 0: plain
  dt::Placements placements;
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> l = {
      {0, {}},
      {1, {Shard(0)}},
      {1, {Shard(1)}},
      {1, {Replicate()}},
      {1, {Partial(R::Sum)}},
      {1, {Partial(R::Max)}},
      {1, {Partial(R::Avg)}},
      {2, {Shard(0), Shard(1)}},
      {2, {Shard(0), Shard(0)}},  // nested
      {2, {Shard(1), Shard(0)}},
      {2, {Replicate(), Shard(1)}},
      {2, {Partial(R::Sum), Shard(0)}},
      {2, {Shard(1), Partial(R::Min)}},
      {2, {Replicate(), Replicate()}},
  };
  return l;
}

// Shapes and dtypes: uneven and empty shards on 2 and 4 ranks, a 1-d, a 0-d and an empty tensor.
struct Case {
  Shape shape;
  DType dtype;
};
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{5, 7}, kFloat32}, {{8, 4}, kInt64}, {{6}, kBFloat16}, {{}, kFloat64}, {{0, 3}, kFloat32}};
  return c;
}

bool fits(const Layout& l, const Case& c) {
  for (const dt::Placement& p : l.placements) {
    if (p.is_shard() && p.dim() >= static_cast<int64_t>(c.shape.size())) return false;
    if (p.is_partial() && p.reduce_op() == R::Avg && !is_floating(c.dtype)) return false;
  }
  return true;
}

std::string name_of(size_t layout, size_t c) { return fmt::format("t{}_{}", c, layout); }

Tensor global_of(size_t c) {
  return global_tensor(cases()[c].shape, cases()[c].dtype, Device(kCPU), static_cast<int64_t>(c));
}

// `value` laid out as `l` on this world's meshes of `device`.
Tensor make(const Layout& l, const Tensor& value, Device device) {
  if (l.mesh_dims == 0) return value.to(device);
  const dt::DeviceMesh& mesh = l.mesh_dims == 1 ? mesh_1d(device) : mesh_2d(device);
  return dt::distribute_tensor(value.to(device), mesh, l.placements);
}

// Every case in every layout.
StateDict sources(Device device) {
  StateDict sd;
  for (size_t c = 0; c < cases().size(); ++c)
    for (size_t l = 0; l < layouts().size(); ++l)
      if (fits(layouts()[l], cases()[c]))
        sd.emplace_back(name_of(l, c), make(layouts()[l], global_of(c), device));
  return sd;
}

// Loads every saved name of `dir` into layout `target`, and checks the values bitwise.
void load_and_check(const std::string& dir, const Layout& target, Device device) {
  StateDict targets;
  std::vector<size_t> which;
  for (size_t c = 0; c < cases().size(); ++c) {
    if (!fits(target, cases()[c])) continue;
    Tensor garbage = full(cases()[c].shape, -3.0, cases()[c].dtype, Device(kCPU));
    for (size_t l = 0; l < layouts().size(); ++l)
      if (fits(layouts()[l], cases()[c])) {
        targets.emplace_back(name_of(l, c), make(target, garbage, device));
        which.push_back(c);
      }
  }
  dt::load_sharded(dir, targets);
  for (size_t i = 0; i < targets.size(); ++i) {
    const Tensor& t = targets[i].second;
    Tensor whole = dt::is_dtensor(t) ? dt::full_tensor(t) : t;
    EXPECT_TRUE(same_bits(whole, global_of(which[i])))
        << targets[i].first << " into " << dt::placements_str(target.placements) << " on a "
        << target.mesh_dims << "-d mesh";
    if (dt::is_dtensor(t) && !dt::spec_of(t)->has_partial()) {
      EXPECT_TRUE(same_bits(dt::to_local(t), expected_local(global_of(which[i]), *dt::spec_of(t))))
          << targets[i].first;
    }
  }
}

// A directory name every rank agrees on (rank 0 draws it), removed by the destructor.
class SharedDir {
 public:
  explicit SharedDir(const std::string& tag) {
    Tensor token = zeros({1}, kInt64, Device(kCPU));
    if (dist::rank() == 0)
      *static_cast<int64_t*>(token.data_ptr()) = std::random_device()() & 0xffffff;
    token = dist::all_reduce(token);
    path_ = (fs::temp_directory_path() /
             fmt::format("kiln_sharded_ckpt_{}_{}", *static_cast<int64_t*>(token.data_ptr()), tag))
                .string();
  }
  ~SharedDir() {
    dist::barrier();
    if (dist::rank() == 0) fs::remove_all(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------- round trips

TEST(ShardedCheckpoint, EveryLayoutToEveryLayout) {
  SharedDir dir("layouts");
  dt::save_sharded(dir.path(), sources(Device(kCPU)), {{"step", "7"}});
  for (const Layout& target : layouts()) load_and_check(dir.path(), target, Device(kCPU));
  std::map<std::string, std::string> md;
  dt::load_sharded(dir.path(), {}, &md);
  EXPECT_EQ(md, (std::map<std::string, std::string>{{"step", "7"}}));
}

TEST(ShardedCheckpoint, SimShardsRoundTrip) {
  SharedDir dir("sim");
  dt::save_sharded(dir.path(), sources(sim()));
  for (size_t l : {0, 1, 5, 8, 11}) load_and_check(dir.path(), layouts()[l], sim());
}

TEST(ShardedCheckpoint, SavingAgainReplacesTheCheckpoint) {
  SharedDir dir("again");
  const dt::DeviceMesh& mesh = mesh_1d(Device(kCPU));
  Tensor a = global_tensor({5, 7}, kFloat32, Device(kCPU)),
         b = global_tensor({5, 7}, kFloat32, Device(kCPU), 100);
  dt::save_sharded(dir.path(), {{"w", dt::distribute_tensor(a, mesh, {Shard(0)})}});
  dt::save_sharded(dir.path(), {{"w", dt::distribute_tensor(b, mesh, {Shard(1)})}});
  Tensor target = zeros({5, 7}, kFloat32, Device(kCPU));
  dt::load_sharded(dir.path(), {{"w", target}});
  EXPECT_TRUE(same_bits(target, b));
}

// ---------------------------------------------------------------- other world sizes

// ctest runs Save on 1, 2 and 4 ranks into $KILN_CKPT_DIR/world{n} first (FIXTURES_SETUP),
// then LoadEveryOtherWorld on each world size reads the checkpoints of the worlds named in
// $KILN_CKPT_FROM: 4 -> 2, 4 -> 1, 2 -> 4 and 1 -> 4.
std::string world_dir(int world) {
  const char* base = std::getenv("KILN_CKPT_DIR");
  return base ? (fs::path(base) / fmt::format("world{}", world)).string() : std::string();
}

TEST(ShardedCheckpointWorlds, Save) {
  if (!std::getenv("KILN_CKPT_DIR")) GTEST_SKIP() << "KILN_CKPT_DIR is not set";
  dt::save_sharded(world_dir(dist::world_size()), sources(Device(kCPU)),
                   {{"world", std::to_string(dist::world_size())}});
}

TEST(ShardedCheckpointWorlds, LoadEveryOtherWorld) {
  const char* from = std::getenv("KILN_CKPT_FROM");
  if (!from || !std::getenv("KILN_CKPT_DIR"))
    GTEST_SKIP() << "KILN_CKPT_DIR or KILN_CKPT_FROM is not set";
  std::istringstream worlds(from);
  int n = 0, loaded = 0;
  while (worlds >> n) {
    SCOPED_TRACE(fmt::format("saved on {} ranks, loaded on {}", n, dist::world_size()));
    std::map<std::string, std::string> md;
    dt::load_sharded(world_dir(n), {}, &md);
    EXPECT_EQ(md["world"], std::to_string(n));
    for (const Layout& target : layouts()) load_and_check(world_dir(n), target, Device(kCPU));
    ++loaded;
  }
  EXPECT_GT(loaded, 0) << "KILN_CKPT_FROM names no world: '" << from << "'";
}

// ---------------------------------------------------------------- malformed checkpoints

// A small checkpoint: "w" [5, 7] float32 Shard(0) on the 1-D mesh and "b" [3] int64 plain.
class Malformed : public ::testing::Test {
 protected:
  Malformed() : dir_("bad") {
    dt::save_sharded(dir(), {{"w", dt::distribute_tensor(w_, mesh(), {Shard(0)})}, {"b", b_}});
  }
  const dt::DeviceMesh& mesh() { return mesh_1d(Device(kCPU)); }
  const std::string& dir() { return dir_.path(); }
  std::string index_path() { return dir() + "/index.json"; }

  // Rank 0 changes the index (as JSON); every rank then waits for it.
  void edit_index(const std::function<void(json&)>& edit) {
    edit_file(index_path(), [&](std::string& text) {
      json j = json::parse(text);
      edit(j);
      text = j.dump();
    });
  }
  void edit_file(const std::string& path, const std::function<void(std::string&)>& edit) {
    if (dist::rank() == 0) {
      std::ifstream in(path, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      in.close();
      edit(text);
      std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    }
    dist::barrier();
  }
  // The file that holds w's last piece.
  std::string last_w_file() {
    std::ifstream in(index_path());
    return dir() + "/" +
           json::parse(in)["tensors"]["w"]["pieces"].back()["file"].get<std::string>();
  }

  // Loading into fresh targets (w: Shard(1), b: plain) fails on every rank with a message that
  // starts with [load_sharded] and holds every one of `parts`, and writes no target.
  void expect_error(const std::vector<std::string>& parts, DType w_dtype = kFloat32,
                    Shape w_shape = {5, 7}, std::string w_name = "w",
                    dt::Placement w_placement = Shard(1)) {
    Tensor w =
        dt::distribute_tensor(full(w_shape, -1.0, w_dtype, Device(kCPU)), mesh(), {w_placement});
    Tensor b = full({3}, -1.0, kInt64, Device(kCPU));
    Tensor w_before = dt::to_local(w).clone(), b_before = b.clone();
    try {
      dt::load_sharded(dir(), {{w_name, w}, {"b", b}});
      ADD_FAILURE() << "no error; expected one holding '" << parts.front() << "'";
    } catch (const ValueError& e) {
      std::string m = e.what();
      EXPECT_EQ(m.rfind("[load_sharded] ", 0), 0u) << m;
      for (const std::string& p : parts)
        EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' not in: " << m;
    }
    EXPECT_TRUE(same_bits(dt::to_local(w), w_before));
    EXPECT_TRUE(same_bits(b, b_before));
  }

  Tensor w_ = global_tensor({5, 7}, kFloat32, Device(kCPU));
  Tensor b_ = global_tensor({3}, kInt64, Device(kCPU), 40);
  SharedDir dir_;
};

TEST_F(Malformed, TheUneditedCheckpointLoads) {
  Tensor w = dt::distribute_tensor(zeros({5, 7}, kFloat32, Device(kCPU)), mesh(), {Shard(1)});
  Tensor b = zeros({3}, kInt64, Device(kCPU));
  dt::load_sharded(dir(), {{"b", b}, {"w", w}});
  EXPECT_TRUE(same_bits(dt::full_tensor(w), w_));
  EXPECT_TRUE(same_bits(b, b_));
}

TEST_F(Malformed, MissingIndex) {
  if (dist::rank() == 0) fs::remove(index_path());
  dist::barrier();
  expect_error({"cannot open '" + index_path() + "'"});
}
TEST_F(Malformed, IndexIsNotJson) {
  edit_file(index_path(), [](std::string& t) { t.resize(t.size() / 2); });
  expect_error({index_path(), "is not valid JSON"});
}
TEST_F(Malformed, WrongFormatVersion) {
  edit_index([](json& j) { j["version"] = 2; });
  expect_error({index_path(), "format version 2; this Kiln reads version 1"});
}
TEST_F(Malformed, NotAnIndex) {
  edit_index([](json& j) { j["format"] = "something.else"; });
  expect_error({"is not a Kiln sharded checkpoint index"});
}
TEST_F(Malformed, DuplicateKey) {
  edit_file(index_path(), [](std::string& t) { t.insert(1, "\"world_size\": 1, "); });
  expect_error({"has the key 'world_size' twice"});
}
TEST_F(Malformed, MissingAndUnknownKeys) {
  edit_index([](json& j) { j["tensors"]["w"].erase("dtype"); });
  expect_error({"tensor 'w'", "lacks 'dtype'"});
  edit_index([](json& j) {
    j["tensors"]["w"]["dtype"] = "float32";
    j["tensors"]["w"]["extra"] = 1;
  });
  expect_error({"tensor 'w'", "unknown key 'extra'"});
}
TEST_F(Malformed, UnknownDtypeAndBadPlacement) {
  edit_index([](json& j) { j["tensors"]["w"]["dtype"] = "float128"; });
  expect_error({"tensor 'w'", "unknown dtype \"float128\""});
  edit_index([](json& j) {
    j["tensors"]["w"]["dtype"] = "float32";
    j["tensors"]["w"]["placements"][0] = "S(2)";
  });
  expect_error({"tensor 'w'", "bad placement \"S(2)\""});
}
TEST_F(Malformed, MeshDoesNotHoldTheWorld) {
  edit_index([](json& j) { j["tensors"]["w"]["mesh"]["shape"] = {7}; });
  expect_error({"tensor 'w'", "mesh shape [7] does not hold the"});
}
TEST_F(Malformed, PieceOutsideTheTensor) {
  edit_index([](json& j) {
    j["tensors"]["w"]["pieces"][0]["offset"] = {4, 0};
    j["tensors"]["w"]["pieces"][0]["shape"] = {2, 7};
  });
  expect_error({"tensor 'w'", "reaches outside the tensor's shape [5, 7]"});
}
// Pieces of w that the grid check refuses before any file is read.
json pieces(const std::vector<std::pair<Shape, Shape>>& boxes) {
  json out = json::array();
  for (size_t i = 0; i < boxes.size(); ++i)
    out.push_back(
        {{"file", "rank0.safetensors"},
         {"key", fmt::format("p{}", i)},
         {"offset", std::vector<int64_t>(boxes[i].first.begin(), boxes[i].first.end())},
         {"shape", std::vector<int64_t>(boxes[i].second.begin(), boxes[i].second.end())}});
  return out;
}
TEST_F(Malformed, OverlappingPieces) {
  edit_index([](json& j) {
    j["tensors"]["w"]["pieces"] = pieces({{{0, 0}, {3, 7}}, {{2, 0}, {3, 7}}});
  });
  expect_error({"tensor 'w'", "pieces overlap along dim 0"});
}
TEST_F(Malformed, MissingPieces) {
  edit_index([](json& j) {
    j["tensors"]["w"]["pieces"] = pieces({{{0, 0}, {2, 7}}, {{3, 0}, {2, 7}}});
  });
  expect_error({"tensor 'w'", "[2, 3) of dim 0 is in no piece"});
  edit_index([](json& j) {
    j["tensors"]["w"]["pieces"] = pieces({{{0, 0}, {2, 3}}, {{0, 3}, {2, 4}}, {{2, 0}, {3, 3}}});
  });
  expect_error({"tensor 'w'", "has 3 pieces where its grid of intervals needs 4"});
  edit_index([](json& j) { j["tensors"]["w"]["pieces"] = json::array(); });
  expect_error({"tensor 'w'", "has no pieces"});
}
TEST_F(Malformed, DuplicatePieces) {
  edit_index([](json& j) {
    j["tensors"]["w"]["pieces"] = pieces({{{0, 0}, {5, 7}}, {{0, 0}, {5, 7}}});
  });
  expect_error({"tensor 'w'", "two pieces start at offset [0, 0]"});
}
TEST_F(Malformed, PieceFileOutsideTheDirectory) {
  edit_index([](json& j) { j["tensors"]["w"]["pieces"][0]["file"] = "../rank0.safetensors"; });
  expect_error({"tensor 'w'", "not a plain file name"});
}
TEST_F(Malformed, MissingShardFile) {
  const std::string file = last_w_file();
  if (dist::rank() == 0) fs::remove(file);
  dist::barrier();
  expect_error({"'" + file + "' (tensor 'w')", "cannot open"});
}
TEST_F(Malformed, TruncatedShardFile) {
  const std::string file = last_w_file();
  edit_file(file, [](std::string& t) { t.resize(t.size() - 5); });
  expect_error({"'" + file + "' (tensor 'w')", "[load_safetensors]"});
}
TEST_F(Malformed, IndexPointsAtNoPiece) {
  edit_index([](json& j) { j["tensors"]["w"]["pieces"].back()["key"] = "w#9"; });
  expect_error({"(tensor 'w')", "holds no piece 'w#9'"});
}
// Rank 0's target rows come from rank 0's file alone; the last writing rank's piece is gone: every
// rank raises that rank's error, and rank 0 writes no target although it read all of its own.
TEST_F(Malformed, OneRankFailingFailsEveryRank) {
  edit_index([](json& j) { j["tensors"]["w"]["pieces"].back()["key"] = "w#9"; });
  const int last = dist::world_size() >= 4 ? 2 : dist::world_size() - 1;
  expect_error({"holds no piece 'w#9'",
                dist::world_size() > 1 ? fmt::format("(on rank {})", last) : std::string()},
               kFloat32, {5, 7}, "w", Shard(0));
}
TEST_F(Malformed, PieceDtypeDiffersFromTheIndex) {
  edit_index([](json& j) { j["tensors"]["w"]["dtype"] = "float64"; });
  expect_error({"(tensor 'w')", "is float32 [", "but the index says float64"}, kFloat64);
}
TEST_F(Malformed, PieceShapeDiffersFromTheIndex) {
  // The file itself is valid safetensors from the same save; only the piece's shape is off.
  const std::string file = last_w_file();
  if (dist::rank() == 0) {
    std::map<std::string, std::string> md;
    StateDict sd = io::load_safetensors(file, &md);
    for (auto& [n, t] : sd)
      if (n.rfind("w#", 0) == 0) t = zeros({1, 1}, kFloat32, Device(kCPU));
    io::save_safetensors(sd, file, md);
  }
  dist::barrier();
  expect_error({"'" + file + "' (tensor 'w')",
                "is float32 [1, 1] in the file, but the index says float32 ["});
}
TEST_F(Malformed, FilesOfAnotherSave) {
  edit_index([](json& j) { j["save_id"] = "0123"; });
  expect_error({"(tensor 'w')", "belongs to another save", "'0123'"});
}
TEST_F(Malformed, TargetsThatDoNotMatch) {
  expect_error(
      {"(tensor 'w')", "the checkpoint holds float32 [5, 7], the target is float64 [5, 7]"},
      kFloat64);
  expect_error(
      {"(tensor 'w')", "the checkpoint holds float32 [5, 7], the target is float32 [5, 8]"},
      kFloat32, {5, 8});
  expect_error({"has no tensor 'v'"}, kFloat32, {5, 7}, "v");
}

// The piecewise reader under load_sharded (kiln/io/safetensors.h), on this rank's own file.
TEST(SafetensorsReader, ReadsSingleTensorsAndRefusesWhatLoadSafetensorsRefuses) {
  const std::string path = (fs::temp_directory_path() /
                            fmt::format("kiln_reader_{}_{}.safetensors", ::getpid(), dist::rank()))
                               .string();
  Tensor a = global_tensor({2, 3}, kFloat32, Device(kCPU)),
         b = global_tensor({4}, kInt64, Device(kCPU), 9);
  io::save_safetensors({{"a", a}, {"b", b}}, path, {{"k", "v"}});
  {
    io::SafetensorsReader r(path);
    ASSERT_NE(r.find("b"), nullptr);
    EXPECT_EQ(r.find("b")->dtype, kInt64);
    EXPECT_EQ(r.find("b")->shape, std::vector<int64_t>{4});
    EXPECT_EQ(r.find("c"), nullptr);
    EXPECT_EQ(r.metadata().at("k"), "v");
    EXPECT_TRUE(same_bits(r.read("b"), b));
    EXPECT_TRUE(same_bits(r.read("a"), a));
    EXPECT_THROW_PREFIX(r.read("c"), ValueError,
                        "[load_safetensors] '" + path + "' holds no tensor 'c'");
  }
  fs::resize_file(path, fs::file_size(path) - 1);
  EXPECT_THROW_CONTAINS(io::SafetensorsReader{path}, ValueError, "reach past the end");
  fs::remove(path);
  EXPECT_THROW_PREFIX(io::SafetensorsReader{path}, ValueError, "[load_safetensors] cannot open");
}

TEST(ShardedCheckpointSave, BadInputWritesNothing) {
  SharedDir dir("save_errors");
  Tensor t = zeros({2}, kFloat32, Device(kCPU));
  EXPECT_THROW_PREFIX(dt::save_sharded(dir.path(), {{"a", t}, {"a", t}}), ValueError,
                      "[save_sharded] duplicate tensor name 'a'");
  EXPECT_THROW_PREFIX(dt::save_sharded(dir.path(), {{"a", Tensor()}}), ValueError,
                      "[save_sharded] tensor 'a' is undefined");
  EXPECT_THROW_CONTAINS(dt::save_sharded(dir.path(), {{"a", zeros({2}, kFloat32, Device(kMeta))}}),
                        ValueError, "is on meta");
  if (dist::world_size() > 1) {
    Tensor mine = zeros({dist::rank() == 1 ? 3 : 2}, kFloat32, Device(kCPU));
    EXPECT_THROW_PREFIX(dt::save_sharded(dir.path(), {{"a", mine}}), ValueError,
                        "[save_sharded] rank 1 saves other tensors than rank 0");
  }
  EXPECT_FALSE(fs::exists(dir.path()));
  // A directory that cannot be made: std::filesystem's error, as the component's, on every rank.
  const std::string file = dir.path() + "_file";
  if (dist::rank() == 0) std::ofstream(file) << "x";
  dist::barrier();
  EXPECT_THROW_PREFIX(dt::save_sharded(file + "/sub", {{"a", t}}), ValueError, "[save_sharded] ");
  dist::barrier();
  if (dist::rank() == 0) fs::remove(file);
}

}  // namespace
}  // namespace kiln::test
