#include "kiln/parallel/ddp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <optional>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/compile/host_guard.h"
#include "kiln/core/error.h"
#include "kiln/core/stream.h"
#include "kiln/dispatch/op.h"
#include "kiln/distributed/collectives.h"
#include "kiln/ops/ops.h"

namespace kiln::parallel {

// Note [DDP's buckets]
// Parameters are taken in reverse registration order (roughly the order backward produces
// their gradients) and packed into buckets, one flat contiguous tensor per (device, dtype): a
// bucket closes once it holds at least its cap, 1 MiB for the first bucket of each (device,
// dtype) so that communication starts early, 25 MiB after that (PyTorch's defaults). Each
// parameter's .grad is a view of its slice of the bucket, so backward accumulates straight
// into the bucket and the all-reduce needs no copy in or out; the views keep their address,
// which compiled steps and device graphs rely on. Buckets are reduced in index order on every
// rank, so the ranks' collectives always match one for one whatever order the gradients
// arrive in. A parameter shared by several modules (tied weights) has one slice.
//
// Note [When a bucket is reduced]
// A parameter is ready when backward has accumulated its gradient of this pass into .grad:
// the post-accumulate-grad hook (autograd/engine.h) fires then, and the engine finishes a
// leaf as soon as the last node sending it a gradient has run (Note [Leaves finish early] in
// engine.cpp), so the first buckets are all-reduced (distributed::all_reduce_async, averaging)
// while backward still runs. A plain gradient hook would not do: it runs before accumulation,
// on the gradient of this pass alone, and would have to write the bucket itself. On the cpu,
// Open MPI progresses a non-blocking collective only inside MPI calls, so every later hook
// tests the buckets in flight. The first ready parameter of a pass queues a callback
// (autograd::queue_callback) that runs when backward ends: it checks that every parameter got
// a gradient and waits for the all-reduces, so .grad holds the average when backward()
// returns, and nothing needs calling before the optimizer step. A parameter that got no
// gradient is an error on every rank, never a hang (Note [A parameter without a gradient]).
// If backward fails midway, the buckets already started are waited for when the pass's
// callback queue is dropped.
//
// Under kiln::compile, all_reduce_async is traced as the synchronous all_reduce_, so a
// compiled step holds its bucketed all-reduces in order with backward (captured into device
// graphs on sim and CUDA); its replays run no hooks. On a device with streams the executable
// runs them on a communication stream of its own, and since a bucket is a free tensor nothing
// waits for its all-reduce until a step touches the bucket again (the optimizer): backward
// goes on meanwhile, as in eager DDP (Note [Collectives on a stream of their own] in
// kiln/compile/comm_stream.cpp). no_sync() is a HostCell read by the hooks
// while tracing, so it is one of the step's guards.
//
// Note [A parameter without a gradient]
// A parameter may get no gradient on some ranks only (rank 1's loss skips a branch). That rank
// cannot start the bucket holding it, nor any later one (buckets start in index order), while
// the other ranks start them all: left alone, they would wait in that bucket's all-reduce
// until the deadline. So at the end of backward a rank with buckets not yet started starts
// them all the same, in order, and the ranks learn of it through flags reduced with the
// buckets: the last bucket's flat tensor ends with one element per group rank, outside every
// gradient view, zero normally; a rank that missed a gradient writes (index of its first
// bucket not full) + 1 into its own element before starting the rest. The last bucket is
// always among those started then, so after the reduction (an average) element r is non-zero
// on every rank exactly when rank r missed, and r's bucket is round(value * ranks) - 1. Every
// rank then raises: the one that missed names its parameters, the others name that rank and
// the bucket's parameters. The flags are zeroed again after a failure (ddp.zero_grad() leaves
// them alone), so a later correct backward works.
//
// When is it read? On the CPU the flags are there once the buckets' waits return: every rank
// raises at the end of the backward at fault. On a device with streams (sim, CUDA) reading
// them is a host sync, which a step must not pay, so the end of backward only records an event
// after the last all-reduce, and the first hook of the next backward (synchronised or not)
// reads the flags on a stream of DDP's own that waits for that event alone (on CUDA the host
// waits for the previous step's last all-reduce, usually done by then, and not for the work
// queued since; sim's copies to the host wait for the whole device). Every rank, the one that
// missed too, raises there, before that backward communicates: the ranks stay in step (each
// took the faulty step's optimizer update alike, from the same averaged gradients) and a later
// backward works. A rank that misses does not raise at once, which would leave the others one
// step behind it. While a compiled step is traced the flags are read at once
// (tracing runs the ops for real; a trace that fails fails on every rank); its replays reduce
// the flags with the last bucket and run no hooks: a replayed step's gradients cannot change
// which parameters they reach. Not caught: a rank on which no parameter at all gets a gradient
// runs no hook, so the others wait for its buckets until the deadline.

// Note [Bucket padding]
// Every bucket's flat tensor is a whole number of kBucketAlignBytes, zeros after the gradients
// (and the flags), reduced with them. The flags alone made the last bucket's length odd
// (3,060,481 floats for the bench's gpt), which leaves the pieces a collective splits a message
// into off 16-byte boundaries. Measured on two H200s (bench/gpu_runs.md, S10), NCCL took that
// bucket in the same time padded or not (65 us in a graph); the padding stays because it costs
// at most kBucketAlignBytes a bucket and the custom all-reduce sums whole 16-byte packs.
constexpr int64_t kBucketAlignBytes = 512;

struct DistributedDataParallel::State : std::enable_shared_from_this<State> {
  struct Bucket {
    Tensor flat;  // [reduced_numel]: the gradients, the last bucket's flags, zero padding
    std::vector<size_t> params;
    size_t pending = 0;  // its parameters not yet ready in this pass
    distributed::Work work;
    bool launched = false, done = false;
  };

  nn::Module* module = nullptr;
  const distributed::ProcessGroup* group = nullptr;
  std::vector<std::string> names;
  TensorList params;
  TensorList views;  // views[i] is params[i]'s .grad
  std::vector<size_t> bucket_of;
  std::vector<Bucket> buckets;
  std::vector<DDPBucket> info;
  std::shared_ptr<compiler::HostCell> sync;
  int rank = 0, ranks = 1;
  Tensor flags;  // [ranks], the last bucket's tail (See Note [A parameter without a gradient])

  // Flags of the last synchronised backward not read yet (devices with streams only).
  bool flags_pending = false;
  std::unique_ptr<Event> flags_ready;     // recorded after that backward's all-reduces
  std::optional<Stream> flags_stream;     // reads them without waiting for later work
  std::vector<std::string> flags_missed;  // the parameters this rank missed then

  // The pass in progress (armed between its first ready parameter and its end).
  bool armed = false;
  std::vector<char> ready;
  size_t ready_count = 0;
  size_t next_launch = 0;
  std::chrono::steady_clock::time_point first_launch;
  std::chrono::steady_clock::duration comm{};  // in collective calls during backward
  DDPSyncStats stats;

  static std::string describe_sync(const void*) {
    return "DistributedDataParallel gradient sync (false inside no_sync())";
  }

  void start_pass() {
    armed = true;
    std::fill(ready.begin(), ready.end(), 0);
    ready_count = 0;
    next_launch = 0;
    comm = {};
    for (Bucket& b : buckets) {
      b.pending = b.params.size();
      b.launched = b.done = false;
      b.work = {};
    }
  }

  void on_accumulated(size_t i) {
    if (flags_pending) check_pending();
    const Tensor& p = params[i];
    if (p.grad().impl() != views[i].impl()) {  // .grad was replaced (zero_grad(set_to_none))
      autograd::NoGradGuard no_grad;
      views[i].copy_(p.grad());
      p.set_grad(views[i]);
    }
    if (!sync->get().as_bool()) return;
    if (!armed) {
      start_pass();
      auto token = std::make_shared<PassToken>(weak_from_this());
      autograd::queue_callback([token] {
        token->finished = true;
        if (auto s = token->state.lock()) s->finish();
      });
    }
    KILN_ASSERT(!ready[i], "DDP parameter '{}' was made ready twice in one backward", names[i]);
    ready[i] = 1;
    ++ready_count;
    if (--buckets[bucket_of[i]].pending == 0) launch_ready();
    progress();
  }

  // Starts every bucket that is full, in index order (See Note [DDP's buckets]).
  void launch_ready() {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) launch_next();
  }

  // Starts bucket next_launch (the time spent in the call counts as communication: a
  // collective that cannot run in the background, such as the cross-memory CPU all-reduce,
  // does all its work there).
  void launch_next() {
    Bucket& b = buckets[next_launch++];
    auto t0 = std::chrono::steady_clock::now();
    if (next_launch == 1) first_launch = t0;
    b.work = distributed::all_reduce_async(b.flat, distributed::ReduceOp::Avg, group);
    b.launched = true;
    comm += std::chrono::steady_clock::now() - t0;
  }

  void progress() {
    auto t0 = std::chrono::steady_clock::now();
    for (size_t k = 0; k < next_launch; ++k) {
      Bucket& b = buckets[k];
      if (!b.done) b.done = b.work.is_completed();
    }
    comm += std::chrono::steady_clock::now() - t0;
  }

  void wait_launched() {
    for (size_t k = 0; k < next_launch; ++k) {
      buckets[k].work.wait();
      buckets[k].work = {};
    }
  }

  // Starts every bucket not started yet, in index order, full or not.
  void launch_rest() {
    while (next_launch < buckets.size()) launch_next();
  }

  void finish() {
    armed = false;
    auto end = std::chrono::steady_clock::now();
    std::vector<std::string> missed;
    if (ready_count < params.size()) {
      // See Note [A parameter without a gradient]: flag it, then start what every other rank
      // may have started.
      for (size_t i = 0; i < params.size(); ++i)
        if (!ready[i]) missed.push_back("'" + names[i] + "'");
      {
        autograd::NoGradGuard no_grad;
        narrow(flags, 0, rank, 1).fill_(static_cast<double>(next_launch + 1));
      }
      launch_rest();
    }
    wait_launched();
    auto waited = std::chrono::steady_clock::now();
    if (flags.device().is_cpu() || tracing()) {
      check_flags(read_flags(), missed, "this backward");
    } else {
      if (!flags_ready) {
        flags_ready = std::make_unique<Event>(flags.device());
        flags_stream = Stream::create(flags.device());
      }
      flags_ready->record();
      flags_pending = true;
      flags_missed = std::move(missed);
    }
    using ms = std::chrono::duration<double, std::milli>;
    stats.syncs += 1;
    stats.bytes = 0;
    for (const DDPBucket& b : info)
      stats.bytes += b.numel * static_cast<int64_t>(itemsize(b.dtype));
    stats.overlap_ms = ms(end - first_launch).count();
    stats.wait_ms = ms(waited - end).count();
    stats.comm_ms = ms(comm).count();
  }

  static bool tracing() { return local_dispatch_state().included.has(DispatchKey::Trace); }

  // The flags as doubles; never traced (the trace would take it for a host read).
  std::vector<double> read_flags() const {
    ExcludeKeyGuard no_trace(DispatchKey::Trace);
    autograd::NoGradGuard no_grad;
    Tensor host = flags.to(Device(kCPU)).to(kFloat64).contiguous();
    const auto* p = static_cast<const double*>(host.impl()->data());
    return std::vector<double>(p, p + host.numel());
  }

  // The start of a backward on a device with streams: the flags of the last synchronised one.
  void check_pending() {
    flags_pending = false;
    std::vector<double> values;
    {
      flags_ready->wait(*flags_stream);
      StreamGuard on(*flags_stream);
      values = read_flags();
    }
    check_flags(values, std::move(flags_missed),
                "the previous synchronised backward (on a device with streams the next backward "
                "reports it)");
  }

  // Raises on every rank alike when some rank missed a gradient (`missed`: this rank's).
  void check_flags(const std::vector<double>& values, std::vector<std::string> missed,
                   const char* when) {
    std::vector<std::string> others;
    bool any = false;
    for (int r = 0; r < ranks; ++r) {
      if (values[r] == 0) continue;
      any = true;
      if (r == rank) continue;
      const int64_t k = std::llround(values[r] * ranks) - 1;
      if (k < 0 || k >= static_cast<int64_t>(info.size())) {
        others.push_back(fmt::format("rank {} (for a parameter of a bucket)", r));
        continue;
      }
      const auto& ps = info[k].params;
      std::vector<std::string> shown;
      for (size_t j = 0; j < ps.size() && j < 6; ++j) shown.push_back("'" + ps[j] + "'");
      if (ps.size() > shown.size()) shown.push_back(fmt::format("... {} in all", ps.size()));
      others.push_back(fmt::format("rank {} (for a parameter of bucket {} of {}: {})", r, k,
                                   info.size(), fmt::join(shown, ", ")));
    }
    KILN_ASSERT(any || missed.empty(),
                "DDP: this rank missed {} gradient(s) but no flag was reduced", missed.size());
    if (!any) return;
    {
      ExcludeKeyGuard no_trace(DispatchKey::Trace);
      autograd::NoGradGuard no_grad;
      flags.zero_();
    }
    constexpr const char* advice =
        "every parameter must take part in the loss of every synchronised backward, on every "
        "rank (freeze it with requires_grad_(false) before wrapping the module, or accumulate "
        "with no_sync())";
    const std::string where = fmt::format("rank {} of group '{}'", rank, group->name());
    if (!missed.empty())
      KILN_THROW(Value,
                 "[DistributedDataParallel] parameter {} received no gradient in {} ({} of {} "
                 "parameters did not: {}) on {}{}{}; {}",
                 missed.front(), when, missed.size(), params.size(), fmt::join(missed, ", "), where,
                 others.empty() ? "" : "; nor did ", fmt::join(others, ", "), advice);
    KILN_THROW(Value,
               "[DistributedDataParallel] another rank got no gradient in {}: {}; {} raises "
               "too, so that the ranks stay in step; {}",
               when, fmt::join(others, ", "), where, advice);
  }

  // A pass that ended without running its callback (backward threw): wait for the buckets
  // every rank started, so the next pass does not write into a bucket still being reduced.
  void abandon() {
    armed = false;
    try {
      wait_launched();
    } catch (...) {  // the pass already failed; its own error is the one to report
    }
  }

  struct PassToken {
    explicit PassToken(std::weak_ptr<State> s) : state(std::move(s)) {}
    ~PassToken() {
      if (finished) return;
      if (auto s = state.lock()) s->abandon();
    }
    std::weak_ptr<State> state;
    bool finished = false;
  };
};

namespace {

// FNV-1a of every parameter's name, shape and dtype: equal modules, equal hashes.
uint64_t signature(const std::vector<std::string>& names, const TensorList& params) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  };
  for (size_t i = 0; i < params.size(); ++i)
    mix(fmt::format("{}[{}]{};", names[i], fmt::join(params[i].sizes(), ","),
                    name(params[i].dtype())));
  return h;
}

// Raises on every rank alike when the ranks' modules differ, before any broadcast could hang
// on or scramble mismatched tensors.
void check_same_module(const distributed::ProcessGroup& g, const std::vector<std::string>& names,
                       const TensorList& params) {
  int64_t numel = 0;
  for (const Tensor& p : params) numel += p.numel();
  uint64_t h = signature(names, params);
  Tensor mine = from_vector(
      std::vector<int64_t>{static_cast<int64_t>(params.size()), numel, static_cast<int64_t>(h)});
  std::vector<int64_t> all = distributed::all_gather_into_tensor(mine, &g).to_vector<int64_t>();
  std::vector<std::string> differ;
  for (int r = 1; r < g.size(); ++r)
    if (all[3 * r + 2] != all[2])
      differ.push_back(fmt::format("rank {} has {} ({} elements)", r, all[3 * r], all[3 * r + 1]));
  KILN_CHECK(differ.empty(),
             "[DistributedDataParallel] the ranks of group '{}' wrap different modules: rank 0 "
             "has {} parameters ({} elements), {}; every rank must wrap the same module (same "
             "parameter names, shapes and dtypes)",
             g.name(), all[0], all[1], fmt::join(differ, ", "));
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, DDPOptions options)
    : state_(std::make_shared<State>()) {
  KILN_CHECK(options.bucket_cap_bytes > 0 && options.first_bucket_cap_bytes > 0,
             "[DistributedDataParallel] bucket caps must be positive, got bucket_cap_bytes {} "
             "and first_bucket_cap_bytes {}",
             options.bucket_cap_bytes, options.first_bucket_cap_bytes);
  State& s = *state_;
  s.module = &module;
  s.group = options.group ? options.group : &distributed::world();
  s.sync = compiler::HostCell::make(true, nullptr, &State::describe_sync);

  // Every parameter once (tied weights are one tensor): all are checked and broadcast, frozen
  // ones too; those that require grad are bucketed.
  std::unordered_set<const TensorImpl*> seen;
  std::vector<std::string> all_names;
  std::vector<Tensor> all_params;
  for (auto& [name, p] : module.named_parameters()) {
    if (!seen.insert(p.impl()).second) continue;
    all_names.push_back(name);
    all_params.push_back(p);
    if (!p.requires_grad()) continue;
    s.names.push_back(name);
    s.params.push_back(p);
  }
  check_same_module(*s.group, all_names, all_params);

  autograd::NoGradGuard no_grad;
  for (const Tensor& p : all_params) distributed::broadcast_(p, 0, s.group);
  if (options.broadcast_buffers)
    for (auto& [name, b] : module.named_buffers()) distributed::broadcast_(b, 0, s.group);

  // See Note [DDP's buckets]: reverse registration order, one open bucket per (device, dtype).
  struct Open {
    size_t bucket;
    int64_t bytes = 0;
    int64_t cap;
  };
  std::map<std::pair<std::string, int>, Open> open;
  std::map<std::pair<std::string, int>, bool> had_first;
  s.bucket_of.resize(s.params.size());
  std::vector<int64_t> offset(s.params.size());
  for (size_t i = s.params.size(); i-- > 0;) {
    const Tensor& p = s.params[i];
    auto key = std::make_pair(fmt::format("{}", p.device()), static_cast<int>(p.dtype()));
    auto it = open.find(key);
    if (it == open.end()) {
      int64_t cap = had_first[key] ? options.bucket_cap_bytes : options.first_bucket_cap_bytes;
      had_first[key] = true;
      it = open.emplace(key, Open{s.buckets.size(), 0, cap}).first;
      s.buckets.emplace_back();
      s.info.push_back({p.dtype(), p.device(), 0, 0, {}});
    }
    size_t b = it->second.bucket;
    s.bucket_of[i] = b;
    offset[i] = s.info[b].numel;
    s.info[b].numel += p.numel();
    s.info[b].params.push_back(s.names[i]);
    s.buckets[b].params.push_back(i);
    it->second.bytes += p.numel() * static_cast<int64_t>(itemsize(p.dtype()));
    if (it->second.bytes >= it->second.cap) open.erase(it);
  }
  // The last bucket ends with one flag per rank (See Note [A parameter without a gradient]).
  s.rank = s.group->rank();
  s.ranks = s.group->size();
  // Note [Bucket padding]
  for (size_t b = 0; b < s.buckets.size(); ++b) {
    const int64_t used = s.info[b].numel + (b + 1 == s.buckets.size() ? s.ranks : 0);
    const int64_t align = std::max<int64_t>(1, kBucketAlignBytes / itemsize(s.info[b].dtype));
    s.info[b].reduced_numel = (used + align - 1) / align * align;
    s.buckets[b].flat = zeros({s.info[b].reduced_numel}, s.info[b].dtype, s.info[b].device);
  }
  if (!s.buckets.empty()) s.flags = narrow(s.buckets.back().flat, 0, s.info.back().numel, s.ranks);
  s.views.resize(s.params.size());
  s.ready.assign(s.params.size(), 0);
  for (size_t i = 0; i < s.params.size(); ++i) {
    const Tensor& p = s.params[i];
    Tensor view = narrow(s.buckets[s.bucket_of[i]].flat, 0, offset[i], p.numel()).view(p.sizes());
    if (p.grad().defined()) view.copy_(p.grad());
    p.set_grad(view);
    s.views[i] = view;
    std::weak_ptr<State> weak = state_;
    autograd::register_post_accumulate_grad_hook(p, [weak, i](const Tensor&) {
      if (auto st = weak.lock()) st->on_accumulated(i);
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() = default;
DistributedDataParallel::DistributedDataParallel(DistributedDataParallel&&) noexcept = default;
DistributedDataParallel& DistributedDataParallel::operator=(DistributedDataParallel&&) noexcept =
    default;

nn::Module& DistributedDataParallel::module() const { return *state_->module; }
const distributed::ProcessGroup& DistributedDataParallel::group() const { return *state_->group; }

DistributedDataParallel::NoSync::NoSync(std::shared_ptr<State> state)
    : state_(std::move(state)), previous_(state_->sync->peek().as_bool()) {
  state_->sync->set(false);
}
DistributedDataParallel::NoSync::~NoSync() { state_->sync->set(previous_); }

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(state_); }

bool DistributedDataParallel::sync_enabled() const { return state_->sync->get().as_bool(); }

void DistributedDataParallel::zero_grad() {
  autograd::NoGradGuard no_grad;
  State& s = *state_;
  for (size_t b = 0; b < s.buckets.size(); ++b)  // the gradients, not the flags after them
    narrow(s.buckets[b].flat, 0, 0, s.info[b].numel).zero_();
  for (size_t i = 0; i < s.params.size(); ++i)
    if (s.params[i].grad().impl() != s.views[i].impl()) s.params[i].set_grad(s.views[i]);
}

const std::vector<DDPBucket>& DistributedDataParallel::buckets() const { return state_->info; }
const DDPSyncStats& DistributedDataParallel::stats() const { return state_->stats; }

}  // namespace kiln::parallel
