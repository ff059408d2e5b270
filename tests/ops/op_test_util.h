#pragma once
// The op table: one record per op, checked against ATen (libtorch's tensor library), in the
// style of ggml's test-backend-ops and PyTorch's OpInfo. This header holds the row type, input
// generation, the comparison, and the helpers that build rows; op_test_*.cpp hold the records,
// and op_test.cpp runs them (see Note [How a case runs] and Note [The op record] there).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"
#include "tests/ops/torch_bridge.h"

namespace kiln::test {

using KTensors = std::vector<Tensor>;
using ATensors = std::vector<at::Tensor>;

inline const std::vector<DType> kAllDTypes = {kBool,    kUInt8,    kInt32,   kInt64,
                                              kFloat16, kBFloat16, kFloat32, kFloat64};
inline const std::vector<DType> kFloatDTypes = {kFloat16, kBFloat16, kFloat32, kFloat64};
inline const std::vector<DType> kNumericDTypes = {kUInt8,    kInt32,   kInt64,  kFloat16,
                                                  kBFloat16, kFloat32, kFloat64};  // all but bool
inline const std::vector<DType> kIntDTypes = {kUInt8, kInt32, kInt64};

// ---------------------------------------------------------------- inputs

// How an input's elements sit in memory. Every layout has the same logical shape:
//   Contig      a fresh contiguous tensor
//   Transposed  the last two dims of a contiguous tensor swapped (1-D: Strided; 0-d: Contig)
//   Strided     every other element of a wider last dim, at a storage offset of 1 (0-d: Contig)
//   Expanded    the first dim whose size is not 1, broadcast with stride 0 from size 1
enum class Layout { Contig, Transposed, Strided, Expanded };

// A logical shape and a layout.
using Dims = std::vector<int64_t>;
struct Spec {
  Dims shape;
  Layout layout = Layout::Contig;
};

// Draws the inputs of one case. Values come from a std::mt19937 seeded per case, so a case
// sees the same inputs on every run; Kiln tensors are made with kiln::from_vector and views.
class Gen {
 public:
  Gen(DType dtype, uint64_t seed) : dtype(dtype), rng(static_cast<uint32_t>(seed)) {}

  // The case's dtype; the `dt` arguments below default to it.
  DType dtype;
  std::mt19937 rng;

  // Floats uniform in [-2, 2]; uint8 in [0, 18]; int32/int64 in [-9, 9]; bool a coin flip.
  Tensor any(const Spec& s, std::optional<DType> dt = {});
  // Floats uniform in [lo, hi]; integers uniform in [ceil(lo), floor(hi)] (uint8: lo >= 0).
  Tensor uniform(const Spec& s, double lo, double hi, std::optional<DType> dt = {});
  // Floats in [0.25, 4]; integers in [1, 9]; bool true.
  Tensor positive(const Spec& s, std::optional<DType> dt = {});
  // Pairwise distinct integers (exact in every dtype), shuffled: no ties for argmax and max.
  // Holds at most 256 elements (counting the hidden ones of a Strided layout).
  Tensor distinct(const Spec& s, std::optional<DType> dt = {});
  // Like any(), with about 40% exact zeros (for all/any and logical ops).
  Tensor sparse(const Spec& s, std::optional<DType> dt = {});
  // A bool tensor, about half true.
  Tensor mask(const Spec& s);
  // Integers in [0, hi).
  Tensor index(const Spec& s, int64_t hi, DType dt = kInt64);
  // Exactly these values, contiguous (0-d when shape is empty and values has one element).
  Tensor values(const std::vector<double>& v, IntArrayRef shape, std::optional<DType> dt = {});
  // A tensor of `s` whose storage elements are drawn one by one from `draw`.
  Tensor make(const Spec& s, DType dt, const std::function<double()>& draw);

  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  }
};

// A copy of `t` with its elements moved to the given device ("meta" keeps only the shape).
Tensor to_device(const Tensor& t, Device d);

// ---------------------------------------------------------------- rows

// What a case runs: the op itself, its in-place variant (writes into input 0, or for foreach
// ops into inputs 0..n-1, returned as outputs 0..n-1), or its out= variant (writes into
// KArgs::out, which the runner allocates from the reference's shape).
enum class Mode { Functional, InPlace, Out };
// The dtype of the out= tensor: the result's, or a wider one the result is cast to on write.
enum class OutDType { Same, Wider };

// Tolerances, per output dtype:
//   Default    PyTorch's assert_close: float32 rtol 1.3e-6 atol 1e-5; float64 1e-7 / 1e-7;
//              float16 1e-3 / 1e-5; bfloat16 1.6e-2 / 1e-5; integers and bool exact.
//   Accum      Default, but float32 rtol 1e-5: for ops that sum many products or terms
//              (reductions, matmul, softmax, norms) and may legitimately accumulate in a
//              different order or with a different blocking than ATen.
//   Intermediate16  Accum, and for the 16-bit floats an atol of 1e-3 (float16) or 8e-3
//              (bfloat16): composites whose 16-bit intermediates can differ by an ulp from the
//              reference's, or stay in float32 inside a fused kernel. Attention probabilities
//              computed with a different exp or summation order round apart, and the next matmul
//              scales such a flip by |v| and sums it; addmm_gelu's preactivation is rounded to
//              the dtype on the CPU but not inside cuBLASLt's epilogue, and gelu's slope carries
//              that into results near zero. Such errors are absolute, not relative to the
//              (possibly small or cancelling) output.
//   Unordered16  Accum, and for the 16-bit floats a few ulps of the partial sums: for ops
//              that round in the dtype after every addition, compared with a float32 sum
//              rounded once (scatter_add), or on a device, whose atomics pick the order of
//              the additions, with ATen's own 16-bit kernel (native_16bit rows; see
//              tolerance()).
//   Searched16  Intermediate16 on the CPU; on a device, Unordered16's tolerance for the 16-bit
//              floats: cuDNN's convolutions run the algorithm that timed fastest, and some of
//              them round partial sums (per group or kernel tap) in the dtype. Seen on the H100:
//              a float16 grouped, dilated convolution_backward 30 ulps from the float32 sum.
//   Exact      bit-for-bit values (NaN positions equal): copies, views, linspace.
//   ShapeOnly  sizes and dtype only (empty).
enum class Tol { Default, Accum, Intermediate16, Unordered16, Searched16, Exact, ShapeOnly };

// Extra checks on the result:
//   View   every output shares storage with input 0, and writing through output 0 changes
//          input 0 exactly where ATen's view of the same input changes.
//   Copy   output 0 shares storage with no input.
enum class Alias { None, View, Copy };

// On the meta device: Same runs the case and compares output sizes and dtypes with the
// reference; HostRead is for cases that must read data on the host (one_hot inferring its
// class count), which must raise kiln::DeviceError there.
enum class MetaMode { Same, HostRead };

// Arguments of a case's Kiln lambda: its inputs, dtype and device (cpu, or meta in the meta
// test; factories use it), and for Mode::Out the tensor to write into.
struct KArgs {
  KTensors in;
  DType dtype = kFloat32;
  Device device;
  Tensor out;
  const Tensor& operator[](size_t i) const { return in[i]; }
};
// The same inputs for the ATen lambda, converted with to_aten.
struct AArgs {
  ATensors in;
  at::ScalarType dtype = at::kFloat;
  const at::Tensor& operator[](size_t i) const { return in[i]; }
};

using MakeFn = std::function<KTensors(Gen&)>;
using KilnFn = std::function<KTensors(const KArgs&)>;
using AtenFn = std::function<ATensors(const AArgs&)>;
using CheckFn = std::function<void(const KArgs&, const KTensors&)>;

// An error sample of a record: `run` makes its tensors, hands those that must survive the
// failed call unchanged to `watch`, then makes the call that must throw.
enum class ErrorKind { Value, Type, Index, Device };
struct ErrorCase {
  std::string name;
  ErrorKind kind;
  std::string op;                     // the message starts with "[op]"
  std::vector<std::string> contains;  // and contains each of these
  std::function<void(const std::function<void(const Tensor&)>& watch)> run;
};
// Shorthands for writing error samples.
using Watch = std::function<void(const Tensor&)>;
using K = ErrorKind;
inline Tensor f32(IntArrayRef shape) { return ones(shape, kFloat32); }
inline Tensor i64(IntArrayRef shape) { return ones(shape, kInt64); }

// Draws a gradcheck sample's inputs: float64, contiguous, deterministic per sample (seeded by
// its name). var/away/pos/grid/avoiding require grad; fixed and mask do not.
class GradGen {
 public:
  explicit GradGen(const std::string& seed)
      : rng_(static_cast<uint32_t>(std::hash<std::string>{}(seed))) {}

  // Uniform in [lo, hi].
  Tensor var(const Dims& shape, double lo = -2, double hi = 2);
  // |x| in [gap, 2] with a random sign (away from 0).
  Tensor away(const Dims& shape, double gap = 0.25);
  // Uniform in [0.25, 2].
  Tensor pos(const Dims& shape) { return var(shape, 0.25, 2); }
  // On the grid offset + k/2, k in [-4, 4]: two tensors with offsets 0.1 and 0.35 never tie.
  Tensor grid(const Dims& shape, double offset);
  // Uniform in [lo, hi], kept at least 0.1 away from each of `avoid`.
  Tensor avoiding(const Dims& shape, std::vector<double> avoid, double lo = -2, double hi = 2);
  // Uniform in [-2, 2]; does not require grad.
  Tensor fixed(const Dims& shape);
  // A bool tensor, about half true.
  Tensor mask(const Dims& shape);

  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng_); }
  int64_t integer(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

 private:
  Tensor make(const Dims& shape, const std::function<double()>& f);
  std::mt19937 rng_;
};
// Exactly these values (float64; `grad`: requires grad), and int64 indices.
Tensor grad_values(const std::vector<double>& v, const Dims& shape, bool grad = true);
Tensor grad_indices(const std::vector<int64_t>& v, const Dims& shape);
// A non-leaf copy of `x` (for in-place ops, which a leaf requiring grad refuses).
inline Tensor nonleaf(const Tensor& x) { return x * 1.0; }

// A gradcheck sample of a record with inputs of its own (Note [How a gradcheck sample runs]
// in op_test.cpp): `fn` on the inputs `make` draws, checked by kiln::autograd::gradcheck.
struct GradSample {
  std::string name;              // unique; letters, digits and '_'
  std::vector<std::string> ops;  // names in kiln::ops::all_ops() that `fn` reaches
  std::function<KTensors(GradGen&)> make;
  std::function<KTensors(const KTensors&)> fn;
};
using GradSamples = std::vector<GradSample>;

// One sample of a record: a row of the table (Note [The op record] in op_test.cpp).
struct OpCase {
  std::string name = {};              // unique; letters, digits and '_'
  std::vector<std::string> ops = {};  // names in kiln::ops::all_ops() this row exercises
  std::vector<DType> dtypes = {};     // the row runs once per dtype; empty: once, dtype unused
  MakeFn make = {};                   // inputs for a dtype
  KilnFn kiln = {};                   // runs the Kiln op
  AtenFn aten = {};                   // the reference, on the same inputs (functional semantics)
  CheckFn check = {};                 // instead of `aten`: property checks (random ops)
  Tol tol = Tol::Default;
  Mode mode = Mode::Functional;
  OutDType out_dtype = OutDType::Same;
  Layout out_layout = Layout::Contig;  // Mode::Out: Contig or Transposed
  Alias alias = Alias::None;
  MetaMode meta = MetaMode::Same;
  // The reference for 16-bit inputs is ATen's own 16-bit kernel rather than float32 rounded
  // once (see Note [16-bit reference] in op_test.cpp): for ops whose result accumulates in the
  // tensor's dtype by definition and whose ATen kernel does so alike in libtorch 1.13 and
  // 2.11 (index_add rounds after every addition; scatter_add does not qualify, see its rows).
  bool native_16bit = false;
  // The record's other checks (Note [The op record]): `grad` gradchecks this row's `kiln` on
  // float64 inputs from `make` (floating ones requiring grad); `grads` are gradcheck samples
  // with inputs of their own; `errors` are calls of the op that must raise.
  bool grad = false;
  GradSamples grads = {};
  std::vector<ErrorCase> errors = {};
  // The dtypes the row runs on CUDA (Note [The op table on CUDA]), when not `dtypes`.
  std::optional<std::vector<DType>> cuda_dtypes = {};
};
using Cases = std::vector<OpCase>;

// The record of `op` in `cs`: its first row, which holds the op's gradcheck and error samples.
OpCase& head(Cases& cs, const std::string& op);

// The tables, one per file; op_test.cpp runs them.
Cases pointwise_cases();
Cases reduce_cases();
Cases linalg_nn_cases();
Cases shape_index_cases();
Cases factory_foreach_cases();
// sort/topk, cumsum/prod, flip/repeat, diagonal, squeeze.dims, elu (op_test_sort_scan.cpp).
Cases sort_scan_cases();
// index, index_put, nonzero and the C++ indexing API (op_test_indexing.cpp), part of
// shape_index_cases().
void add_advanced_indexing(Cases& cs);
// convolution and its backward (op_test_conv.cpp), part of linalg_nn_cases().
void add_convolution(Cases& cs);
// The pooling ops and their backward ops (op_test_pool.cpp), part of linalg_nn_cases().
void add_pooling(Cases& cs);
// The padding and upsampling ops and their backward ops (op_test_pad_upsample.cpp), part of
// linalg_nn_cases().
void add_pad_upsample(Cases& cs);
// batch, group and layer norm and their backward ops (op_test_norm.cpp), part of
// linalg_nn_cases().
void add_norm(Cases& cs);
// randperm, empty_strided, cdist/pdist and their backward ops, im2col and col2im,
// grid_sampler_2d and its backward op (op_test_misc_core.cpp).
Cases misc_core_cases();
// Samples that exercise several ops at once or no op at all (op_test_composite.cpp).
GradSamples composite_grads();
std::vector<ErrorCase> composite_errors();

// ---------------------------------------------------------------- comparison

// Where a result was computed: on the CPU, or on an accelerator whose math functions and
// summation order differ from glibc's and ATen's (see Note [The op table on CUDA]).
enum class Where { Cpu, Device };

// Whether `got` (a cpu tensor) has want's sizes and dtype and, within `tol` for its dtype (or
// `tol_dtype`), its values (NaN where want has NaN, equal infinities).
testing::AssertionResult compare(const Tensor& got, const at::Tensor& want, Tol tol,
                                 std::optional<DType> tol_dtype = {}, Where where = Where::Cpu);
// rtol and atol for an output dtype. On a device (Note [The op table on CUDA]): float32 gets
// rtol 4e-6 for Default (CUDA's expf, logf, powf, tanhf are within 2-4 ulps, glibc's within
// 1); Accum and Intermediate16 get atol 1e-4 for the 16- and 32-bit floats and float32 rtol
// 5e-5 (block and warp reductions and cuBLASLt's split products sum hundreds of terms in
// another order: an error relative to the terms, not to a result that cancels); Intermediate16
// float16 and bfloat16 atol 2e-3 and 1.6e-2 (the fused attention kernels round the
// probabilities to the dtype before multiplying by v, and normalise by their unrounded sum);
// Unordered16 is for rows that round in the dtype after every addition (scatter_add, and
// native_16bit rows on a device, which adds in an order of its atomics' choosing): float16
// rtol 1e-2 atol 4e-3, bfloat16 6.4e-2 and 3.2e-2 on the CPU and the device (a few ulps of the
// partial sums, which cancel to small results), Accum's for the other dtypes.
std::pair<double, double> tolerance(Tol tol, DType dtype, Where where = Where::Cpu);

// ---------------------------------------------------------------- row builders

// Invokers handed to the generic bodies of pointwise and structured rows, so that one body
// (`[](auto call, const KArgs& x) { return call(x[0], x[1], 2); }`) runs any variant.
template <class Op>
struct CallFunctional {
  Op& op;
  template <class... A>
  Tensor operator()(A&&... a) const {
    return op(std::forward<A>(a)...);
  }
};
template <class Op>
struct CallInPlace {
  Op& op;
  template <class... A>
  Tensor operator()(const Tensor& self, A&&... a) const {
    op(self, std::forward<A>(a)...);
    return self;
  }
};
template <class Op>
struct CallOut {
  Op& op;
  Tensor out;
  template <class... A>
  Tensor operator()(A&&... a) const {
    op(out, std::forward<A>(a)...);
    return out;
  }
};

// Draws one input of a pointwise row from its spec.
using Draw = std::function<Tensor(Gen&, const Spec&)>;
Draw draw_any();
Draw draw_positive();
Draw draw_sparse();
Draw draw_mask();
Draw draw_uniform(double lo, double hi);

// Which dtypes an in-place variant applies to: the result must be castable to self's dtype.
enum class ResultKind { Same, Bool, Float };

// The shape configurations pointwise rows run (labels become part of the row name).
struct ShapeConfig {
  std::string label;
  std::vector<Spec> in;
};

struct PointwiseSpec {
  std::string name = {};  // the op's name in all_ops(): rows exercise name, name_, name_out
  std::vector<DType> dtypes = {};
  std::vector<Draw> draws = {};  // one per tensor input, in argument order
  ResultKind result = ResultKind::Same;
  Tol tol = Tol::Default;
  bool special = false;  // also run NaN, +-inf, +-0 and huge values (float dtypes)
  std::optional<std::vector<DType>> inplace_dtypes = {};  // overrides `result`
  std::string tag = {};  // distinguishes rows of one op with different arguments
  // The record's fields (see OpCase): `grad` gradchecks the functional and in-place rows whose
  // inputs are small (see grad_config); `grads` and `errors` go to the first functional row;
  // `cuda_dtypes` restricts every row on CUDA.
  bool grad = false;
  GradSamples grads = {};
  std::vector<ErrorCase> errors = {};
  std::optional<std::vector<DType>> cuda_dtypes = {};
};

// Whether a pointwise shape configuration is small enough to gradcheck (every input at most
// 64 elements: finite differences evaluate the op twice per input element).
bool grad_config(const ShapeConfig& c);

std::vector<ShapeConfig> functional_configs(size_t arity);
std::vector<ShapeConfig> inplace_configs(size_t arity);
std::vector<ShapeConfig> out_configs(size_t arity);

// Values that exercise IEEE corner cases.
const std::vector<double>& special_values();

MakeFn make_from(std::vector<Draw> draws, std::vector<Spec> specs);

// Adds the rows of a pointwise op: its functional form on every shape configuration, its
// in-place form (ref = functional result cast to self's dtype) and its out= form.
template <class F, class I, class O, class Body>
void add_pointwise(Cases& cs, const PointwiseSpec& spec, F& f, I& inplace, O& out, Body body,
                   AtenFn aten) {
  size_t arity = spec.draws.size();
  std::string base = spec.tag.empty() ? spec.name : spec.name + "_" + spec.tag;
  // The CUDA dtypes of a row that runs `dtypes`: those of spec.cuda_dtypes among them.
  auto on_cuda = [&](const std::vector<DType>& dtypes) -> std::optional<std::vector<DType>> {
    if (!spec.cuda_dtypes) return std::nullopt;
    std::vector<DType> r;
    for (DType d : dtypes)
      if (std::find(spec.cuda_dtypes->begin(), spec.cuda_dtypes->end(), d) !=
          spec.cuda_dtypes->end())
        r.push_back(d);
    return r;
  };
  auto configs = functional_configs(arity);
  for (const ShapeConfig& c : configs) {
    bool first = &c == &configs.front();
    cs.push_back({.name = base + "_" + c.label,
                  .ops = {spec.name},
                  .dtypes = spec.dtypes,
                  .make = make_from(spec.draws, c.in),
                  .kiln = [fp = &f, body](
                              const KArgs& x) { return KTensors{body(CallFunctional<F>{*fp}, x)}; },
                  .aten = aten,
                  .tol = spec.tol,
                  .grad = spec.grad && grad_config(c),
                  .grads = first ? spec.grads : GradSamples{},
                  .errors = first ? spec.errors : std::vector<ErrorCase>{},
                  .cuda_dtypes = on_cuda(spec.dtypes)});
  }
  if (spec.special) {
    std::vector<Draw> draws(arity, [](Gen& g, const Spec& s) {
      std::vector<double> v = special_values();
      std::shuffle(v.begin(), v.end(), g.rng);
      return g.values(v, s.shape);
    });
    Dims shape{static_cast<int64_t>(special_values().size())};
    cs.push_back({.name = base + "_special",
                  .ops = {spec.name},
                  .dtypes = kFloatDTypes,
                  .make = make_from(draws, std::vector<Spec>(arity, Spec{shape})),
                  .kiln = [fp = &f, body](
                              const KArgs& x) { return KTensors{body(CallFunctional<F>{*fp}, x)}; },
                  .aten = aten,
                  .tol = spec.tol,
                  .cuda_dtypes = on_cuda(kFloatDTypes)});
  }
  std::vector<DType> in_dtypes;
  if (spec.inplace_dtypes) {
    in_dtypes = *spec.inplace_dtypes;
  } else {
    for (DType d : spec.dtypes)
      if (spec.result != ResultKind::Float || is_floating(d)) in_dtypes.push_back(d);
  }
  for (const ShapeConfig& c : inplace_configs(arity)) {
    cs.push_back({.name = base + "_inplace_" + c.label,
                  .ops = {spec.name + "_"},
                  .dtypes = in_dtypes,
                  .make = make_from(spec.draws, c.in),
                  .kiln = [ip = &inplace,
                           body](const KArgs& x) { return KTensors{body(CallInPlace<I>{*ip}, x)}; },
                  .aten = aten,
                  .tol = spec.tol,
                  .mode = Mode::InPlace,
                  .grad = spec.grad && grad_config(c),
                  .cuda_dtypes = on_cuda(in_dtypes)});
  }
  for (const ShapeConfig& c : out_configs(arity)) {
    bool wider = c.label == "wider";
    cs.push_back({.name = base + "_out_" + c.label,
                  .ops = {spec.name + "_out"},
                  .dtypes = spec.dtypes,
                  .make = make_from(spec.draws, c.in),
                  .kiln =
                      [op = &out, body](const KArgs& x) {
                        return KTensors{body(CallOut<O>{*op, x.out}, x)};
                      },
                  .aten = aten,
                  .tol = spec.tol,
                  .mode = Mode::Out,
                  .out_dtype = wider ? OutDType::Wider : OutDType::Same,
                  .out_layout = c.label == "noncontig" ? Layout::Transposed : Layout::Contig,
                  .cuda_dtypes = on_cuda(spec.dtypes)});
  }
}

// A copy of `base` that runs the op's out= form through `kiln` (renamed `<base>_out<suffix>`),
// without base's gradchecks and error samples.
OpCase out_variant(const OpCase& base, const std::string& op, KilnFn kiln,
                   const std::string& suffix = "", Layout out_layout = Layout::Contig,
                   OutDType out_dtype = OutDType::Same);

// For references of composite ops with 16-bit inputs (see Note [16-bit reference] in
// op_test.cpp, which hands the lambda float32 inputs): `t` rounded to `dtype` and back, as an
// intermediate result of that dtype would be.
inline at::Tensor round_to(const at::Tensor& t, at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16 ? t.to(dtype).to(t.scalar_type()) : t;
}
// A C++ number as an op on a tensor of `dtype` uses it: ATen (and Kiln) cast it to the
// tensor's dtype first.
inline double round_to(double x, at::ScalarType dtype) {
  return at::scalar_tensor(x, dtype).item<double>();
}

// Helpers for lambdas.
inline std::vector<int64_t> vec(IntArrayRef a) { return {a.begin(), a.end()}; }
// All dims of an n-dim tensor when `dims` is empty (ATen's reductions take explicit lists).
std::vector<int64_t> dims_or_all(IntArrayRef dims, int64_t ndim);
// The sizes of a tensor as a Kiln shape.
Shape shape_of(const at::Tensor& t);

}  // namespace kiln::test
