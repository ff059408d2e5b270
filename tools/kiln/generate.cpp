// `kiln generate`: autoregressive sampling from a `kiln train` checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include <fmt/format.h>

#include "kiln/autograd/grad_mode.h"
#include "kiln/core/error.h"
#include "kiln/nn/transformer.h"
#include "kiln/ops/ops.h"
#include "tools/kiln/checkpoint.h"
#include "tools/kiln/commands.h"
#include "tools/kiln/data.h"

namespace kiln::tool {

namespace {

// Draws a token from next-token logits [vocab]: greedy at temperature 0, else a sample from
// softmax(logits / temperature) restricted to the top_k most likely tokens (0: all).
int64_t sample_token(const Tensor& logits, double temperature, int64_t top_k, Generator& gen) {
  if (temperature == 0) return argmax(logits).item<int64_t>();
  std::vector<float> probs = softmax(div(logits, temperature), -1).to_vector<float>();
  std::vector<int64_t> order(probs.size());
  std::iota(order.begin(), order.end(), 0);
  auto keep =
      static_cast<size_t>(top_k > 0 ? std::min<int64_t>(top_k, order.size()) : order.size());
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [&](int64_t a, int64_t b) { return probs[a] > probs[b]; });
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += probs[order[i]];
  double u = rand({1}, &gen, kFloat64).item<double>() * total;
  for (size_t i = 0; i < keep; ++i) {
    u -= probs[order[i]];
    if (u < 0) return order[i];
  }
  return order[keep - 1];  // u landed on the rounding error past the last kept token
}

}  // namespace

int run_generate(const GenerateOptions& o) {
  const Device device = apply_common(o.common).device;
  KILN_CHECK(o.tokens >= 0, "[generate] --tokens must be >= 0, got {}", o.tokens);
  KILN_CHECK(o.temperature >= 0 && std::isfinite(o.temperature),
             "[generate] --temperature must be >= 0, got {}", o.temperature);
  KILN_CHECK(o.top_k >= 0, "[generate] --top-k must be >= 0, got {}", o.top_k);
  Checkpoint ck = load_checkpoint(o.ckpt);
  nn::GPT model(ck.config);
  model.to(device);
  model.load_state_dict(ck.state);
  model.eval();
  autograd::NoGradGuard no_grad;

  Generator gen(o.seed);
  // An empty prompt starts from a newline, a natural beginning of text.
  std::vector<int64_t> tokens = encode_bytes(o.prompt.empty() ? "\n" : o.prompt);
  fmt::print("{}", o.prompt);
  std::fflush(stdout);
  const int64_t context = ck.config.context;
  for (int64_t i = 0; i < o.tokens; ++i) {
    auto len = std::min<int64_t>(static_cast<int64_t>(tokens.size()), context);
    std::vector<int64_t> window(tokens.end() - len, tokens.end());
    Tensor logits = model.forward(from_vector(window, {1, len}).to(device));  // [1, len, vocab]
    int64_t next =
        sample_token(select(select(logits, 0, 0), 0, len - 1), o.temperature, o.top_k, gen);
    tokens.push_back(next);
    fmt::print("{}", decode_bytes({next}));
  }
  fmt::print("\n");
  return 0;
}

}  // namespace kiln::tool
