// CPU convolution: oneDNN for float32 (float16 and bfloat16 through float32), direct loops for
// float64. The three canonical kernels of Note [Convolution] (kiln/ops/conv_meta.cpp).
#include <omp.h>

#if KILN_HAVE_DNNL
#include <dnnl.hpp>
#endif
#include <list>
#include <map>
#include <mutex>
#include <vector>

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/conv_meta.h"
#include "kiln/ops/structured.h"

namespace kiln::cpu {
namespace {

using detail::ConvGeom;

// ---------------------------------------------------------------- float64: direct loops

// Note [float64 convolution]
// oneDNN has no float64 convolution, and gradcheck needs one, so float64 runs plain loops over
// the canonical direction (Note [Convolution]): forward gathers, backward_data scatters each
// y element's contributions into x (per batch element, so threads never share an x), and
// backward_weight accumulates per output channel. They are for correctness, not speed.
struct Idx {
  const ConvGeom& g;
  int64_t x_off(int64_t n, int64_t c) const { return (n * g.ci + c) * g.x[0] * g.x[1] * g.x[2]; }
  int64_t y_off(int64_t n, int64_t c) const { return (n * g.co + c) * g.y[0] * g.y[1] * g.y[2]; }
  int64_t w_off(int64_t o, int64_t c) const {
    return (o * (g.ci / g.groups) + c) * g.k[0] * g.k[1] * g.k[2];
  }
};

// Calls f(x index within a channel, y index within a channel, kernel index) for every
// (y position, kernel position) whose x position is inside the unpadded input.
template <class F>
void for_taps(const ConvGeom& g, F f) {
  for (int64_t o0 = 0; o0 < g.y[0]; ++o0)
    for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
      int64_t i0 = o0 * g.stride[0] - g.pad[0] + k0 * g.dil[0];
      if (i0 < 0 || i0 >= g.x[0]) continue;
      for (int64_t o1 = 0; o1 < g.y[1]; ++o1)
        for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
          int64_t i1 = o1 * g.stride[1] - g.pad[1] + k1 * g.dil[1];
          if (i1 < 0 || i1 >= g.x[1]) continue;
          for (int64_t o2 = 0; o2 < g.y[2]; ++o2)
            for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
              int64_t i2 = o2 * g.stride[2] - g.pad[2] + k2 * g.dil[2];
              if (i2 < 0 || i2 >= g.x[2]) continue;
              f((i0 * g.x[1] + i1) * g.x[2] + i2, (o0 * g.y[1] + o1) * g.y[2] + o2,
                (k0 * g.k[1] + k1) * g.k[2] + k2);
            }
        }
    }
}

Tensor new_like(IntArrayRef sizes, DType dtype) {
  Tensor t = detail::empty_tensor(sizes, dtype, Device(kCPU));
  ops::op_fill_(t, 0);
  return t;
}
Shape x_sizes(const ConvGeom& g) {
  Shape s{g.n, g.ci};
  for (int64_t i = 3 - g.nd; i < 3; ++i) s.push_back(g.x[static_cast<size_t>(i)]);
  return s;
}
Shape y_sizes(const ConvGeom& g) {
  Shape s{g.n, g.co};
  for (int64_t i = 3 - g.nd; i < 3; ++i) s.push_back(g.y[static_cast<size_t>(i)]);
  return s;
}
Shape w_sizes(const ConvGeom& g) {
  Shape s{g.co, g.ci / g.groups};
  for (int64_t i = 3 - g.nd; i < 3; ++i) s.push_back(g.k[static_cast<size_t>(i)]);
  return s;
}

Tensor forward_f64(const Tensor& x_, const Tensor& w_, const ConvGeom& g) {
  Tensor xc = contiguous_as(x_, kFloat64), wc = contiguous_as(w_, kFloat64);
  Tensor y = new_like(y_sizes(g), kFloat64);
  const double* x = static_cast<const double*>(xc.impl()->data());
  const double* w = static_cast<const double*>(wc.impl()->data());
  double* out = static_cast<double*>(y.impl()->data());
  Idx ix{g};
  const int64_t cig = g.ci / g.groups, cog = g.co / g.groups;
#pragma omp parallel for collapse(2)
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.co; ++o) {
      int64_t grp = o / cog;
      double* yo = out + ix.y_off(n, o);
      for (int64_t c = 0; c < cig; ++c) {
        const double* xc_ = x + ix.x_off(n, grp * cig + c);
        const double* wo = w + ix.w_off(o, c);
        for_taps(g, [&](int64_t xi, int64_t yi, int64_t ki) { yo[yi] += xc_[xi] * wo[ki]; });
      }
    }
  return y;
}

Tensor backward_data_f64(const Tensor& gy_, const Tensor& w_, const ConvGeom& g) {
  Tensor gyc = contiguous_as(gy_, kFloat64), wc = contiguous_as(w_, kFloat64);
  Tensor gx = new_like(x_sizes(g), kFloat64);
  const double* gy = static_cast<const double*>(gyc.impl()->data());
  const double* w = static_cast<const double*>(wc.impl()->data());
  double* out = static_cast<double*>(gx.impl()->data());
  Idx ix{g};
  const int64_t cig = g.ci / g.groups, cog = g.co / g.groups;
#pragma omp parallel for collapse(2)
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c_all = 0; c_all < g.ci; ++c_all) {
      int64_t grp = c_all / cig, c = c_all % cig;
      double* gxc = out + ix.x_off(n, c_all);
      for (int64_t oo = 0; oo < cog; ++oo) {
        int64_t o = grp * cog + oo;
        const double* gyo = gy + ix.y_off(n, o);
        const double* wo = w + ix.w_off(o, c);
        for_taps(g, [&](int64_t xi, int64_t yi, int64_t ki) { gxc[xi] += gyo[yi] * wo[ki]; });
      }
    }
  return gx;
}

Tensor backward_weight_f64(const Tensor& x_, const Tensor& gy_, const ConvGeom& g) {
  Tensor xc = contiguous_as(x_, kFloat64), gyc = contiguous_as(gy_, kFloat64);
  Tensor gw = new_like(w_sizes(g), kFloat64);
  const double* x = static_cast<const double*>(xc.impl()->data());
  const double* gy = static_cast<const double*>(gyc.impl()->data());
  double* out = static_cast<double*>(gw.impl()->data());
  Idx ix{g};
  const int64_t cig = g.ci / g.groups, cog = g.co / g.groups;
#pragma omp parallel for collapse(2)
  for (int64_t o = 0; o < g.co; ++o)
    for (int64_t c = 0; c < cig; ++c) {
      int64_t grp = o / cog;
      double* gwo = out + ix.w_off(o, c);
      for (int64_t n = 0; n < g.n; ++n) {
        const double* xn = x + ix.x_off(n, grp * cig + c);
        const double* gyo = gy + ix.y_off(n, o);
        for_taps(g, [&](int64_t xi, int64_t yi, int64_t ki) { gwo[ki] += xn[xi] * gyo[yi]; });
      }
    }
  return gw;
}

// ---------------------------------------------------------------- float32: oneDNN

#if KILN_HAVE_DNNL
// Note [oneDNN primitive cache]
// Making a oneDNN primitive (its descriptor, the implementation search, JIT code generation)
// costs far more than running a small convolution, so each primitive is made once per shape and
// kept: the key is the kind (forward, backward data, backward weights) and every number of the
// ConvGeom; the value holds the primitive. oneDNN's own primitive cache would spare the code
// generation but not the descriptor search. The map is bounded (kCapacity entries, least
// recently used evicted first) and guarded by a mutex; a primitive runs outside the lock, with a
// scratchpad of the caller's (scratchpad_mode::user), so it may run on several threads at once.
// The primitives choose their operands' layouts (format_tag::any): the fast kernels want blocked
// ones (nChw16c, OIhw16i16o). Each call reorders the plain tensors (ncw/nchw/ncdhw, [g,] oi*) into
// the primitive's layouts where they differ, and the result back; on ResNet's 3x3 shapes this was
// 1.2-1.9 times faster than running the plain layouts directly (bench/conv_bench.cpp), as
// PyTorch's own oneDNN path does it.
enum class Kind : int64_t { Forward, BackwardData, BackwardWeights };

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

using Dims = dnnl::memory::dims;
using Tag = dnnl::memory::format_tag;

struct Mds {
  dnnl::memory::desc x, y, w;
  Dims stride, dil, pad_l, pad_r;
};

// The same descriptors with the layouts left to the primitive.
Mds any_layouts(Mds m) {
  m.x = dnnl::memory::desc(m.x.dims(), m.x.data_type(), Tag::any);
  m.y = dnnl::memory::desc(m.y.dims(), m.y.data_type(), Tag::any);
  m.w = dnnl::memory::desc(m.w.dims(), m.w.data_type(), Tag::any);
  return m;
}

int64_t right_pad(const ConvGeom& g, size_t j);

Mds descriptors(const ConvGeom& g) {
  const int first = static_cast<int>(3 - g.nd);
  Dims xd{g.n, g.ci}, yd{g.n, g.co}, wd, stride, dil, pad;
  if (g.groups > 1)
    wd = {g.groups, g.co / g.groups, g.ci / g.groups};
  else
    wd = {g.co, g.ci};
  for (int i = first; i < 3; ++i) {
    xd.push_back(g.x[static_cast<size_t>(i)]);
    yd.push_back(g.y[static_cast<size_t>(i)]);
    wd.push_back(g.k[static_cast<size_t>(i)]);
    stride.push_back(g.stride[static_cast<size_t>(i)]);
    dil.push_back(g.dil[static_cast<size_t>(i)] - 1);  // oneDNN counts the gaps
    pad.push_back(g.pad[static_cast<size_t>(i)]);
  }
  static const Tag act[] = {Tag::ncw, Tag::nchw, Tag::ncdhw};
  static const Tag wt[] = {Tag::oiw, Tag::oihw, Tag::oidhw};
  static const Tag gwt[] = {Tag::goiw, Tag::goihw, Tag::goidhw};
  const size_t r = static_cast<size_t>(g.nd - 1);
  const auto f32 = dnnl::memory::data_type::f32;
  // The right padding makes oneDNN's size rule ((x - span + l + r) / s + 1, floored) give y.
  Dims pad_r;
  for (int i = first; i < 3; ++i) pad_r.push_back(right_pad(g, static_cast<size_t>(i)));
  return {dnnl::memory::desc(xd, f32, act[r]),
          dnnl::memory::desc(yd, f32, act[r]),
          dnnl::memory::desc(wd, f32, g.groups > 1 ? gwt[r] : wt[r]),
          stride,
          dil,
          pad,
          pad_r};
}

// The scratchpad is the caller's (allocated per call), so one primitive may run on several
// threads at once (sim's streams, user threads).
dnnl::primitive_attr attr() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

dnnl::convolution_forward::primitive_desc forward_pd(const Mds& m) {
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training,
                                    dnnl::algorithm::convolution_direct, m.x, m.w, m.y, m.stride,
                                    m.dil, m.pad_l, m.pad_r);
  return {d, attr(), engine()};
}

// A primitive and the layouts it chose for its two inputs (a, b) and its output, in run_dnnl's
// order: forward (x, w -> y), backward data (gy, w -> gx), backward weights (x, gy -> gw).
struct Prim {
  dnnl::primitive p;
  dnnl::memory::desc scratch, a, b, out;
};

Prim make_primitive(Kind kind, const ConvGeom& g) {
  Mds m = any_layouts(descriptors(g));
  auto fwd = forward_pd(m);
  switch (kind) {
    case Kind::Forward:
      return {dnnl::convolution_forward(fwd), fwd.scratchpad_desc(), fwd.src_desc(),
              fwd.weights_desc(), fwd.dst_desc()};
    case Kind::BackwardData: {
      dnnl::convolution_backward_data::desc d(dnnl::algorithm::convolution_direct, m.x, m.w, m.y,
                                              m.stride, m.dil, m.pad_l, m.pad_r);
      dnnl::convolution_backward_data::primitive_desc pd(d, attr(), engine(), fwd);
      return {dnnl::convolution_backward_data(pd), pd.scratchpad_desc(), pd.diff_dst_desc(),
              pd.weights_desc(), pd.diff_src_desc()};
    }
    case Kind::BackwardWeights: {
      dnnl::convolution_backward_weights::desc d(dnnl::algorithm::convolution_direct, m.x, m.w, m.y,
                                                 m.stride, m.dil, m.pad_l, m.pad_r);
      dnnl::convolution_backward_weights::primitive_desc pd(d, attr(), engine(), fwd);
      return {dnnl::convolution_backward_weights(pd), pd.scratchpad_desc(), pd.src_desc(),
              pd.diff_dst_desc(), pd.diff_weights_desc()};
    }
  }
  KILN_ASSERT(false, "unknown convolution kind");
  return {};
}

Prim cached_primitive(Kind kind, const ConvGeom& g) {
  constexpr size_t kCapacity = 256;
  using Key = std::vector<int64_t>;
  struct Cache {
    std::mutex mu;
    std::list<Key> order;  // most recently used first
    std::map<Key, std::pair<Prim, std::list<Key>::iterator>> map;
  };
  static Cache cache;
  Key key{static_cast<int64_t>(kind), g.nd, g.n, g.ci, g.co, g.groups};
  for (const auto* a : {&g.x, &g.y, &g.k, &g.stride, &g.pad, &g.dil})
    key.insert(key.end(), a->begin(), a->end());
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.map.find(key);
  if (it != cache.map.end()) {
    cache.order.splice(cache.order.begin(), cache.order, it->second.second);
    return it->second.first;
  }
  Prim p = make_primitive(kind, g);
  if (cache.map.size() >= kCapacity) {
    cache.map.erase(cache.order.back());
    cache.order.pop_back();
  }
  cache.order.push_front(key);
  cache.map.emplace(key, std::make_pair(p, cache.order.begin()));
  return p;
}

dnnl::memory mem(const dnnl::memory::desc& d, const Tensor& t) {
  return dnnl::memory(d, engine(), const_cast<void*>(t.impl()->data()));
}

// A buffer of `bytes` bytes on the cpu (uint8), for oneDNN memories in blocked layouts.
Tensor bytes_tensor(size_t bytes) {
  return detail::empty_tensor({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, kUInt8,
                              Device(kCPU));
}

// Runs one oneDNN primitive on float32 copies of a and b (contiguous) into a new float32 result
// of `sizes`, returned in `dtype`. Operands are reordered into the primitive's layouts and the
// result out of its layout where they differ from the plain ones (Note [oneDNN primitive cache]).
Tensor run_dnnl(Kind kind, const Tensor& a, const Tensor& b, IntArrayRef sizes, DType dtype,
                const ConvGeom& g) {
  Tensor ac = contiguous_as(a, kFloat32), bc = contiguous_as(b, kFloat32);
  Tensor out = detail::empty_tensor(sizes, kFloat32, Device(kCPU));
  Mds m = descriptors(g);
  Prim prim = cached_primitive(kind, g);
  // The plain layouts of a, b and the output, in run_dnnl's order.
  const dnnl::memory::desc plain_a = kind == Kind::BackwardData ? m.y : m.x;
  const dnnl::memory::desc plain_b = kind == Kind::BackwardWeights ? m.y : m.w;
  const dnnl::memory::desc plain_out = kind == Kind::Forward        ? m.y
                                       : kind == Kind::BackwardData ? m.x
                                                                    : m.w;
  Tensor scratch = bytes_tensor(prim.scratch.get_size());
  dnnl::memory scratch_mem(prim.scratch, engine(), scratch.impl()->data());
  dnnl::stream s(engine());
  std::vector<Tensor> keep;  // the blocked buffers, alive until the stream is done
  // `t` (plain) as the primitive wants it: itself, or a reordered copy.
  auto input = [&](const dnnl::memory::desc& want, const dnnl::memory::desc& plain,
                   const Tensor& t) {
    dnnl::memory user = mem(plain, t);
    if (want == plain) return user;
    keep.push_back(bytes_tensor(want.get_size()));
    dnnl::memory blocked(want, engine(), keep.back().impl()->data());
    dnnl::reorder(user, blocked).execute(s, user, blocked);
    return blocked;
  };
  dnnl::memory a_mem = input(prim.a, plain_a, ac), b_mem = input(prim.b, plain_b, bc);
  dnnl::memory out_user = mem(plain_out, out), out_mem = out_user;
  const bool reorder_out = prim.out != plain_out;
  if (reorder_out) {
    keep.push_back(bytes_tensor(prim.out.get_size()));
    out_mem = dnnl::memory(prim.out, engine(), keep.back().impl()->data());
  }
  static constexpr int kArgs[3][3] = {{DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                                      {DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
                                      {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS}};
  const int* args = kArgs[static_cast<int>(kind)];
  prim.p.execute(
      s,
      {{args[0], a_mem}, {args[1], b_mem}, {args[2], out_mem}, {DNNL_ARG_SCRATCHPAD, scratch_mem}});
  if (reorder_out) dnnl::reorder(out_mem, out_user).execute(s, out_mem, out_user);
  s.wait();
  return dtype == kFloat32 ? out : ops::op_to_copy(out, dtype, Device(kCPU));
}

#endif  // KILN_HAVE_DNNL

#if KILN_HAVE_DNNL
// The right padding of dim j: the left one when oneDNN's size rule then gives y (always, but
// for a transposed convolution whose output_padding reaches the stride, which is allowed while
// it is below the dilation), else the exact one, which may be negative.
int64_t right_pad(const ConvGeom& g, size_t j) {
  int64_t span = g.dil[j] * (g.k[j] - 1) + 1;
  if ((g.x[j] + 2 * g.pad[j] - span) / g.stride[j] + 1 == g.y[j]) return g.pad[j];
  return (g.y[j] - 1) * g.stride[j] + span - g.x[j] - g.pad[j];
}
// Negative paddings go through the float64 loops.
bool dnnl_fits(const ConvGeom& g) {
  for (size_t j = 0; j < 3; ++j)
    if (right_pad(g, j) < 0) return false;
  return true;
}
#endif  // KILN_HAVE_DNNL

Tensor via_f64(Tensor (*f)(const Tensor&, const Tensor&, const ConvGeom&), const Tensor& a,
               const Tensor& b, DType dtype, const ConvGeom& g) {
  Tensor r = f(a, b, g);
  return dtype == kFloat64 ? r : ops::op_to_copy(r, dtype, Device(kCPU));
}

Tensor forward(const Tensor& x, const Tensor& w, const ConvGeom& g) {
#if KILN_HAVE_DNNL
  if (x.dtype() != kFloat64 && dnnl_fits(g))
    return run_dnnl(Kind::Forward, x, w, y_sizes(g), x.dtype(), g);
#endif
  return via_f64(&forward_f64, x, w, x.dtype(), g);
}
Tensor backward_data(const Tensor& gy, const Tensor& w, const ConvGeom& g) {
#if KILN_HAVE_DNNL
  if (gy.dtype() != kFloat64 && dnnl_fits(g))
    return run_dnnl(Kind::BackwardData, gy, w, x_sizes(g), gy.dtype(), g);
#endif
  return via_f64(&backward_data_f64, gy, w, gy.dtype(), g);
}
Tensor backward_weight(const Tensor& x, const Tensor& gy, const ConvGeom& g) {
#if KILN_HAVE_DNNL
  if (x.dtype() != kFloat64 && dnnl_fits(g))
    return run_dnnl(Kind::BackwardWeights, x, gy, w_sizes(g), x.dtype(), g);
#endif
  return via_f64(&backward_weight_f64, x, gy, x.dtype(), g);
}

constexpr detail::ConvKernels kKernels{&forward, &backward_data, &backward_weight};

Tensor convolution_kernel(const Tensor& input, const Tensor& weight, const Tensor& bias,
                          IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
                          bool transposed, IntArrayRef output_padding, int64_t groups) {
  return detail::run_convolution(kKernels, input, weight, bias, stride, padding, dilation,
                                 transposed, output_padding, groups);
}
TensorTriple convolution_backward_kernel(const Tensor& grad_output, const Tensor& input,
                                         const Tensor& weight, IntArrayRef bias_sizes,
                                         IntArrayRef stride, IntArrayRef padding,
                                         IntArrayRef dilation, bool transposed,
                                         IntArrayRef output_padding, int64_t groups,
                                         IntArrayRef output_mask) {
  return detail::run_convolution_backward(kKernels, grad_output, input, weight, bias_sizes, stride,
                                          padding, dilation, transposed, output_padding, groups,
                                          output_mask);
}

const bool registered = [] {
  ops::op_convolution.set_kernel(DispatchKey::CPU, &convolution_kernel);
  ops::op_convolution_backward.set_kernel(DispatchKey::CPU, &convolution_backward_kernel);
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
