// A sim device's kernel launches, captures and graphs: capture records launches instead of
// running them, an instantiated graph replays its nodes on a stream, update() swaps in a graph
// of the same kernels (Note [The sim device] in sim.cpp).
#include "kiln/backend/sim/sim_impl.h"

namespace kiln::sim {

void SimDevice::launch(std::string_view name, std::function<void()> fn) {
  Capture* c = tls_capture;
  const uint64_t s = current();
  if (c && c->device == index_) {
    if (c->has(s)) {
      KILN_CHECK_DEVICE(c->invalid.empty(), "[sim] launching {} into an invalidated capture: {}",
                        name, c->invalid);
      if (s != c->stream) ++c->joined[s].work;
      c->nodes.push_back({name, std::move(fn)});
      return;
    }
    if (s == 0)
      forbid_in_capture(fmt::format("launching {} on the default stream", name).c_str(),
                        "cudaErrorStreamCaptureImplicit");
  }
  stream(s)->push({std::move(fn), g_launch_ns});
}

void SimDevice::begin_capture(uint64_t stream_id, uint64_t pool) {
  KILN_CHECK_DEVICE(stream_id != 0,
                    "[sim] cannot capture the default stream of sim:{}: capture a stream made "
                    "with create_stream (cudaErrorStreamCaptureUnsupported)",
                    index_);
  KILN_CHECK_DEVICE(!tls_capture,
                    "[sim] this thread is already capturing stream {} (cudaErrorIllegalState)",
                    tls_capture ? tls_capture->stream : 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    KILN_CHECK_DEVICE(streams_.count(stream_id), "[sim] sim:{} has no stream {}", index_,
                      stream_id);
    KILN_CHECK_DEVICE(pool == 0 || pools_.count(pool), "[sim] sim:{} has no pool {}", index_, pool);
  }
  tls_capture = new Capture{index_, stream_id, pool, {}, {}, {}, {}};
}

uint64_t SimDevice::end_capture(uint64_t stream_id) {
  Capture* c = tls_capture;
  KILN_CHECK_DEVICE(c && c->device == index_ && c->stream == stream_id,
                    "[sim] stream {} of sim:{} is not being captured by this thread "
                    "(cudaErrorIllegalState)",
                    stream_id, index_);
  std::unique_ptr<Capture> done(c);
  tls_capture = nullptr;
  std::vector<std::pair<void*, size_t>> frees;
  {
    std::lock_guard<std::mutex> lock(mu_);
    frees.swap(frees_after_capture_);
  }
  for (auto [p, n] : frees) deallocate(p, n);
  KILN_CHECK_DEVICE(done->invalid.empty(),
                    "[sim] the capture of stream {} was invalidated "
                    "(cudaErrorStreamCaptureInvalidated) by: {}",
                    stream_id, done->invalid);
  for (const auto& [id, j] : done->joined)
    KILN_CHECK_DEVICE(j.rejoined == j.work,
                      "[sim] the capture of stream {} ended with stream {} not joined back: the "
                      "origin stream must wait for an event recorded on it after its last launch "
                      "(cudaErrorStreamCaptureUnjoined)",
                      stream_id, id);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_id_++;
  graphs_[id] = {std::make_shared<Nodes>(std::move(done->nodes)), {}, 0};
  return id;
}

SimDevice::GraphEntry& SimDevice::graph(uint64_t id, const char* what) {
  auto it = graphs_.find(id);
  KILN_CHECK_DEVICE(it != graphs_.end(), "[sim] sim:{} has no {} {}", index_, what, id);
  return it->second;
}

int SimDevice::graph_nodes(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(graph(id, "graph").nodes->size());
}

uint64_t SimDevice::instantiate(uint64_t g) {
  std::lock_guard<std::mutex> lock(mu_);
  auto nodes = graph(g, "graph").nodes;
  uint64_t id = next_id_++;
  graphs_[id] = {nodes, {}, 0};
  return id;
}

bool SimDevice::update(uint64_t exec, uint64_t g) {
  std::lock_guard<std::mutex> lock(mu_);
  GraphEntry& e = graph(exec, "graph exec");
  auto nodes = graph(g, "graph").nodes;
  if (e.nodes->size() != nodes->size()) return false;
  for (size_t i = 0; i < e.nodes->size(); ++i)
    if ((*e.nodes)[i].name != (*nodes)[i].name) return false;
  e.nodes = nodes;  // queued launches keep the old nodes
  return true;
}

void SimDevice::launch_graph(uint64_t exec, uint64_t stream_id) {
  forbid_in_capture("launching a graph", "cudaErrorStreamCaptureUnsupported");
  std::shared_ptr<Stream> s = stream(stream_id);
  std::lock_guard<std::mutex> lock(mu_);
  GraphEntry& e = graph(exec, "graph exec");
  if (e.last_stream && e.last_stream != s)
    s->push({[prev = e.last_stream, seq = e.last_seq] { prev->wait_for(seq); }, 0});
  std::shared_ptr<const Nodes> nodes = e.nodes;
  s->push({[nodes] {
             for (const Node& n : *nodes) {
               spin_ns(g_node_ns);
               n.fn();
             }
           },
           g_launch_ns});
  e.last_stream = s;
  e.last_seq = s->submitted();
}

void SimDevice::destroy(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  graphs_.erase(id);
}

}  // namespace kiln::sim
