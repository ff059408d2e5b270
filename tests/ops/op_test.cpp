// Runs the op table (op_test_*.cpp) against ATen on the CPU and on CUDA, on the meta device and
// on sim, and every record's gradcheck and error samples.
//
// Note [The op record]
// Each op has one record in the op table, in the file of its family, holding all of its tests
// (PyTorch's OpInfo): the OpCase rows that name it (its samples, checked against ATen on every
// dtype of `dtypes`, on meta, on sim, and on CUDA with `cuda_dtypes` when given), and on its
// first row (head() in op_test_util.h) the op's other checks: `grad` (gradcheck this row too),
// `grads` (gradcheck samples with inputs of their own, e.g. kept away from a kink) and `errors`
// (calls that must raise). A pointwise op's record is its PointwiseSpec, which add_pointwise
// turns into rows, so a new unary op with a derivative is one add_pointwise call with
// `.grad = true`. Samples that exercise several ops at once (a view of a view, a chain of
// in-place ops) or no op (parsing a device) are op_test_composite.cpp's short table.
// Coverage (OpCoverage.*): every op has a row, and every op with a backward formula is reached
// by a gradcheck of its record.
//
// Note [How a case runs]
#include <ATen/Parallel.h>

#include <cmath>
#include <set>

#include "kiln/autograd/derivative.h"
#include "kiln/autograd/gradcheck.h"
#include "tests/backend/cuda_util.h"
#include "tests/backend/sim_util.h"
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

// One test per (row, dtype).
struct CaseParam {
  const OpCase* c;
  std::optional<DType> dtype;
};
void PrintTo(const CaseParam& p, std::ostream* os) {
  *os << p.c->name << (p.dtype ? "/" + std::string(name(*p.dtype)) : "");
}

// The (row, dtype) cases of a table; on CUDA with each row's cuda_dtypes where it has them.
std::vector<CaseParam> params_of(const Cases& cs, bool cuda = false) {
  std::vector<CaseParam> out;
  for (const OpCase& c : cs) {
    if (c.dtypes.empty()) out.push_back({&c, std::nullopt});
    for (DType d : cuda&& c.cuda_dtypes ? *c.cuda_dtypes : c.dtypes) out.push_back({&c, d});
  }
  return out;
}
std::vector<CaseParam> cuda_params_of(const Cases& cs) { return params_of(cs, true); }
std::string param_name(const testing::TestParamInfo<CaseParam>& info) {
  const CaseParam& p = info.param;
  return p.c->name + (p.dtype ? "_" + std::string(name(*p.dtype)) : "");
}

const Cases& pointwise() {
  static const Cases c = pointwise_cases();
  return c;
}
const Cases& reduce() {
  static const Cases c = reduce_cases();
  return c;
}
const Cases& linalg_nn() {
  static const Cases c = linalg_nn_cases();
  return c;
}
const Cases& shape_index() {
  static const Cases c = shape_index_cases();
  return c;
}
const Cases& factory_foreach() {
  static const Cases c = factory_foreach_cases();
  return c;
}
const Cases& sort_scan() {
  static const Cases c = sort_scan_cases();
  return c;
}
const Cases& misc_core() {
  static const Cases c = misc_core_cases();
  return c;
}
std::vector<const Cases*> all_tables() {
  return {&pointwise(),       &reduce(),    &linalg_nn(), &shape_index(),
          &factory_foreach(), &sort_scan(), &misc_core()};
}

uint64_t seed_of(const std::string& s, std::optional<DType> d) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char ch : s) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  return h ^ (d ? static_cast<uint64_t>(*d) + 1 : 0) * 0x9e3779b97f4a7c15ull;
}

// Note [16-bit reference]
// ATen 1.13's CPU backend lacks float16 kernels for many ops (exp, sigmoid, softmax, mm,
// layer_norm, ...), and several of its bfloat16 kernels round intermediates to bfloat16 (mm on
// small matrices is off by 2% of the result, layer_norm by 2 ulps). So the reference for
// float16 and bfloat16 inputs is the op run on the inputs converted to float32, rounded once to
// the dtype ATen's own op returns: the correctly rounded result, which is also what ATen's
// float16 kernels compute ("opmath" in float) and what PyTorch's tests compare 16-bit results
// with. Rows that stand for a composite (sdpa, cross_entropy) round their intermediates, and
// the C++ numbers they scale by, themselves (see round_to in op_test_util.h); rows whose op
// accumulates in the tensor's dtype by definition use ATen's 16-bit kernel (native_16bit:
// index_add). scatter_add does too, but libtorch 2.11's CPU kernel rounds its 16-bit sums
// otherwise than 1.13's (one ulp apart), so its reference is float32 rounded once and its
// tolerance (Tol::Unordered16) a few ulps of the partial sums that Kiln rounds after each
// addition.
bool is_16bit(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }
ATensors reference(const OpCase& c, const AArgs& a) {
  std::optional<at::ScalarType> low;
  for (const at::Tensor& t : a.in)
    if (t.defined() && is_16bit(t.scalar_type()) && !low) low = t.scalar_type();
  if (!low || c.native_16bit) return c.aten(a);
  AArgs up = a;
  for (at::Tensor& t : up.in)
    if (t.defined() && is_16bit(t.scalar_type())) t = t.to(at::kFloat);
  ATensors r = c.aten(up);
  std::optional<ATensors> native;
  try {
    native = c.aten(a);  // only for its output dtypes
  } catch (const c10::Error&) {
  }
  for (size_t i = 0; i < r.size(); ++i) {
    at::ScalarType want = native                             ? (*native)[i].scalar_type()
                          : r[i].scalar_type() == at::kFloat ? *low
                                                             : r[i].scalar_type();
    r[i] = r[i].to(want);
  }
  return r;
}

// The dtype OutDType::Wider writes into: one the result can be cast to (see kiln::can_cast).
at::ScalarType wider(at::ScalarType t) {
  switch (t) {
    case at::kBool:
      return at::kByte;
    case at::kByte:
      return at::kInt;
    case at::kInt:
      return at::kLong;
    case at::kLong:
      return at::kDouble;
    case at::kHalf:
    case at::kBFloat16:
      return at::kFloat;
    default:
      return at::kDouble;
  }
}

ATensors expected(const OpCase& c, const AArgs& a) {
  ATensors want = reference(c, a);
  if (c.mode == Mode::InPlace)
    for (size_t i = 0; i < want.size(); ++i) want[i] = want[i].to(a[i].scalar_type());
  if (c.mode == Mode::Out && c.out_dtype == OutDType::Wider)
    want[0] = want[0].to(wider(want[0].scalar_type()));
  return want;
}

Tensor alloc_out(const at::Tensor& like, Layout layout, Device dev) {
  Shape shape = shape_of(like);
  DType dt = from_aten(like.scalar_type());
  Scalar fill = dt == kBool ? Scalar(true) : is_floating(dt) ? Scalar(NAN) : Scalar(77);
  if (layout != Layout::Transposed || shape.size() < 2) return full(shape, fill, dt, dev);
  Shape base(shape);
  std::swap(base[base.size() - 1], base[base.size() - 2]);
  return transpose(full(base, fill, dt, dev), -2, -1);
}

std::string error_class(const kiln::Error& e) {
  if (dynamic_cast<const ValueError*>(&e)) return "ValueError";
  if (dynamic_cast<const TypeError*>(&e)) return "TypeError";
  if (dynamic_cast<const IndexError*>(&e)) return "IndexError";
  if (dynamic_cast<const DeviceError*>(&e)) return "DeviceError";
  if (dynamic_cast<const NotImplementedError*>(&e)) return "NotImplementedError";
  return "Error";
}

bool internal_overlap(const Tensor& t) {
  for (int64_t i = 0; i < t.dim(); ++i)
    if (t.strides()[i] == 0 && t.sizes()[i] > 1) return true;
  return false;
}

// Alias::View: outputs share input 0's storage, and a write through output 0 lands where
// ATen's view of the same input puts it.
void check_view(const OpCase& c, const KArgs& x, const AArgs& a, const KTensors& got) {
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i].impl()->storage(), x[0].impl()->storage())
        << "output " << i << " is not a view of input 0";
  if (got.empty() || got[0].numel() == 0 || internal_overlap(got[0])) return;
  AArgs base = a;
  base.in[0] = a[0].clone();
  at::Tensor ref_view = c.aten(base)[0];
  ref_view.fill_(5);
  Tensor view = got[0];
  view.fill_(5);
  EXPECT_TRUE(compare(to_device(x[0], Device(kCPU)), base[0], Tol::Exact))
      << "writing through the view";
}

// Note [The op table on CUDA]
// Each row runs again with its inputs on cuda:0, laid out as on the CPU (transposed, strided,
// broadcast), where the CUDA backend loads (skipped elsewhere, as in CI), and is checked like
// the CPU run against the same ATen reference, with the device tolerances of tolerance():
// outputs must be on cuda:0 and match, inputs must be unchanged (in place: output i is input
// i), views must write through to their input as ATen's do. Random rows run their property
// checks on the results copied back. The GPU machine has no Debian libtorch: scripts/gpu.sh
// builds this test there against PyTorch's own (KILN_TORCH_DIR).

// t's elements on `d` laid out as in t: the same strides and storage offset, and broadcast
// (stride 0) dims expanded from one copied slice (to() would make the copy contiguous).
Tensor to_device_as_laid_out(const Tensor& t, Device d) {
  if (!t.defined() || t.numel() == 0) return to_device(t, d);
  Tensor src = t;
  Shape inner(t.sizes());
  int64_t extent = t.storage_offset() + 1;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.strides()[i] == 0) {
      inner[i] = 1;
      src = narrow(src, i, 0, 1);
    }
    extent += (inner[i] - 1) * t.strides()[i];
  }
  Tensor view = as_strided(zeros({extent}, t.dtype(), d), inner, t.strides(), t.storage_offset());
  view.copy_(src);
  return expand(view, t.sizes());
}

// Runs row `c` with its inputs on `dev` (the CPU, or cuda:0 under Note [The op table on CUDA])
// and checks it against ATen (Note [How a case runs]).
void run_against_aten(const OpCase& c, std::optional<DType> dtype, Device dev) {
  DType dt = dtype.value_or(kFloat32);
  const Device cpu(kCPU);
  Gen g(dt, seed_of(c.name, dtype));
  KArgs host{c.make(g), dt, cpu, {}};
  KArgs x = host;
  if (!dev.is_cpu()) {
    x.device = dev;
    for (Tensor& t : x.in) t = to_device_as_laid_out(t, dev);
  }
  auto on_cpu = [&](const KTensors& ts) {
    KTensors r;
    for (const Tensor& t : ts) r.push_back(to_device(t, cpu));
    return r;
  };
  if (c.check) {
    KTensors got = c.kiln(x);
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].device(), dev) << "output " << i;
    }
    c.check(host, on_cpu(got));
    return;
  }
  AArgs a{to_aten(host.in), to_aten(dt)};
  ATensors want = expected(c, a);
  // A result cast to a wider out= dtype carries the precision of the result's dtype.
  std::optional<DType> tol_dtype;
  if (c.mode == Mode::Out && c.out_dtype == OutDType::Wider)
    tol_dtype = from_aten(reference(c, a)[0].scalar_type());
  if (c.mode == Mode::Out) x.out = alloc_out(want[0], c.out_layout, dev);
  KTensors got = c.kiln(x);
  ASSERT_EQ(got.size(), want.size()) << "number of outputs";
  const Where where = dev.is_cpu() ? Where::Cpu : Where::Device;
  // Sums rounded in the 16-bit dtype after every addition: a device's atomics pick the order.
  bool unordered = where == Where::Device && c.native_16bit &&
                   (dt == kFloat16 || dt == kBFloat16) &&
                   (c.tol == Tol::Default || c.tol == Tol::Accum);
  Tol tol = unordered ? Tol::Unordered16 : c.tol;
  KTensors back = on_cpu(got);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].device(), dev) << "output " << i;
    EXPECT_TRUE(compare(back[i], want[i], tol, i == 0 ? tol_dtype : std::nullopt, where))
        << "output " << i;
  }
  // In place, output i is input i; the other inputs must be untouched.
  size_t written = c.mode == Mode::InPlace ? got.size() : 0;
  for (size_t i = 0; i < written; ++i) {
    EXPECT_EQ(got[i].impl()->storage(), x[i].impl()->storage())
        << "in-place output " << i << " is not input " << i;
  }
  for (size_t i = written; i < x.in.size(); ++i) {
    if (x[i].defined()) {
      EXPECT_TRUE(compare(to_device(x[i], cpu), a[i], Tol::Exact)) << "input " << i << " changed";
    }
  }
  if (c.alias == Alias::View) check_view(c, x, a, got);
  if (c.alias == Alias::Copy) {
    for (const Tensor& in : x.in) {
      if (in.defined()) {
        EXPECT_NE(got[0].impl()->storage(), in.impl()->storage()) << "result aliases an input";
      }
    }
  }
}

void run_meta(const OpCase& c, std::optional<DType> dtype) {
  DType dt = dtype.value_or(kFloat32);
  Gen g(dt, seed_of(c.name, dtype));
  KArgs cpu{c.make(g), dt, Device(kCPU), {}};
  ATensors want;
  if (c.check) {
    want = to_aten(c.kiln(cpu));
  } else {
    want = expected(c, AArgs{to_aten(cpu.in), to_aten(dt)});
  }
  Device meta("meta");
  KArgs x{{}, dt, meta, {}};
  for (const Tensor& t : cpu.in) x.in.push_back(to_device(t, meta));
  if (c.mode == Mode::Out) x.out = alloc_out(want[0], c.out_layout, meta);
  if (c.meta == MetaMode::HostRead) {
    EXPECT_THROW(c.kiln(x), DeviceError);
    return;
  }
  KTensors got = c.kiln(x);
  ASSERT_EQ(got.size(), want.size()) << "number of outputs";
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].device().is_meta()) << "output " << i << " is on " << got[i].device().str();
    EXPECT_EQ(got[i].dtype(), from_aten(want[i].scalar_type())) << "output " << i;
    EXPECT_EQ(vec(got[i].sizes()), want[i].sizes().vec()) << "output " << i;
    EXPECT_EQ(got[i].impl()->data(), nullptr) << "output " << i << " has data";
  }
}

// Note [The op table on sim]
// Each row runs again with its inputs on the sim accelerator (kiln/backend/sim, loaded as a
// plugin), whose kernels are the CPU's run on a stream's worker thread over the device's own
// memory: results, the inputs afterwards (in-place writes) and random draws from the same
// seed must equal the CPU run bit for bit, outputs must be on sim, in-place outputs must be
// their inputs and views must share their input's storage.
void run_sim(const OpCase& c, std::optional<DType> dtype) {
  DType dt = dtype.value_or(kFloat32);
  Device cpu(kCPU), dev = sim();
  std::optional<at::Tensor> out_like;
  if (c.mode == Mode::Out) {
    Gen g(dt, seed_of(c.name, dtype));
    out_like = expected(c, AArgs{to_aten(c.make(g)), to_aten(dt)})[0];
  }
  auto run = [&](Device d) {
    Gen g(dt, seed_of(c.name, dtype));
    KArgs x{c.make(g), dt, d, {}};
    for (Tensor& t : x.in) t = to_device(t, d);
    if (out_like) x.out = alloc_out(*out_like, c.out_layout, d);
    manual_seed(1234);
    KTensors got = c.kiln(x);
    return std::make_pair(std::move(x), std::move(got));
  };
  auto [cx, want] = run(cpu);
  auto [sx, got] = run(dev);
  ASSERT_EQ(got.size(), want.size()) << "number of outputs";
  for (size_t i = 0; i < got.size(); ++i) {
    if (!want[i].defined()) continue;
    EXPECT_EQ(got[i].device(), want[i].device().is_cpu() ? dev : want[i].device())
        << "output " << i;
    Tensor back = to_device(got[i], cpu);
    EXPECT_TRUE(
        compare(back, to_aten(want[i]), c.tol == Tol::ShapeOnly ? Tol::ShapeOnly : Tol::Exact))
        << "output " << i;
  }
  for (size_t i = 0; i < sx.in.size(); ++i) {
    if (!sx[i].defined()) continue;
    EXPECT_TRUE(compare(to_device(sx[i], cpu), to_aten(cx[i]), Tol::Exact)) << "input " << i;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (c.mode == Mode::InPlace) {
      EXPECT_EQ(got[i].impl()->storage(), sx[i].impl()->storage()) << "in-place output " << i;
    }
    if (c.alias == Alias::View) {
      EXPECT_EQ(got[i].impl()->storage(), sx[0].impl()->storage()) << "view output " << i;
    }
  }
}

// Turns exceptions into failures that name their class.
template <class F>
void guarded(F&& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    ADD_FAILURE() << "Kiln threw " << error_class(e) << ": " << e.what();
  } catch (const c10::Error& e) {
    ADD_FAILURE() << "ATen threw: " << e.what_without_backtrace();
  }
}

class OpOracle : public testing::TestWithParam<CaseParam> {};
TEST_P(OpOracle, MatchesATen) {
  guarded([&] { run_against_aten(*GetParam().c, GetParam().dtype, Device(kCPU)); });
}

class OpMeta : public testing::TestWithParam<CaseParam> {};
TEST_P(OpMeta, ShapesOnly) {
  guarded([&] { run_meta(*GetParam().c, GetParam().dtype); });
}

class OpSim : public testing::TestWithParam<CaseParam> {};
TEST_P(OpSim, MatchesTheCpu) {
  guarded([&] { run_sim(*GetParam().c, GetParam().dtype); });
}

class OpCuda : public testing::TestWithParam<CaseParam> {};
TEST_P(OpCuda, MatchesATen) {
  if (!cuda_unavailable().empty()) GTEST_SKIP() << cuda_unavailable();
  guarded([&] { run_against_aten(*GetParam().c, GetParam().dtype, Device("cuda:0")); });
}

#define KILN_INSTANTIATE_TABLE(Name, table)                                                    \
  INSTANTIATE_TEST_SUITE_P(Name, OpOracle, testing::ValuesIn(params_of(table())), param_name); \
  INSTANTIATE_TEST_SUITE_P(Name, OpMeta, testing::ValuesIn(params_of(table())), param_name);   \
  INSTANTIATE_TEST_SUITE_P(Name, OpSim, testing::ValuesIn(params_of(table())), param_name);    \
  INSTANTIATE_TEST_SUITE_P(Name, OpCuda, testing::ValuesIn(cuda_params_of(table())), param_name)
KILN_INSTANTIATE_TABLE(Pointwise, pointwise);
KILN_INSTANTIATE_TABLE(Reduce, reduce);
KILN_INSTANTIATE_TABLE(LinalgNN, linalg_nn);
KILN_INSTANTIATE_TABLE(ShapeIndex, shape_index);
KILN_INSTANTIATE_TABLE(FactoryForeach, factory_foreach);
KILN_INSTANTIATE_TABLE(SortScan, sort_scan);
KILN_INSTANTIATE_TABLE(MiscCore, misc_core);
#undef KILN_INSTANTIATE_TABLE

// ---------------------------------------------------------------- gradcheck

// Note [How a gradcheck sample runs]
// A gradcheck is a row with `grad` or a sample of a record's `grads` (or of the composite
// table). A row runs its `kiln` on inputs from its `make` at float64, made contiguous, the
// floating ones requiring grad (in place: input 0 is first copied to a non-leaf, which a leaf
// requiring grad would refuse); a sample runs `fn` on the float64 inputs its `make` draws from
// a GradGen seeded by its name (those that require grad are the ones checked). The function is
// run once with the Profile key included, recording the ops it reaches (each name in `ops` must
// be among them, so the coverage list cannot drift from what the samples really call), and
// every floating output must require grad; then kiln::autograd::gradcheck compares the
// Jacobian that backward gives with central differences (eps 1e-6, atol 1e-5, rtol 1e-3), on
// copies of the outputs (see run_gradcheck). Inputs avoid the points where an op is not
// differentiable (ties of maximum/amax, 0 for abs and relu, clamp's bounds). Functions that
// draw random numbers reseed their Generator on every call, so the finite differences see the
// same mask.

// One gradcheck: a row with `grad` (sample null), a sample of a row's `grads`, or a composite
// sample (row null).
struct GradParam {
  const OpCase* row;
  const GradSample* sample;
};
void PrintTo(const GradParam& p, std::ostream* os);
std::string grad_name(const GradParam& p) { return p.sample ? p.sample->name : p.row->name; }
void PrintTo(const GradParam& p, std::ostream* os) { *os << grad_name(p); }
const std::vector<std::string>& grad_ops(const GradParam& p) {
  return p.sample ? p.sample->ops : p.row->ops;
}

const GradSamples& composite_grad_table() {
  static const GradSamples g = composite_grads();
  return g;
}
std::vector<GradParam> grad_params() {
  std::vector<GradParam> out;
  for (const Cases* t : all_tables())
    for (const OpCase& c : *t) {
      if (c.grad) out.push_back({&c, nullptr});
      for (const GradSample& g : c.grads) out.push_back({&c, &g});
    }
  for (const GradSample& g : composite_grad_table()) out.push_back({nullptr, &g});
  return out;
}

using GradFn = std::function<KTensors(const KTensors&)>;

// The inputs and function of a gradcheck (Note [How a gradcheck sample runs]).
std::pair<KTensors, GradFn> grad_problem(const GradParam& p) {
  if (p.sample) {
    GradGen gen(p.sample->name);
    return {p.sample->make(gen), p.sample->fn};
  }
  const OpCase& c = *p.row;
  Gen g(kFloat64, seed_of(c.name, kFloat64));
  KTensors in = c.make(g);
  for (Tensor& t : in)
    if (t.defined() && is_floating(t.dtype())) t = clone(t).requires_grad_();
  return {in, [&c](const KTensors& x) {
            KArgs a{x, kFloat64, Device(kCPU), {}};
            if (c.mode == Mode::InPlace) a.in[0] = nonleaf(a.in[0]);
            return c.kiln(a);
          }};
}

// Records the names of the ops that reach the Profile key while it is included; the fallback
// is installed only for the recording.
std::set<std::string>* g_recorded = nullptr;
void record_fallback(const OpDef& op, DispatchKey, Stack& stack) {
  if (g_recorded) g_recorded->emplace(op.name());
  ExcludeKeyGuard guard(DispatchKey::Profile);
  op.call_boxed(stack);
}
std::set<std::string> ops_reached(const GradFn& fn, const KTensors& inputs) {
  std::set<std::string> out;
  if (fallback_for(DispatchKey::Profile) != nullptr) return out;  // a real profiler owns it
  register_fallback(DispatchKey::Profile, &record_fallback);
  g_recorded = &out;
  try {
    IncludeKeyGuard include(DispatchKey::Profile);
    fn(inputs);
  } catch (...) {
    g_recorded = nullptr;
    register_fallback(DispatchKey::Profile, nullptr);
    throw;
  }
  g_recorded = nullptr;
  register_fallback(DispatchKey::Profile, nullptr);
  return out;
}

void run_gradcheck(const GradParam& p) {
  auto [inputs, fn] = grad_problem(p);
  const std::string name = grad_name(p);
  // Every floating output must carry a gradient: gradcheck skips outputs that do not, so a
  // sample whose output lost its history would otherwise pass without checking anything.
  for (const Tensor& out : fn(inputs)) {
    bool floating = out.defined() && is_floating(out.dtype());
    EXPECT_TRUE(!floating || out.requires_grad())
        << "an output of " << name << " does not require grad";
  }
  std::set<std::string> reached = ops_reached(fn, inputs);
  if (!reached.empty()) {
    for (const std::string& op : grad_ops(p))
      EXPECT_TRUE(reached.count(op)) << name << " lists " << op << " but does not call it";
  }
  // Outputs are copied (to_copy, whose backward is the identity) before gradcheck sees them:
  // gradcheck reads the plus and minus evaluations only after restoring the input, so an output
  // that is a view of an input would read the restored values twice (see
  // GradcheckTool.OutputThatIsAViewOfTheInput in tests/autograd/gradcheck_test.cpp).
  GradFn copied = [&fn](const KTensors& x) {
    KTensors out = fn(x);
    for (Tensor& t : out)
      if (t.defined()) t = clone(t);
    return out;
  };
  std::string why;
  EXPECT_TRUE(autograd::gradcheck(copied, inputs, {}, &why)) << why;
}

class OpGradcheck : public testing::TestWithParam<GradParam> {};
TEST_P(OpGradcheck, MatchesFiniteDifferences) {
  guarded([&] { run_gradcheck(GetParam()); });
}
INSTANTIATE_TEST_SUITE_P(Gradcheck, OpGradcheck, testing::ValuesIn(grad_params()),
                         [](const testing::TestParamInfo<GradParam>& i) {
                           return grad_name(i.param);
                         });

// ---------------------------------------------------------------- error samples

const std::vector<ErrorCase>& composite_error_table() {
  static const std::vector<ErrorCase> e = composite_errors();
  return e;
}
std::vector<const ErrorCase*> error_params() {
  std::vector<const ErrorCase*> out;
  for (const Cases* t : all_tables())
    for (const OpCase& c : *t)
      for (const ErrorCase& e : c.errors) out.push_back(&e);
  for (const ErrorCase& e : composite_error_table()) out.push_back(&e);
  return out;
}

// ---------------------------------------------------------------- coverage

TEST(OpCoverage, EveryOpHasARow) {
  std::set<std::string> known, covered;
  for (OpDef* op : ops::all_ops()) known.insert(std::string(op->name()));
  for (const Cases* t : all_tables())
    for (const OpCase& c : *t)
      for (const std::string& op : c.ops) {
        EXPECT_TRUE(known.count(op)) << "row " << c.name << " names an unknown op '" << op << "'";
        covered.insert(op);
      }
  // Collectives (OpDef::side_effects) are exempt: their results depend on the other ranks, so
  // tests/distributed checks them under mpirun on 1 to 4 ranks, on CPU and sim.
  for (OpDef* op : ops::all_ops())
    EXPECT_TRUE(covered.count(std::string(op->name())) || op->side_effects())
        << "op '" << op->name() << "' has no row in the op table";
}

TEST(OpCoverage, RowsAreWellFormed) {
  std::set<std::string> names, grad_names, error_names;
  for (const Cases* t : all_tables())
    for (const OpCase& c : *t) {
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate row name " << c.name;
      EXPECT_TRUE(c.make && c.kiln) << c.name;
      EXPECT_NE(static_cast<bool>(c.aten), static_cast<bool>(c.check))
          << c.name << " needs exactly one of aten and check";
      EXPECT_TRUE(!c.grad || c.mode != Mode::Out) << c.name << ": autograd refuses out= variants";
      for (DType d : c.cuda_dtypes.value_or(c.dtypes)) {
        EXPECT_NE(std::find(c.dtypes.begin(), c.dtypes.end(), d), c.dtypes.end())
            << c.name << ": CUDA dtype " << name(d) << " is not among its dtypes";
      }
    }
  for (const GradParam& g : grad_params())
    EXPECT_TRUE(grad_names.insert(grad_name(g)).second) << "duplicate gradcheck " << grad_name(g);
  for (const ErrorCase* e : error_params())
    EXPECT_TRUE(error_names.insert(e->name).second) << "duplicate error sample " << e->name;
}

// Every op with a backward formula is reached by a gradcheck of its record (a row with `grad`
// or a sample in `grads`; the composite samples do not count). Adding a formula without a
// gradcheck is not allowed.
TEST(OpCoverage, EveryFormulaHasAGradcheck) {
  std::set<std::string> covered;
  for (const GradParam& g : grad_params()) {
    if (!g.row) continue;
    for (const std::string& op : grad_ops(g)) {
      EXPECT_NE(ops::find_op(op), nullptr) << grad_name(g) << " lists unknown op " << op;
      covered.insert(op);
    }
  }
  std::string missing;
  for (const OpDef* op : ops::all_ops()) {
    if (autograd::derivative_of(*op).kind != autograd::Differentiability::Formula) continue;
    // Collectives' gradients are checked on several ranks (tests/distributed).
    if (op->side_effects()) continue;
    if (!covered.count(std::string(op->name())))
      missing += std::string(missing.empty() ? "" : ", ") + std::string(op->name());
  }
  EXPECT_EQ(missing, "") << "ops with a backward formula but no gradcheck in their record";
}

// ---------------------------------------------------------------- type promotion

// Kiln's result dtype for every pair of dtypes, as 1-d and 0-d tensors and as wrapped C++
// numbers, equals at::result_type. Runs on meta: it needs no kernels.
TEST(OpPromotion, MatchesAtenResultType) {
  Device meta("meta");
  std::vector<std::string> wrong;
  auto check = [&](const Tensor& k, at::ScalarType want, const std::string& what) {
    if (k.dtype() != from_aten(want))
      wrong.push_back(
          fmt::format("{}: kiln {}, aten {}", what, name(k.dtype()), name(from_aten(want))));
  };
  for (DType da : kAllDTypes)
    for (DType db : kAllDTypes)
      for (auto [sa, sb] : {std::pair<Shape, Shape>{{2}, {2}}, {{}, {2}}, {{2}, {}}, {{}, {}}}) {
        Tensor ka = empty(sa, da, meta), kb = empty(sb, db, meta);
        at::Tensor aa = at::empty(vec(sa), to_aten(da)), ab = at::empty(vec(sb), to_aten(db));
        check(mul(ka, kb), at::result_type(aa, ab),
              fmt::format("{}[{}] * {}[{}]", name(da), fmt::join(sa, ","), name(db),
                          fmt::join(sb, ",")));
      }
  for (DType d : kAllDTypes)
    for (Shape s : {Shape{2}, Shape{}}) {
      Tensor k = empty(s, d, meta);
      at::Tensor a = at::empty(vec(s), to_aten(d));
      std::string t = fmt::format("{}[{}]", name(d), fmt::join(s, ","));
      check(mul(k, Scalar(true)), at::result_type(a, at::Scalar(true)), t + " * true");
      check(mul(k, Scalar(3)), at::result_type(a, at::Scalar(3)), t + " * 3");
      check(mul(k, Scalar(2.5)), at::result_type(a, at::Scalar(2.5)), t + " * 2.5");
    }
  EXPECT_TRUE(wrong.empty()) << fmt::format("{} mismatches:\n  {}", wrong.size(),
                                            fmt::join(wrong, "\n  "));
}

// ---------------------------------------------------------------- errors

class OpErrors : public testing::TestWithParam<const ErrorCase*> {};

bool has_kind(const kiln::Error& e, ErrorKind k) {
  switch (k) {
    case ErrorKind::Value:
      return dynamic_cast<const ValueError*>(&e) != nullptr;
    case ErrorKind::Type:
      return dynamic_cast<const TypeError*>(&e) != nullptr;
    case ErrorKind::Index:
      return dynamic_cast<const IndexError*>(&e) != nullptr;
    case ErrorKind::Device:
      return dynamic_cast<const DeviceError*>(&e) != nullptr;
  }
  return false;
}
const char* kind_name(ErrorKind k) {
  constexpr const char* names[] = {"ValueError", "TypeError", "IndexError", "DeviceError"};
  return names[static_cast<int>(k)];
}

// An error sample (a record's `errors`, or the composite table's): the call throws the sample's
// error class with a message that starts with "[op]" and carries
// the offending values, and the tensors it would have written are unchanged ("nothing
// written": errors are raised before any write).
TEST_P(OpErrors, Throws) {
  const ErrorCase& c = *GetParam();
  std::vector<std::pair<Tensor, at::Tensor>> watched;
  auto watch = [&](const Tensor& t) { watched.emplace_back(t, to_aten(t)); };
  try {
    c.run(watch);
    ADD_FAILURE() << "no exception; expected " << kind_name(c.kind);
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    EXPECT_TRUE(has_kind(e, c.kind))
        << "threw " << error_class(e) << ", expected " << kind_name(c.kind) << ": " << msg;
    EXPECT_TRUE(msg.starts_with("[" + c.op + "]")) << "message: " << msg;
    for (const std::string& s : c.contains)
      EXPECT_NE(msg.find(s), std::string::npos) << "message lacks '" << s << "': " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-Kiln exception: " << e.what();
  }
  for (auto& [t, before] : watched)
    EXPECT_TRUE(compare(t, before, Tol::Exact)) << "the failed call wrote into a tensor";
}
INSTANTIATE_TEST_SUITE_P(Errors, OpErrors, testing::ValuesIn(error_params()),
                         [](const testing::TestParamInfo<const ErrorCase*>& i) {
                           return i.param->name;
                         });

// ATen runs on one thread so that references are deterministic and the two cores of a CI
// machine are not oversubscribed.
class TorchEnvironment : public testing::Environment {
 public:
  void SetUp() override { at::set_num_threads(1); }
};
[[maybe_unused]] testing::Environment* const torch_environment =
    testing::AddGlobalTestEnvironment(new TorchEnvironment);

}  // namespace
}  // namespace kiln::test
