// PyTorch's Core ATen operator set against Kiln (issue 16): tests/ops/core_aten_ops.txt pins the
// list (PyTorch 2.11's overloads tagged core); every entry has exactly one row here. See Note
// [Core ATen coverage].
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/ops/op_list.h"

namespace kiln::test {
namespace {

// Note [Core ATen coverage]
// Each Core ATen entry is one of:
//   kOp         a Kiln op of that name is registered (its meta, kernels, formula, sharding rule
//               and test rows are OpRecordTest's business);
//   kComposite  a public function that composes ops (named in `what`);
//   kExcluded   left out on purpose, `what` saying why;
//   kPending    not done yet (`what`: the batch, or what a partly done op lacks). Issue 16 is
//               done when none is left; a pending row whose op now exists fails, so the list
//               only shrinks.
// An entry of the pinned list without a row, a row for an entry the list lacks, a kOp row whose op
// is not registered and an exclusion without a reason each fail.
enum Kind { kOp, kComposite, kExcluded, kPending };

struct Row {
  const char* entry;
  Kind kind;
  const char* what;
};

const std::vector<Row>& rows() {
  static const std::vector<Row> r = {
      {"_adaptive_avg_pool2d", kOp, "adaptive_avg_pool2d"},
      {"_adaptive_avg_pool2d_backward", kOp, "adaptive_avg_pool2d_backward"},
      {"_adaptive_avg_pool3d", kOp, "adaptive_avg_pool3d"},
      {"_cdist_forward", kOp, "cdist_forward"},
      {"_embedding_bag", kOp, "embedding_bag"},
      {"_fft_c2r", kExcluded,
       "takes a complex tensor: Kiln has no complex dtypes (kiln/core/dtype.h), and an FFT library "
       "is out of scope for CNN and LLM training"},
      {"_fft_r2c", kExcluded,
       "returns a complex tensor and Kiln has no complex dtypes (kiln/core/dtype.h: 8 real "
       "dtypes); an FFT library (pocketfft/cuFFT) is out of scope for CNN/LLM training"},
      {"_local_scalar_dense", kComposite, "Tensor::item() (host read, note_host_read)"},
      {"_log_softmax", kOp, "log_softmax"},
      {"_native_batch_norm_legit", kOp, "native_batch_norm_legit"},
      {"_native_batch_norm_legit.no_stats", kOp, "native_batch_norm_legit_no_stats"},
      {"_native_batch_norm_legit_no_training", kOp, "native_batch_norm_legit_no_training"},
      {"_pdist_forward", kOp, "pdist_forward"},
      {"_softmax", kOp, "softmax"},
      {"_to_copy", kOp, "to_copy"},
      {"abs", kOp, "abs"},
      {"acos", kOp, "acos"},
      {"acosh", kOp, "acosh"},
      {"add.Scalar", kOp, "add"},
      {"add.Tensor", kOp, "add"},
      {"addmm", kOp, "addmm"},
      {"alias", kOp, "alias"},
      {"amax", kOp, "amax"},
      {"amin", kOp, "amin"},
      {"any", kOp, "any"},
      {"any.dim", kOp, "any"},
      {"any.dims", kOp, "any"},
      {"arange.start_step", kOp, "arange"},
      {"argmax", kOp, "argmax"},
      {"argmin", kOp, "argmin"},
      {"as_strided", kOp, "as_strided"},
      {"asin", kOp, "asin"},
      {"asinh", kOp, "asinh"},
      {"atan", kOp, "atan"},
      {"atan2", kOp, "atan2"},
      {"atan2.out", kOp, "atan2"},
      {"atanh", kOp, "atanh"},
      {"avg_pool2d", kOp, "avg_pool2d"},
      {"avg_pool2d_backward", kOp, "avg_pool2d_backward"},
      {"avg_pool3d", kOp, "avg_pool3d"},
      {"bitwise_and.Scalar", kOp, "bitwise_and"},
      {"bitwise_and.Tensor", kOp, "bitwise_and"},
      {"bitwise_not", kOp, "bitwise_not"},
      {"bitwise_or.Scalar", kOp, "bitwise_or"},
      {"bitwise_or.Tensor", kOp, "bitwise_or"},
      {"bitwise_xor.Scalar", kOp, "bitwise_xor"},
      {"bitwise_xor.Tensor", kOp, "bitwise_xor"},
      {"bmm", kOp, "bmm"},
      {"cat", kOp, "cat"},
      {"ceil", kOp, "ceil"},
      {"clamp", kOp, "clamp"},
      {"clamp.Tensor", kComposite, "clamp(self, Tensor min, Tensor max): maximum then minimum"},
      {"clone", kComposite, "clone (composite.cpp: to_copy)"},
      {"col2im", kOp, "col2im"},
      {"constant_pad_nd", kOp, "constant_pad_nd"},
      {"convolution", kOp, "convolution"},
      {"convolution_backward", kOp, "convolution_backward"},
      {"copy", kOp, "copy_"},
      {"cos", kOp, "cos"},
      {"cosh", kOp, "cosh"},
      {"cumsum", kOp, "cumsum"},
      {"diagonal", kOp, "diagonal"},
      {"div.Scalar", kOp, "div"},
      {"div.Scalar_mode", kComposite,
       "div(self, Scalar, rounding_mode) over the div_trunc and div_floor ops"},
      {"div.Tensor", kOp, "div"},
      {"div.Tensor_mode", kComposite,
       "div(self, other, rounding_mode) over the div_trunc and div_floor ops"},
      {"elu", kOp, "elu"},
      {"embedding", kOp, "embedding"},
      {"embedding_dense_backward", kOp, "embedding_dense_backward"},
      {"empty.memory_format", kOp, "empty"},
      {"empty_strided", kOp, "empty_strided"},
      {"eq.Scalar", kOp, "eq"},
      {"eq.Tensor", kOp, "eq"},
      {"erf", kOp, "erf"},
      {"exp", kOp, "exp"},
      {"expand", kOp, "expand"},
      {"expm1", kOp, "expm1"},
      {"fill.Scalar", kOp, "fill_"},
      {"flip", kOp, "flip"},
      {"floor", kOp, "floor"},
      {"fmod.Scalar", kOp, "fmod"},
      {"fmod.Tensor", kOp, "fmod"},
      {"full", kOp, "full"},
      {"full_like", kComposite, "full_like (ops.h composite over full)"},
      {"gather", kOp, "gather"},
      {"ge.Scalar", kOp, "ge"},
      {"ge.Tensor", kOp, "ge"},
      {"gelu", kOp, "gelu"},
      {"grid_sampler_2d", kOp, "grid_sampler_2d"},
      {"gt.Scalar", kOp, "gt"},
      {"gt.Tensor", kOp, "gt"},
      {"hardtanh", kOp, "hardtanh"},
      {"index.Tensor", kOp, "index"},
      {"index_put", kOp, "index_put"},
      {"index_select", kOp, "index_select"},
      {"isinf", kOp, "isinf"},
      {"isnan", kOp, "isnan"},
      {"le.Scalar", kOp, "le"},
      {"le.Tensor", kOp, "le"},
      {"leaky_relu", kOp, "leaky_relu"},
      {"log", kOp, "log"},
      {"log10", kOp, "log10"},
      {"log1p", kOp, "log1p"},
      {"log2", kOp, "log2"},
      {"logical_and", kOp, "logical_and"},
      {"logical_not", kOp, "logical_not"},
      {"logical_or", kOp, "logical_or"},
      {"logical_xor", kOp, "logical_xor"},
      {"lt.Scalar", kOp, "lt"},
      {"lt.Tensor", kOp, "lt"},
      {"masked_scatter", kComposite,
       "masked_scatter (kiln/ops/indexing.cpp): cumsum of the mask, index_select, where"},
      {"max.dim", kOp, "max_dim"},
      {"max_pool2d_with_indices", kOp, "max_pool2d_with_indices"},
      {"max_pool2d_with_indices_backward", kOp, "max_pool2d_with_indices_backward"},
      {"max_pool3d_with_indices", kOp, "max_pool3d_with_indices"},
      {"maximum", kOp, "maximum"},
      {"mean", kOp, "mean"},
      {"mean.dim", kOp, "mean"},
      {"min.dim", kOp, "min_dim"},
      {"minimum", kOp, "minimum"},
      {"mm", kOp, "mm"},
      {"mul.Scalar", kOp, "mul"},
      {"mul.Tensor", kOp, "mul"},
      {"native_dropout", kOp, "native_dropout"},
      {"native_group_norm", kOp, "native_group_norm"},
      {"native_group_norm_backward", kOp, "native_group_norm_backward"},
      {"native_layer_norm", kOp, "native_layer_norm"},
      {"native_layer_norm_backward", kOp, "native_layer_norm_backward"},
      {"ne.Scalar", kOp, "ne"},
      {"ne.Tensor", kOp, "ne"},
      {"neg", kOp, "neg"},
      {"nonzero", kOp, "nonzero"},
      {"permute", kOp, "permute"},
      {"pow.Scalar", kComposite, "pow(Scalar, Tensor): pow with the base as a wrapped number"},
      {"pow.Tensor_Scalar", kOp, "pow"},
      {"pow.Tensor_Tensor", kOp, "pow"},
      {"prod", kOp, "prod"},
      {"prod.dim_int", kOp, "prod"},
      {"rand", kOp, "rand"},
      {"randn", kOp, "randn"},
      {"randperm", kOp, "randperm"},
      {"reciprocal", kOp, "reciprocal"},
      {"reflection_pad1d", kOp, "reflection_pad1d"},
      {"reflection_pad2d", kOp, "reflection_pad2d"},
      {"reflection_pad3d", kOp, "reflection_pad3d"},
      {"relu", kOp, "relu"},
      {"remainder.Scalar", kOp, "remainder"},
      {"remainder.Tensor", kOp, "remainder"},
      {"repeat", kOp, "repeat"},
      {"replication_pad2d", kOp, "replication_pad2d"},
      {"replication_pad3d", kOp, "replication_pad3d"},
      {"round", kOp, "round"},
      {"rsqrt", kOp, "rsqrt"},
      {"scalar_tensor", kComposite, "scalar_tensor (ops.h; host write on CPU, full() elsewhere)"},
      {"scatter.src", kOp, "scatter"},
      {"scatter.value", kComposite,
       "scatter(self, dim, index, Scalar value): scatter with the value expanded to the index"},
      {"scatter_add", kOp, "scatter_add"},
      {"scatter_reduce.two", kOp, "scatter_reduce"},
      {"select.int", kOp, "select"},
      {"select_scatter", kOp, "select_scatter"},
      {"sigmoid", kOp, "sigmoid"},
      {"sign", kOp, "sign"},
      {"sin", kOp, "sin"},
      {"sinh", kOp, "sinh"},
      {"slice.Tensor", kOp, "slice"},
      {"slice_scatter", kOp, "slice_scatter"},
      {"sort", kOp, "sort"},
      {"split_with_sizes", kComposite, "split(t, sizes, dim) composite over slice (ops.h)"},
      {"sqrt", kOp, "sqrt"},
      {"squeeze.dim", kOp, "squeeze"},
      {"squeeze.dims", kOp, "squeeze_dims"},
      {"sub.Scalar", kOp, "sub"},
      {"sub.Tensor", kOp, "sub"},
      {"sum.dim_IntList", kOp, "sum"},
      {"sym_numel", kExcluded,
       "a size query, not a tensor op: Kiln shapes are concrete host integers (compile guards "
       "them); there is no SymInt to trace"},
      {"sym_size.int", kExcluded,
       "a size query, not a tensor op: Kiln shapes are concrete host integers (compile guards "
       "them); there is no SymInt to trace"},
      {"sym_storage_offset", kExcluded,
       "a size query, not a tensor op: Kiln shapes are concrete host integers (compile guards "
       "them); there is no SymInt to trace"},
      {"sym_stride.int", kExcluded,
       "a size query, not a tensor op: Kiln shapes are concrete host integers (compile guards "
       "them); there is no SymInt to trace"},
      {"tan", kOp, "tan"},
      {"tanh", kOp, "tanh"},
      {"topk", kOp, "topk"},
      {"trunc", kOp, "trunc"},
      {"unsqueeze", kOp, "unsqueeze"},
      {"upsample_bilinear2d.vec", kComposite,
       "upsample_bilinear2d_vec over the op upsample_bilinear2d (ATen's base overload: "
       "output_size, scales_h, scales_w)"},
      {"upsample_nearest2d.vec", kComposite,
       "upsample_nearest2d_vec over the op upsample_nearest2d (ATen's base overload: output_size, "
       "scales_h, scales_w)"},
      {"var.correction", kOp, "var"},
      {"var.dim", kOp, "var"},
      {"view", kOp, "view"},
      {"where.self", kOp, "where"},
  };
  return r;
}

std::vector<std::string> pinned_list() {
  std::ifstream in(KILN_CORE_ATEN_LIST);
  EXPECT_TRUE(in.good()) << "cannot read " << KILN_CORE_ATEN_LIST;
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] != '#') out.push_back(line);
  return out;
}

std::string base_of(const std::string& entry) { return entry.substr(0, entry.find('.')); }

TEST(CoreAtenCoverage, EveryPinnedEntryHasExactlyOneRow) {
  const std::vector<std::string> list = pinned_list();
  EXPECT_GT(list.size(), 150u);
  std::map<std::string, int> count;
  for (const Row& r : rows()) ++count[r.entry];
  std::set<std::string> pinned(list.begin(), list.end());
  EXPECT_EQ(pinned.size(), list.size()) << "duplicate entries in the pinned list";
  for (const std::string& e : list) EXPECT_EQ(count[e], 1) << e << ": rows for this entry";
  for (const auto& [e, n] : count) EXPECT_TRUE(pinned.count(e)) << e << ": a row the list lacks";
}

TEST(CoreAtenCoverage, ImplementedRowsNameRegisteredOps) {
  for (const Row& r : rows()) {
    if (r.kind == kOp) {
      EXPECT_NE(ops::find_op(r.what), nullptr) << r.entry << ": no op named " << r.what;
    }
    if (r.kind == kExcluded) {
      EXPECT_GT(std::string(r.what).size(), 20u) << r.entry << ": an exclusion says why";
    }
    EXPECT_FALSE(std::string(r.what).empty()) << r.entry;
  }
}

TEST(CoreAtenCoverage, PendingRowsAreNotDoneYet) {
  int pending = 0, done = 0, composite = 0, excluded = 0;
  for (const Row& r : rows()) {
    switch (r.kind) {
      case kOp:
        ++done;
        break;
      case kComposite:
        ++composite;
        break;
      case kExcluded:
        ++excluded;
        break;
      case kPending: {
        ++pending;
        const bool partly = std::string(r.what).starts_with("partly");
        if (!partly) {
          EXPECT_EQ(ops::find_op(base_of(r.entry)), nullptr)
              << r.entry << " is registered now: make its row kOp";
        }
        break;
      }
    }
  }
  std::cout << fmt::format(
      "Core ATen: {} entries; {} ops, {} composites, {} excluded, {} pending\n", rows().size(),
      done, composite, excluded, pending);
}

}  // namespace
}  // namespace kiln::test
