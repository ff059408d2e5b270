// kiln/data/idx.h and fashion_mnist.h: round trips of small IDX files, raw and gzipped, one test
// per hostile file (each a single "[idx] '<path>': ..." line), and the real Fashion-MNIST files
// when Debian's dataset-fashion-mnist package is installed.
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>

#include <gtest/gtest.h>

#include "kiln/core/error.h"
#include "kiln/data/fashion_mnist.h"
#include "kiln/data/idx.h"
#include "kiln/ops/ops.h"

namespace kiln::data {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// An IDX file's bytes: magic 00 00 <code> <ndims>, big-endian dims, then `data` as given.
Bytes idx_bytes(uint8_t code, const std::vector<uint32_t>& dims, const Bytes& data) {
  Bytes b = {0, 0, code, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

std::vector<int64_t> vec(IntArrayRef s) { return {s.begin(), s.end()}; }

Bytes iota_bytes(size_t n) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(i * 7 + 3);
  return b;
}

// A one-member gzip file of `raw` through zlib's deflate (level 9).
Bytes gzip(const Bytes& raw) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&zs, raw.size()) + 64);
  zs.next_in = const_cast<Bytef*>(raw.data());
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = out.data();
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

class Idx : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("kiln_idx_test_{}", getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const Bytes& bytes) {
    std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `f` raises one ValueError line starting "[idx] '<path>': <what>".
  static void expect_error(const std::function<void()>& f, const std::string& path,
                           const std::string& what) {
    std::string prefix = fmt::format("[idx] '{}': {}", path, what);
    try {
      f();
      ADD_FAILURE() << "no error, expected " << prefix;
    } catch (const ValueError& e) {
      std::string msg = e.what();
      EXPECT_EQ(msg.substr(0, prefix.size()), prefix) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  // Both the raw file and its gzip raise `what`.
  void expect_both(const std::string& name, const Bytes& raw, const std::string& what,
                   const IdxOptions& o = {}) {
    std::string p = write(name, raw), pz = write(name + ".gz", gzip(raw));
    expect_error([&] { read_idx(p, o); }, p, what);
    expect_error([&] { read_idx(pz, o); }, pz, what);
  }

  fs::path dir_;
};

TEST_F(Idx, RoundTripsEveryDTypeRawAndGzipped) {
  for (DType d : {kUInt8, kInt32, kFloat32, kFloat64}) {
    SCOPED_TRACE(fmt::format("{}", d));
    Tensor t = arange(-30, 30, 1, kFloat64).reshape({3, 4, 5}).to(d == kUInt8 ? kFloat64 : d);
    if (d == kUInt8) t = add(t, 30).to(kUInt8);
    std::string p = path("t.idx");
    write_idx(t, p);
    Tensor raw = read_idx(p);
    EXPECT_EQ(raw.dtype(), d);
    EXPECT_EQ(vec(raw.sizes()), vec(t.sizes()));
    EXPECT_EQ(raw.to_vector<double>(), t.to_vector<double>());
    std::ifstream in(p, std::ios::binary);
    Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Tensor z = read_idx(write("t.idx.gz", gzip(bytes)));
    EXPECT_EQ(vec(z.sizes()), vec(t.sizes()));
    EXPECT_EQ(z.to_vector<double>(), t.to_vector<double>());
  }
}

TEST_F(Idx, BigEndianOnDisk) {
  // int32 258 is 00 00 01 02 in the file.
  Tensor t = read_idx(write("i32", idx_bytes(0x0C, {2}, {0, 0, 1, 2, 0xFF, 0xFF, 0xFF, 0xFE})));
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{258, -2}));
}

TEST_F(Idx, CompressionIsDetectedByContentNotName) {
  Bytes raw = idx_bytes(0x08, {2, 3}, iota_bytes(6));
  Tensor a = read_idx(write("looks_raw.idx", gzip(raw)));
  Tensor b = read_idx(write("looks_gzipped.gz", raw));
  EXPECT_EQ(a.to_vector<int64_t>(), b.to_vector<int64_t>());
  EXPECT_EQ(vec(a.sizes()), (std::vector<int64_t>{2, 3}));
}

TEST_F(Idx, OptionsAcceptMatchingFiles) {
  Bytes raw = idx_bytes(0x08, {4, 28, 28}, iota_bytes(4 * 28 * 28));
  Tensor t = read_idx(write("images", raw), {kUInt8, {-1, 28, 28}});
  EXPECT_EQ(vec(t.sizes()), (std::vector<int64_t>{4, 28, 28}));
  EXPECT_EQ(read_idx(path("images"), {kUInt8, {4, -1, 28}}).numel(), 4 * 28 * 28);
}

TEST_F(Idx, EmptyDimsGiveAnEmptyTensor) {
  Tensor t = read_idx(write("empty", idx_bytes(0x08, {0, 28, 28}, {})));
  EXPECT_EQ(vec(t.sizes()), (std::vector<int64_t>{0, 28, 28}));
}

// ---------------------------------------------------------------- hostile files

TEST_F(Idx, MissingFileAndDirectory) {
  std::string p = path("absent");
  expect_error([&] { read_idx(p); }, p, "cannot open: No such file or directory");
  std::string d = dir_.string();
  expect_error([&] { read_idx(d); }, d, "is a directory");
}

TEST_F(Idx, BadMagic) {
  Bytes raw = idx_bytes(0x08, {1}, {5});
  raw[0] = 0x12;
  raw[1] = 0x34;
  expect_both("magic", raw, "bad magic 0x12340801: an IDX file starts 00 00 <type code> <ndims>");
  // A text file.
  expect_both("text", Bytes{'h', 'e', 'l', 'l', 'o', '\n'}, "bad magic 0x68656c6c");
}

TEST_F(Idx, UnknownTypeCode) {
  expect_both("code", idx_bytes(0x07, {1}, {5}),
              "bad magic 0x00000701: unknown type code 0x07 (IDX has 0x08 uint8");
}

TEST_F(Idx, TypeCodeWithoutAKilnDType) {
  expect_both("int8", idx_bytes(0x09, {1}, {5}),
              "magic 0x00000901: type code 0x09 (int8) has no "
              "Kiln dtype");
  expect_both("int16", idx_bytes(0x0B, {1}, {0, 5}), "magic 0x00000b01: type code 0x0b (int16)");
}

TEST_F(Idx, NDimsOutOfRange) {
  expect_both("nd0", idx_bytes(0x08, {}, {5}), "magic 0x00000800: ndims 0 is outside [1, 8]");
  expect_both("nd9", idx_bytes(0x08, std::vector<uint32_t>(9, 1), {5}),
              "magic 0x00000809: ndims 9 is outside [1, 8]");
}

TEST_F(Idx, WrongDims) {
  Bytes raw = idx_bytes(0x08, {2, 28, 27}, iota_bytes(2 * 28 * 27));
  expect_both("dims", raw, "dims [2, 28, 27] do not match the expected [*, 28, 28]",
              {kUInt8, {-1, 28, 28}});
  expect_both("ndims", idx_bytes(0x08, {2, 784}, iota_bytes(2 * 784)),
              "dims [2, 784] do not match the expected [*, 28, 28]", {kUInt8, {-1, 28, 28}});
}

TEST_F(Idx, WrongDType) {
  expect_both("f32", idx_bytes(0x0D, {1}, {0, 0, 0, 0}),
              "holds float32 (magic 0x00000d01), expected uint8", {kUInt8, {}});
}

TEST_F(Idx, TruncatedHeader) {
  expect_both("empty", {}, "truncated header: ");
  std::string p = write("h3", {0, 0, 8});
  expect_error([&] { read_idx(p); }, p, "truncated header: the file holds 3 of 4 bytes");
  // ndims 3 needs 16 header bytes; 10 are there.
  Bytes head = idx_bytes(0x08, {60000, 28, 28}, {});
  head.resize(10);
  p = write("h10", head);
  expect_error([&] { read_idx(p); }, p, "truncated header: the file holds 10 of 16 bytes");
  std::string pz = write("h10.gz", gzip(head));
  expect_error([&] { read_idx(pz); }, pz, "truncated header: the gzip stream ends after 10 of 16");
}

TEST_F(Idx, TruncatedData) {
  Bytes raw = idx_bytes(0x08, {3, 28, 28}, iota_bytes(2 * 28 * 28 + 5));
  std::string p = write("short", raw);
  expect_error([&] { read_idx(p); }, p,
               "truncated data: the header [3, 28, 28] implies 2368 bytes, the file holds 1589");
  std::string pz = write("short.gz", gzip(raw));
  expect_error([&] { read_idx(pz); }, pz,
               "truncated data: the gzip stream ends after 1589 of 2368 bytes");
  // A gzip file cut short: its deflate data stops in the middle.
  Bytes whole = gzip(idx_bytes(0x08, {100, 28, 28}, iota_bytes(100 * 28 * 28)));
  whole.resize(whole.size() / 2);
  std::string pc = write("cut.gz", whole);
  expect_error([&] { read_idx(pc); }, pc, "truncated data: the gzip stream ends after ");
  // All the data, but not the gzip trailer (CRC-32 and length) that ends the stream.
  Bytes no_trailer = gzip(idx_bytes(0x08, {4}, {1, 2, 3, 4}));
  no_trailer.resize(no_trailer.size() - 8);
  std::string pt = write("no_trailer.gz", no_trailer);
  expect_error([&] { read_idx(pt); }, pt,
               "truncated gzip stream: the data is whole but the stream's end is missing");
}

TEST_F(Idx, TrailingBytes) {
  Bytes raw = idx_bytes(0x08, {4}, {1, 2, 3, 4, 5, 6, 7});
  std::string p = write("trail", raw);
  expect_error([&] { read_idx(p); }, p, "3 trailing bytes after the 12 the header [4] implies");
  // Inside the compressed stream, extra data is the gzip-bomb case (below); after it:
  Bytes z = gzip(idx_bytes(0x08, {4}, {1, 2, 3, 4}));
  Bytes garbage = z;
  garbage.insert(garbage.end(), {0xde, 0xad, 0xbe, 0xef, 0});
  std::string pg = write("garbage.gz", garbage);
  expect_error([&] { read_idx(pg); }, pg, "5 bytes follow the end of the gzip stream");
  Bytes two = z;
  two.insert(two.end(), z.begin(), z.end());
  std::string p2 = write("two_members.gz", two);
  expect_error([&] { read_idx(p2); }, p2,
               fmt::format("{} bytes follow the end of the gzip stream", z.size()));
}

TEST_F(Idx, GzipBombIsRefusedWithoutInflatingIt) {
  // 9 bytes claimed ([1] uint8), 64 MiB of zeros in a file of about 64 KiB.
  Bytes raw = idx_bytes(0x08, {1}, Bytes(size_t{64} << 20, 0));
  Bytes bomb = gzip(raw);
  EXPECT_LT(bomb.size(), size_t{1} << 17);
  std::string p = write("bomb.gz", bomb);
  expect_error([&] { read_idx(p); }, p,
               "the gzip stream inflates to more than the 9 bytes its header implies");
}

TEST_F(Idx, HeaderClaimingTooMuchIsRefusedBeforeAllocating) {
  // [60000, 60000, 60000] uint8 is 2.16e14 bytes; the file is 16 bytes.
  expect_both("huge", idx_bytes(0x08, {60000, 60000, 60000}, {}),
              "dims [60000, 60000, 60000] of uint8 make more than max_bytes 2147483648");
  // Eight dims of 2^32 - 1 overflow int64 in a naive product.
  expect_both("overflow", idx_bytes(0x0E, std::vector<uint32_t>(8, 0xFFFFFFFF), {}),
              "dims [4294967295, 4294967295, 4294967295, 4294967295, 4294967295, 4294967295, "
              "4294967295, 4294967295] of float64 make more than max_bytes");
  // A tighter limit of the caller's.
  IdxOptions small;
  small.max_bytes = 100;
  expect_both("small", idx_bytes(0x08, {10, 10}, iota_bytes(2)),
              "dims [10, 10] of uint8 make more than max_bytes 100", small);
}

TEST_F(Idx, FileLargerThanAnyFileOfMaxBytes) {
  IdxOptions small;
  small.max_bytes = 16;
  // A gzip file of 16 decoded bytes is at most 16 + deflate's overhead + 4 KiB of gzip header.
  std::string p = write("big", idx_bytes(0x08, {5000}, iota_bytes(5000)));
  expect_error([&] { read_idx(p, small); }, p,
               "the file's 5008 bytes are more than a gzip file of max_bytes 16 can be");
}

TEST_F(Idx, CorruptGzipStream) {
  Bytes z = gzip(idx_bytes(0x08, {200, 28, 28}, iota_bytes(200 * 28 * 28)));
  Bytes bad = z;
  for (size_t i = 20; i < 40; ++i) bad[i] ^= 0x5A;  // inside the deflate data
  std::string p = write("corrupt.gz", bad);
  expect_error([&] { read_idx(p); }, p, "corrupt gzip stream after ");
  // The data inflates, but its CRC-32 in the trailer does not match.
  Bytes crc = z;
  crc[crc.size() - 8] ^= 1;
  std::string pc = write("crc.gz", crc);
  expect_error([&] { read_idx(pc); }, pc,
               "corrupt gzip stream after 156816 decoded bytes: "
               "incorrect data check");
  // A gzip header with a bad compression method.
  Bytes method = z;
  method[2] = 7;
  std::string pm = write("method.gz", method);
  expect_error([&] { read_idx(pm); }, pm, "corrupt gzip stream after 0 decoded bytes: ");
}

TEST_F(Idx, MaxBytesMustBePositive) {
  IdxOptions o;
  o.max_bytes = 0;
  EXPECT_THROW(read_idx(write("x", idx_bytes(0x08, {1}, {1})), o), ValueError);
}

// ---------------------------------------------------------------- labelled pairs

TEST_F(Idx, LabelledPair) {
  std::string img = write("img", idx_bytes(0x08, {3, 2, 2}, iota_bytes(12)));
  std::string lbl = write("lbl.gz", gzip(idx_bytes(0x08, {3}, {9, 0, 4})));
  LabelledSet s = load_labelled_idx(img, lbl, {-1, 2, 2}, 10);
  EXPECT_EQ(s.size(), 3);
  EXPECT_EQ(s.inputs.dtype(), kUInt8);
  EXPECT_EQ(s.labels.dtype(), kInt64);
  EXPECT_EQ(s.labels.to_vector<int64_t>(), (std::vector<int64_t>{9, 0, 4}));
}

TEST_F(Idx, LabelledPairCountsMustAgree) {
  std::string img = write("img", idx_bytes(0x08, {3, 2, 2}, iota_bytes(12)));
  std::string lbl = write("lbl", idx_bytes(0x08, {4}, {1, 2, 3, 4}));
  try {
    load_labelled_idx(img, lbl, {-1, 2, 2});
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()),
              fmt::format("[idx] '{}' holds 3 samples but '{}' holds 4 labels", img, lbl));
  }
}

TEST_F(Idx, LabelledPairChecksLabelsAndKinds) {
  std::string img = write("img", idx_bytes(0x08, {3, 2, 2}, iota_bytes(12)));
  std::string lbl = write("lbl", idx_bytes(0x08, {3}, {1, 12, 3}));
  expect_error(
      [&] {
        load_labelled_idx(img, lbl, {-1, 2, 2}, 10);
      },
      lbl, "label 12 at index 1 is outside [0, 10)");
  // Labels must be 1-D uint8, inputs of the given dims.
  std::string lbl2 = write("lbl2", idx_bytes(0x08, {3, 1}, {1, 2, 3}));
  expect_error(
      [&] {
        load_labelled_idx(img, lbl2, {-1, 2, 2});
      },
      lbl2, "dims [3, 1] do not match the expected [*]");
  expect_error(
      [&] {
        load_labelled_idx(img, lbl, {-1, 28, 28});
      },
      img, "dims [3, 2, 2] do not match the expected [*, 28, 28]");
}

// ---------------------------------------------------------------- Fashion-MNIST

TEST(FashionMnist, MissingDirectoryNamesThePackage) {
  try {
    load_fashion_mnist("/nonexistent/fashion-mnist");
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_EQ(std::string(e.what()),
              "[fashion_mnist] '/nonexistent/fashion-mnist' is not a directory: Debian's "
              "dataset-fashion-mnist package installs the data set in "
              "/usr/share/datasets/fashion-mnist");
  }
}

// The real files, when Debian's dataset-fashion-mnist package is installed.
TEST(FashionMnist, RealFiles) {
  if (!fs::is_directory(kFashionMnistDir))
    GTEST_SKIP() << kFashionMnistDir << " is absent (Debian's dataset-fashion-mnist package)";
  FashionMnist d = load_fashion_mnist();
  EXPECT_EQ(vec(d.train.inputs.sizes()), (std::vector<int64_t>{60000, 28, 28}));
  EXPECT_EQ(vec(d.train.labels.sizes()), (std::vector<int64_t>{60000}));
  EXPECT_EQ(vec(d.test.inputs.sizes()), (std::vector<int64_t>{10000, 28, 28}));
  EXPECT_EQ(vec(d.test.labels.sizes()), (std::vector<int64_t>{10000}));
  // Balanced classes: 6,000 training and 1,000 test images of each.
  for (auto [set, per_class] : {std::pair{&d.train, 6000}, std::pair{&d.test, 1000}}) {
    std::vector<int64_t> count(10, 0);
    for (int64_t l : set->labels.to_vector<int64_t>()) {
      ASSERT_GE(l, 0);
      ASSERT_LT(l, 10);
      ++count[static_cast<size_t>(l)];
    }
    EXPECT_EQ(count, std::vector<int64_t>(10, per_class));
  }
  std::vector<int64_t> labels = d.train.labels.to_vector<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(labels.begin(), labels.begin() + 10),
            (std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}));
  // The training pixels' sum, counted independently (Python's gzip module): 3,431,114,169 over
  // 47,040,000 pixels, mean 72.940/255 = 0.28604 and standard deviation 0.35302 of x / 255, the
  // values tutorials pass to torchvision's Normalize for Fashion-MNIST (0.2860, 0.3530).
  const uint8_t* px = d.train.inputs.data<uint8_t>();
  int64_t n = d.train.inputs.numel();
  int64_t sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += px[i], sum_sq += int64_t{px[i]} * px[i];
  EXPECT_EQ(sum, 3431114169);
  double mean = static_cast<double>(sum) / static_cast<double>(n) / 255;
  double var = static_cast<double>(sum_sq) / static_cast<double>(n) / (255.0 * 255.0) - mean * mean;
  EXPECT_NEAR(mean, 0.2860, 5e-5);
  EXPECT_NEAR(std::sqrt(var), 0.3530, 5e-5);
  EXPECT_NEAR(mean, kFashionMnistMean, 1e-7);
  EXPECT_NEAR(std::sqrt(var), kFashionMnistStd, 1e-7);
}

}  // namespace
}  // namespace kiln::data
