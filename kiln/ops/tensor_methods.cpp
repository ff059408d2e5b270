// Tensor's member functions that dispatch, and PyTorch-style printing.
#include <cmath>

#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {

using namespace ops;  // NOLINT

Scalar Tensor::item() const {
  KILN_CHECK(defined(), "[item] undefined tensor");
  KILN_CHECK(numel() == 1, "[item] a tensor with {} elements cannot be converted to a Scalar",
             numel());
  KILN_CHECK_DEVICE(!device().is_meta(), "[item] a meta tensor has no data to read");
  Tensor host = device().is_cpu() ? *this : to(Device(kCPU));
  return KILN_DISPATCH_TYPES(dtype(), "item", [&]() -> Scalar {
    scalar_t v = *static_cast<const scalar_t*>(host.impl()->data());
    if constexpr (std::is_same_v<scalar_t, bool>)
      return Scalar(v);
    else if constexpr (std::is_integral_v<scalar_t>)
      return Scalar(static_cast<int64_t>(v));
    else
      return Scalar(static_cast<double>(v));
  });
}

Tensor Tensor::to(DType dtype, bool copy) const {
  if (!copy && dtype == this->dtype()) return *this;
  return to_copy_op(*this, dtype, device());
}
Tensor Tensor::to(Device device, bool copy) const {
  if (!copy && device == this->device()) return *this;
  return to_copy_op(*this, dtype(), device);
}
Tensor Tensor::contiguous() const { return kiln::contiguous(*this); }
Tensor Tensor::clone() const { return kiln::clone(*this); }
Tensor& Tensor::copy_(const Tensor& src) {
  copy__op(*this, src);
  return *this;
}
Tensor& Tensor::fill_(const Scalar& value) {
  fill__op(*this, value);
  return *this;
}
Tensor& Tensor::zero_() { return fill_(0); }
Tensor Tensor::view(IntArrayRef sizes) const { return view_op(*this, sizes); }
Tensor Tensor::reshape(IntArrayRef sizes) const { return kiln::reshape(*this, sizes); }
Tensor Tensor::detach() const { return detach_op(*this); }

template <class T>
std::vector<T> Tensor::to_vector() const {
  KILN_CHECK(defined(), "[to_vector] undefined tensor");
  KILN_CHECK_DEVICE(!device().is_meta(), "[to_vector] a meta tensor has no data to read");
  Tensor host = to(Device(kCPU)).to(dtype_of<T>::value).contiguous();
  const T* p = static_cast<const T*>(host.impl()->data());
  return std::vector<T>(p, p + numel());
}
template std::vector<bool> Tensor::to_vector<bool>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<Half> Tensor::to_vector<Half>() const;
template std::vector<BFloat16> Tensor::to_vector<BFloat16>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;

namespace {

// How every element is printed, chosen from all of them (PyTorch's _Formatter).
struct Formatter {
  enum class Mode { Bool, Int, FloatInt, Fixed, Sci } mode;
  size_t width = 1;

  explicit Formatter(const std::vector<double>& v, DType dtype) {
    if (dtype == kBool) {
      mode = Mode::Bool;
    } else if (!is_floating(dtype)) {
      mode = Mode::Int;
    } else {
      double amax = 0, amin = INFINITY;
      bool all_int = true, any_finite = false;
      for (double x : v) {
        if (!std::isfinite(x)) continue;
        any_finite = true;
        if (x != std::trunc(x)) all_int = false;
        double a = std::abs(x);
        amax = std::max(amax, a);
        if (a != 0) amin = std::min(amin, a);
      }
      if (!any_finite)
        mode = Mode::Fixed;
      else if (all_int)
        mode = amax > 1e8 ? Mode::Sci : Mode::FloatInt;
      else if (amax / amin > 1000 || amax > 1e8 || amin < 1e-4)
        mode = Mode::Sci;
      else
        mode = Mode::Fixed;
    }
    for (double x : v) width = std::max(width, raw(x).size());
  }
  std::string raw(double x) const {
    switch (mode) {
      case Mode::Bool:
        return x != 0 ? "True" : "False";
      case Mode::Int:
        return fmt::format("{}", static_cast<int64_t>(x));
      case Mode::FloatInt:
        return std::isfinite(x) ? fmt::format("{:.0f}.", x) : fmt::format("{}", x);
      case Mode::Fixed:
        return fmt::format("{:.4f}", x);
      case Mode::Sci:
        return fmt::format("{:.4e}", x);
    }
    return {};
  }
  std::string operator()(double x) const {
    std::string s = raw(x);
    return std::string(width - std::min(width, s.size()), ' ') + s;
  }
};

constexpr int64_t kSummarizeThreshold = 1000;
constexpr int64_t kEdgeItems = 3;

void print_rec(std::string& out, const std::vector<double>& v, IntArrayRef sizes, size_t dim,
               int64_t offset, int64_t stride_elems, const Formatter& f, int indent,
               bool summarize) {
  if (dim == sizes.size()) {
    out += f(v[offset]);
    return;
  }
  int64_t n = sizes[dim];
  int64_t inner = 1;
  for (size_t i = dim + 1; i < sizes.size(); ++i) inner *= sizes[i];
  out += '[';
  bool last = dim + 1 == sizes.size();
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) {
      out += last ? "..., " : fmt::format("...,\n{}", std::string(indent + dim + 1, ' '));
      i = n - kEdgeItems - 1;
      continue;
    }
    print_rec(out, v, sizes, dim + 1, offset + i * inner, stride_elems, f, indent, summarize);
    if (i + 1 < n) {
      if (last) {
        out += ", ";
      } else {
        out += ',';
        out += std::string(sizes.size() - dim - 1, '\n');
        out += std::string(indent + dim + 1, ' ');
      }
    }
  }
  out += ']';
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::vector<std::string> suffix;
  if (!device().is_cpu()) suffix.push_back(fmt::format("device='{}'", device()));
  std::string body;
  bool show_size = numel() == 0 && dim() != 1;
  if (device().is_meta()) {
    body = "...";
    show_size = true;
  } else {
    std::vector<double> v = to_vector<double>();
    Formatter f(v, dtype());
    if (dim() == 0)
      body = f.raw(v[0]);
    else
      print_rec(body, v, sizes(), 0, 0, 1, f, 7, numel() > kSummarizeThreshold);
  }
  if (show_size)
    suffix.push_back(fmt::format("size=({}{})", fmt::join(sizes(), ", "), dim() == 1 ? "," : ""));
  if (dtype() != default_dtype() && dtype() != kInt64 && dtype() != kBool)
    suffix.push_back(fmt::format("dtype={}", dtype()));
  std::string s = "tensor(" + body;
  for (const auto& x : suffix) s += ", " + x;
  return s + ")";
}

}  // namespace kiln
