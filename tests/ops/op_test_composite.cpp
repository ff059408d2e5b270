// The composite samples: gradchecks and error samples that belong to no single op's record
// (Note [The op record] in op_test.cpp), run by op_test.cpp with the records' own. Keep this
// table short: a sample of one op, or of a wrapper that lowers to one op, goes to that op's
// record. What remains, and why:
//  - scaled_dot_product_attention: a chain of softmax, bmm, where, tril and add, no op of its
//    own (its op-table rows check it against ATen's composite).
//  - a view of a view, and in-place ops on views of a non-leaf: autograd's rewriting of the
//    base's history (CopySlices) across several view and in-place ops.
//  - matmul's errors: matmul picks mm or bmm after checking its arguments under its own name.
//  - errors of what is not an op: parsing a device or a dtype, item() on the meta device.
#include "tests/ops/op_test_util.h"

namespace kiln::test {
namespace {

Device meta() { return Device("meta"); }

GradSample view_grad(const std::string& name, std::vector<std::string> ops, Dims shape,
                     std::function<Tensor(const Tensor&)> f) {
  return {name, std::move(ops), [shape](GradGen& d) { return TensorList{d.var(shape)}; },
          [f](const TensorList& x) { return TensorList{f(x[0])}; }};
}

}  // namespace

GradSamples composite_grads() {
  GradSamples cs;
  auto one = [](Dims s) { return [s](GradGen& d) { return TensorList{d.var(s)}; }; };
  auto qkv = [](GradGen& d) {
    return TensorList{d.var({2, 3, 2}), d.var({2, 4, 2}), d.var({2, 4, 2})};
  };
  cs.push_back({"sdpa", {"softmax", "bmm"}, qkv, [](const TensorList& x) {
                  return TensorList{scaled_dot_product_attention(x[0], x[1], x[2])};
                }});
  cs.push_back({"sdpa_causal",
                {"softmax", "bmm", "where", "tril"},
                [](GradGen& d) {
                  return TensorList{d.var({2, 3, 2}), d.var({2, 3, 2}), d.var({2, 3, 2})};
                },
                [](const TensorList& x) {
                  return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], {}, true)};
                }});
  cs.push_back(
      {"sdpa_bool_mask",
       {"softmax", "bmm", "where"},
       [](GradGen& d) {
         TensorList x = {d.var({2, 3, 2}), d.var({2, 4, 2}), d.var({2, 4, 2})};
         // Every query keeps at least one key (column 0).
         x.push_back(grad_values({1, 0, 1, 1, 1, 1, 0, 0, 1, 0, 0, 1}, {3, 4}, false).to(kBool));
         return x;
       },
       [](const TensorList& x) {
         return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], x[3])};
       }});
  cs.push_back(
      {"sdpa_float_mask_grad",
       {"softmax", "bmm", "add"},
       [](GradGen& d) {
         return TensorList{d.var({1, 3, 2}), d.var({1, 4, 2}), d.var({1, 4, 2}), d.var({3, 4})};
       },
       [](const TensorList& x) {
         return TensorList{scaled_dot_product_attention(x[0], x[1], x[2], x[3], false, 0.7)};
       }});
  cs.push_back(view_grad(
      "view_of_view", {"transpose", "slice", "select"}, {3, 4, 2},
      [](const Tensor& x) { return select(slice(transpose(x, 0, 1), 0, 1, 4, 2), 2, 1); }));
  // In-place ops on views of a non-leaf: the base's history is rewritten (CopySlices).
  auto base_and = [](Dims b, Dims o) {
    return [b, o](GradGen& d) { return TensorList{d.var(b), d.var(o)}; };
  };
  cs.push_back({"inplace_mul_on_slice",
                {"mul_", "slice"},
                base_and({4, 3}, {2, 3}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = slice(b, 0, 1, 3);
                  mul_(v, x[1]);
                  return TensorList{b};
                }});
  cs.push_back({"inplace_add_on_select_alpha",
                {"add_", "select"},
                base_and({3, 4}, {4}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = select(b, 0, 1);
                  add_(v, x[1], 2);
                  return TensorList{b * b};
                }});
  cs.push_back({"inplace_on_strided_slice_then_view_used",
                {"mul_", "slice"},
                base_and({5, 2}, {2}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = slice(b, 0, 0, 5, 2);
                  mul_(v, x[1]);
                  return TensorList{b, v * 3.0};
                }});
  cs.push_back({"inplace_on_view_of_view",
                {"exp_", "transpose", "select"},
                one({3, 4}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = select(transpose(b, 0, 1), 0, 2);
                  exp_(v);
                  return TensorList{b};
                }});
  cs.push_back({"inplace_on_base_then_old_view",
                {"mul_", "slice"},
                base_and({4, 2}, {4, 2}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor v = slice(b, 0, 1, 3);  // taken before the in-place op on b
                  mul_(b, x[1]);
                  return TensorList{v * v};
                }});
  cs.push_back({"inplace_on_one_view_other_view_read",
                {"mul_", "transpose", "select"},
                base_and({3, 3}, {3}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  Tensor row = select(b, 0, 0);
                  Tensor col = select(transpose(b, 0, 1), 0, 0);  // shares b[0][0] with row
                  mul_(row, x[1]);
                  return TensorList{col * 2.0, b};
                }});
  cs.push_back({"inplace_chain_on_nonleaf",
                {"mul_", "add_", "sigmoid_"},
                base_and({2, 3}, {3}),
                [](const TensorList& x) {
                  Tensor b = nonleaf(x[0]);
                  mul_(b, x[1]);
                  add_(b, x[1], -1);
                  ops::op_sigmoid_(b);
                  return TensorList{b};
                }});
  return cs;
}

// One sample per line; clang-format would put every argument of a sample on its own line.
// clang-format off
std::vector<ErrorCase> composite_errors() {
  return {
      {"matmul_shape_mismatch", K::Value, "matmul", {"[2, 3, 4]", "[2, 5, 6]"},
       [](const Watch&) { matmul(f32({2, 3, 4}), f32({2, 5, 6})); }},
      {"matmul_0d", K::Value, "matmul", {"0-D"}, [](const Watch&) { matmul(f32({}), f32({3})); }},
      {"sdpa_embedding_mismatch", K::Value, "scaled_dot_product_attention", {"8", "4"},
       [](const Watch&) {
         scaled_dot_product_attention(f32({2, 3, 8}), f32({2, 3, 4}), f32({2, 3, 4}));
       }},
      {"device_bad_index", K::Device, "device", {"cuda:x"}, [](const Watch&) { Device("cuda:x"); }},
      {"device_negative_index", K::Device, "device", {"cuda:-1"},
       [](const Watch&) { Device("cuda:-1"); }},
      {"device_unknown", K::Device, "device", {"nope"}, [](const Watch&) { Device("nope"); }},
      {"device_cpu_index", K::Device, "device", {"cpu", "1"},
       [](const Watch&) { Device("cpu:1"); }},
      {"dtype_unknown", K::Value, "dtype", {"float8"}, [](const Watch&) { parse_dtype("float8"); }},
      {"item_of_meta", K::Device, "item", {"meta"},
       [](const Watch&) { (void)empty({}, kFloat32, meta()).item(); }},
  };
}
// clang-format on

}  // namespace kiln::test
