// Where an eager CUDA op's time goes: the launch floor (an empty kernel), allocation, and Kiln's
// ops on 4096 floats, each timed on the host with the device synchronised at the end of each
// repeat; and causal attention at gpt_large's and gpt's sizes, the fused kernels against the
// math path (forward, and forward + backward); and a linear layer with GELU, fused by cuBLASLt's
// epilogue or not. Exits 0 with a note when no CUDA device is present
// (CI).
// `--json FILE` writes them; `--attention16` runs only the 16-bit attention rows (to compare
// kernel variants quickly on a GPU machine).
#include <cstring>
#include <fstream>
#include <string>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/timing.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/backend/backend.h"
#include "kiln/backend/cuda/cuda.h"
#include "kiln/core/stream.h"
#include "kiln/ops/ops.h"

using namespace kiln;

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  bool only_attention16 = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--attention16") == 0) {
      only_attention16 = true;
    } else {
      fmt::print(stderr, "kiln_cuda_bench: unknown argument '{}' (--json FILE, --attention16)\n",
                 argv[i]);
      return 2;
    }
  }
  try {
    load_backend("cuda");
  } catch (const Error& e) {
    fmt::print("kiln_cuda_bench: skipped: {}\n", e.what());
    return 0;
  }
  Device gpu("cuda:0");
  Tensor x = randn({4096}).to(gpu), y = randn({4096}).to(gpu), out = empty({4096}, kFloat32, gpu);
  auto timed = [&](auto&& fn) {
    double s = bench::median_seconds_per_call(
        [&] {
          for (int i = 0; i < 100; ++i) fn();
          synchronize(gpu);
        },
        20, 5, 3);
    return s / 100 * 1e6;
  };
  // Microseconds per call of a longer-running fn, run `reps` times per repeat.
  auto timed_long = [&](int reps, auto&& fn) {
    double sec = bench::median_seconds_per_call(
        [&] {
          for (int i = 0; i < reps; ++i) fn();
          synchronize(gpu);
        },
        3, 3, 1);
    return sec / reps * 1e6;
  };
  nlohmann::ordered_json j;
  if (!only_attention16) {
    j["empty_launch_us"] = cuda::empty_launch_us(0);
    j["empty_driver_launch_us"] = cuda::empty_driver_launch_us(0);
    j["empty_graph_node_us"] = cuda::empty_graph_node_us(0);
    j["alloc_free_4096_us"] = timed([&] { empty({4096}, kFloat32, gpu); });
    j["mul_scalar_us"] = timed([&] { mul(x, 1.0001); });
    j["mul_out_us"] = timed([&] { mul_out(out, x, y); });
    j["add_us"] = timed([&] { add(x, y); });
    j["relu_us"] = timed([&] { relu(x); });
    j["sum_us"] = timed([&] { sum(x); });
    {  // the same on a stream of Kiln's own (non-blocking) instead of CUDA's legacy stream
      Stream side = Stream::create(gpu);
      StreamGuard g(side);
      j["empty_launch_side_stream_us"] = cuda::empty_launch_us(0);
      j["mul_scalar_side_stream_us"] = timed([&] { mul(x, 1.0001); });
    }
    // Causal attention at gpt_large's size (batch 8, 12 heads, 1024 tokens) and gpt's (4 heads,
    // 128 tokens), head dim 64, TF32: the fused kernels (atomic and deterministic backward)
    // against the math path, forward and forward + backward.
    set_allow_tf32(true);
    for (auto [name, heads, t] : {std::tuple{"large", 12, 1024}, std::tuple{"gpt", 4, 128}}) {
      Generator g(1);
      auto input = [&] { return randn({8, heads, t, 64}, &g).to(gpu).requires_grad_(); };
      Tensor q = input(), k = input(), v = input();
      Tensor grad = randn({8, heads, t, 64}, &g).to(gpu);
      int reps = t >= 1024 ? 5 : 50;
      auto attention_us = [&](auto&& fn) { return timed_long(reps, fn); };
      Tensor keep = tril(ones({t, t}, kBool, gpu));
      auto math = [&] {  // what scaled_dot_product_attention runs without the fused kernels
        Tensor sc = mul(matmul(q, transpose(k, -2, -1)), 0.125);
        return matmul(softmax(where(keep, sc, -INFINITY), -1), v);
      };
      auto train = [&] {
        sum(mul(scaled_dot_product_attention(q, k, v, {}, true), grad)).backward();
      };
      std::string p = fmt::format("attention_{}_", name);
      j[p + "fused_forward_us"] =
          attention_us([&] { flash_attention(q.detach(), k.detach(), v.detach(), true); });
      j[p + "fused_train_us"] = attention_us(train);
      set_deterministic_algorithms(true);
      j[p + "fused_deterministic_train_us"] = attention_us(train);
      set_deterministic_algorithms(false);
      j[p + "math_forward_us"] = attention_us([&] {
        autograd::NoGradGuard ng;
        math();
      });
      j[p + "math_train_us"] = attention_us([&] { sum(mul(math(), grad)).backward(); });
    }
  }
  // Causal attention at gpt_large's size in bfloat16 and float16 (issue 16's target: PyTorch's
  // fused attention, 48 us forward and 254 us forward + backward in bfloat16 on the H100), on
  // cuDNN's fused attention and on Kiln's kernels (Note [cuDNN fused attention]); 50 calls a
  // timing, as ../shared/anchors/torch_sdpa_anchor.py times PyTorch's.
  for (bool cudnn : {true, false}) {
    cuda::set_cudnn_attention(cudnn);
    for (DType t : {kBFloat16, kFloat16}) {
      Generator g(3);
      auto input = [&] { return randn({8, 12, 1024, 64}, &g).to(t).to(gpu).requires_grad_(); };
      Tensor q = input(), k = input(), v = input();
      Tensor grad = randn({8, 12, 1024, 64}, &g).to(t).to(gpu);
      std::string p = fmt::format("attention_large_{}_{}", name(t), cudnn ? "cudnn_" : "");
      j[p + "fused_forward_us"] =
          timed_long(50, [&] { flash_attention(q.detach(), k.detach(), v.detach(), true); });
      j[p + "fused_train_us"] = timed_long(
          50, [&] { sum(mul(scaled_dot_product_attention(q, k, v, {}, true), grad)).backward(); });
      auto [o, lse] = flash_attention(q.detach(), k.detach(), v.detach(), true);
      j[p + "fused_backward_us"] = timed_long(50, [&] {
        flash_attention_backward(grad, q.detach(), k.detach(), v.detach(), o, lse, true);
      });
    }
  }
  cuda::set_cudnn_attention(true);
  j["cudnn_attention_runs"] = cuda::cudnn_attention_runs();
  if (!only_attention16) {
    // Note [GELU epilogue] at gpt_large's MLP size ([8192, 768] @ [768, 3072] + bias): one
    // cuBLASLt product with the GELU epilogue against the product with bias, then gelu (tanh), in
    // the dtypes that take the epilogue (float32 measured no faster with it: gpu_runs.md F3-F4).
    for (DType t : {kBFloat16, kFloat16}) {
      Generator g(2);
      auto input = [&](IntArrayRef sizes) { return randn(sizes, &g).to(t).to(gpu); };
      Tensor xin = input({8192, 768}), w = input({3072, 768}), b = input({3072});
      autograd::NoGradGuard ng;
      std::string p = fmt::format("linear_gelu_{}_", name(t));
      j[p + "fused_us"] = timed_long(20, [&] { linear_gelu(xin, w, b); });
      j[p + "unfused_us"] = timed_long(20, [&] { gelu(linear(xin, w, b), true); });
    }
  }
  set_allow_tf32(false);
  for (auto& [k, v] : j.items()) fmt::print("  {:<48} {:10.3f}\n", k, v.get<double>());
  if (json_path) std::ofstream(json_path) << j.dump(1) << "\n";
  return 0;
}
