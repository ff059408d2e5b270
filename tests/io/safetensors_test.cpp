#include "kiln/io/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::io {
namespace {

namespace fs = std::filesystem;
using Metadata = std::map<std::string, std::string>;

// Bit-exact equality: dtype, sizes and the row-major bytes (so NaN payloads count too).
::testing::AssertionResult same_tensor(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    return ::testing::AssertionFailure()
           << "dtype " << name(a.dtype()) << " vs " << name(b.dtype());
  if (!std::equal(a.sizes().begin(), a.sizes().end(), b.sizes().begin(), b.sizes().end()))
    return ::testing::AssertionFailure() << fmt::format(
               "sizes [{}] vs [{}]", fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", "));
  Tensor ca = a.contiguous(), cb = b.contiguous();
  if (a.nbytes() > 0 && std::memcmp(ca.data_ptr(), cb.data_ptr(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << "values differ: " << a.str() << " vs " << b.str();
  return ::testing::AssertionSuccess();
}

void expect_same(const StateDict& got, const StateDict& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(same_tensor(got[i].second, want[i].second)) << got[i].first;
    EXPECT_TRUE(got[i].second.device().is_cpu());
  }
}

StateDict sorted(StateDict sd) {
  std::sort(sd.begin(), sd.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return sd;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A fresh directory per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln_io_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

// ---------------------------------------------------------------- round trips

TEST_F(SafetensorsTest, RoundTripsEveryDType) {
  StateDict sd;
  for (int i = 0; i < kNumDTypes; ++i) {
    auto dt = static_cast<DType>(i);
    Tensor t = is_floating(dt) ? randn({2, 3, 4}, nullptr, dt)
                               : arange(0, 24, 1, kInt64).reshape({2, 3, 4}).to(dt);
    sd.emplace_back(fmt::format("t_{}", name(dt)), t);
  }
  save_safetensors(sd, path("all.safetensors"));
  expect_same(load_safetensors(path("all.safetensors")), sorted(sd));
}

TEST_F(SafetensorsTest, RoundTripsScalarsAndEmptyTensors) {
  StateDict sd = {{"scalar", scalar_tensor(3.5, kFloat64)},
                  {"scalar_bool", scalar_tensor(true, kBool)},
                  {"empty_rows", empty({0, 3}, kFloat32)},
                  {"empty_cols", empty({2, 0}, kInt64)},
                  {"empty_1d", empty({0}, kUInt8)}};
  save_safetensors(sd, path("small.safetensors"));
  expect_same(load_safetensors(path("small.safetensors")), sorted(sd));
}

TEST_F(SafetensorsTest, RoundTripsAnEmptyStateDict) {
  save_safetensors({}, path("none.safetensors"));
  std::vector<uint8_t> bytes = read_bytes(path("none.safetensors"));
  EXPECT_EQ(bytes.size(), 16u);  // 8-byte length, then "{}" padded to 8
  EXPECT_TRUE(load_safetensors(path("none.safetensors")).empty());
}

TEST_F(SafetensorsTest, WritesNonContiguousTensorsInRowMajorOrder) {
  Tensor base = arange(0, 24, 1, kFloat32).reshape({4, 6});
  StateDict sd = {{"transposed", transpose(base, 0, 1)},
                  {"strided", slice(base, 1, 0, 6, 2)},
                  {"expanded", expand(arange(0, 3, 1, kInt32).reshape({3, 1}), {3, 5})},
                  {"offset", select(base, 0, 2)}};
  save_safetensors(sd, path("views.safetensors"));
  StateDict got = load_safetensors(path("views.safetensors"));
  expect_same(got, sorted(sd));
  for (const auto& [n, t] : got) EXPECT_TRUE(t.is_contiguous()) << n;
}

TEST_F(SafetensorsTest, RoundTripsMetadata) {
  Metadata md = {{"format", "pt"}, {"note", "ünïcode ✓"}, {"empty", ""}};
  save_safetensors({{"w", ones({2})}}, path("md.safetensors"), md);
  Metadata got = {{"stale", "entry"}};
  load_safetensors(path("md.safetensors"), &got);
  EXPECT_EQ(got, md);
}

TEST_F(SafetensorsTest, LoadsTheSameFromBytesAndFromFile) {
  StateDict sd = {{"b", randn({3})}, {"a", arange(0, 5, 1, kInt64)}};
  save_safetensors(sd, path("x.safetensors"));
  std::vector<uint8_t> bytes = read_bytes(path("x.safetensors"));
  expect_same(load_safetensors_bytes(bytes), load_safetensors(path("x.safetensors")));
}

TEST_F(SafetensorsTest, OverwritesAndLeavesNoTemporaryFiles) {
  save_safetensors({{"a", ones({2})}}, path("x.safetensors"));
  save_safetensors({{"b", zeros({3})}}, path("x.safetensors"));
  EXPECT_EQ(files(), std::vector<std::string>{"x.safetensors"});
  StateDict got = load_safetensors(path("x.safetensors"));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, "b");
}

// ---------------------------------------------------------------- save errors

void expect_save_error(const StateDict& sd, const std::string& path, const std::string& what,
                       const Metadata& md = {}) {
  try {
    save_safetensors(sd, path, md);
    ADD_FAILURE() << "no error; expected one containing: " << what;
  } catch (const ValueError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[save_safetensors]", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST_F(SafetensorsTest, SaveRejectsBadNamesAndTensorsWithoutTouchingTheFile) {
  save_safetensors({{"old", ones({1})}}, path("x.safetensors"));
  std::vector<uint8_t> before = read_bytes(path("x.safetensors"));
  std::string p = path("x.safetensors");
  expect_save_error({{"a", ones({1})}, {"a", ones({1})}}, p, "duplicate tensor name 'a'");
  expect_save_error({{"", ones({1})}}, p, "tensor 0 has an empty name");
  expect_save_error({{"a", Tensor()}}, p, "tensor 'a' is undefined");
  expect_save_error({{"__metadata__", ones({1})}}, p, "reserved for metadata");
  expect_save_error({{"m", empty({2}, kFloat32, Device("meta"))}}, p, "is on meta");
  expect_save_error({{"bad\xff", ones({1})}}, p, "tensor name 'bad");
  expect_save_error({{"a", ones({1})}}, p, "metadata value", {{"k", "\xc3"}});
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(files(), std::vector<std::string>{"x.safetensors"});
}

TEST_F(SafetensorsTest, FailedSaveLeavesNoFile) {
  std::string p = path("missing_dir/x.safetensors");
  expect_save_error({{"a", ones({1})}}, p, "cannot create a temporary file beside");
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(files().empty());
}

// ---------------------------------------------------------------- malformed files

// A file: the 8-byte length (N = header's size unless given), the header, then the data.
std::vector<uint8_t> file_bytes(const std::string& header, size_t data_bytes = 0,
                                std::optional<uint64_t> length = {}) {
  uint64_t n = length.value_or(header.size());
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                  const std::string& offsets) {
  return fmt::format(R"("{}": {{"dtype": "{}", "shape": {}, "data_offsets": {}}})", name, dtype,
                     shape, offsets);
}
// A header of the given entries.
std::string header(const std::vector<std::string>& entries) {
  return fmt::format("{{{}}}", fmt::join(entries, ", "));
}

void expect_load_error(const std::vector<uint8_t>& bytes, const std::string& what) {
  Metadata md = {{"keep", "me"}};
  try {
    load_safetensors_bytes(bytes, &md);
    ADD_FAILURE() << "no error; expected one containing: " << what;
  } catch (const ValueError& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[load_safetensors]", 0), 0u) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
  EXPECT_EQ(md, (Metadata{{"keep", "me"}})) << "a failed load must not write the metadata";
}

TEST(SafetensorsMalformed, FileShorterThan8Bytes) {
  expect_load_error({}, "file is 0 bytes, shorter than the 8-byte header length");
  expect_load_error({1, 2, 3}, "file is 3 bytes");
}

TEST(SafetensorsMalformed, HeaderLengthOverTheLimit) {
  expect_load_error(file_bytes("{}", 0, 100'000'001), "header length 100000001 exceeds the");
  expect_load_error(file_bytes("{}", 0, ~uint64_t{0}), "exceeds the 100000000-byte limit");
}

TEST(SafetensorsMalformed, HeaderLengthPastTheEndOfTheFile) {
  expect_load_error(file_bytes("{}", 4, 64), "header length 64 exceeds the 6 bytes that follow it");
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  expect_load_error(file_bytes(R"({"a": )"), "header is not valid JSON");
  expect_load_error(file_bytes("{} trailing"), "header is not valid JSON");
  expect_load_error(file_bytes("{\"\xff\": 1}"), "header is not valid JSON");  // not UTF-8
  expect_load_error(file_bytes(""), "header is not valid JSON");
}

TEST(SafetensorsMalformed, TopLevelNotAnObject) {
  expect_load_error(file_bytes("[1, 2]"), "header must be a JSON object, got [1,2]");
  expect_load_error(file_bytes("7"), "header must be a JSON object");
}

TEST(SafetensorsMalformed, DeepNesting) {
  std::string deep = R"({"a": )" + std::string(100, '[') + std::string(100, ']') + "}";
  expect_load_error(file_bytes(deep), "header nests deeper than");
}

TEST(SafetensorsMalformed, EntryNotAnObject) {
  expect_load_error(file_bytes(R"({"a": 3})"), "entry 'a' must be an object, got 3");
  expect_load_error(file_bytes(R"({"a": [1]})"), "entry 'a' must be an object");
}

TEST(SafetensorsMalformed, UnknownOrMissingKeys) {
  expect_load_error(
      file_bytes(R"({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], "x": 1}})", 4),
      "entry 'a' has unknown key 'x'");
  expect_load_error(file_bytes(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4),
                    "entry 'a' lacks 'shape'");
}

TEST(SafetensorsMalformed, EmptyName) {
  expect_load_error(file_bytes(header({entry("", "F32", "[]", "[0, 4]")}), 4),
                    "a tensor has an empty name");
}

TEST(SafetensorsMalformed, UnsupportedDType) {
  for (std::string dt : {"I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "f32", ""})
    expect_load_error(file_bytes(header({entry("a", dt, "[1]", "[0, 1]")}), 1),
                      fmt::format("tensor 'a' has unsupported dtype \"{}\"", dt));
  expect_load_error(file_bytes(R"({"a": {"dtype": 4, "shape": [], "data_offsets": [0, 4]}})", 4),
                    "tensor 'a': dtype must be a string, got 4");
}

TEST(SafetensorsMalformed, ShapeNotNonNegativeIntegers) {
  for (std::string shape :
       {"[-1]", "[1.5]", "[\"2\"]", "3", "[[2]]", "null", "[9223372036854775808]"})
    expect_load_error(file_bytes(header({entry("a", "F32", shape, "[0, 0]")})),
                      "tensor 'a': shape must be an array of non-negative integers below 2^63");
}

TEST(SafetensorsMalformed, NumelOverflow) {
  expect_load_error(file_bytes(header({entry("a", "F32", "[4294967296, 4294967296]", "[0, 0]")})),
                    "tensor 'a': shape [4294967296,4294967296] has too many elements");
  // Empty, yet its strides would overflow int64.
  expect_load_error(
      file_bytes(header({entry("a", "F32", "[0, 4611686018427387904, 4]", "[0, 0]")})),
      "has too many elements");
  // numel fits int64 but numel * itemsize does not fit uint64.
  expect_load_error(file_bytes(header({entry("a", "F64", "[4611686018427387904]", "[0, 0]")})),
                    "is too large");
}

TEST(SafetensorsMalformed, DataOffsetsNotTwoNonNegativeIntegers) {
  for (std::string off : {"[0]", "[0, 4, 8]", "[-1, 3]", "[\"0\", 4]", "{}", "[0.0, 4]"})
    expect_load_error(
        file_bytes(header({entry("a", "F32", "[1]", off)}), 4),
        fmt::format("tensor 'a': data_offsets must be two non-negative integers below 2^63, got {}",
                    off.substr(0, 2)));
}

TEST(SafetensorsMalformed, DataOffsetsBackwards) {
  expect_load_error(file_bytes(header({entry("a", "F32", "[1]", "[8, 4]")}), 8),
                    "tensor 'a': data_offsets [8, 4] end before they begin");
}

TEST(SafetensorsMalformed, DataOffsetsPastTheDataSection) {
  expect_load_error(
      file_bytes(header({entry("a", "F32", "[2]", "[0, 8]")}), 4),
      "tensor 'a': data_offsets [0, 8] reach past the end of the 4-byte data section");
  expect_load_error(
      file_bytes(header({entry("a", "F32", "[1]", "[18446744073709551612, 18446744073709551615]")}),
                 4),
      "data_offsets must be two non-negative integers");
}

TEST(SafetensorsMalformed, DataOffsetsDisagreeWithShape) {
  expect_load_error(file_bytes(header({entry("a", "F32", "[2]", "[0, 4]")}), 4),
                    "tensor 'a': data_offsets [0, 4] span 4 bytes, but shape [2] of F32 needs 8");
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  std::string h = header({entry("a", "F32", "[2]", "[0, 8]"), entry("b", "F32", "[2]", "[4, 12]")});
  expect_load_error(file_bytes(h, 12), "tensor 'b' at [4, 12) overlaps tensor 'a' at [0, 8)");
  // Two names for the same bytes.
  h = header({entry("a", "F32", "[1]", "[0, 4]"), entry("b", "I32", "[1]", "[0, 4]")});
  expect_load_error(file_bytes(h, 4), "overlaps tensor 'a' at [0, 4)");
}

TEST(SafetensorsMalformed, HolesInTheDataSection) {
  expect_load_error(file_bytes(header({entry("a", "F32", "[1]", "[4, 8]")}), 8),
                    "bytes [0, 4) of the data section are not covered by any tensor");
  std::string h = header({entry("a", "F32", "[1]", "[0, 4]"), entry("b", "F32", "[1]", "[8, 12]")});
  expect_load_error(file_bytes(h, 12), "bytes [4, 8) of the data section are not covered");
  expect_load_error(file_bytes(header({entry("a", "F32", "[1]", "[0, 4]")}), 6),
                    "bytes [4, 6) of the data section are not covered");
  expect_load_error(file_bytes("{}", 3), "bytes [0, 3) of the data section are not covered");
}

TEST(SafetensorsMalformed, DuplicateNames) {
  std::string h = header({entry("a", "F32", "[1]", "[0, 4]"), entry("a", "F32", "[1]", "[4, 8]")});
  expect_load_error(file_bytes(h, 8), "duplicate key 'a' in header");
  expect_load_error(
      file_bytes(R"({"a": {"dtype": "F32", "dtype": "F32", "shape": [], "data_offsets": [0, 4]}})",
                 4),
      "duplicate key 'dtype' in header");
  expect_load_error(file_bytes(R"({"__metadata__": {"k": "1", "k": "2"}})"),
                    "duplicate key 'k' in header");
}

TEST(SafetensorsMalformed, MetadataNotStringToString) {
  expect_load_error(file_bytes(R"({"__metadata__": [1]})"), "__metadata__ must be an object");
  expect_load_error(file_bytes(R"({"__metadata__": null})"), "__metadata__ must be an object");
  expect_load_error(file_bytes(R"({"__metadata__": {"k": 1}})"),
                    "__metadata__ value of 'k' must be a string, got 1");
}

TEST(SafetensorsMalformed, BoolBytesOtherThanZeroOrOne) {
  expect_load_error(
      [] {
        auto b = file_bytes(header({entry("m", "BOOL", "[3]", "[0, 3]")}), 3);
        b[b.size() - 1] = 2;
        return b;
      }(),
      "tensor 'm' (BOOL) holds byte 2 at element 2; booleans must be 0 or 1");
}

TEST(SafetensorsMalformed, LongNamesAndTokensAreCutShortInMessages) {
  std::string name(10'000, 'x');
  for (std::string h : {R"({")" + name + R"(": 3})", R"({")" + name}) {  // the second: no JSON
    try {
      load_safetensors_bytes(file_bytes(h));
      ADD_FAILURE();
    } catch (const ValueError& e) {
      EXPECT_LT(std::strlen(e.what()), 400u) << e.what();
    }
  }
}

TEST_F(SafetensorsTest, FileErrors) {
  EXPECT_THROW(
      {
        try {
          load_safetensors(path("nope.safetensors"));
        } catch (const ValueError& e) {
          EXPECT_NE(std::string(e.what()).find("[load_safetensors] cannot open"),
                    std::string::npos);
          throw;
        }
      },
      ValueError);
  EXPECT_THROW(load_safetensors(dir_.string()), ValueError);  // a directory
  // A file cut short: the header promises more data than is there.
  save_safetensors({{"a", ones({16})}}, path("x.safetensors"));
  fs::resize_file(path("x.safetensors"), fs::file_size(path("x.safetensors")) - 4);
  EXPECT_THROW(load_safetensors(path("x.safetensors")), ValueError);
}

// ---------------------------------------------------------------- an independent encoder

// Mirrors KNOWN and METADATA in tests/io/make_safetensors.py.
StateDict known_tensors() {
  std::vector<float> f32;
  for (int i = 0; i < 12; ++i) f32.push_back(static_cast<float>(i) - 5.5f);
  return sorted({
      {"f32", from_vector(f32, {3, 4})},
      {"i64", from_vector(std::vector<int64_t>{-3, 0, int64_t{1} << 40, -(int64_t{1} << 62)})},
      {"mask", from_vector(std::vector<bool>{true, false, true})},
      {"f16",
       from_vector(std::vector<float>{0.5f, -1.25f, 65504.0f, 0x1p-24f}, {2, 2}).to(kFloat16)},
      {"f64", from_vector(std::vector<double>{3.141592653589793, -2.718281828459045, 1e300})},
      {"u8", from_vector(std::vector<uint8_t>{0, 255, 7})},
      {"i32", from_vector(std::vector<int32_t>{INT32_MIN, INT32_MAX})},
      {"bf16", from_vector(std::vector<float>{1.0f, -2.5f, 3.0f}).to(kBFloat16)},
      {"scalar", scalar_tensor(42.0, kFloat32)},
      {"empty", empty({0, 3}, kFloat32)},
  });
}
const Metadata kKnownMetadata = {{"format", "pt"}, {"source", "make_safetensors.py"}};

class SafetensorsInteropTest : public SafetensorsTest {
 protected:
  void SetUp() override {
    SafetensorsTest::SetUp();
    if (std::system("command -v python3 >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 not found";
  }
  int run_script(const std::string& args) {
    std::string cmd = fmt::format("python3 '{}' {}", KILN_IO_SCRIPT, args);
    return std::system(cmd.c_str());
  }
};

TEST_F(SafetensorsInteropTest, ReadsAFileWrittenByAnIndependentEncoder) {
  ASSERT_EQ(run_script("'" + path("py.safetensors") + "'"), 0);
  Metadata md;
  expect_same(load_safetensors(path("py.safetensors"), &md), known_tensors());
  EXPECT_EQ(md, kKnownMetadata);
}

TEST_F(SafetensorsInteropTest, WritesAFileAnIndependentCheckerAccepts) {
  save_safetensors(known_tensors(), path("kiln.safetensors"), kKnownMetadata);
  EXPECT_EQ(run_script("--check '" + path("kiln.safetensors") + "'"), 0);
  // The checker itself rejects a wrong file.
  StateDict wrong = known_tensors();
  wrong[0].second = ones({3}, kBFloat16);
  save_safetensors(wrong, path("wrong.safetensors"), kKnownMetadata);
  EXPECT_NE(run_script("--check '" + path("wrong.safetensors") + "' >/dev/null"), 0);
}

}  // namespace
}  // namespace kiln::io
