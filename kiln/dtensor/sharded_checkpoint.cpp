#include "kiln/dtensor/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/distributed/collectives.h"
#include "kiln/distributed/init.h"
#include "kiln/dtensor/dtensor.h"
#include "kiln/dtensor/redistribute.h"
#include "kiln/ops/ops.h"

// Note [Sharded checkpoint format]
// A checkpoint is a directory: `rank{r}.safetensors` per saving rank and `index.json`:
//
//   {"format": "kiln.sharded_checkpoint", "version": 1, "world_size": 4,
//    "save_id": "5f0c...", "metadata": {"step": "100"},
//    "tensors": {"w": {"dtype": "float32", "shape": [5, 6],
//                      "mesh": {"shape": [2, 2], "names": ["dp", "tp"]},
//                      "placements": ["S(0)", "R"],
//                      "pieces": [{"file": "rank0.safetensors", "key": "w#0,0",
//                                  "offset": [0, 0], "shape": [3, 6]}, ...]}}}
//
// A piece is a box of the global tensor (its offset and shape per dim) stored whole as the
// safetensors entry `key` of `file`. The pieces of a tensor are the distinct non-empty local
// shards of its saving spec: of the ranks that hold the same shard (they differ only along
// Replicate mesh dims) the one at coordinate 0 of those dims writes it. A Partial DTensor is
// reduced first (Partial -> Replicate along those mesh dims) and its value saved: terms would
// tie a load to the saving mesh's reduction order, and a value is what every other mesh wants.
// A plain tensor is one piece from rank 0. The mesh and the placements are recorded for the
// reader's information only: the pieces alone say where every element lives, so any target
// mesh reads what overlaps its shard. Rank files carry the save_id in their metadata, so a
// directory that mixes two saves (rank files of one, index of another) is refused.
//
// Because the savers cut tensors by chunk's rule per dim, the pieces of a tensor form a grid:
// per tensor dim their intervals partition [0, size), and the pieces are every combination of
// them, once. The loader checks exactly that (in O(pieces) rather than comparing every pair of
// boxes), which rules out overlapping and missing pieces whatever the index says.
//
// Note [Failing on every rank]
// Saving and loading are collective, and most failures are one rank's (its file is truncated,
// its disk is full). Each phase runs this rank's part inside exchange(), which all-gathers every
// rank's outcome: on any failure every rank throws the same ValueError, the first failing rank's
// message with its rank, so no rank goes on to a collective that the others never reach. A
// load assembles every target's shard in temporaries and copies them into the targets only
// after the last exchange succeeded, so a failed load leaves every target as it was.

namespace kiln::dtensor {

using io::SafetensorsReader;
using io::save_safetensors;
namespace {

namespace dt = kiln::dtensor;
namespace dist = kiln::distributed;
namespace fs = std::filesystem;
using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kFormat = "kiln.sharded_checkpoint";
constexpr int64_t kVersion = 1;
constexpr std::string_view kIndexName = "index.json";
constexpr std::string_view kSaveIdKey = "kiln_sharded_checkpoint";
// An index names every piece of every tensor in a few hundred bytes; the bound keeps a hostile
// one from claiming the memory of a huge string.
constexpr uint64_t kMaxIndexBytes = 256u << 20;
constexpr int kMaxJsonDepth = 16;
// Far beyond any real tensor; bounds the work a hostile shape can ask for.
constexpr size_t kMaxTensorDims = 64;

std::string brief(std::string_view s, size_t max = 80) {
  return s.size() <= max ? std::string(s) : std::string(s.substr(0, max - 3)) + "...";
}
std::string brief_json(const json& j) {
  return brief(j.dump(-1, ' ', false, json::error_handler_t::replace));
}
std::string errno_text() { return std::strerror(errno); }
std::string path_in(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / name).string();
}

// ---------------------------------------------------------------- every rank's outcome

// Every rank's string, in rank order: two all_gathers over the world (lengths, then the bytes
// padded to the longest).
std::vector<std::string> all_gather_strings(const std::string& s) {
  const int n = dist::world_size();
  if (n == 1) return {s};
  Tensor len = empty({1}, kInt64, Device(kCPU));
  *static_cast<int64_t*>(len.data_ptr()) = static_cast<int64_t>(s.size());
  Tensor lens = dist::all_gather_into_tensor(len);
  const auto* l = static_cast<const int64_t*>(lens.data_ptr());
  const int64_t longest = std::max<int64_t>(1, *std::max_element(l, l + n));
  Tensor bytes = zeros({longest}, kUInt8, Device(kCPU));
  if (!s.empty()) std::memcpy(bytes.data_ptr(), s.data(), s.size());
  Tensor all = dist::all_gather_into_tensor(bytes);
  const auto* p = static_cast<const char*>(all.data_ptr());
  std::vector<std::string> out;
  for (int r = 0; r < n; ++r) out.emplace_back(p + r * longest, static_cast<size_t>(l[r]));
  return out;
}

// Runs `fn` (this rank's part of a phase, returning what the others should learn) and returns
// every rank's result; when any rank's fn threw, every rank throws the same ValueError (a
// message from outside Kiln, such as std::filesystem's, gets "[op] " before it). See Note
// [Failing on every rank].
template <class F>
std::vector<std::string> exchange(const char* op, F&& fn) {
  std::string mine;
  try {
    std::string result = fn();
    mine.reserve(result.size() + 1);
    mine.push_back('+');
    mine.append(result);
  } catch (const Error& e) {
    mine = std::string("-") + e.what();
  } catch (const std::exception& e) {
    mine = fmt::format("-[{}] {}", op, e.what());
  }
  std::vector<std::string> all = all_gather_strings(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty() || all[r][0] != '-') continue;
    if (all.size() == 1) KILN_THROW(Value, "{}", all[r].substr(1));
    KILN_THROW(Value, "{} (on rank {})", all[r].substr(1), r);
  }
  for (std::string& s : all) s.erase(0, 1);
  return all;
}

// ---------------------------------------------------------------- strict JSON

json parse_json(std::string_view text, const std::string& path) {
  std::vector<std::set<std::string>> keys;  // one set per object being parsed
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        KILN_CHECK(depth < kMaxJsonDepth, "[load_sharded] '{}' nests deeper than {} levels", path,
                   kMaxJsonDepth);
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        KILN_CHECK(keys.back().insert(k).second, "[load_sharded] '{}' has the key '{}' twice", path,
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
    KILN_THROW(Value, "[load_sharded] '{}' is not valid JSON: {}", path, brief(e.what(), 300));
  }
}

bool is_index(const json& j) {
  return j.is_number_unsigned() &&
         j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
}

std::optional<DType> dtype_named(std::string_view s) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name(static_cast<DType>(i)) == s) return static_cast<DType>(i);
  return std::nullopt;
}

// "S(0)", "R", "P(sum)" as Placement::str() writes them; nullopt for anything else.
std::optional<dt::Placement> parse_placement(std::string_view s, int64_t ndim) {
  if (s == "R") return dt::Placement(dt::Replicate());
  for (auto op :
       {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max, dist::ReduceOp::Min})
    if (s == dt::Placement(dt::Partial(op)).str()) return dt::Placement(dt::Partial(op));
  for (int64_t d = 0; d < ndim; ++d)
    if (s == dt::Placement(dt::Shard(d)).str()) return dt::Placement(dt::Shard(d));
  return std::nullopt;
}

// ---------------------------------------------------------------- save

// What every rank must agree on about one tensor to save.
ordered_json describe(const std::string& name, const Tensor& t) {
  ordered_json d;
  d["name"] = name;
  if (dt::is_dtensor(t)) {
    const dt::DTensorSpec& spec = *dt::spec_of(t);
    d["dtype"] = std::string(kiln::name(spec.dtype()));
    d["shape"] = std::vector<int64_t>(spec.shape().begin(), spec.shape().end());
    d["mesh"] = {
        {"shape", std::vector<int64_t>(spec.mesh().shape().begin(), spec.mesh().shape().end())},
        {"names", spec.mesh().dim_names()}};
    std::vector<std::string> ps;
    for (const dt::Placement& p : spec.placements()) ps.push_back(p.str());
    d["placements"] = ps;
  } else {
    d["dtype"] = std::string(kiln::name(t.dtype()));
    d["shape"] = std::vector<int64_t>(t.sizes().begin(), t.sizes().end());
    d["mesh"] = nullptr;
    d["placements"] = json::array();
  }
  return d;
}

void check_utf8(const std::string& s) {
  try {
    (void)json(s).dump();
  } catch (const json::exception&) {
    KILN_THROW(Value, "[save_sharded] tensor name '{}' is not valid UTF-8", brief(s));
  }
}

std::string piece_key(const std::string& name, IntArrayRef offset) {
  return fmt::format("{}#{}", name, fmt::join(offset, ","));
}

// Writes `text` to `path` through a temporary file renamed over it.
void write_file_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  KILN_CHECK(fd >= 0, "[save_sharded] cannot create a temporary file beside '{}': {}", path,
             errno_text());
  ::fchmod(fd, 0644);
  size_t done = 0;
  bool ok = true;
  std::string why;
  while (ok && done < text.size()) {
    ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0)
      ok = false, why = errno_text();
    else
      done += static_cast<size_t>(w);
  }
  if (ok && ::fsync(fd) != 0) ok = false, why = errno_text();
  if (::close(fd) != 0 && ok) ok = false, why = errno_text();
  if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) ok = false, why = errno_text();
  if (!ok) {
    ::unlink(tmp.c_str());
    KILN_THROW(Value, "[save_sharded] cannot write '{}': {}", path, why);
  }
}

// ---------------------------------------------------------------- the index

struct Piece {
  std::string file;
  std::string key;
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;
};

struct IndexTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;
};

struct Index {
  std::string save_id;
  std::map<std::string, std::string> metadata;
  std::map<std::string, IndexTensor> tensors;
};

void check_keys(const json& obj, std::initializer_list<std::string_view> allowed,
                const std::string& what) {
  for (const auto& [key, unused] : obj.items()) {
    (void)unused;
    KILN_CHECK(std::find(allowed.begin(), allowed.end(), key) != allowed.end(),
               "[load_sharded] {} has the unknown key '{}' (expected {})", what, brief(key),
               fmt::join(allowed, ", "));
  }
  for (std::string_view key : allowed)
    KILN_CHECK(obj.contains(key), "[load_sharded] {} lacks '{}'", what, key);
}

// Sizes (or offsets) of `ndim` dims: non-negative integers below 2^63.
std::vector<int64_t> parse_sizes(const json& j, size_t ndim, const std::string& what,
                                 const char* field) {
  bool ok = j.is_array() && (ndim == SIZE_MAX || j.size() == ndim) &&
            std::all_of(j.begin(), j.end(), is_index);
  KILN_CHECK(ok, "[load_sharded] {}: {} must be an array of {}non-negative integers, got {}", what,
             field, ndim == SIZE_MAX ? std::string() : fmt::format("{} ", ndim), brief_json(j));
  std::vector<int64_t> out;
  for (const json& d : j) out.push_back(d.get<int64_t>());
  return out;
}

// A file a piece may name: a plain name inside the checkpoint's directory.
bool is_plain_file_name(const std::string& f) {
  return !f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
         f.find('\0') == std::string::npos && f != kIndexName;
}

// See Note [Sharded checkpoint format]: the pieces form a grid that covers the tensor once.
void check_grid(const IndexTensor& t, const std::string& what) {
  const size_t ndim = t.shape.size();
  int64_t numel = 1;
  for (int64_t s : t.shape) numel *= s;
  if (numel == 0) {
    KILN_CHECK(t.pieces.empty(), "[load_sharded] {} is empty but has {} pieces", what,
               t.pieces.size());
    return;
  }
  KILN_CHECK(!t.pieces.empty(), "[load_sharded] {} has no pieces", what);
  uint64_t cells = 1;
  for (size_t d = 0; d < ndim; ++d) {
    std::set<std::pair<int64_t, int64_t>> intervals;
    for (const Piece& p : t.pieces) intervals.emplace(p.offset[d], p.shape[d]);
    int64_t covered = 0;
    for (const auto& [begin, length] : intervals) {
      KILN_CHECK(begin >= covered,
                 "[load_sharded] {}: pieces overlap along dim {}: [{}, {}) begins before {}, "
                 "where another piece ends",
                 what, d, begin, begin + length, covered);
      KILN_CHECK(begin == covered, "[load_sharded] {}: [{}, {}) of dim {} is in no piece", what,
                 covered, begin, d);
      covered = begin + length;
    }
    KILN_CHECK(covered == t.shape[d], "[load_sharded] {}: [{}, {}) of dim {} is in no piece", what,
               covered, t.shape[d], d);
    cells *= intervals.size();  // at most numel, which fits
  }
  std::set<std::vector<int64_t>> offsets;
  for (const Piece& p : t.pieces)
    KILN_CHECK(offsets.insert(p.offset).second,
               "[load_sharded] {}: two pieces start at offset [{}]", what,
               fmt::join(p.offset, ", "));
  KILN_CHECK(t.pieces.size() == cells,
             "[load_sharded] {} has {} pieces where its grid of intervals needs {}: a piece is "
             "missing",
             what, t.pieces.size(), cells);
}

IndexTensor parse_tensor(const std::string& name, const json& v, int64_t world_size,
                         const std::string& path) {
  const std::string what = fmt::format("'{}' (tensor '{}')", path, brief(name));
  KILN_CHECK(v.is_object(), "[load_sharded] {}: the entry must be an object, got {}", what,
             brief_json(v));
  check_keys(v, {"dtype", "shape", "mesh", "placements", "pieces"}, what);
  IndexTensor t;
  const json& dtj = v["dtype"];
  std::optional<DType> dtype =
      dtj.is_string() ? dtype_named(dtj.get_ref<const std::string&>()) : std::nullopt;
  KILN_CHECK(dtype.has_value(), "[load_sharded] {}: unknown dtype {}", what, brief_json(dtj));
  t.dtype = *dtype;
  t.shape = parse_sizes(v["shape"], SIZE_MAX, what, "shape");
  KILN_CHECK(t.shape.size() <= kMaxTensorDims, "[load_sharded] {}: shape {} has more than {} dims",
             what, brief_json(v["shape"]), kMaxTensorDims);
  int64_t extent = 1;
  for (int64_t s : t.shape)
    KILN_CHECK(!__builtin_mul_overflow(extent, std::max<int64_t>(s, 1), &extent),
               "[load_sharded] {}: shape {} has too many elements", what, brief_json(v["shape"]));

  // The mesh and placements are informational (Note [Sharded checkpoint format]), but checked.
  const json& mesh = v["mesh"];
  const json& placements = v["placements"];
  KILN_CHECK(placements.is_array() && std::all_of(placements.begin(), placements.end(),
                                                  [](const json& p) { return p.is_string(); }),
             "[load_sharded] {}: placements must be an array of strings, got {}", what,
             brief_json(placements));
  if (mesh.is_null()) {
    KILN_CHECK(placements.empty(),
               "[load_sharded] {}: a plain tensor (mesh null) has placements {}", what,
               brief_json(placements));
  } else {
    KILN_CHECK(mesh.is_object(), "[load_sharded] {}: mesh must be an object or null, got {}", what,
               brief_json(mesh));
    check_keys(mesh, {"shape", "names"}, what + " mesh");
    std::vector<int64_t> ms = parse_sizes(mesh["shape"], SIZE_MAX, what, "mesh shape");
    int64_t ranks = 1;
    bool ok = !ms.empty();
    for (int64_t s : ms) ok = ok && s >= 1 && !__builtin_mul_overflow(ranks, s, &ranks);
    KILN_CHECK(ok && ranks == world_size,
               "[load_sharded] {}: mesh shape {} does not hold the {} ranks of the save", what,
               brief_json(mesh["shape"]), world_size);
    const json& names = mesh["names"];
    KILN_CHECK(
        names.is_array() && names.size() == ms.size() &&
            std::all_of(names.begin(), names.end(), [](const json& n) { return n.is_string(); }),
        "[load_sharded] {}: mesh names must be {} strings, got {}", what, ms.size(),
        brief_json(names));
    KILN_CHECK(placements.size() == ms.size(), "[load_sharded] {}: {} placements for a {}-d mesh",
               what, placements.size(), ms.size());
    for (const json& p : placements)
      KILN_CHECK(
          parse_placement(p.get_ref<const std::string&>(), static_cast<int64_t>(t.shape.size())),
          "[load_sharded] {}: bad placement {} for a {}-d tensor", what, brief_json(p),
          t.shape.size());
  }

  const json& pieces = v["pieces"];
  KILN_CHECK(pieces.is_array(), "[load_sharded] {}: pieces must be an array, got {}", what,
             brief_json(pieces));
  for (const json& pj : pieces) {
    KILN_CHECK(pj.is_object(), "[load_sharded] {}: a piece must be an object, got {}", what,
               brief_json(pj));
    check_keys(pj, {"file", "key", "offset", "shape"}, what + " piece");
    Piece p;
    const json& f = pj["file"];
    KILN_CHECK(f.is_string() && is_plain_file_name(f.get_ref<const std::string&>()),
               "[load_sharded] {}: piece file {} is not a plain file name in the checkpoint's "
               "directory",
               what, brief_json(f));
    p.file = f.get<std::string>();
    KILN_CHECK(pj["key"].is_string(), "[load_sharded] {}: piece key must be a string, got {}", what,
               brief_json(pj["key"]));
    p.key = pj["key"].get<std::string>();
    p.offset = parse_sizes(pj["offset"], t.shape.size(), what, "piece offset");
    p.shape = parse_sizes(pj["shape"], t.shape.size(), what, "piece shape");
    for (size_t d = 0; d < t.shape.size(); ++d) {
      KILN_CHECK(
          p.shape[d] >= 1 && p.offset[d] <= t.shape[d] - p.shape[d] && p.shape[d] <= t.shape[d],
          "[load_sharded] {}: piece '{}' at offset [{}] of shape [{}] is empty or reaches "
          "outside the tensor's shape [{}]",
          what, brief(p.key), fmt::join(p.offset, ", "), fmt::join(p.shape, ", "),
          fmt::join(t.shape, ", "));
    }
    t.pieces.push_back(std::move(p));
  }
  check_grid(t, what);
  return t;
}

Index read_index(const std::string& dir) {
  const std::string path = path_in(dir, kIndexName);
  struct stat st;
  KILN_CHECK(::stat(path.c_str(), &st) == 0, "[load_sharded] cannot open '{}': {}", path,
             errno_text());
  KILN_CHECK(S_ISREG(st.st_mode), "[load_sharded] '{}' is not a regular file", path);
  KILN_CHECK(static_cast<uint64_t>(st.st_size) <= kMaxIndexBytes,
             "[load_sharded] '{}' is {} bytes, more than the {}-byte limit", path, st.st_size,
             kMaxIndexBytes);
  std::string text(static_cast<size_t>(st.st_size), '\0');
  {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    KILN_CHECK(fd >= 0, "[load_sharded] cannot open '{}': {}", path, errno_text());
    size_t done = 0;
    while (done < text.size()) {
      ssize_t r = ::read(fd, text.data() + done, text.size() - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += static_cast<size_t>(r);
    }
    ::close(fd);
    KILN_CHECK(done == text.size(), "[load_sharded] '{}' ended at byte {} of {} while reading it",
               path, done, text.size());
  }
  json root = parse_json(text, path);
  KILN_CHECK(root.is_object(), "[load_sharded] '{}' must hold a JSON object, got {}", path,
             brief_json(root));
  KILN_CHECK(root.contains("format") && root["format"] == kFormat,
             "[load_sharded] '{}' is not a Kiln sharded checkpoint index (format {}, expected "
             "\"{}\")",
             path, root.contains("format") ? brief_json(root["format"]) : "missing", kFormat);
  KILN_CHECK(root.contains("version") && root["version"].is_number_integer() &&
                 root["version"].get<int64_t>() == kVersion,
             "[load_sharded] '{}' has format version {}; this Kiln reads version {}", path,
             root.contains("version") ? brief_json(root["version"]) : "missing", kVersion);
  check_keys(root, {"format", "version", "world_size", "save_id", "metadata", "tensors"},
             "'" + path + "'");
  const json& ws = root["world_size"];
  KILN_CHECK(is_index(ws) && ws.get<int64_t>() >= 1,
             "[load_sharded] '{}': world_size must be a positive integer, got {}", path,
             brief_json(ws));
  KILN_CHECK(root["save_id"].is_string(), "[load_sharded] '{}': save_id must be a string, got {}",
             path, brief_json(root["save_id"]));
  Index index;
  index.save_id = root["save_id"].get<std::string>();
  const json& md = root["metadata"];
  KILN_CHECK(md.is_object(), "[load_sharded] '{}': metadata must be an object, got {}", path,
             brief_json(md));
  for (const auto& [k, val] : md.items()) {
    KILN_CHECK(val.is_string(), "[load_sharded] '{}': metadata value of '{}' must be a string",
               path, brief(k));
    index.metadata[k] = val.get<std::string>();
  }
  const json& tensors = root["tensors"];
  KILN_CHECK(tensors.is_object(), "[load_sharded] '{}': tensors must be an object, got {}", path,
             brief_json(tensors));
  std::set<std::pair<std::string, std::string>> stored;  // (file, key): each piece once
  for (const auto& [n, v] : tensors.items()) {
    IndexTensor t = parse_tensor(n, v, ws.get<int64_t>(), path);
    for (const Piece& p : t.pieces)
      KILN_CHECK(stored.emplace(p.file, p.key).second,
                 "[load_sharded] '{}' (tensor '{}'): the piece '{}' of '{}' is named twice", path,
                 brief(n), brief(p.key), p.file);
    index.tensors.emplace(n, std::move(t));
  }
  return index;
}

// ---------------------------------------------------------------- load

// The rank files a load opens, each once, checked to belong to the index's save.
class Files {
 public:
  Files(std::string dir, std::string save_id)
      : dir_(std::move(dir)), save_id_(std::move(save_id)) {}

  // Piece `p` of tensor `name` (dtype `dtype`), as a cpu tensor; every failure names both.
  Tensor read(const std::string& name, DType dtype, const Piece& p) {
    const std::string path = path_in(dir_, p.file);
    const std::string what = fmt::format("'{}' (tensor '{}')", path, brief(name));
    auto it = readers_.find(p.file);
    if (it == readers_.end()) {
      std::unique_ptr<SafetensorsReader> r;
      try {
        r = std::make_unique<SafetensorsReader>(path);
      } catch (const Error& e) {
        KILN_THROW(Value, "[load_sharded] {}: {}", what, e.what());
      }
      auto id = r->metadata().find(std::string(kSaveIdKey));
      KILN_CHECK(id != r->metadata().end() && id->second == save_id_,
                 "[load_sharded] {}: the file belongs to another save (save id '{}', the index's "
                 "is '{}'): the directory mixes two checkpoints",
                 what, id == r->metadata().end() ? "missing" : brief(id->second), save_id_);
      it = readers_.emplace(p.file, std::move(r)).first;
    }
    const SafetensorsReader& r = *it->second;
    const SafetensorsReader::Info* info = r.find(p.key);
    KILN_CHECK(info, "[load_sharded] {}: the file holds no piece '{}'", what, brief(p.key));
    KILN_CHECK(info->dtype == dtype && info->shape == p.shape,
               "[load_sharded] {}: piece '{}' is {} [{}] in the file, but the index says {} [{}]",
               what, brief(p.key), kiln::name(info->dtype), fmt::join(info->shape, ", "),
               kiln::name(dtype), fmt::join(p.shape, ", "));
    try {
      return r.read(p.key);
    } catch (const Error& e) {
      KILN_THROW(Value, "[load_sharded] {}: {}", what, e.what());
    }
  }

 private:
  std::string dir_;
  std::string save_id_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> readers_;
};

// The box [offset, offset + shape) of the global tensor that `target` holds on this rank, read
// from the pieces that overlap it.
Tensor assemble(const std::string& name, const IndexTensor& t, IntArrayRef offset,
                IntArrayRef shape, Files& files) {
  Tensor out = empty(shape, t.dtype, Device(kCPU));
  if (out.numel() == 0) return out;
  for (const Piece& p : t.pieces) {
    std::vector<int64_t> lo(shape.size()), hi(shape.size());
    bool overlaps = true;
    for (size_t d = 0; d < shape.size(); ++d) {
      lo[d] = std::max(p.offset[d], offset[d]);
      hi[d] = std::min(p.offset[d] + p.shape[d], offset[d] + shape[d]);
      overlaps = overlaps && lo[d] < hi[d];
    }
    if (!overlaps) continue;
    Tensor src = files.read(name, t.dtype, p);
    Tensor dst = out;
    for (size_t d = 0; d < shape.size(); ++d) {
      auto dim = static_cast<int64_t>(d);
      src = narrow(src, dim, lo[d] - p.offset[d], hi[d] - lo[d]);
      dst = narrow(dst, dim, lo[d] - offset[d], hi[d] - lo[d]);
    }
    dst.copy_(src);
  }
  return out;
}

}  // namespace

void save_sharded(const std::string& dir, const StateDict& tensors,
                  const std::map<std::string, std::string>& metadata) {
  autograd::NoGradGuard no_grad;
  const int me = dist::rank();

  // 1. Validate, and learn that every rank saves the same tensors the same way (before any
  //    collective that depends on the list).
  std::vector<std::string> descs = exchange("save_sharded", [&] {
    std::set<std::string_view> seen;
    ordered_json d = ordered_json::array();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& [n, t] = tensors[i];
      KILN_CHECK(!n.empty(), "[save_sharded] tensor {} has an empty name", i);
      KILN_CHECK(seen.insert(n).second, "[save_sharded] duplicate tensor name '{}'", brief(n));
      check_utf8(n);
      KILN_CHECK(t.defined(), "[save_sharded] tensor '{}' is undefined", brief(n));
      const Device device = dt::is_dtensor(t) ? dt::to_local(t).device() : t.device();
      KILN_CHECK(!device.is_meta(), "[save_sharded] tensor '{}' is on meta and has no data",
                 brief(n));
      d.push_back(describe(n, t));
    }
    for (const auto& [k, v] : metadata) {
      check_utf8(k);
      check_utf8(v);
    }
    return d.dump();
  });
  for (size_t r = 1; r < descs.size(); ++r) {
    if (descs[r] == descs[0]) continue;
    json a = json::parse(descs[0]), b = json::parse(descs[r]);
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    KILN_THROW(Value,
               "[save_sharded] rank {} saves other tensors than rank 0: its tensor {} is {} "
               "where rank 0's is {}",
               r, i, i < b.size() ? brief_json(b[i]) : "missing",
               i < a.size() ? brief_json(a[i]) : "missing");
  }

  // 2. Partial values are reduced (Note [Sharded checkpoint format]); every rank does the same.
  std::vector<Tensor> values;
  for (const auto& [n, t] : tensors) {
    if (!dt::is_dtensor(t) || !dt::spec_of(t)->has_partial()) {
      values.push_back(t);
      continue;
    }
    dt::Placements ps(dt::spec_of(t)->placements().begin(), dt::spec_of(t)->placements().end());
    for (dt::Placement& p : ps)
      if (p.is_partial()) p = dt::Replicate();
    values.push_back(dt::redistribute(t, ps));
  }

  // 3. Rank 0 makes the directory and removes an older index: from here until step 5 the
  //    directory holds no complete checkpoint.
  std::random_device rd;
  const std::string proposed_id = fmt::format("{:08x}{:08x}{:08x}", rd(), rd(), rd());
  const std::string save_id = exchange("save_sharded", [&] {
    if (me == 0) {
      fs::create_directories(dir);
      fs::remove(path_in(dir, kIndexName));
    }
    return proposed_id;
  })[0];

  // 4. Every rank writes its pieces.
  std::vector<std::string> pieces = exchange("save_sharded", [&] {
    StateDict mine;
    ordered_json list = ordered_json::array();
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string& n = tensors[i].first;
      const Tensor& v = values[i];
      if (!dt::is_dtensor(v)) {
        if (me != 0 || v.numel() == 0) continue;  // an empty tensor has no pieces
        std::vector<int64_t> zero(v.dim(), 0);
        mine.emplace_back(piece_key(n, zero), v);
        list.push_back({{"tensor", i},
                        {"key", piece_key(n, zero)},
                        {"offset", zero},
                        {"shape", std::vector<int64_t>(v.sizes().begin(), v.sizes().end())}});
        continue;
      }
      const dt::DTensorSpec& spec = *dt::spec_of(v);
      bool writes = true;
      for (int64_t m = 0; m < spec.mesh().ndim(); ++m)
        writes = writes && (spec.placement(m).is_shard() || spec.mesh().coordinate(m) == 0);
      Tensor local = dt::to_local(v);
      if (!writes || local.numel() == 0) continue;
      mine.emplace_back(piece_key(n, spec.local_offset()), local);
      list.push_back(
          {{"tensor", i},
           {"key", piece_key(n, spec.local_offset())},
           {"offset", std::vector<int64_t>(spec.local_offset().begin(), spec.local_offset().end())},
           {"shape", std::vector<int64_t>(local.sizes().begin(), local.sizes().end())}});
    }
    fs::create_directories(dir);
    save_safetensors(mine, path_in(dir, fmt::format("rank{}.safetensors", me)),
                     {{std::string(kSaveIdKey), save_id}, {"rank", std::to_string(me)}});
    return list.dump();
  });

  // 5. Rank 0 writes the index, which makes the checkpoint complete.
  exchange("save_sharded", [&] {
    if (me != 0) return std::string();
    ordered_json index;
    index["format"] = kFormat;
    index["version"] = kVersion;
    index["world_size"] = dist::world_size();
    index["save_id"] = save_id;
    index["metadata"] = metadata;
    ordered_json entries = ordered_json::object();
    ordered_json descs0 = ordered_json::parse(descs[0]);
    for (size_t i = 0; i < tensors.size(); ++i) {
      ordered_json e;
      for (const char* k : {"dtype", "shape", "mesh", "placements"}) e[k] = descs0[i][k];
      e["pieces"] = ordered_json::array();
      entries[tensors[i].first] = e;
    }
    for (size_t r = 0; r < pieces.size(); ++r)
      for (const json& p : json::parse(pieces[r])) {
        const std::string& n = tensors[p["tensor"].get<size_t>()].first;
        entries[n]["pieces"].push_back({{"file", fmt::format("rank{}.safetensors", r)},
                                        {"key", p["key"]},
                                        {"offset", p["offset"]},
                                        {"shape", p["shape"]}});
      }
    index["tensors"] = entries;
    write_file_atomically(path_in(dir, kIndexName), index.dump(1));
    return std::string();
  });
}

void load_sharded(const std::string& dir, const StateDict& targets,
                  std::map<std::string, std::string>* metadata) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> loaded;
  std::map<std::string, std::string> md;
  exchange("load_sharded", [&] {
    std::set<std::string_view> seen;
    for (size_t i = 0; i < targets.size(); ++i) {
      const auto& [n, t] = targets[i];
      KILN_CHECK(seen.insert(n).second, "[load_sharded] duplicate target name '{}'", brief(n));
      KILN_CHECK(t.defined(), "[load_sharded] target '{}' is undefined", brief(n));
      const Device device = dt::is_dtensor(t) ? dt::sharded_meta(t).local.device() : t.device();
      KILN_CHECK(!device.is_meta(), "[load_sharded] target '{}' is on meta and holds no data",
                 brief(n));
    }
    Index index = read_index(dir);
    const std::string index_path = path_in(dir, kIndexName);
    Files files(dir, index.save_id);
    for (const auto& [n, t] : targets) {
      auto it = index.tensors.find(n);
      KILN_CHECK(it != index.tensors.end(), "[load_sharded] '{}' has no tensor '{}'", index_path,
                 brief(n));
      const IndexTensor& saved = it->second;
      const bool sharded = dt::is_dtensor(t);
      const dt::DTensorSpec* spec = sharded ? dt::spec_of(t) : nullptr;
      IntArrayRef shape = sharded ? spec->shape() : t.sizes();
      KILN_CHECK(saved.dtype == t.dtype() &&
                     std::equal(shape.begin(), shape.end(), saved.shape.begin(), saved.shape.end()),
                 "[load_sharded] '{}' (tensor '{}'): the checkpoint holds {} [{}], the target is "
                 "{} [{}]",
                 index_path, brief(n), kiln::name(saved.dtype), fmt::join(saved.shape, ", "),
                 kiln::name(t.dtype()), fmt::join(shape, ", "));
      Tensor value;
      if (sharded) {
        value = assemble(n, saved, spec->local_offset(), spec->local_shape(), files);
        // A Partial(sum) target holds the value once along that mesh dim (distribute_tensor's
        // rule); avg, max and min hold it everywhere.
        for (int64_t m = 0; m < spec->mesh().ndim(); ++m) {
          const dt::Placement& p = spec->placement(m);
          if (p.is_partial() && p.reduce_op() == dist::ReduceOp::Sum &&
              spec->mesh().coordinate(m) != 0)
            value.zero_();
        }
        value = value.to(dt::sharded_meta(t).local.device());
      } else {
        std::vector<int64_t> zero(shape.size(), 0);
        value = assemble(n, saved, zero, shape, files).to(t.device());
      }
      loaded.push_back(std::move(value));
    }
    md = std::move(index.metadata);
    return std::string();
  });

  // Every rank has every target's values: only now are the targets written.
  for (size_t i = 0; i < targets.size(); ++i) {
    const Tensor& t = targets[i].second;
    Tensor dst = dt::is_dtensor(t) ? dt::sharded_meta(t).local : t;
    dst.copy_(loaded[i]);
  }
  if (metadata) *metadata = std::move(md);
}

}  // namespace kiln::dtensor
