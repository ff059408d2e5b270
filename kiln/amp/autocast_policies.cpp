// Every op's mixed-precision policy (Note [Autocast policies]), set at start-up.
#include "kiln/amp/autocast_policies.h"

#include <array>

#include "kiln/ops/op_list.h"

namespace kiln::amp {

// Note [Autocast policies]
// After PyTorch's autocast lists. Functional ops are listed here one by one; the coverage test
// (OpRecordTest.AutocastPolicyCoverage) fails for a functional op without an entry, so a new op
// comes with a decision. In-place and out= forms, views and factories are Passthrough by their
// kind: autocast leaves a written tensor's dtype alone and views and factories have no inputs to
// cast. Backward ops (gelu_backward, threshold_backward, layer_norm_backward,
// layer_norm_fused_backward, flash_attention_backward) run in backward passes, where autocast is
// off; they are Passthrough.
namespace {

using P = AutocastPolicy;

constexpr auto kTable = std::to_array<PolicyEntry>({
    // Products and attention: the 16-bit dtype (tensor cores, half the memory traffic).
    {"mm", P::LowerPrecision},
    {"bmm", P::LowerPrecision},
    {"addmm", P::LowerPrecision},
    {"addmm_gelu", P::LowerPrecision},
    {"flash_attention", P::LowerPrecision},
    {"convolution", P::LowerPrecision},
    // Where 16 bits lose too much: exponentials, powers, sums, softmax, norms and losses.
    {"exp", P::Float32},
    {"log", P::Float32},
    {"pow", P::Float32},
    {"rsqrt", P::Float32},
    {"sum", P::Float32},
    {"cumsum", P::Float32},
    {"prod", P::Float32},
    {"softmax", P::Float32},
    {"log_softmax", P::Float32},
    {"layer_norm", P::Float32},
    {"rms_norm", P::Float32},
    {"native_layer_norm", P::Float32},
    {"native_group_norm", P::Float32},
    {"cdist_forward", P::Float32},  // cdist and pdist: PyTorch's CUDA float32 list
    {"pdist_forward", P::Float32},
    // Batch norm runs in the input's dtype: a 16-bit input with float32 weight and running
    // stats is the mixed-dtype kernel (float32 statistics), as PyTorch's autocast leaves
    // batch_norm off its lists; casting would also copy the running stats it writes.
    {"native_batch_norm_legit", P::Passthrough},
    {"native_batch_norm_legit_no_stats", P::Passthrough},
    {"native_batch_norm_legit_no_training", P::Passthrough},
    {"nll_loss", P::Float32},
    {"acos", P::Float32},
    {"asin", P::Float32},
    {"cosh", P::Float32},
    {"sinh", P::Float32},
    {"tan", P::Float32},
    {"expm1", P::Float32},
    {"log1p", P::Float32},
    {"log2", P::Float32},
    {"log10", P::Float32},
    {"reciprocal", P::Float32},
    // Several floating inputs that must agree: the widest.
    {"cat", P::Promote},
    {"where", P::Promote},
    {"scatter_add", P::Promote},
    {"index_add", P::Promote},
    {"index_put", P::Promote},
    {"scatter", P::Promote},
    {"scatter_reduce", P::Promote},
    {"embedding_bag", P::Promote},  // weight and per_sample_weights share a dtype
    {"select_scatter", P::Promote},
    {"slice_scatter", P::Promote},
    // In the inputs' dtypes: elementwise ops (type promotion mixes dtypes), comparisons, mean
    // and var (they accumulate in float32 internally), selections, casts, random masks, the
    // collectives, and the backward ops.
    {"add", P::Passthrough},
    {"sub", P::Passthrough},
    {"mul", P::Passthrough},
    {"div", P::Passthrough},
    {"div_trunc", P::Passthrough},
    {"div_floor", P::Passthrough},
    {"fmod", P::Passthrough},
    {"remainder", P::Passthrough},
    {"bitwise_and", P::Passthrough},
    {"bitwise_or", P::Passthrough},
    {"bitwise_xor", P::Passthrough},
    {"bitwise_not", P::Passthrough},
    {"atan2", P::Promote},  // in PyTorch's promote list
    {"maximum", P::Passthrough},
    {"minimum", P::Passthrough},
    {"eq", P::Passthrough},
    {"ne", P::Passthrough},
    {"lt", P::Passthrough},
    {"le", P::Passthrough},
    {"gt", P::Passthrough},
    {"ge", P::Passthrough},
    {"logical_and", P::Passthrough},
    {"logical_or", P::Passthrough},
    {"logical_xor", P::Passthrough},
    {"logical_not", P::Passthrough},
    {"neg", P::Passthrough},
    {"abs", P::Passthrough},
    {"sqrt", P::Passthrough},
    {"tanh", P::Passthrough},
    {"sigmoid", P::Passthrough},
    {"relu", P::Passthrough},
    {"silu", P::Passthrough},
    {"sin", P::Passthrough},
    {"cos", P::Passthrough},
    {"erf", P::Passthrough},
    {"gelu", P::Passthrough},
    {"acosh", P::Passthrough},
    {"asinh", P::Passthrough},
    {"atan", P::Passthrough},
    {"atanh", P::Passthrough},
    {"ceil", P::Passthrough},
    {"floor", P::Passthrough},
    {"round", P::Passthrough},
    {"trunc", P::Passthrough},
    {"sign", P::Passthrough},
    {"isnan", P::Passthrough},
    {"isinf", P::Passthrough},
    {"hardtanh", P::Passthrough},
    {"leaky_relu", P::Passthrough},
    {"elu", P::Passthrough},
    {"clamp", P::Passthrough},
    {"mean", P::Passthrough},
    {"var", P::Passthrough},
    {"amax", P::Passthrough},
    {"amin", P::Passthrough},
    {"all", P::Passthrough},
    {"any", P::Passthrough},
    {"argmax", P::Passthrough},
    {"argmin", P::Passthrough},
    {"max_dim", P::Passthrough},
    {"min_dim", P::Passthrough},
    {"sort", P::Passthrough},
    {"topk", P::Passthrough},
    {"flip", P::Passthrough},
    {"repeat", P::Passthrough},
    {"embedding", P::Passthrough},
    {"embedding_dense_backward", P::Passthrough},
    {"index_select", P::Passthrough},
    {"gather", P::Passthrough},
    {"index", P::Passthrough},
    {"nonzero", P::Passthrough},
    {"triu", P::Passthrough},
    {"tril", P::Passthrough},
    {"one_hot", P::Passthrough},
    {"to_copy", P::Passthrough},
    {"native_dropout", P::Passthrough},
    {"foreach_sqrt", P::Passthrough},
    {"gelu_backward", P::Passthrough},
    {"threshold_backward", P::Passthrough},
    {"elu_backward", P::Passthrough},
    {"layer_norm_backward", P::Passthrough},
    {"layer_norm_fused_backward", P::Passthrough},
    {"flash_attention_backward", P::Passthrough},
    {"convolution_backward", P::Passthrough},
    {"cdist_backward", P::Passthrough},
    {"pdist_backward", P::Passthrough},
    // Sliding blocks copy and sum in the input's dtype (PyTorch's CUDA lists leave them out; the
    // sums run in float32 inside the kernels).
    {"im2col", P::Passthrough},
    {"col2im", P::Passthrough},
    // grid_sampler runs in the widest of input's and grid's dtypes: PyTorch's CUDA promote list.
    {"grid_sampler_2d", P::Promote},
    {"grid_sampler_2d_backward", P::Passthrough},
    // 2-D pooling runs in the input's dtype (PyTorch's lists leave it out; a max is exact in any
    // dtype, and the means sum in float32 inside the kernels). The 3-D pools are on PyTorch's CPU
    // float32 list (max_pool3d, avg_pool3d, adaptive_avg_pool3d in autocast_mode.cpp).
    {"max_pool2d_with_indices", P::Passthrough},
    {"max_pool3d_with_indices", P::Float32},
    {"avg_pool2d", P::Passthrough},
    {"avg_pool3d", P::Float32},
    {"adaptive_avg_pool2d", P::Passthrough},
    {"adaptive_avg_pool3d", P::Float32},
    {"max_pool2d_with_indices_backward", P::Passthrough},
    {"max_pool3d_with_indices_backward", P::Passthrough},
    {"avg_pool2d_backward", P::Passthrough},
    {"avg_pool3d_backward", P::Passthrough},
    {"adaptive_avg_pool2d_backward", P::Passthrough},
    {"adaptive_avg_pool3d_backward", P::Passthrough},
    {"native_batch_norm_backward", P::Passthrough},
    {"native_group_norm_backward", P::Passthrough},
    {"native_layer_norm_backward", P::Passthrough},
    // Padding copies elements, in any dtype. Upsampling is on PyTorch's CUDA float32 list
    // (AT_FORALL_FP32: upsample_nearest*, upsample_bilinear2d, ...): its weights and sums run
    // in float32.
    {"constant_pad_nd", P::Passthrough},
    {"reflection_pad1d", P::Passthrough},
    {"reflection_pad2d", P::Passthrough},
    {"reflection_pad3d", P::Passthrough},
    {"replication_pad1d", P::Passthrough},
    {"replication_pad2d", P::Passthrough},
    {"replication_pad3d", P::Passthrough},
    {"upsample_nearest2d", P::Float32},
    {"upsample_bilinear2d", P::Float32},
    {"reflection_pad1d_backward", P::Passthrough},
    {"reflection_pad2d_backward", P::Passthrough},
    {"reflection_pad3d_backward", P::Passthrough},
    {"replication_pad1d_backward", P::Passthrough},
    {"replication_pad2d_backward", P::Passthrough},
    {"replication_pad3d_backward", P::Passthrough},
    {"upsample_nearest2d_backward", P::Passthrough},
    {"upsample_bilinear2d_backward", P::Passthrough},
    {"all_reduce", P::Passthrough},
    {"all_gather_into_tensor", P::Passthrough},
    {"reduce_scatter_tensor", P::Passthrough},
    {"broadcast", P::Passthrough},
    {"all_to_all_single", P::Passthrough},
    {"send", P::Passthrough},
});

const bool g_set = [] {
  for (OpDef* op : ops::all_ops())
    if (op->kind() != OpKind::Functional) op->set_autocast_policy(AutocastPolicy::Passthrough);
  for (const PolicyEntry& e : kTable)
    if (OpDef* op = const_cast<OpDef*>(ops::find_op(e.op))) op->set_autocast_policy(e.policy);
  return true;
}();

}  // namespace

std::span<const PolicyEntry> autocast_policy_table() { return kTable; }

}  // namespace kiln::amp
