// Builds against the installed Kiln::kiln_cuda (kiln/backend/cuda/cuda.h). With a GPU it loads
// the backend and runs a product there; without one it says so and exits 0.
#include "kiln/backend/cuda/cuda.h"
#include "kiln/kiln.h"

int main() {
  if (kiln::cuda::device_count() == 0) {
    fmt::print("no CUDA device: Kiln::kiln_cuda linked, nothing run\n");
    return 0;
  }
  kiln::load_backend("cuda");
  kiln::Device gpu("cuda:0");
  kiln::Tensor x = kiln::ones({2, 2}).to(gpu);
  kiln::Tensor y = kiln::matmul(x, x);
  fmt::print("{} ({} bytes allocated on cuda:0)\n", y, kiln::cuda::memory_stats(0).allocated);
  return kiln::sum(y).item<double>() == 8.0 ? 0 : 1;
}
