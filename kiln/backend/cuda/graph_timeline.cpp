// Timelines of replayed device graphs.
//
// Note [Graph timelines]
// KILN_GRAPH_TIMELINE=<folder> times the nodes of every device graph this process replays, on
// the device, for the questions a profiler would answer where none is installed (the GPU
// machines have no Nsight Systems and no CUPTI). Before a graph is instantiated it gains stamp
// kernels (one thread each, writing %globaltimer): one before everything (the replay's start),
// one after everything (its end: it depends on each node nothing depends on), and for every node
// it follows two: one after the node (when it ended) and one beside it (depending on what the
// node depends on: when it could start). Nothing depends on a stamp but the graph's own roots on
// the first, so the graph's order is unchanged; the stamps do take launch slots, so a timed
// replay is slower than an untimed one: compare timelines with timelines. A node behind a
// programmatic edge (cuBLAS's kernels launch early, Programmatic Dependent Launch) may start,
// and even end, before its "could start" stamp, which waits for its dependencies to finish.
// Each replay writes its own row of a ring of 64 in device memory. When the executable graph is
// destroyed its timeline goes to <folder>/timeline.<pid>.<n>.tsv: a line per followed node (its
// name; over the replays kept, the first left out: when it could start and when it ended, from the
// replay's start, and its mean and least time between the two), after a line for the whole replay.
// KILN_GRAPH_TIMELINE_MATCH=a,b follows only the kernels whose name contains one of the words
// (memcpy and memset nodes are named so); every kernel, memcpy and memset node otherwise.
// Executable graphs are not updated in place while timelines are on (an update would drop the
// stamps): they are instantiated again. Writing a timeline synchronizes the whole device, which
// waits for every stream on it: a diagnostic, not for production runs.
#include "kiln/backend/cuda/graph_timeline.h"

#include <cuda.h>
#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "kiln/backend/cuda/common.h"

namespace kiln::cuda {

namespace {

constexpr int kRing = 64;

struct Timeline {
  int device = 0;
  std::string folder;              // where its file goes
  std::vector<std::string> names;  // the followed nodes, in the graph's order
  int stamps = 0;                  // 0 start, 1 end, then (could start, ended) per followed node
  uint64_t* rows = nullptr;        // device: kRing rows of `stamps`
  uint32_t* state = nullptr;       // device: {replays begun, the replay in progress}

  ~Timeline() {
    if (rows) cudaFree(rows);
    if (state) cudaFree(state);
  }
};

std::mutex g_mu;
int g_written = 0;
// Never destroyed: executables alive at exit are destroyed after static destructors, if ever.
auto& g_timelines = *new std::unordered_map<cudaGraphExec_t, std::unique_ptr<Timeline>>();

// Read at each instantiation, so that a test can turn timelines on and off.
std::string folder() {
  const char* v = std::getenv("KILN_GRAPH_TIMELINE");
  return v ? v : "";
}

std::vector<std::string> match_words() {
  std::vector<std::string> words;
  const char* v = std::getenv("KILN_GRAPH_TIMELINE_MATCH");
  std::string_view rest = v ? v : "";
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    if (std::string_view word = rest.substr(0, comma); !word.empty()) words.emplace_back(word);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return words;
}

std::string demangled(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  return s;
}

// A kernel node's function name, through the driver (kernels launched by the runtime and by
// the driver alike: NCCL's are the latter), else the runtime; "kernel" when neither knows it.
std::string kernel_name(cudaGraphNode_t node) {
  using ParamsFn = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
  using FuncNameFn = CUresult (*)(const char**, CUfunction);
  using KernelNameFn = CUresult (*)(const char**, CUkernel);
  static auto params = reinterpret_cast<ParamsFn>(driver_function("cuGraphKernelNodeGetParams"));
  static auto func_name = reinterpret_cast<FuncNameFn>(driver_function("cuFuncGetName", 12030));
  static auto kernel_name =
      reinterpret_cast<KernelNameFn>(driver_function("cuKernelGetName", 12030));
  const char* name = nullptr;
  CUDA_KERNEL_NODE_PARAMS p{};
  if (params && params(reinterpret_cast<CUgraphNode>(node), &p) == CUDA_SUCCESS) {
    if (p.func && func_name && func_name(&name, p.func) == CUDA_SUCCESS && name)
      return demangled(name);
    if (p.kern && kernel_name && kernel_name(&name, p.kern) == CUDA_SUCCESS && name)
      return demangled(name);
  }
  cudaKernelNodeParams rp{};
  if (cudaGraphKernelNodeGetParams(node, &rp) == cudaSuccess &&
      cudaFuncGetName(&name, rp.func) == cudaSuccess && name)
    return demangled(name);
  cudaGetLastError();
  return "kernel";
}

// The name a followed node goes by, or "" for a node the timeline does not follow.
std::string followed_name(cudaGraphNode_t node, const std::vector<std::string>& words) {
  cudaGraphNodeType type{};
  KILN_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
  std::string name;
  if (type == cudaGraphNodeTypeKernel)
    name = kernel_name(node);
  else if (type == cudaGraphNodeTypeMemcpy)
    name = "memcpy";
  else if (type == cudaGraphNodeTypeMemset)
    name = "memset";
  else
    return "";
  const bool matched = words.empty() || std::any_of(words.begin(), words.end(), [&](auto& w) {
                         return name.find(w) != std::string::npos;
                       });
  return matched ? name : "";
}

std::vector<cudaGraphNode_t> dependencies(cudaGraphNode_t node) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &n));
  std::vector<cudaGraphNode_t> deps(n);
  std::vector<cudaGraphEdgeData> edges(n);
  if (n > 0) KILN_CUDA_CHECK(cudaGraphNodeGetDependencies(node, deps.data(), edges.data(), &n));
  return deps;
}

size_t dependent_count(cudaGraphNode_t node) {
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &n));
  return n;
}

cudaGraphNode_t add_stamp(cudaGraph_t g, Timeline& t, int index,
                          const std::vector<cudaGraphNode_t>& deps) {
  int stamps = t.stamps, ring = kRing;
  void* args[] = {&t.rows, &t.state, &index, &stamps, &ring};
  cudaKernelNodeParams p{};
  p.func = const_cast<void*>(detail::graph_timeline_stamp_kernel());
  p.gridDim = dim3(1);
  p.blockDim = dim3(1);
  p.kernelParams = args;
  cudaGraphNode_t node = nullptr;
  KILN_CUDA_CHECK(cudaGraphAddKernelNode(&node, g, deps.data(), deps.size(), &p));
  return node;
}

void write(const Timeline& t, const std::vector<uint64_t>& rows, uint32_t replays) {
  std::error_code ec;
  std::filesystem::create_directories(t.folder, ec);
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    n = g_written++;
  }
  const std::string path = fmt::format("{}/timeline.{}.{}.tsv", t.folder, getpid(), n);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    fmt::print(stderr, "[cuda] KILN_GRAPH_TIMELINE: cannot write {}\n", path);
    return;
  }
  // The replays still in the ring, the first of all left out when there are others.
  const uint32_t last = replays;
  uint32_t first = last > static_cast<uint32_t>(kRing) ? last - kRing : 0;
  if (first == 0 && last > 1) first = 1;
  const double kept = std::max<double>(1, last - first);
  auto at = [&](uint32_t r, int i) {
    return static_cast<double>(rows[static_cast<size_t>(r % kRing) * t.stamps + i]);
  };
  auto line = [&](const std::string& name, int ready, int done) {
    double sum_ready = 0, sum_done = 0, least = 1e300;
    for (uint32_t r = first; r < last; ++r) {
      const double start = at(r, 0), a = at(r, ready) - start, b = at(r, done) - start;
      sum_ready += a;
      sum_done += b;
      least = std::min(least, b - a);
    }
    fmt::print(f, "{}\t{:.2f}\t{:.2f}\t{:.2f}\t{:.2f}\n", name, sum_ready / kept / 1e3,
               sum_done / kept / 1e3, (sum_done - sum_ready) / kept / 1e3,
               last > first ? least / 1e3 : 0.0);
  };
  fmt::print(f, "# device {}, {} replays, means over the last {}; times in us from each start\n",
             t.device, replays, last - first);
  fmt::print(f, "name\tcould_start_us\tended_us\tmean_us\tleast_us\n");
  line("(replay)", 0, 1);
  for (size_t i = 0; i < t.names.size(); ++i)
    line(t.names[i], 2 + 2 * static_cast<int>(i), 3 + 2 * static_cast<int>(i));
  std::fclose(f);
}

}  // namespace

bool graph_timeline_on() { return !folder().empty(); }

void* graph_timeline_instrument(int device, cudaGraph_t g) {
  if (!graph_timeline_on()) return nullptr;
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0) KILN_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  auto t = std::make_unique<Timeline>();
  t->device = device;
  t->folder = folder();
  const std::vector<std::string> words = match_words();
  // What the graph is before any stamp joins it.
  std::vector<cudaGraphNode_t> roots, sinks, followed;
  std::vector<std::vector<cudaGraphNode_t>> followed_deps;
  for (cudaGraphNode_t node : nodes) {
    std::vector<cudaGraphNode_t> deps = dependencies(node);
    if (deps.empty()) roots.push_back(node);
    if (dependent_count(node) == 0) sinks.push_back(node);
    if (std::string name = followed_name(node, words); !name.empty()) {
      t->names.push_back(std::move(name));
      followed.push_back(node);
      followed_deps.push_back(std::move(deps));
    }
  }
  t->stamps = 2 + 2 * static_cast<int>(followed.size());
  const size_t bytes = sizeof(uint64_t) * kRing * static_cast<size_t>(t->stamps);
  KILN_CUDA_CHECK(cudaMalloc(&t->rows, bytes));
  KILN_CUDA_CHECK(cudaMalloc(&t->state, 2 * sizeof(uint32_t)));
  KILN_CUDA_CHECK(cudaMemset(t->rows, 0, bytes));
  KILN_CUDA_CHECK(cudaMemset(t->state, 0, 2 * sizeof(uint32_t)));
  cudaGraphNode_t start = add_stamp(g, *t, 0, {});
  for (cudaGraphNode_t root : roots)
    KILN_CUDA_CHECK(cudaGraphAddDependencies(g, &start, &root, nullptr, 1));
  std::vector<cudaGraphNode_t> last = sinks;  // the end waits for every node and stamp
  last.push_back(start);
  for (size_t i = 0; i < followed.size(); ++i) {
    const int ready = 2 + 2 * static_cast<int>(i);
    last.push_back(
        add_stamp(g, *t, ready, followed_deps[i].empty() ? std::vector{start} : followed_deps[i]));
    last.push_back(add_stamp(g, *t, ready + 1, {followed[i]}));
  }
  add_stamp(g, *t, 1, last);
  return t.release();
}

void graph_timeline_adopt(cudaGraphExec_t e, void* timeline) {
  std::unique_ptr<Timeline> t(static_cast<Timeline*>(timeline));
  if (!t || !e) return;
  std::lock_guard<std::mutex> lock(g_mu);
  g_timelines[e] = std::move(t);
}

void graph_timeline_release(cudaGraphExec_t e) {
  std::unique_ptr<Timeline> t;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_timelines.find(e);
    if (it == g_timelines.end()) return;
    t = std::move(it->second);
    g_timelines.erase(it);
  }
  // Called while an executable is destroyed: report a failure, never throw.
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(t->device);
  std::vector<uint64_t> rows(static_cast<size_t>(kRing) * t->stamps);
  uint32_t state[2] = {0, 0};
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess)
    err = cudaMemcpy(rows.data(), t->rows, rows.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost);
  if (err == cudaSuccess) err = cudaMemcpy(state, t->state, sizeof(state), cudaMemcpyDeviceToHost);
  if (err == cudaSuccess)
    write(*t, rows, state[0]);
  else
    fmt::print(stderr, "[cuda] KILN_GRAPH_TIMELINE: reading a timeline failed: {}\n",
               cudaGetErrorName(err));
  t.reset();  // its buffers, on its device
  cudaGetLastError();
  cudaSetDevice(previous);
}

}  // namespace kiln::cuda
