// The error table: calls that must raise a specific Kiln error whose message starts with
// "[op]" and names the offending values, and must write nothing (DESIGN.md "Errors").
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

using Watch = std::function<void(const Tensor&)>;
using K = ErrorKind;

Tensor f32(IntArrayRef shape) { return ones(shape, kFloat32); }
Tensor i64(IntArrayRef shape) { return ones(shape, kInt64); }
Tensor idx(std::vector<int64_t> v) { return from_vector(v); }
Device meta() { return Device("meta"); }

ErrorCase err(std::string name, ErrorKind kind, std::string op, std::vector<std::string> contains,
              std::function<void(const Watch&)> run) {
  return {std::move(name), kind, std::move(op), std::move(contains), std::move(run)};
}

}  // namespace

// One row per case; clang-format would put every argument of a row on its own line.
// clang-format off
std::vector<ErrorCase> error_cases() {
  return {
      // ---------------------------------------------------------------- shapes
      err("add_shape_mismatch", K::Value, "add", {"[2, 3]", "[4]"},
          [](const Watch&) { add(f32({2, 3}), f32({4})); }),
      err("mm_shape_mismatch", K::Value, "mm", {"[4, 3]", "[5, 2]"},
          [](const Watch&) { mm(f32({4, 3}), f32({5, 2})); }),
      err("mm_not_2d", K::Value, "mm", {"1-D"}, [](const Watch&) { mm(f32({4}), f32({4, 2})); }),
      err("bmm_batch_mismatch", K::Value, "bmm", {"[2, 3, 4]", "[3, 4, 5]"},
          [](const Watch&) { bmm(f32({2, 3, 4}), f32({3, 4, 5})); }),
      err("matmul_shape_mismatch", K::Value, "matmul", {"[2, 3, 4]", "[2, 5, 6]"},
          [](const Watch&) { matmul(f32({2, 3, 4}), f32({2, 5, 6})); }),
      err("matmul_0d", K::Value, "matmul", {"0-D"},
          [](const Watch&) { matmul(f32({}), f32({3})); }),
      err("cat_size_mismatch", K::Value, "cat", {"dimension 0", "3", "4"},
          [](const Watch&) { cat({f32({2, 3}), f32({2, 4})}, 0); }),
      err("stack_size_mismatch", K::Value, "stack", {"[2, 3]", "[3, 2]"},
          [](const Watch&) { stack({f32({2, 3}), f32({3, 2})}); }),
      err("view_incompatible", K::Value, "view", {"[12]", "reshape"},
          [](const Watch&) { view(transpose(f32({3, 4}), 0, 1), {12}); }),
      err("reshape_bad_numel", K::Value, "reshape", {"[5, 5]", "12"},
          [](const Watch&) { reshape(f32({3, 4}), {5, 5}); }),
      err("expand_bad_size", K::Value, "expand", {"3", "4"},
          [](const Watch&) { expand(f32({3, 1}), {4, 2}); }),
      err("permute_repeated_dim", K::Value, "permute", {"[0, 0, 1]"},
          [](const Watch&) { permute(f32({2, 3, 4}), {0, 0, 1}); }),
      err("split_sizes_sum", K::Value, "split", {"[2, 2]", "5"},
          [](const Watch&) { split(f32({5, 2}), {2, 2}); }),
      err("chunk_zero", K::Value, "chunk", {"0"}, [](const Watch&) { chunk(f32({5}), 0); }),
      err("layer_norm_shape", K::Value, "layer_norm", {"[2, 3]", "[4]"},
          [](const Watch&) { layer_norm(f32({2, 3}), {4}); }),
      err("sdpa_embedding_mismatch", K::Value, "scaled_dot_product_attention", {"8", "4"},
          [](const Watch&) {
            scaled_dot_product_attention(f32({2, 3, 8}), f32({2, 3, 4}), f32({2, 3, 4}));
          }),
      err("flash_attention_embedding_mismatch", K::Value, "flash_attention", {"8", "4"},
          [](const Watch&) { flash_attention(f32({2, 3, 8}), f32({2, 3, 4}), f32({2, 3, 4})); }),
      err("flash_attention_batch_mismatch", K::Value, "flash_attention", {"[2, 3, 8]", "[3, 3, 8]"},
          [](const Watch&) { flash_attention(f32({2, 3, 8}), f32({3, 3, 8}), f32({3, 3, 8})); }),
      err("flash_attention_dtype_mismatch", K::Type, "flash_attention", {"float32", "float64"},
          [](const Watch&) {
            flash_attention(f32({3, 8}), f32({3, 8}), ones({3, 8}, kFloat64));
          }),
      err("flash_attention_int", K::Type, "flash_attention", {"int64"},
          [](const Watch&) { flash_attention(i64({3, 8}), i64({3, 8}), i64({3, 8})); }),
      err("flash_attention_no_keys", K::Value, "flash_attention", {"[0, 8]"},
          [](const Watch&) { flash_attention(f32({3, 8}), f32({0, 8}), f32({0, 8})); }),
      err("flash_attention_bad_scale", K::Value, "flash_attention", {"inf"},
          [](const Watch&) {
            flash_attention(f32({3, 8}), f32({3, 8}), f32({3, 8}), false, INFINITY);
          }),
      err("flash_attention_backward_lse_shape", K::Value, "flash_attention_backward", {"[3]", "[4]"},
          [](const Watch&) {
            flash_attention_backward(f32({3, 8}), f32({3, 8}), f32({3, 8}), f32({3, 8}),
                                     f32({3, 8}), f32({4}));
          }),
      err("flash_attention_backward_lse_dtype", K::Type, "flash_attention_backward", {"float32", "float64"},
          [](const Watch&) {
            flash_attention_backward(f32({3, 8}), f32({3, 8}), f32({3, 8}), f32({3, 8}),
                                     f32({3, 8}), ones({3}, kFloat64));
          }),
      err("addmm_gelu_inner_mismatch", K::Value, "addmm_gelu", {"[3, 4]", "[5, 6]"},
          [](const Watch&) { addmm_gelu(f32({6}), f32({3, 4}), f32({5, 6})); }),
      err("addmm_gelu_1d", K::Value, "addmm_gelu", {"[4]"},
          [](const Watch&) { addmm_gelu(Tensor(), f32({4}), f32({4, 6})); }),
      err("addmm_gelu_int", K::Type, "addmm_gelu", {"int64"},
          [](const Watch&) { addmm_gelu(Tensor(), i64({3, 4}), i64({4, 6})); }),
      err("addmm_gelu_bias_size", K::Value, "addmm_gelu", {"6", "[5]"},
          [](const Watch&) { addmm_gelu(f32({5}), f32({3, 4}), f32({4, 6})); }),
      err("addmm_gelu_bias_dtype", K::Type, "addmm_gelu", {"float32", "float64"},
          [](const Watch&) { addmm_gelu(ones({6}, kFloat64), f32({3, 4}), f32({4, 6})); }),
      err("linear_gelu_weight_mismatch", K::Value, "linear_gelu", {"4", "[6, 5]"},
          [](const Watch&) { linear_gelu(f32({3, 4}), f32({6, 5})); }),
      err("linear_gelu_bias_size", K::Value, "linear_gelu", {"6", "[5]"},
          [](const Watch&) { linear_gelu(f32({3, 4}), f32({6, 4}), f32({5})); }),
      err("foreach_length_mismatch", K::Value, "foreach_add_", {"2", "3"},
          [](const Watch& watch) {
            TensorList a{f32({2}), f32({3})};
            for (const Tensor& t : a) watch(t);
            foreach_add_(a, {f32({2}), f32({3}), f32({4})});
          }),
      err("foreach_shape_mismatch", K::Value, "foreach_mul_list_", {"[3]", "[2]"},
          [](const Watch& watch) {
            TensorList a{f32({2}), f32({3})};
            for (const Tensor& t : a) watch(t);
            foreach_mul_(a, {f32({2}), f32({2})});
          }),
      // foreach_adamw_: everything is checked before any parameter, moment or step is written.
      err("adamw_lr_not_a_0d_float64", K::Type, "foreach_adamw_", {"lr", "[] float32"},
          [](const Watch& watch) {
            TensorList p{f32({2})}, g{f32({2})}, m{f32({2})}, v{f32({2})},
                s{zeros({}, kFloat64)};
            for (const TensorList* l : {&p, &m, &v, &s}) watch((*l)[0]);
            foreach_adamw_(p, g, m, v, s, f32({}), 0.9, 0.999, 1e-8, 0.0);
          }),
      err("adamw_step_count", K::Value, "foreach_adamw_", {"1 step tensors", "2 parameters"},
          [](const Watch& watch) {
            TensorList p{f32({2}), f32({3})}, g{f32({2}), f32({3})}, m{f32({2}), f32({3})},
                v{f32({2}), f32({3})}, s{zeros({}, kFloat64)};
            for (const Tensor& t : p) watch(t);
            foreach_adamw_(p, g, m, v, s, zeros({}, kFloat64), 0.9, 0.999, 1e-8, 0.0);
          }),
      err("adamw_negative_lr", K::Value, "foreach_adamw_", {"lr", "-1"},
          [](const Watch& watch) {
            TensorList p{f32({2})}, g{f32({2})}, m{f32({2})}, v{f32({2})},
                s{zeros({}, kFloat64)};
            for (const TensorList* l : {&p, &m, &v, &s}) watch((*l)[0]);
            foreach_adamw_(p, g, m, v, s, full({}, -1.0, kFloat64), 0.9, 0.999, 1e-8, 0.0);
          }),
      err("adamw_fractional_step", K::Value, "foreach_adamw_", {"steps[0]", "1.5"},
          [](const Watch& watch) {
            TensorList p{f32({2})}, g{f32({2})}, m{f32({2})}, v{f32({2})},
                s{full({}, 1.5, kFloat64)};
            for (const TensorList* l : {&p, &m, &v, &s}) watch((*l)[0]);
            foreach_adamw_(p, g, m, v, s, zeros({}, kFloat64), 0.9, 0.999, 1e-8, 0.0);
          }),
      err("adamw_shared_step_tensor", K::Value, "foreach_adamw_", {"steps[0]", "steps[1]"},
          [](const Watch& watch) {
            Tensor step = zeros({}, kFloat64);
            TensorList p{f32({2}), f32({3})}, g{f32({2}), f32({3})}, m{f32({2}), f32({3})},
                v{f32({2}), f32({3})}, s{step, step};
            for (const Tensor& t : p) watch(t);
            watch(step);
            foreach_adamw_(p, g, m, v, s, zeros({}, kFloat64), 0.9, 0.999, 1e-8, 0.0);
          }),
      err("gelu_backward_shape", K::Value, "gelu_backward", {"[2, 3]", "[3, 2]"},
          [](const Watch&) { gelu_backward(f32({2, 3}), f32({3, 2})); }),
      err("gelu_backward_int", K::Type, "gelu_backward", {"int64"},
          [](const Watch&) { gelu_backward(i64({3}), i64({3})); }),
      err("layer_norm_backward_shape", K::Value, "layer_norm_backward", {"[2, 4]", "[2, 3]"},
          [](const Watch&) { layer_norm_backward(f32({2, 4}), f32({2, 3}), {3}); }),
      err("layer_norm_backward_normalized_shape", K::Value, "layer_norm_backward", {"[4]"},
          [](const Watch&) { layer_norm_backward(f32({2, 3}), f32({2, 3}), {4}); }),
      err("layer_norm_backward_dtype", K::Type, "layer_norm_backward", {"float64", "float32"},
          [](const Watch&) { layer_norm_backward(ones({2, 3}, kFloat64), f32({2, 3}), {3}); }),
      // ---------------------------------------------------------------- dtypes
      err("mm_dtype_mismatch", K::Type, "mm", {"float32", "float64"},
          [](const Watch&) { mm(f32({2, 3}), ones({3, 2}, kFloat64)); }),
      err("where_non_bool_condition", K::Type, "where", {"int64"},
          [](const Watch&) { where(i64({3}), f32({3}), f32({3})); }),
      err("mean_of_int", K::Type, "mean", {"int64"}, [](const Watch&) { mean(i64({3, 4})); }),
      err("var_of_int", K::Type, "var", {"int32"}, [](const Watch&) { var(ones({3}, kInt32)); }),
      err("softmax_of_int", K::Type, "softmax", {"int64"},
          [](const Watch&) { softmax(i64({3}), 0); }),
      err("sub_bool", K::Type, "sub", {"logical_xor"},
          [](const Watch&) { sub(ones({3}, kBool), ones({3}, kBool)); }),
      err("neg_bool", K::Type, "neg", {"bool"}, [](const Watch&) { neg(ones({3}, kBool)); }),
      err("add_float_alpha_on_int", K::Type, "add", {"alpha", "0.5"},
          [](const Watch&) { add(i64({3}), i64({3}), 0.5); }),
      err("embedding_float_indices", K::Type, "embedding", {"float32"},
          [](const Watch&) { embedding(f32({10, 4}), f32({3})); }),
      err("nll_loss_int32_target", K::Type, "nll_loss", {"int32"},
          [](const Watch&) { nll_loss(f32({4, 3}), zeros({4}, kInt32)); }),
      err("gather_int32_index", K::Type, "gather", {"int32"},
          [](const Watch&) { gather(f32({3, 4}), 1, zeros({3, 2}, kInt32)); }),
      err("one_hot_float", K::Type, "one_hot", {"float32"},
          [](const Watch&) { one_hot(f32({3}), 4); }),
      err("silu_int", K::Type, "silu", {"int64"}, [](const Watch&) { silu(i64({3})); }),
      // ---------------------------------------------------------------- devices
      err("add_cpu_meta", K::Device, "add", {"cpu", "meta"},
          [](const Watch&) { add(f32({2, 3}), empty({2, 3}, kFloat32, meta())); }),
      err("mm_meta_cpu", K::Device, "mm", {"cpu", "meta"},
          [](const Watch&) { mm(empty({2, 3}, kFloat32, meta()), f32({3, 2})); }),
      err("cat_cpu_meta", K::Device, "cat", {"cpu", "meta"},
          [](const Watch&) { cat({f32({2}), empty({2}, kFloat32, meta())}); }),
      err("device_bad_index", K::Device, "device", {"cuda:x"},
          [](const Watch&) { Device("cuda:x"); }),
      err("device_negative_index", K::Device, "device", {"cuda:-1"},
          [](const Watch&) { Device("cuda:-1"); }),
      err("device_unknown", K::Device, "device", {"nope"}, [](const Watch&) { Device("nope"); }),
      err("device_cpu_index", K::Device, "device", {"cpu", "1"},
          [](const Watch&) { Device("cpu:1"); }),
      err("dtype_unknown", K::Value, "dtype", {"float8"},
          [](const Watch&) { parse_dtype("float8"); }),
      err("item_of_meta", K::Device, "item", {"meta"},
          [](const Watch&) { (void)empty({}, kFloat32, meta()).item(); }),
      // ---------------------------------------------------------------- dims and indices
      err("sum_dim_out_of_range", K::Index, "sum", {"5", "[-2, 1]"},
          [](const Watch&) { sum(f32({2, 3}), {5}); }),
      err("sum_dim_repeated", K::Value, "sum", {"1", "[1, -1]"},
          [](const Watch&) { sum(f32({2, 3}), {1, -1}); }),
      err("select_index_out_of_range", K::Index, "select", {"10", "3"},
          [](const Watch&) { select(f32({3, 4}), 0, 10); }),
      err("narrow_beyond_end", K::Index, "narrow", {"2", "5", "4"},
          [](const Watch&) { narrow(f32({3, 4}), 1, 2, 5); }),
      err("index_select_bad_dim", K::Index, "index_select", {"3"},
          [](const Watch&) { index_select(f32({3, 4}), 3, idx({0})); }),
      err("index_select_index_value", K::Index, "index_select", {"9"},
          [](const Watch&) { index_select(f32({3, 4}), 0, idx({0, 9})); }),
      err("gather_index_value", K::Index, "gather", {"7"},
          [](const Watch&) { gather(f32({3, 4}), 1, from_vector<int64_t>({0, 7, 1}, {3, 1})); }),
      err("embedding_index_value", K::Index, "embedding", {"10"},
          [](const Watch&) { embedding(f32({10, 4}), idx({3, 10})); }),
      err("nll_loss_target_value", K::Index, "nll_loss", {"7"},
          [](const Watch&) { nll_loss(f32({2, 3}), idx({1, 7})); }),
      err("transpose_dim", K::Index, "transpose", {"2"},
          [](const Watch&) { transpose(f32({3, 4}), 0, 2); }),
      err("squeeze_dim", K::Index, "squeeze", {"-3"},
          [](const Watch&) { squeeze(f32({3, 1}), -3); }),
      err("softmax_dim", K::Index, "softmax", {"2"}, [](const Watch&) { softmax(f32({3, 4}), 2); }),
      err("as_strided_beyond_storage", K::Index, "as_strided", {"12"},
          [](const Watch&) { as_strided(f32({3, 4}), {4, 4}, {4, 1}); }),
      // ---------------------------------------------------------------- empty tensors
      err("amax_of_empty", K::Index, "amax", {"size 0"},
          [](const Watch&) { amax(f32({0, 3}), {0}); }),
      err("amax_all_of_empty", K::Index, "amax", {"size 0"}, [](const Watch&) { max(f32({0})); }),
      err("argmax_of_empty", K::Index, "argmax", {"empty"},
          [](const Watch&) { argmax(f32({0, 3})); }),
      err("max_dim_of_empty", K::Index, "max", {"size 0"},
          [](const Watch&) { max(f32({2, 0}), 1); }),
      err("one_hot_infer_empty", K::Value, "one_hot", {"empty"},
          [](const Watch&) { one_hot(i64({0})); }),
      // ---------------------------------------------------------------- values
      err("clamp_no_bounds", K::Value, "clamp", {"min", "max"},
          [](const Watch&) { clamp(f32({3}), std::nullopt, std::nullopt); }),
      err("arange_zero_step", K::Value, "arange", {"step"}, [](const Watch&) { arange(0, 5, 0); }),
      err("arange_wrong_sign", K::Value, "arange", {"5", "-1"},
          [](const Watch&) { arange(0, 5, -1); }),
      err("linspace_negative_steps", K::Value, "linspace", {"-1"},
          [](const Watch&) { linspace(0, 1, -1); }),
      err("randint_empty_range", K::Value, "randint", {"5", "2"},
          [](const Watch&) { randint(5, 2, {3}); }),
      err("dropout_bad_p", K::Value, "dropout", {"1.5"},
          [](const Watch&) { dropout(f32({3}), 1.5); }),
      err("var_negative_correction", K::Value, "var", {"-1"},
          [](const Watch&) { var(f32({3}), {}, -1); }),
      // ---------------------------------------------------------------- in-place and out=
      // Each checks that the target is unchanged after the failed call.
      err("add__into_expanded", K::Value, "add_", {"single memory location"},
          [](const Watch& watch) {
            Tensor base = from_vector<float>({1, 2, 3}, {1, 3});
            watch(base);
            Tensor self = expand(base, {2, 3});
            add_(self, f32({2, 3}));
          }),
      err("add__broadcast_self", K::Value, "add_", {"[3]", "[2, 3]"},
          [](const Watch& watch) {
            Tensor self = from_vector<float>({1, 2, 3});
            watch(self);
            add_(self, f32({2, 3}));
          }),
      err("add__int_self_float_other", K::Type, "add_", {"float32", "int64"},
          [](const Watch& watch) {
            Tensor self = from_vector<int64_t>({1, 2, 3});
            watch(self);
            add_(self, from_vector<float>({0.5f, 1.5f, 2.5f}));
          }),
      err("mul__bool_self_int_other", K::Type, "mul_", {"int64", "bool"},
          [](const Watch& watch) {
            Tensor self = ones({3}, kBool);
            watch(self);
            mul_(self, i64({3}));
          }),
      err("fill__float_into_int", K::Type, "fill_", {"2.5", "int32"},
          [](const Watch& watch) {
            Tensor self = ones({3}, kInt32);
            watch(self);
            self.fill_(2.5);
          }),
      err("copy__not_broadcastable", K::Value, "copy_", {"[4]", "[2, 3]"},
          [](const Watch& watch) { Tensor self = f32({2, 3}); watch(self); self.copy_(f32({4})); }),
      err("add_out_partial_overlap", K::Value, "add_out", {"single memory location"},
          [](const Watch& watch) {
            Tensor base = arange(0, 10, 1, kFloat32);
            watch(base);
            Tensor out = slice(base, 0, 2, 8);
            add_out(out, slice(base, 0, 0, 6), f32({6}));
          }),
      err("add_out_wrong_shape", K::Value, "add_out", {"[2, 2]", "[2, 3]"},
          [](const Watch& watch) {
            Tensor out = zeros({2, 2});
            watch(out);
            add_out(out, f32({2, 3}), f32({2, 3}));
          }),
      err("mul_out_float_into_int", K::Type, "mul_out", {"float32", "int64"},
          [](const Watch& watch) {
            Tensor out = zeros({3}, kInt64);
            watch(out);
            mul_out(out, f32({3}), f32({3}));
          }),
      err("mm_out_wrong_shape", K::Value, "mm_out", {"[3, 3]", "[2, 4]"},
          [](const Watch& watch) {
            Tensor out = zeros({3, 3});
            watch(out);
            mm_out(out, f32({2, 3}), f32({3, 4}));
          }),
      err("mm_out_overlaps_input", K::Value, "mm_out", {"single memory location"},
          [](const Watch& watch) {
            Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {3, 3});
            watch(a);
            Tensor out = as_strided(a, {3, 3}, {3, 1}, 0);
            mm_out(out, transpose(a, 0, 1), f32({3, 3}));
          }),
      err("sum_out_overlaps_input", K::Value, "sum_out", {"single memory location"},
          [](const Watch& watch) {
            Tensor a = arange(0, 12, 1, kFloat32).view({3, 4});
            watch(a);
            Tensor out = select(a, 0, 1);
            sum_out(out, a, {0});
          }),
      err("sum_out_wrong_dtype", K::Type, "sum_out", {"float32", "int32"},
          [](const Watch& watch) {
            Tensor out = zeros({4}, kInt32);
            watch(out);
            sum_out(out, f32({3, 4}), {0});
          }),
      err("scatter_add__index_value", K::Index, "scatter_add", {"7"},
          [](const Watch& watch) {
            Tensor self = zeros({2, 5});
            watch(self);
            scatter_add_(self, 1, from_vector<int64_t>({0, 7, 1, 2}, {2, 2}), f32({2, 2}));
          }),
      err("index_add__index_value", K::Index, "index_add", {"5"},
          [](const Watch& watch) {
            Tensor self = zeros({5, 2});
            watch(self);
            index_add_(self, 0, idx({1, 5}), f32({2, 2}));
          }),
      err("foreach_add__float_into_int", K::Type, "foreach_add_", {"float32", "int64"},
          [](const Watch& watch) {
            TensorList self{i64({2}), i64({3})};
            for (const Tensor& t : self) watch(t);
            foreach_add_(self, {i64({2}), f32({3})});
          }),
    };
}
// clang-format on

}  // namespace kiln::test
