// Tensor's member functions that dispatch, and PyTorch-style printing.
#include <cmath>

#include "kiln/ops/op_list.h"
#include "kiln/ops/ops.h"

namespace kiln {

using namespace ops;  // NOLINT

namespace {
// A DTensor's impl is a wrapper without bytes of its own (its values are spread over the mesh):
// reading it on the host would read nothing, so the host reads raise as data_ptr() does.
void check_not_dtensor(const Tensor& t, const char* op) {
  KILN_CHECK(!t.key_set().has(DispatchKey::Sharded),
             "[{}] a DTensor has no data of its own; read kiln::dtensor::full_tensor(t) "
             "(collective) or to_local(t)",
             op);
}
}  // namespace

Scalar Tensor::item() const {
  KILN_CHECK(defined(), "[item] undefined tensor");
  check_not_dtensor(*this, "item");
  KILN_CHECK(numel() == 1, "[item] a tensor with {} elements cannot be converted to a Scalar",
             numel());
  KILN_CHECK_DEVICE(!device().is_meta(), "[item] a meta tensor has no data to read");
  detail::note_host_read(*impl(), "item");
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
  return op_to_copy(*this, dtype, device());
}
Tensor Tensor::to(Device device, bool copy) const {
  if (!copy && device == this->device()) return *this;
  return op_to_copy(*this, dtype(), device);
}
Tensor Tensor::contiguous() const { return kiln::contiguous(*this); }
Tensor Tensor::clone() const { return kiln::clone(*this); }
Tensor& Tensor::copy_(const Tensor& src) {
  op_copy_(*this, src);
  return *this;
}
Tensor& Tensor::fill_(const Scalar& value) {
  op_fill_(*this, value);
  return *this;
}
Tensor& Tensor::zero_() { return fill_(0); }
Tensor Tensor::view(IntArrayRef sizes) const { return op_view(*this, sizes); }
Tensor Tensor::reshape(IntArrayRef sizes) const { return kiln::reshape(*this, sizes); }
Tensor Tensor::detach() const { return op_detach(*this); }

template <class T>
std::vector<T> Tensor::to_vector() const {
  KILN_CHECK(defined(), "[to_vector] undefined tensor");
  check_not_dtensor(*this, "to_vector");
  KILN_CHECK_DEVICE(!device().is_meta(), "[to_vector] a meta tensor has no data to read");
  detail::note_host_read(*impl(), "to_vector");
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

// PyTorch's print options: precision 4, linewidth 80, summarise above 1000 elements showing 3
// at each edge.
constexpr int64_t kSummarizeThreshold = 1000;
constexpr int64_t kEdgeItems = 3;
constexpr size_t kLineWidth = 80;

// How every element is printed, chosen from all of them (PyTorch's _Formatter): integers as
// they are; floats as "1." when all are integral, "0.1000" fixed, or "1.0000e-05" when the
// nonzero finite magnitudes span more than 1000x, exceed 1e8, or go below 1e-4.
struct Formatter {
  bool floating = false, int_mode = true, sci_mode = false;
  size_t width = 1;

  Formatter(const std::vector<double>& v, DType dtype) {
    floating = is_floating(dtype);
    if (!floating) {
      for (double x : v) width = std::max(width, plain(x, dtype).size());
      dtype_ = dtype;
      return;
    }
    double amax = 0, amin = INFINITY;
    bool any = false;
    for (double x : v) {
      if (!std::isfinite(x) || x == 0) continue;
      any = true;
      if (x != std::trunc(x)) int_mode = false;
      amax = std::max(amax, std::abs(x));
      amin = std::min(amin, std::abs(x));
    }
    if (!any) return;
    if (int_mode) {
      sci_mode = amax / amin > 1000.0 || amax > 1.0e8;
    } else {
      sci_mode = amax / amin > 1000.0 || amax > 1.0e8 || amin < 1.0e-4;
    }
    for (double x : v) {
      if (!std::isfinite(x) || x == 0) continue;
      size_t w = sci_mode   ? fmt::format("{:.4e}", x).size()
                 : int_mode ? fmt::format("{:.0f}", x).size() + 1
                            : fmt::format("{:.4f}", x).size();
      width = std::max(width, w);
    }
  }
  std::string plain(double x, DType dtype) const {
    if (dtype == kBool) return x != 0 ? "True" : "False";
    return fmt::format("{}", static_cast<int64_t>(x));
  }
  std::string raw(double x) const {
    if (!floating) return plain(x, dtype_);
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    if (sci_mode) return fmt::format("{:.4e}", x);
    if (int_mode) return fmt::format("{:.0f}.", x);
    return fmt::format("{:.4f}", x);
  }
  std::string operator()(double x) const {
    std::string s = raw(x);
    return std::string(width - std::min(width, s.size()), ' ') + s;
  }

 private:
  DType dtype_ = kFloat32;
};

struct Printer {
  const std::vector<double>& v;
  IntArrayRef sizes;
  const Formatter& f;
  bool summarize;

  // The elements of dim `dim` to show: all, or the edges when summarising.
  std::vector<int64_t> shown(int64_t n) const {
    std::vector<int64_t> idx;
    if (summarize && n > 2 * kEdgeItems) {
      for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
      idx.push_back(-1);  // the "..." marker
      for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
    } else {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
    }
    return idx;
  }
  std::string rec(size_t dim, int64_t offset, size_t indent) const {
    int64_t inner = 1;
    for (size_t i = dim + 1; i < sizes.size(); ++i) inner *= sizes[i];
    std::vector<int64_t> idx = shown(sizes[dim]);
    if (dim + 1 == sizes.size()) {
      std::vector<std::string> items;
      for (int64_t i : idx) items.push_back(i < 0 ? " ..." : f(v[offset + i]));
      size_t per_line =
          std::max<size_t>(1, (kLineWidth - std::min(kLineWidth, indent)) / (f.width + 2));
      std::string out = "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += (i % per_line == 0) ? ",\n" + std::string(indent + 1, ' ') : ", ";
        out += items[i];
      }
      return out + "]";
    }
    std::string sep =
        "," + std::string(sizes.size() - dim - 1, '\n') + std::string(indent + 1, ' ');
    std::string out = "[";
    for (size_t k = 0; k < idx.size(); ++k) {
      if (k > 0) out += sep;
      out += idx[k] < 0 ? "..." : rec(dim + 1, offset + idx[k] * inner, indent + 1);
    }
    return out + "]";
  }
};

// The values PyTorch's formatter looks at: only the shown edges when summarising.
void collect_shown(const std::vector<double>& v, IntArrayRef sizes, size_t dim, int64_t offset,
                   bool summarize, std::vector<double>& out) {
  if (dim == sizes.size()) {
    out.push_back(v[offset]);
    return;
  }
  int64_t n = sizes[dim], inner = 1;
  for (size_t i = dim + 1; i < sizes.size(); ++i) inner *= sizes[i];
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdgeItems && i == kEdgeItems) i = n - kEdgeItems;
    collect_shown(v, sizes, dim + 1, offset + i * inner, summarize, out);
  }
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  detail::note_host_read(*impl(), "print");
  std::vector<std::string> suffix;
  if (!device().is_cpu()) suffix.push_back(fmt::format("device='{}'", device()));
  std::string body;
  auto size_str = [&] {
    return fmt::format("size=({}{})", fmt::join(sizes(), ", "), dim() == 1 ? "," : "");
  };
  bool default_like = dtype() == default_dtype() || dtype() == kInt64 || dtype() == kBool;
  if (device().is_meta()) {
    body = "...";
    suffix.push_back(size_str());
    if (dtype() != default_dtype()) suffix.push_back(fmt::format("dtype={}", dtype()));
  } else if (numel() == 0) {
    // No elements to infer an integer dtype from, so any non-default dtype is named.
    body = "[]";
    if (dim() != 1) suffix.push_back(size_str());
    if (dtype() != default_dtype()) suffix.push_back(fmt::format("dtype={}", dtype()));
  } else {
    std::vector<double> v = to_vector<double>();
    bool summarize = numel() > kSummarizeThreshold;
    std::vector<double> shown;
    collect_shown(v, sizes(), 0, 0, summarize, shown);
    Formatter f(shown, dtype());
    body = dim() == 0 ? f.raw(v[0]) : Printer{v, sizes(), f, summarize}.rec(0, 0, 7);
    if (!default_like) suffix.push_back(fmt::format("dtype={}", dtype()));
  }
  std::string s = "tensor(" + body;
  for (const auto& x : suffix) s += ", " + x;
  return s + ")";
}

}  // namespace kiln
