// CUDA multi-tensor (foreach) updates used by optimizers: host glue. Every list is validated
// before the first launch; then one launch per (device, dtype) group covers all its tensors
// (several only past a table's capacity, see foreach.h). Strided tensors are updated through
// contiguous copies, as on the CPU.
#include <algorithm>
#include <climits>
#include <utility>
#include <vector>

#include "kiln/backend/cuda/common.h"
#include "kiln/backend/cuda/foreach.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cuda {
namespace {

void check_on_cuda(const char* op, const TensorList& self) {
  for (size_t i = 0; i < self.size(); ++i)
    KILN_CHECK_DEVICE(self[i].device().type() == kCUDA, "[{}] tensor {} is on {}, expected cuda",
                      op, i, self[i].device());
}

void check_writable(const char* op, const TensorList& self,
                    std::initializer_list<const TensorList*> others) {
  check_on_cuda(op, self);
  for (size_t i = 0; i < self.size(); ++i) {
    const Tensor& t = self[i];
    std::vector<const Tensor*> ins;
    for (const TensorList* l : others) ins.push_back(&(*l)[i]);
    TensorSpec spec{Shape(t.sizes()), t.dtype(), t.device()};
    meta::check_inplace(op, t, spec, ArrayRef<const Tensor*>(ins.data(), ins.size()));
  }
}

ForeachScalar scalar_arg(const Scalar& s) {
  return {s.to<double>(), s.to<float>(), s.is_floating() ? 0 : s.to<int64_t>()};
}

// One tensor of a launch: its device and dtype, and the data of each list (contiguous).
template <int L>
struct Entry {
  int device;
  DType dtype;
  int64_t numel;
  std::array<void*, L> ptr;
};

// Calls launch(dtype, table, stream) over `entries` grouped by (device, dtype), in list order
// within a group, as many tensors a call as a table holds.
template <int L, class Launch>
void launch_tables(const char* op, std::vector<Entry<L>>& entries, Launch launch) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry<L>& a, const Entry<L>& b) {
    return std::pair(a.device, a.dtype) < std::pair(b.device, b.dtype);
  });
  ForeachTable<L> tab;
  size_t i = 0;
  while (i < entries.size()) {
    const int device = entries[i].device;
    const DType dtype = entries[i].dtype;
    tab.n = 0;
    tab.chunk_start[0] = 0;
    for (; i < entries.size() && entries[i].device == device && entries[i].dtype == dtype &&
           tab.n < ForeachTable<L>::kCapacity;
         ++i) {
      const Entry<L>& e = entries[i];
      int64_t chunks = (e.numel + kForeachChunk - 1) / kForeachChunk;
      if (tab.n > 0 && tab.chunk_start[tab.n] + chunks > INT_MAX) break;  // the grid's limit
      for (int l = 0; l < L; ++l) tab.ptr[l][tab.n] = e.ptr[l];
      tab.numel[tab.n] = e.numel;
      tab.chunk_start[tab.n + 1] = tab.chunk_start[tab.n] + chunks;
      ++tab.n;
    }
    launch(dtype, tab, current_stream(device));
    check_launch(op);
  }
}

// self[i] = f(self[i], others[0][i], ...) for every i, the others cast to self[i]'s dtype.
template <int L>
void update(const char* op, ForeachOp kind, const TensorList& self,
            std::array<const TensorList*, L - 1> others, const ForeachScalar& s) {
  std::vector<Tensor> keep;                     // contiguous copies and casts, alive until enqueued
  std::vector<std::pair<Tensor, Tensor>> back;  // (strided self, its contiguous copy)
  std::vector<Entry<L>> entries;
  for (size_t i = 0; i < self.size(); ++i) {
    const Tensor& t = self[i];
    if (t.numel() == 0) continue;
    Entry<L> e{t.device().index(), t.dtype(), t.numel(), {}};
    Tensor c = contiguous_as(t, t.dtype());
    if (!t.is_contiguous()) back.emplace_back(t, c);
    e.ptr[0] = c.impl()->data();
    keep.push_back(std::move(c));
    for (int l = 0; l < L - 1; ++l) {
      Tensor o = contiguous_as((*others[l])[i], t.dtype());
      e.ptr[l + 1] = o.impl()->data();
      keep.push_back(std::move(o));
    }
    entries.push_back(e);
  }
  launch_tables<L>(op, entries, [&](DType d, const ForeachTable<L>& tab, cudaStream_t stream) {
    launch_foreach<L>(kind, dt(d), tab, s, stream);
  });
  for (const auto& [t, c] : back) copy_kernel(t, c);
  for (const Tensor& t : self)
    if (t.numel() != 0) t.impl()->storage()->bump_version();
}

void add_(const TensorList& self, const TensorList& other, const Scalar& alpha) {
  meta::foreach_lists("foreach_add_", {&self, &other});
  meta::foreach_scalar("foreach_add_", self, alpha);
  check_writable("foreach_add_", self, {&other});
  update<2>("foreach_add_", ForeachOp::Add, self, {&other}, scalar_arg(alpha));
}
void mul_(const TensorList& self, const Scalar& scalar) {
  meta::foreach_lists("foreach_mul_", {&self});
  meta::foreach_scalar("foreach_mul_", self, scalar);
  check_writable("foreach_mul_", self, {});
  update<1>("foreach_mul_", ForeachOp::Mul, self, {}, scalar_arg(scalar));
}
void mul_list_(const TensorList& self, const TensorList& other) {
  meta::foreach_lists("foreach_mul_list_", {&self, &other});
  check_writable("foreach_mul_list_", self, {&other});
  update<2>("foreach_mul_list_", ForeachOp::MulList, self, {&other}, {});
}
void lerp_(const TensorList& self, const TensorList& end, const Scalar& weight) {
  meta::foreach_lists("foreach_lerp_", {&self, &end});
  meta::foreach_float("foreach_lerp_", self);
  check_writable("foreach_lerp_", self, {&end});
  update<2>("foreach_lerp_", ForeachOp::Lerp, self, {&end}, scalar_arg(weight));
}
void addcmul_(const TensorList& self, const TensorList& t1, const TensorList& t2,
              const Scalar& value) {
  meta::foreach_lists("foreach_addcmul_", {&self, &t1, &t2});
  meta::foreach_scalar("foreach_addcmul_", self, value);
  check_writable("foreach_addcmul_", self, {&t1, &t2});
  update<3>("foreach_addcmul_", ForeachOp::Addcmul, self, {&t1, &t2}, scalar_arg(value));
}
void addcdiv_(const TensorList& self, const TensorList& t1, const TensorList& t2,
              const Scalar& value) {
  meta::foreach_lists("foreach_addcdiv_", {&self, &t1, &t2});
  meta::foreach_float("foreach_addcdiv_", self);
  check_writable("foreach_addcdiv_", self, {&t1, &t2});
  update<3>("foreach_addcdiv_", ForeachOp::Addcdiv, self, {&t1, &t2}, scalar_arg(value));
}
void sqrt_(const TensorList& self) {
  meta::foreach_lists("foreach_sqrt_", {&self});
  meta::foreach_float("foreach_sqrt_", self);
  check_writable("foreach_sqrt_", self, {});
  update<1>("foreach_sqrt_", ForeachOp::Sqrt, self, {}, {});
}
// New tensors sqrt(self[i]), in sqrt's result dtype (integers give the default float dtype).
TensorList sqrt(const TensorList& self) {
  meta::foreach_lists("foreach_sqrt", {&self});
  check_on_cuda("foreach_sqrt", self);
  TensorList out;
  out.reserve(self.size());
  std::vector<Tensor> keep;
  std::vector<Entry<2>> entries;
  for (const Tensor& t : self) {
    DType d = meta::float_result(t.dtype());
    out.push_back(empty_cuda(t.sizes(), d, t.device()));
    if (t.numel() == 0) continue;
    Tensor in = contiguous_as(t, d);
    entries.push_back(
        {t.device().index(), d, t.numel(), {out.back().impl()->data(), in.impl()->data()}});
    keep.push_back(std::move(in));
  }
  launch_tables<2>("foreach_sqrt", entries,
                   [](DType d, const ForeachTable<2>& tab, cudaStream_t stream) {
                     launch_foreach<2>(ForeachOp::SqrtOut, dt(d), tab, {}, stream);
                   });
  return out;
}

// Note [AdamW steps on the device]
// lr and the steps live on the device and are read there (a captured graph replays with their
// current values). Launch order on the stream: check kernels (lr and every step; a failure
// sets a flag and the device's error word), then the update kernels (each block computes
// step + 1 from the step as it was, skipping everything when the flag is set), then the step
// kernels (step += 1 unless flagged). The increment runs after every update block has read
// the old step, so no block can see a half-updated step, and a bad value anywhere writes
// nothing at all. A GradScaler's found_inf, when given, is read by the check kernels too: a
// nonzero value sets the flag without an error, so a skipped step writes nothing (steps
// included) and needs no host read.
void adamw_(const TensorList& p, const TensorList& g, const TensorList& m, const TensorList& v,
            const TensorList& steps, const Tensor& lr_t, double beta1, double beta2, double eps,
            double wd, const Tensor& found_inf) {
  const char* op = "foreach_adamw_";
  meta::foreach_adamw(op, p, g, m, v, steps, lr_t, beta1, beta2, eps, wd, found_inf);
  check_writable(op, p, {&g, &m, &v});
  check_writable(op, m, {&g, &v});
  check_writable(op, v, {&g});
  for (size_t i = 0; i < p.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      KILN_CHECK(steps[j].impl()->data() != steps[i].impl()->data(),
                 "[{}] steps[{}] and steps[{}] are the same tensor", op, j, i);
  if (p.empty()) return;
  static const int kBadLr = error_code(
      "[foreach_adamw_] lr must be finite and >= 0 (found on the device; nothing was "
      "updated)");
  static const int kBadStep = error_code(
      "[foreach_adamw_] every step must hold a whole number >= 0 (found on the "
      "device; nothing was updated)");
  const Device device = lr_t.device();  // every tensor's (checked by the meta function)
  const int index = device.index();
  cudaStream_t stream = current_stream(index);
  Tensor flag = empty_cuda({1}, kInt32, device);
  int* flag_p = static_cast<int*>(flag.impl()->data());
  const auto* lr = static_cast<const double*>(lr_t.impl()->data());
  const auto* found =
      found_inf.defined() ? static_cast<const float*>(found_inf.impl()->data()) : nullptr;

  auto each_step_table = [&](auto launch) {
    StepTable st;
    for (size_t b = 0; b < p.size(); b += kStepCapacity) {
      st.n = static_cast<int>(std::min<size_t>(kStepCapacity, p.size() - b));
      for (int k = 0; k < st.n; ++k)
        st.step[k] = static_cast<double*>(steps[b + static_cast<size_t>(k)].impl()->data());
      launch(st, b == 0);
      check_launch(op);
    }
  };
  each_step_table([&](const StepTable& st, bool first) {
    launch_adamw_check(st, lr, found, flag_p, first, error_word(index), kBadLr, kBadStep, stream);
  });

  std::vector<Tensor> keep;
  std::vector<std::pair<Tensor, Tensor>> back;  // (strided tensor, its contiguous copy)
  std::vector<Entry<5>> entries;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].numel() == 0) continue;
    Entry<5> e{index, p[i].dtype(), p[i].numel(), {}};
    const Tensor* lists[] = {&p[i], &g[i], &m[i], &v[i]};
    for (int l = 0; l < 4; ++l) {
      Tensor c = contiguous_as(*lists[l], p[i].dtype());
      if (l != 1 && !lists[l]->is_contiguous()) back.emplace_back(*lists[l], c);
      e.ptr[l] = c.impl()->data();
      keep.push_back(std::move(c));
    }
    e.ptr[4] = steps[i].impl()->data();
    entries.push_back(e);
  }
  AdamWArgs args{lr, flag_p, beta1, beta2, eps, wd};
  launch_tables<5>(op, entries, [&](DType d, const ForeachTable<5>& tab, cudaStream_t st) {
    launch_adamw(dt(d), tab, args, st);
  });

  each_step_table([&](const StepTable& st, bool) { launch_adamw_steps(st, flag_p, stream); });
  for (const auto& [t, c] : back) copy_kernel(t, c);
  for (size_t i = 0; i < p.size(); ++i)
    for (const TensorList* l : {&p, &m, &v, &steps}) (*l)[i].impl()->storage()->bump_version();
}

KILN_CUDA_KERNELS(::kiln::backend_kernel(ops::op_foreach_adamw_, &adamw_),
                  ::kiln::backend_kernel(ops::op_foreach_add_, &add_),
                  ::kiln::backend_kernel(ops::op_foreach_mul_, &mul_),
                  ::kiln::backend_kernel(ops::op_foreach_mul_list_, &mul_list_),
                  ::kiln::backend_kernel(ops::op_foreach_lerp_, &lerp_),
                  ::kiln::backend_kernel(ops::op_foreach_addcmul_, &addcmul_),
                  ::kiln::backend_kernel(ops::op_foreach_addcdiv_, &addcdiv_),
                  ::kiln::backend_kernel(ops::op_foreach_sqrt_, &sqrt_),
                  ::kiln::backend_kernel(ops::op_foreach_sqrt, &sqrt));

}  // namespace
}  // namespace kiln::cuda
