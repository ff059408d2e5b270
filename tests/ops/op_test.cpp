// Runs the op table (op_test_*.cpp) against ATen on the CPU and on CUDA, on the meta device and
// on sim, and the error table.
//
// Note [How a case runs]
// For each row of the table and each of its dtypes:
//  1. `make` draws the inputs from a Gen seeded by the row's name and the dtype; to_aten copies
//     them for ATen.
//  2. `aten` computes the reference (see Note [16-bit reference]). Mode::InPlace casts output i
//     to input i's dtype (output i is input i, written in place) and Mode::Out to the out
//     tensor's dtype, which is what PyTorch's in-place and out= variants do with a functional
//     result.
//  3. `kiln` runs the op. For Mode::Out the runner first allocates `out` with the reference's
//     shape, filled with a sentinel (NaN for floats) so that unwritten elements show.
//  4. Every output is compared with compare(); functional and out= cases must leave their inputs
//     untouched (in-place cases all but the ones they write); Alias checks run.
// The meta test runs each row again with its inputs moved to Device("meta") and expects the
// reference's sizes and dtypes, on meta, with no data.
#include <ATen/Parallel.h>

#include <cmath>
#include <set>

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

std::vector<CaseParam> params_of(const Cases& cs) {
  std::vector<CaseParam> out;
  for (const OpCase& c : cs) {
    if (c.dtypes.empty()) out.push_back({&c, std::nullopt});
    for (DType d : c.dtypes) out.push_back({&c, d});
  }
  return out;
}
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
std::vector<const Cases*> all_tables() {
  return {&pointwise(), &reduce(), &linalg_nn(), &shape_index(), &factory_foreach()};
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
// accumulates in the tensor's dtype by definition use ATen's 16-bit kernel (native_16bit).
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
  INSTANTIATE_TEST_SUITE_P(Name, OpCuda, testing::ValuesIn(params_of(table())), param_name)
KILN_INSTANTIATE_TABLE(Pointwise, pointwise);
KILN_INSTANTIATE_TABLE(Reduce, reduce);
KILN_INSTANTIATE_TABLE(LinalgNN, linalg_nn);
KILN_INSTANTIATE_TABLE(ShapeIndex, shape_index);
KILN_INSTANTIATE_TABLE(FactoryForeach, factory_foreach);
#undef KILN_INSTANTIATE_TABLE

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
  for (const std::string& op : known)
    EXPECT_TRUE(covered.count(op)) << "op '" << op << "' has no row in the op table";
}

TEST(OpCoverage, RowsAreWellFormed) {
  std::set<std::string> names;
  for (const Cases* t : all_tables())
    for (const OpCase& c : *t) {
      EXPECT_TRUE(names.insert(c.name).second) << "duplicate row name " << c.name;
      EXPECT_TRUE(c.make && c.kiln) << c.name;
      EXPECT_NE(static_cast<bool>(c.aten), static_cast<bool>(c.check))
          << c.name << " needs exactly one of aten and check";
    }
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

const std::vector<ErrorCase>& errors() {
  static const std::vector<ErrorCase> e = error_cases();
  return e;
}
std::vector<const ErrorCase*> error_params() {
  std::vector<const ErrorCase*> out;
  for (const ErrorCase& e : errors()) out.push_back(&e);
  return out;
}

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

// The call throws the row's error class with a message that starts with "[op]" and carries
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
