// Kiln's demo: tensors, views, broadcasting, reductions, matmul, the meta device, errors, and a
// least-squares fit by gradient descent written with plain ops.
#include <cstdio>

#include "kiln/kiln.h"

int main() {
  using namespace kiln;
  manual_seed(0);

  Tensor a = arange(6, kFloat32).view({2, 3});
  Tensor b = from_vector<float>({10, 20, 30});
  fmt::print("a =\n{}\n", a);
  fmt::print("a + b (broadcast) =\n{}\n", a + b);
  fmt::print("a.T (a view) =\n{}\n", transpose(a, 0, 1));
  fmt::print("sum over dim 1 = {}\n", sum(a, {1}));
  fmt::print("softmax(a, -1) =\n{}\n", softmax(a, -1));
  fmt::print("int tensor / 2 = {}\n", arange(4) / 2);

  // Shapes without data: the meta device runs every op's meta function and allocates nothing.
  Tensor big = empty({4096, 4096}, kFloat32, Device("meta"));
  Tensor y = sum(matmul(big, transpose(big, 0, 1)), {0});
  fmt::print("meta: matmul(4096x4096, its transpose).sum(0) has shape [{}]\n",
             fmt::join(y.sizes(), ", "));

  // Errors name the op and the values, and nothing is written.
  try {
    mm(ones({4, 3}), ones({5, 2}));
  } catch (const Error& e) {
    fmt::print("error, as expected: {}\n", e.what());
  }

  // Fit w in y = X w by gradient descent on the mean squared error.
  Tensor w_true = from_vector<float>({2.0f, -3.0f, 0.5f}, {3, 1});
  Tensor X = randn({256, 3});
  Tensor Y = matmul(X, w_true) + 0.01 * randn({256, 1});
  Tensor w = zeros({3, 1});
  for (int step = 0; step <= 200; ++step) {
    Tensor err = matmul(X, w) - Y;                                // [256, 1]
    Tensor grad = matmul(transpose(X, 0, 1), err) * (2.0 / 256);  // [3, 1]
    sub_(w, grad, 0.1);
    if (step % 50 == 0)
      fmt::print("step {:3d}  loss {:.6f}\n", step, mean(err * err).item<double>());
  }
  fmt::print("learned w = {}\ntrue    w = {}\n", w.view({3}), w_true.view({3}));
  bool ok = allclose(w, w_true, 0, 0.01);
  fmt::print("fit: {}\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
