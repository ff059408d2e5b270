#include "kiln/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::data {

// Note [IDX files]
// An IDX file (LeCun's MNIST format) is a 4-byte magic, 0x00 0x00 <type code> <ndims>, then
// ndims big-endian uint32 dims, then prod(dims) elements of the type, big-endian, row-major.
// Fashion-MNIST ships its files gzip-compressed (train-images-idx3-ubyte.gz is 0x00000803: uint8,
// 3 dims [60000, 28, 28]); labels are 0x00000801 [60000].
//
// Files are hostile. The reader decodes the header first (at most 4 + 4 * 8 bytes, from the raw
// file or the first bytes the gzip stream inflates to), validates it (magic, type code, ndims,
// the caller's dtype and dims), and computes the exact decoded size from it, checked against
// IdxOptions::max_bytes with overflow-safe arithmetic, before allocating anything. A raw file's
// size must then be exactly that (fstat, before allocating). A gzip stream is inflated in
// chunks straight into the tensor and never past the size the header implies: one more byte of
// output is a "gzip bomb" error (a small file that inflates to far more than it claims never
// gets to allocate or write it), a stream that ends early is truncated, and anything after the
// stream's end (a second member, garbage) is an error too. zlib checks the gzip trailer's CRC-32
// and length. The file on disk may not be larger than a gzip of max_bytes could be.

namespace {

constexpr int kMaxDims = 8;
constexpr size_t kChunk = size_t{1} << 16;

struct TypeCode {
  uint8_t code;
  const char* name;
  std::optional<DType> dtype;  // unset: Kiln has no such dtype
};
constexpr std::array<TypeCode, 6> kTypeCodes = {{
    {0x08, "uint8", kUInt8},
    {0x09, "int8", std::nullopt},
    {0x0B, "int16", std::nullopt},
    {0x0C, "int32", kInt32},
    {0x0D, "float32", kFloat32},
    {0x0E, "float64", kFloat64},
}};

const TypeCode* find_type_code(uint8_t code) {
  for (const TypeCode& t : kTypeCodes)
    if (t.code == code) return &t;
  return nullptr;
}
const TypeCode* find_type_code(DType d) {
  for (const TypeCode& t : kTypeCodes)
    if (t.dtype == d) return &t;
  return nullptr;
}

template <class... Args>
[[noreturn]] void fail(const std::string& path, fmt::format_string<Args...> what, Args&&... args) {
  KILN_THROW(Value, "[idx] '{}': {}", path, fmt::format(what, std::forward<Args>(args)...));
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i] < 0 ? std::string("*") : std::to_string(dims[i]);
  }
  return s + "]";
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// The decoded bytes of a file, raw or inflated; read() returns fewer than asked only at the end.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual size_t read(uint8_t* dst, size_t n) = 0;
  // After the data: raises unless nothing at all follows it.
  virtual void expect_end(int64_t decoded) = 0;
};

class RawSource : public ByteSource {
 public:
  RawSource(std::FILE* f, const std::string& path) : f_(f), path_(path) {}
  size_t read(uint8_t* dst, size_t n) override {
    size_t got = std::fread(dst, 1, n, f_);
    if (got < n && std::ferror(f_)) fail(path_, "read failed: {}", std::strerror(errno));
    return got;
  }
  void expect_end(int64_t decoded) override {
    uint8_t extra[kChunk];
    int64_t n = 0;
    while (size_t got = read(extra, sizeof extra)) n += static_cast<int64_t>(got);
    if (n) fail(path_, "{} trailing bytes after the {} the header implies", n, decoded);
  }

 private:
  std::FILE* f_;
  const std::string& path_;
};

class GzipSource : public ByteSource {
 public:
  GzipSource(std::FILE* f, const std::string& path) : f_(f), path_(path), in_(kChunk) {
    // 16 + MAX_WBITS: a gzip wrapper only (no zlib or raw deflate).
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK)
      fail(path_, "cannot start inflating: {}", zs_.msg ? zs_.msg : "out of memory");
  }
  ~GzipSource() override { inflateEnd(&zs_); }

  size_t read(uint8_t* dst, size_t n) override {
    zs_.next_out = dst;
    zs_.avail_out = static_cast<uInt>(n);
    while (zs_.avail_out > 0 && !ended_) {
      // At the file's end inflate still runs: it may hold output it had no room for.
      if (zs_.avail_in == 0 && !eof_) refill();
      int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        ended_ = true;
      } else if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
        fail(path_, "corrupt gzip stream after {} decoded bytes: {}", zs_.total_out,
             zs_.msg ? zs_.msg : "invalid data");
      } else if (rc == Z_MEM_ERROR) {
        fail(path_, "out of memory while inflating");
      } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0 && eof_) {
        break;  // no input left and nothing pending: the stream is cut short
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail(path_, "inflate failed with zlib error {}", rc);
      }
    }
    return n - zs_.avail_out;
  }

  void expect_end(int64_t decoded) override {
    // One more byte of output means the stream holds more than the header implies.
    uint8_t extra;
    if (read(&extra, 1))
      fail(path_, "the gzip stream inflates to more than the {} bytes its header implies", decoded);
    if (!ended_)
      fail(path_, "truncated gzip stream: the data is whole but the stream's end is missing");
    int64_t after = zs_.avail_in;
    zs_.avail_in = 0;
    while (!eof_ && refill()) after += zs_.avail_in, zs_.avail_in = 0;
    if (after) fail(path_, "{} bytes follow the end of the gzip stream", after);
  }

 private:
  bool refill() {
    size_t got = std::fread(in_.data(), 1, in_.size(), f_);
    if (got == 0 && std::ferror(f_)) fail(path_, "read failed: {}", std::strerror(errno));
    zs_.next_in = in_.data();
    zs_.avail_in = static_cast<uInt>(got);
    eof_ = got == 0;
    return got > 0;
  }

  std::FILE* f_;
  const std::string& path_;
  std::vector<Bytef> in_;
  z_stream zs_{};
  bool ended_ = false;
  bool eof_ = false;
};

uint32_t be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

// Reads exactly n bytes or reports what the header implied and what came.
void read_exact(ByteSource& src, uint8_t* dst, size_t n, int64_t done, int64_t total,
                const std::string& path, bool gz, const char* what) {
  size_t got = src.read(dst, n);
  if (got == n) return;
  int64_t have = done + static_cast<int64_t>(got);
  if (gz) fail(path, "truncated {}: the gzip stream ends after {} of {} bytes", what, have, total);
  fail(path, "truncated {}: the file holds {} of {} bytes", what, have, total);
}

// The largest gzip file of `bytes` decoded: deflate's bound, plus the gzip wrapper with room
// for its optional name and comment fields.
int64_t max_file_bytes(int64_t bytes) {
  return static_cast<int64_t>(compressBound(static_cast<uLong>(bytes))) + 4096;
}

}  // namespace

Tensor read_idx(const std::string& path, const IdxOptions& options) {
  KILN_CHECK(options.max_bytes > 0, "[idx] max_bytes must be positive, got {}", options.max_bytes);
  FilePtr file(std::fopen(path.c_str(), "rb"));
  if (!file) fail(path, "cannot open: {}", std::strerror(errno));
  struct stat st {};
  if (fstat(fileno(file.get()), &st) != 0) fail(path, "cannot stat: {}", std::strerror(errno));
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory");
  bool regular = S_ISREG(st.st_mode);
  int64_t file_bytes = regular ? static_cast<int64_t>(st.st_size) : -1;
  if (regular && file_bytes > max_file_bytes(options.max_bytes))
    fail(path, "the file's {} bytes are more than a gzip file of max_bytes {} can be", file_bytes,
         options.max_bytes);

  // Compressed or not, by content: gzip's magic 1f 8b cannot start an IDX file (00 00).
  uint8_t sniff[2] = {0, 0};
  size_t sniffed = std::fread(sniff, 1, 2, file.get());
  bool gz = sniffed == 2 && sniff[0] == 0x1f && sniff[1] == 0x8b;
  std::rewind(file.get());
  std::unique_ptr<ByteSource> src;
  if (gz)
    src = std::make_unique<GzipSource>(file.get(), path);
  else
    src = std::make_unique<RawSource>(file.get(), path);

  // See Note [IDX files]: the header first, validated before anything is allocated.
  uint8_t head[4 + 4 * kMaxDims];
  read_exact(*src, head, 4, 0, 4, path, gz, "header");
  uint32_t magic = be32(head);
  if (head[0] != 0 || head[1] != 0)
    fail(path,
         "bad magic 0x{:08x}: an IDX file starts 00 00 <type code> <ndims> "
         "(0x00000803 for uint8 images, 0x00000801 for labels)",
         magic);
  const TypeCode* type = find_type_code(head[2]);
  if (!type)
    fail(path,
         "bad magic 0x{:08x}: unknown type code 0x{:02x} (IDX has 0x08 uint8, 0x09 int8, "
         "0x0b int16, 0x0c int32, 0x0d float32, 0x0e float64)",
         magic, head[2]);
  if (!type->dtype)
    fail(path, "magic 0x{:08x}: type code 0x{:02x} ({}) has no Kiln dtype", magic, head[2],
         type->name);
  int ndims = head[3];
  if (ndims < 1 || ndims > kMaxDims)
    fail(path, "magic 0x{:08x}: ndims {} is outside [1, {}]", magic, ndims, kMaxDims);
  int64_t head_bytes = 4 + 4 * int64_t{ndims};
  read_exact(*src, head + 4, 4 * static_cast<size_t>(ndims), 4, head_bytes, path, gz, "header");
  std::vector<int64_t> dims(static_cast<size_t>(ndims));
  for (int i = 0; i < ndims; ++i) dims[static_cast<size_t>(i)] = be32(head + 4 + 4 * i);

  DType dtype = *type->dtype;
  if (options.dtype && *options.dtype != dtype)
    fail(path, "holds {} (magic 0x{:08x}), expected {}", dtype, magic, *options.dtype);
  if (!options.dims.empty()) {
    bool ok = options.dims.size() == dims.size();
    for (size_t i = 0; ok && i < dims.size(); ++i)
      ok = options.dims[i] < 0 || options.dims[i] == dims[i];
    if (!ok)
      fail(path, "dims {} do not match the expected {}", dims_str(dims), dims_str(options.dims));
  }
  // Each dim is below 2^32 and there are at most 8: the product is checked step by step.
  int64_t data_bytes = static_cast<int64_t>(kiln::itemsize(dtype));
  for (int64_t d : dims) {
    if (d != 0 && data_bytes > (options.max_bytes - head_bytes) / d)
      fail(path, "dims {} of {} make more than max_bytes {}", dims_str(dims), dtype,
           options.max_bytes);
    data_bytes *= d;
  }
  if (data_bytes > options.max_bytes - head_bytes)
    fail(path, "dims {} of {} make more than max_bytes {}", dims_str(dims), dtype,
         options.max_bytes);
  int64_t total = head_bytes + data_bytes;
  if (!gz && regular && file_bytes < total)
    fail(path, "truncated data: the header {} implies {} bytes, the file holds {}", dims_str(dims),
         total, file_bytes);
  if (!gz && regular && file_bytes > total)
    fail(path, "{} trailing bytes after the {} the header {} implies", file_bytes - total, total,
         dims_str(dims));

  Tensor out = empty(dims, dtype, Device(kCPU));
  auto* data = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t done = 0; done < data_bytes;) {
    size_t n = static_cast<size_t>(std::min<int64_t>(data_bytes - done, int64_t{1} << 30));
    read_exact(*src, data + done, n, head_bytes + done, total, path, gz, "data");
    done += static_cast<int64_t>(n);
  }
  src->expect_end(total);

  size_t item = kiln::itemsize(dtype);
  if (item == 4) {
    auto* p = reinterpret_cast<uint32_t*>(data);
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = __builtin_bswap32(p[i]);
  } else if (item == 8) {
    auto* p = reinterpret_cast<uint64_t*>(data);
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = __builtin_bswap64(p[i]);
  }
  return out;
}

void write_idx(const Tensor& t, const std::string& path) {
  KILN_CHECK(t.defined() && t.device() == Device(kCPU), "[idx] write_idx takes a cpu tensor");
  const TypeCode* type = find_type_code(t.dtype());
  KILN_CHECK(type, "[idx] write_idx: IDX has no type for {}", t.dtype());
  KILN_CHECK(t.dim() >= 1 && t.dim() <= kMaxDims, "[idx] write_idx: {} dims, IDX takes 1 to {}",
             t.dim(), kMaxDims);
  for (int64_t d : t.sizes())
    KILN_CHECK(d <= std::numeric_limits<uint32_t>::max(), "[idx] write_idx: dim {} is over 2^32",
               d);
  std::vector<uint8_t> bytes;
  auto put32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<uint8_t>(v >> s));
  };
  put32(uint32_t{type->code} << 8 | static_cast<uint32_t>(t.dim()));
  for (int64_t d : t.sizes()) put32(static_cast<uint32_t>(d));
  Tensor c = t.contiguous();
  size_t head = bytes.size(), item = kiln::itemsize(t.dtype());
  bytes.resize(head + c.nbytes());
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  // Big endian: each element's bytes reversed.
  for (size_t i = 0; i < c.nbytes(); ++i) bytes[head + i] = p[i - i % item + (item - 1 - i % item)];
  FilePtr f(std::fopen(path.c_str(), "wb"));
  KILN_CHECK(f, "[idx] '{}': cannot create: {}", path, std::strerror(errno));
  KILN_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f.get()) == bytes.size() &&
                 std::fflush(f.get()) == 0,
             "[idx] '{}': write failed: {}", path, std::strerror(errno));
}

LabelledSet load_labelled_idx(const std::string& inputs_path, const std::string& labels_path,
                              const std::vector<int64_t>& input_dims, int64_t num_classes,
                              int64_t max_bytes) {
  IdxOptions in_opts{kUInt8, input_dims, max_bytes};
  IdxOptions label_opts{kUInt8, {-1}, max_bytes};
  Tensor inputs = read_idx(inputs_path, in_opts);
  Tensor labels = read_idx(labels_path, label_opts);
  if (inputs.size(0) != labels.size(0))
    KILN_THROW(Value, "[idx] '{}' holds {} samples but '{}' holds {} labels", inputs_path,
               inputs.size(0), labels_path, labels.size(0));
  if (num_classes > 0) {
    const uint8_t* l = labels.data<uint8_t>();
    for (int64_t i = 0; i < labels.numel(); ++i)
      if (l[i] >= num_classes)
        KILN_THROW(Value, "[idx] '{}': label {} at index {} is outside [0, {})", labels_path,
                   int{l[i]}, i, num_classes);
  }
  return {inputs, labels.to(kInt64)};
}

}  // namespace kiln::data
