#include "kiln/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include <nlohmann/json.hpp>

#include "kiln/core/error.h"
#include "kiln/ops/ops.h"

namespace kiln::io {
namespace {

// The format is little-endian; tensors' bytes are copied as they are.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little-endian");

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The reference implementation's limit; it bounds the memory a hostile header can claim.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests 3 deep (header, entry, shape); the limit keeps recursion (dump, destroy)
// bounded on hostile input.
constexpr int kMaxJsonDepth = 16;
constexpr std::string_view kMetadataKey = "__metadata__";

// Indexed by DType.
constexpr std::array<std::pair<DType, std::string_view>, kNumDTypes> kDTypeNames = {{
    {kBool, "BOOL"},
    {kUInt8, "U8"},
    {kInt32, "I32"},
    {kInt64, "I64"},
    {kFloat16, "F16"},
    {kBFloat16, "BF16"},
    {kFloat32, "F32"},
    {kFloat64, "F64"},
}};

static_assert(kDTypeNames[static_cast<int>(kFloat64)].first == kFloat64);

std::string_view format_name(DType t) { return kDTypeNames[static_cast<int>(t)].second; }

std::optional<DType> parse_format_dtype(std::string_view s) {
  for (const auto& [d, n] : kDTypeNames)
    if (n == s) return d;
  return std::nullopt;
}

// Names and values are cut short in messages: a hostile header may hold a 100 MB string.
std::string brief(std::string_view s, size_t max = 80) {
  return s.size() <= max ? std::string(s) : std::string(s.substr(0, max - 3)) + "...";
}
std::string brief_json(const json& j) {
  return brief(j.dump(-1, ' ', false, json::error_handler_t::replace));
}

std::string errno_text() { return std::strerror(errno); }

// ---------------------------------------------------------------- load

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// The header length N from the first 8 bytes, checked against the file's size.
uint64_t header_length(const uint8_t* prefix, uint64_t file_size) {
  uint64_t n;
  std::memcpy(&n, prefix, sizeof(n));
  KILN_CHECK(n <= kMaxHeaderBytes, "[load_safetensors] header length {} exceeds the {}-byte limit",
             n, kMaxHeaderBytes);
  KILN_CHECK(n <= file_size - 8,
             "[load_safetensors] header length {} exceeds the {} bytes that follow it", n,
             file_size - 8);
  return n;
}

void check_file_size(uint64_t file_size) {
  KILN_CHECK(file_size >= 8,
             "[load_safetensors] file is {} bytes, shorter than the 8-byte header length",
             file_size);
}

// Parses the header, rejecting duplicate keys (nlohmann's parser would keep the last one) and
// deep nesting.
json parse_json(std::string_view text) {
  std::vector<std::set<std::string>> keys;  // one set per object being parsed
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        KILN_CHECK(depth < kMaxJsonDepth, "[load_safetensors] header nests deeper than {} levels",
                   kMaxJsonDepth);
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        KILN_CHECK(keys.back().insert(k).second, "[load_safetensors] duplicate key '{}' in header",
                   brief(k));
        break;
      }
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.data(), text.data() + text.size(), callback);
  } catch (const json::exception& e) {
    // nlohmann's message quotes the last token read, which may be most of the header.
    KILN_THROW(Value, "[load_safetensors] header is not valid JSON: {}", brief(e.what(), 300));
  }
}

// A JSON integer in [0, 2^63), the range Kiln's sizes and the format's offsets share.
bool is_index(const json& j) {
  return j.is_number_unsigned() &&
         j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

Entry parse_entry(const std::string& name, const json& v, uint64_t data_size) {
  const std::string n = brief(name);
  KILN_CHECK(!name.empty(), "[load_safetensors] a tensor has an empty name");
  KILN_CHECK(v.is_object(), "[load_safetensors] entry '{}' must be an object, got {}", n,
             brief_json(v));
  for (const auto& [key, unused] : v.items()) {
    (void)unused;
    KILN_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
               "[load_safetensors] entry '{}' has unknown key '{}' (expected dtype, shape, "
               "data_offsets)",
               n, brief(key));
  }
  for (const char* key : {"dtype", "shape", "data_offsets"})
    KILN_CHECK(v.contains(key), "[load_safetensors] entry '{}' lacks '{}'", n, key);

  Entry e{name, kBool, {}, 0, 0};
  const json& dt = v["dtype"];
  KILN_CHECK(dt.is_string(), "[load_safetensors] tensor '{}': dtype must be a string, got {}", n,
             brief_json(dt));
  std::optional<DType> dtype = parse_format_dtype(dt.get_ref<const std::string&>());
  KILN_CHECK(dtype.has_value(),
             "[load_safetensors] tensor '{}' has unsupported dtype {} (Kiln reads BOOL, U8, I32, "
             "I64, F16, BF16, F32, F64)",
             n, brief_json(dt));
  e.dtype = *dtype;

  const json& shape = v["shape"];
  bool shape_ok = shape.is_array() && std::all_of(shape.begin(), shape.end(), is_index);
  KILN_CHECK(shape_ok,
             "[load_safetensors] tensor '{}': shape must be an array of non-negative integers "
             "below 2^63, got {}",
             n, brief_json(shape));
  // The product of the sizes, zeros counted as ones, must fit int64: Kiln's strides are that
  // product's suffixes even when the tensor is empty.
  int64_t extent = 1;
  bool has_zero = false;
  for (const json& d : shape) {
    int64_t s = d.get<int64_t>();
    e.shape.push_back(s);
    has_zero = has_zero || s == 0;
    KILN_CHECK(!__builtin_mul_overflow(extent, std::max<int64_t>(s, 1), &extent),
               "[load_safetensors] tensor '{}': shape {} has too many elements", n,
               brief_json(shape));
  }
  uint64_t numel = has_zero ? 0 : static_cast<uint64_t>(extent);
  uint64_t nbytes;
  KILN_CHECK(!__builtin_mul_overflow(numel, itemsize(e.dtype), &nbytes),
             "[load_safetensors] tensor '{}': shape {} of {} is too large", n, brief_json(shape),
             dt.get_ref<const std::string&>());

  const json& off = v["data_offsets"];
  bool off_ok = off.is_array() && off.size() == 2 && is_index(off[0]) && is_index(off[1]);
  KILN_CHECK(off_ok,
             "[load_safetensors] tensor '{}': data_offsets must be two non-negative integers "
             "below 2^63, got {}",
             n, brief_json(off));
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  KILN_CHECK(e.begin <= e.end,
             "[load_safetensors] tensor '{}': data_offsets [{}, {}] end before "
             "they begin",
             n, e.begin, e.end);
  KILN_CHECK(e.end <= data_size,
             "[load_safetensors] tensor '{}': data_offsets [{}, {}] reach past the end of the "
             "{}-byte data section",
             n, e.begin, e.end, data_size);
  KILN_CHECK(e.end - e.begin == nbytes,
             "[load_safetensors] tensor '{}': data_offsets [{}, {}] span {} bytes, but shape {} "
             "of {} needs {}",
             n, e.begin, e.end, e.end - e.begin, brief_json(shape),
             dt.get_ref<const std::string&>(), nbytes);
  return e;
}

// Validates the header against a data section of `data_size` bytes. Returns the entries in
// data order; fills `metadata`.
std::vector<Entry> parse_header(std::string_view text, uint64_t data_size,
                                std::map<std::string, std::string>& metadata) {
  json root = parse_json(text);
  KILN_CHECK(root.is_object(), "[load_safetensors] header must be a JSON object, got {}",
             brief_json(root));
  std::vector<Entry> entries;
  for (const auto& [name, v] : root.items()) {
    if (name != kMetadataKey) {
      entries.push_back(parse_entry(name, v, data_size));
      continue;
    }
    KILN_CHECK(v.is_object(), "[load_safetensors] __metadata__ must be an object, got {}",
               brief_json(v));
    for (const auto& [key, value] : v.items()) {
      KILN_CHECK(value.is_string(),
                 "[load_safetensors] __metadata__ value of '{}' must be a string, got {}",
                 brief(key), brief_json(value));
      metadata[key] = value.get<std::string>();
    }
  }

  // The spec: tensors cover the data section exactly, without overlaps or holes.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    KILN_CHECK(e.begin >= covered,
               "[load_safetensors] tensor '{}' at [{}, {}) overlaps tensor '{}' at [{}, {})",
               brief(e.name), e.begin, e.end, brief(prev->name), prev->begin, prev->end);
    KILN_CHECK(e.begin == covered,
               "[load_safetensors] bytes [{}, {}) of the data section are not covered by any "
               "tensor",
               covered, e.begin);
    covered = e.end;
    prev = &e;
  }
  KILN_CHECK(covered == data_size,
             "[load_safetensors] bytes [{}, {}) of the data section are not covered by any tensor",
             covered, data_size);
  return entries;
}

// Makes each entry's tensor; read(dst, offset, n) copies n bytes from data-section offset.
template <class Read>
StateDict make_tensors(const std::vector<Entry>& entries, Read&& read) {
  StateDict out;
  out.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.dtype, Device(kCPU));
    uint64_t nbytes = e.end - e.begin;
    if (nbytes > 0) read(t.data_ptr(), e.begin, nbytes);
    if (e.dtype == kBool) {
      // Any byte but 0 and 1 would be an invalid bool once read through bool*.
      const auto* p = static_cast<const uint8_t*>(nbytes > 0 ? t.data_ptr() : nullptr);
      const auto* bad = std::find_if(p, p + nbytes, [](uint8_t b) { return b > 1; });
      KILN_CHECK(bad == p + nbytes,
                 "[load_safetensors] tensor '{}' (BOOL) holds byte {} at element {}; booleans "
                 "must be 0 or 1",
                 brief(e.name), nbytes > 0 ? *bad : 0, bad - p);
    }
    out.emplace_back(e.name, std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void read_exact(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    KILN_CHECK(r >= 0, "[load_safetensors] cannot read '{}' at byte {}: {}", path, offset,
               errno_text());
    KILN_CHECK(r > 0, "[load_safetensors] '{}' ended at byte {} while reading it", path, offset);
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

// ---------------------------------------------------------------- save

void check_utf8(const std::string& s, std::string_view what) {
  try {
    (void)json(s).dump();
  } catch (const json::exception&) {
    KILN_THROW(Value, "[save_safetensors] {} '{}' is not valid UTF-8", what, brief(s));
  }
}

// A temporary file beside the destination, removed unless commit() renamed it into place.
class TempFile {
 public:
  explicit TempFile(const std::string& dest) : dest_(dest), path_(dest + ".tmp.XXXXXX") {
    fd_ = ::mkostemp(path_.data(), O_CLOEXEC);
    KILN_CHECK(fd_ >= 0, "[save_safetensors] cannot create a temporary file beside '{}': {}", dest,
               errno_text());
    ::fchmod(fd_, 0644);  // mkstemp makes it 0600; a saved model is normally world-readable
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  void write(const void* src, size_t n) {
    const auto* p = static_cast<const uint8_t*>(src);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      KILN_CHECK(w > 0, "[save_safetensors] cannot write '{}': {}", path_, errno_text());
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  void commit() {
    KILN_CHECK(::fsync(fd_) == 0, "[save_safetensors] cannot flush '{}': {}", path_, errno_text());
    int fd = fd_;
    fd_ = -1;
    KILN_CHECK(::close(fd) == 0, "[save_safetensors] cannot close '{}': {}", path_, errno_text());
    KILN_CHECK(::rename(path_.c_str(), dest_.c_str()) == 0,
               "[save_safetensors] cannot rename '{}' to '{}': {}", path_, dest_, errno_text());
    committed_ = true;
  }

 private:
  std::string dest_;
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

StateDict load_safetensors_bytes(std::span<const uint8_t> bytes,
                                 std::map<std::string, std::string>* metadata) {
  check_file_size(bytes.size());
  uint64_t n = header_length(bytes.data(), bytes.size());
  std::string_view header(reinterpret_cast<const char*>(bytes.data() + 8), n);
  std::span<const uint8_t> data = bytes.subspan(8 + n);
  std::map<std::string, std::string> md;
  std::vector<Entry> entries = parse_header(header, data.size(), md);
  StateDict out = make_tensors(entries, [&](void* dst, uint64_t offset, uint64_t count) {
    std::memcpy(dst, data.data() + offset, count);
  });
  if (metadata) *metadata = std::move(md);
  return out;
}

StateDict load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  KILN_CHECK(f.fd >= 0, "[load_safetensors] cannot open '{}': {}", path, errno_text());
  struct stat st;
  KILN_CHECK(::fstat(f.fd, &st) == 0, "[load_safetensors] cannot stat '{}': {}", path,
             errno_text());
  KILN_CHECK(S_ISREG(st.st_mode), "[load_safetensors] '{}' is not a regular file", path);
  // Read piecewise rather than whole: each tensor's bytes go straight into its storage.
  auto size = static_cast<uint64_t>(st.st_size);
  check_file_size(size);
  uint8_t prefix[8];
  read_exact(f.fd, prefix, 8, 0, path);
  uint64_t n = header_length(prefix, size);
  std::string header(n, '\0');
  read_exact(f.fd, header.data(), n, 8, path);
  std::map<std::string, std::string> md;
  std::vector<Entry> entries = parse_header(header, size - 8 - n, md);
  StateDict out = make_tensors(entries, [&](void* dst, uint64_t offset, uint64_t count) {
    read_exact(f.fd, dst, count, 8 + n + offset, path);
  });
  if (metadata) *metadata = std::move(md);
  return out;
}

struct SafetensorsReader::Impl {
  std::string path;
  Fd file;
  uint64_t data_start = 0;
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::pair<Entry, Info>, std::less<>> entries;
};

SafetensorsReader::SafetensorsReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  int& fd = impl_->file.fd;
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, "[load_safetensors] cannot open '{}': {}", path, errno_text());
  struct stat st;
  KILN_CHECK(::fstat(fd, &st) == 0, "[load_safetensors] cannot stat '{}': {}", path, errno_text());
  KILN_CHECK(S_ISREG(st.st_mode), "[load_safetensors] '{}' is not a regular file", path);
  auto size = static_cast<uint64_t>(st.st_size);
  check_file_size(size);
  uint8_t prefix[8];
  read_exact(fd, prefix, 8, 0, path);
  uint64_t n = header_length(prefix, size);
  std::string header(n, '\0');
  read_exact(fd, header.data(), n, 8, path);
  impl_->data_start = 8 + n;
  for (Entry& e : parse_header(header, size - 8 - n, impl_->metadata)) {
    Info info{e.dtype, e.shape};
    std::string name = e.name;
    impl_->entries.emplace(std::move(name), std::make_pair(std::move(e), std::move(info)));
  }
}

SafetensorsReader::~SafetensorsReader() = default;

const SafetensorsReader::Info* SafetensorsReader::find(const std::string& name) const {
  auto it = impl_->entries.find(name);
  return it == impl_->entries.end() ? nullptr : &it->second.second;
}

const std::map<std::string, std::string>& SafetensorsReader::metadata() const {
  return impl_->metadata;
}

Tensor SafetensorsReader::read(const std::string& name) const {
  auto it = impl_->entries.find(name);
  KILN_CHECK(it != impl_->entries.end(), "[load_safetensors] '{}' holds no tensor '{}'",
             impl_->path, brief(name));
  StateDict one = make_tensors({it->second.first}, [&](void* dst, uint64_t offset, uint64_t count) {
    read_exact(impl_->file.fd, dst, count, impl_->data_start + offset, impl_->path);
  });
  return std::move(one.front().second);
}

void save_safetensors(const StateDict& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata) {
  // Everything is validated before the file system is touched.
  std::set<std::string_view> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    KILN_CHECK(!name.empty(), "[save_safetensors] tensor {} has an empty name", i);
    KILN_CHECK(name != kMetadataKey, "[save_safetensors] the name '{}' is reserved for metadata",
               kMetadataKey);
    KILN_CHECK(seen.insert(name).second, "[save_safetensors] duplicate tensor name '{}'",
               brief(name));
    KILN_CHECK(t.defined(), "[save_safetensors] tensor '{}' is undefined", brief(name));
    KILN_CHECK(!t.device().is_meta(), "[save_safetensors] tensor '{}' is on meta and has no data",
               brief(name));
    check_utf8(name, "tensor name");
  }
  for (const auto& [key, value] : metadata) {
    check_utf8(key, "metadata key");
    check_utf8(value, "metadata value");
  }

  // Larger elements first keeps every tensor aligned to its element size in the file.
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& item : tensors) order.push_back(&item);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    size_t sa = a->second.itemsize(), sb = b->second.itemsize();
    return sa != sb ? sa > sb : a->first < b->first;
  });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  uint64_t offset = 0;
  for (const auto* item : order) {
    const Tensor& t = item->second;
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    header[item->first] = {{"dtype", format_name(t.dtype())},
                           {"shape", shape},
                           {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();

  TempFile file(path);
  file.write(&n, sizeof(n));
  file.write(text.data(), text.size());
  for (const auto* item : order) {
    Tensor t = item->second.detach();
    if (!t.device().is_cpu()) t = t.to(Device(kCPU));
    t = t.contiguous();
    if (t.nbytes() > 0) file.write(t.data_ptr(), t.nbytes());
  }
  file.commit();
}

}  // namespace kiln::io
