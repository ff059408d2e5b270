#include "kiln/distributed/process_group.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <utility>

#include "kiln/core/error.h"
#include "kiln/core/stream.h"
#include "kiln/distributed/backends.h"
#include "kiln/distributed/collective_backend.h"
#include "kiln/distributed/init.h"
#include "kiln/distributed/mpi_comm.h"

#ifdef KILN_HAVE_MPI
#include <mpi.h>
#endif

// Note [Process groups]
// A group is a communicator plus, per device type, the backend that moves tensors of that type
// (collective_backend.h). Groups are made collectively (every rank of the parent calls) and live
// until exit; collective ops name them by id, an int that traces and graphs can hold. Ids are
// local to a process: ranks agree on which group a call uses because they run the same program,
// not because the numbers match. Device backends (NCCL) are made when the group is made, never
// inside a capture: their set-up is itself collective and may not be captured.
//
// Note [One communicator per stream]
// MPI matches collectives on a communicator in the order they are issued. Two threads (the
// caller's, and a sim stream's worker running host tasks) issuing on one communicator could
// interleave differently on different ranks and deadlock or mix data. So each context that
// issues collectives gets its own duplicate of the group's communicator: the host collectives
// of each thread, and each device stream. The duplicate is made the first time the context
// issues, on the issuing thread, in program order (so in the same order on every rank); the
// group's own communicator is used only to make duplicates and for set-up. Duplicates pair up
// across ranks by the order they are made: a program whose user threads issue collectives on
// one group must make each thread's first collective on it in the same order on every rank
// (device streams are issued from the program's thread, so theirs always are).
namespace kiln::distributed {

// Note [Finding a group's backend and communicator]
// Every collective looks up its group's backend (by device type) and its communicator (by
// stream key), so the lookups take no lock: backends sit in an array of atomic pointers, one
// per device type, and communicators in a list that only ever grows at its head. Both are
// written under setup_mu_ and published with release stores; an entry, once published, lives
// as long as the group (a backend replaced by a re-registered factory is kept too, since
// another thread may still be inside it).
//
// Note [A failed set-up is not retried]
// A backend factory that throws (NCCL's communicator could not be made, say) leaves its error
// with the group, and every later collective of that device type raises it again, naming the
// group, instead of trying again: a retry would be collective work on some ranks only, at
// whatever collective came next, possibly inside a capture. Registering the factory again
// (loading the plugin again) is the way to retry, on every rank at once. For the same reason
// a backend still to be made when its device's stream is capturing is an error, not a set-up
// inside the graph.
struct GroupFactory {
  static std::shared_ptr<ProcessGroup> make(std::unique_ptr<MpiComm> comm,
                                            std::vector<int> world_ranks, std::string name);
  // Makes (or remakes) `g`'s backend for device type `type`; a failure is remembered (Note [A
  // failed set-up is not retried]) and rethrown.
  static void set_backend(const ProcessGroup& g, int type, const BackendFactory& factory) {
    std::lock_guard<std::mutex> setup(g.setup_mu_);
    build(g, type, [&] { return factory(const_cast<ProcessGroup&>(g)); });
  }
  // Under g.setup_mu_.
  template <class Make>
  static CollectiveBackend* build(const ProcessGroup& g, int type, Make&& make) {
    std::unique_ptr<CollectiveBackend> b;
    try {
      b = make();
    } catch (const std::exception& e) {
      std::erase_if(g.failed_, [type](const auto& f) { return f.first == type; });
      g.failed_.emplace_back(type, e.what());
      throw;
    }
    if (!b) return nullptr;
    CollectiveBackend* raw = b.get();
    g.install_backend(type, std::move(b));
    return raw;
  }
};

void ProcessGroup::install_backend(int type, std::unique_ptr<CollectiveBackend> b) const {
  std::erase_if(failed_, [type](const auto& f) { return f.first == type; });
  backend_of_type_[type].store(b.get(), std::memory_order_release);
  backends_.push_back(std::move(b));
}

namespace {

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ProcessGroup>> groups;  // by id
  int64_t next_id = 0;
  std::vector<std::pair<std::string, BackendFactory>> factories;
};
// Never destroyed: factories may hold code of plugins unloaded before static destructors run,
// and groups live until exit anyway.
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Product:
      return "product";
  }
  return "?";
}

ReduceOp reduce_op_from(int64_t v, std::string_view op) {
  KILN_CHECK(v >= 0 && v <= static_cast<int64_t>(ReduceOp::Product),
             "[{}] reduce_op {} is not a ReduceOp (0 sum, 1 avg, 2 max, 3 min, 4 product)", op, v);
  return static_cast<ReduceOp>(v);
}

std::chrono::milliseconds default_timeout() {
  static const std::chrono::milliseconds t = [] {
    const char* v = std::getenv("KILN_DIST_TIMEOUT");
    if (!v || !*v) return std::chrono::milliseconds(600'000);
    char* end = nullptr;
    double s = std::strtod(v, &end);
    KILN_CHECK(end && *end == '\0' && s > 0 && s < 1e9,
               "[distributed] KILN_DIST_TIMEOUT='{}' is not a positive number of seconds", v);
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }();
  return t;
}

std::shared_ptr<ProcessGroup> GroupFactory::make(std::unique_ptr<MpiComm> comm,
                                                 std::vector<int> world_ranks, std::string name) {
  std::shared_ptr<ProcessGroup> g(new ProcessGroup());
  g->rank_ = comm->rank();
  g->world_ranks_ = std::move(world_ranks);
  g->timeout_ms_ = default_timeout().count();
  g->base_ = std::move(comm);
  Registry& r = registry();
  std::vector<std::pair<std::string, BackendFactory>> factories;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    g->id_ = r.next_id++;
    g->name_ = name.empty() ? fmt::format("group{}", g->id_) : std::move(name);
    r.groups.push_back(g);
    factories = r.factories;
  }
  // Device backends are made now, collectively (Note [Process groups]).
  for (auto& [type, factory] : factories) {
    int t = find_device_type(type);
    if (t >= 0) set_backend(*g, t, factory);
  }
  return g;
}

ProcessGroup::~ProcessGroup() {
  for (CommEntry* e = comms_.load(); e;) delete std::exchange(e, e->next);
}

int ProcessGroup::group_rank_of(int world_rank) const {
  auto it = std::find(world_ranks_.begin(), world_ranks_.end(), world_rank);
  return it == world_ranks_.end() ? -1 : static_cast<int>(it - world_ranks_.begin());
}

void ProcessGroup::set_timeout(std::chrono::milliseconds t) {
  KILN_CHECK(t.count() > 0, "[ProcessGroup] group {}'s timeout must be positive, got {} ms", name_,
             t.count());
  std::lock_guard<std::mutex> setup(setup_mu_);
  timeout_ms_ = t.count();
  base_->set_setup_timeout(t);
  for (CommEntry* e = comms_.load(); e; e = e->next) e->comm->set_setup_timeout(t);
}

// Set-up (a backend, a communicator) is collective and made once, under setup_mu_; lookups
// take no lock (Note [Finding a group's backend and communicator]).
CollectiveBackend& ProcessGroup::backend(Device device, std::string_view op) const {
  const int type = device.type();
  if (CollectiveBackend* b = backend_of_type_[type].load(std::memory_order_acquire)) return *b;
  std::lock_guard<std::mutex> setup(setup_mu_);
  if (CollectiveBackend* b = backend_of_type_[type].load(std::memory_order_acquire)) return *b;
  const std::string where = fmt::format("[{}] group {} (rank {} of {})", op, name_, rank_, size());
  for (auto& [t, why] : failed_)  // Note [A failed set-up is not retried]
    if (t == type)
      throw DistributedError(fmt::format(
          "{} has no collective backend for {} tensors: its set-up failed and is not retried "
          "(register the backend again, on every rank, to retry): {}",
          where, device, why));
  // A factory registered after this group was made whose set-up could not run then (its
  // device type did not exist yet): made now, by every rank at the same collective.
  BackendFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& [name, f] : r.factories)
      if (find_device_type(name) == type) factory = f;
  }
  CollectiveBackend* made = nullptr;
  if (factory) {
    DeviceInterface* iface = device_interface(type);
    if (iface && iface->capturing(device.index()))
      throw DistributedError(fmt::format(
          "{} would set up its collective backend for {} tensors while {}'s stream is capturing; "
          "set-up is collective work a graph cannot hold: run one collective of this group on "
          "{} eagerly before capturing (or register the backend before making the group)",
          where, device, device, device));
    made =
        GroupFactory::build(*this, type, [&] { return factory(const_cast<ProcessGroup&>(*this)); });
  } else {
    made = GroupFactory::build(*this, type, [&] { return make_builtin_backend(*this, device); });
  }
  if (!made)
    throw DistributedError(fmt::format("{} has no collective backend for {} tensors{}", where,
                                       device,
                                       device_type_name(device.type()) == "cuda"
                                           ? " (load the CUDA plugin before making the group)"
                                           : ""));
  return *made;
}

MpiComm* ProcessGroup::comm(uint64_t key) const {
  for (CommEntry* e = comms_.load(std::memory_order_acquire); e; e = e->next)
    if (e->key == key) return e->comm.get();
  std::lock_guard<std::mutex> setup(setup_mu_);
  CommEntry* head = comms_.load(std::memory_order_acquire);
  for (CommEntry* e = head; e; e = e->next)  // made while this thread waited
    if (e->key == key) return e->comm.get();
  auto* made = new CommEntry{key, base_->dup(), head};
  comms_.store(made, std::memory_order_release);
  return made->comm.get();
}

ProcessGroup& world() {
  init();
  static ProcessGroup* w = [] {
#ifdef KILN_HAVE_MPI
    if (mpi_active()) {
      MPI_Comm comm = MPI_COMM_WORLD;
      std::vector<int> ranks(world_size());
      for (int i = 0; i < world_size(); ++i) ranks[i] = i;
      return GroupFactory::make(MpiComm::adopt(&comm), std::move(ranks), "world").get();
    }
#endif
    return GroupFactory::make(MpiComm::solo(), {0}, "world").get();
  }();
  return *w;
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) {
  ProcessGroup& w = world();
  KILN_CHECK(!ranks.empty(), "[new_group] the rank list is empty");
  for (size_t i = 0; i < ranks.size(); ++i) {
    KILN_CHECK(ranks[i] >= 0 && ranks[i] < w.size(),
               "[new_group] rank {} is outside the world of {} ranks (ranks {})", ranks[i],
               w.size(), ranks);
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(ranks[j] != ranks[i], "[new_group] rank {} is listed twice (ranks {})", ranks[i],
                 ranks);
  }
  int pos = static_cast<int>(std::find(ranks.begin(), ranks.end(), w.rank()) - ranks.begin());
  bool member = pos < static_cast<int>(ranks.size());
  std::unique_ptr<MpiComm> c = w.base_comm()->split(member ? 0 : -1, pos);
  if (!member) {
    std::lock_guard<std::mutex> lock(registry().mu);
    // Every rank numbers the same groups alike: a non-member keeps the id's slot empty, so
    // that ids stay indices of `groups`.
    registry().groups.push_back(nullptr);
    registry().next_id++;
    return nullptr;
  }
  return GroupFactory::make(std::move(c), ranks, "");
}

std::shared_ptr<ProcessGroup> split_group(const ProcessGroup& parent, int color, int key) {
  std::unique_ptr<MpiComm> c = parent.base_comm()->split(color, key);
  if (!c) {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().groups.push_back(nullptr);  // as in new_group
    registry().next_id++;
    return nullptr;
  }
  int me = parent.world_ranks()[parent.rank()];
  std::vector<int> ranks(c->size());
  c->all_gather_bytes(&me, ranks.data(), sizeof(int));
  return GroupFactory::make(std::move(c), std::move(ranks), "");
}

const ProcessGroup& group_by_id(int64_t id, std::string_view op) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  KILN_CHECK(id >= 0 && id < static_cast<int64_t>(r.groups.size()) && r.groups[id],
             "[{}] group {} does not exist on rank {} (groups 0..{} were made; a rank outside a "
             "group cannot call its collectives)",
             op, id, rank(), static_cast<int64_t>(r.groups.size()) - 1);
  return *r.groups[id];
}

void register_collective_backend(std::string_view device_type, BackendFactory factory) {
  Registry& r = registry();
  std::vector<std::shared_ptr<ProcessGroup>> existing;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = std::find_if(r.factories.begin(), r.factories.end(),
                           [&](const auto& f) { return f.first == device_type; });
    if (it != r.factories.end())
      it->second = factory;
    else
      r.factories.emplace_back(std::string(device_type), factory);
    for (auto& g : r.groups)
      if (g) existing.push_back(g);
  }
  int t = find_device_type(device_type);
  if (t < 0) return;
  // A group whose set-up fails keeps the error for its first collective on that device type
  // (Note [A failed set-up is not retried]); the other groups still get the backend.
  for (auto& g : existing) {
    try {
      GroupFactory::set_backend(*g, t, factory);
    } catch (const std::exception&) {
    }
  }
}

uint64_t stream_key(Device device) {
  if (device.dispatch_key() == DispatchKey::CPU) {
    // Host collectives: one context per thread.
    static std::atomic<uint64_t> next{1};
    thread_local uint64_t mine = next++;
    return mine;
  }
  Stream s = Stream::current(device);
  return (uint64_t{1} << 63) | ((static_cast<uint64_t>(device.type()) << 56) ^
                                (static_cast<uint64_t>(device.index()) << 48) ^ s.id());
}

}  // namespace kiln::distributed
