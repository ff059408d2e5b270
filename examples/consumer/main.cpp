// Builds against the installed Kiln package: find_package(Kiln CONFIG) -> Kiln::kiln.
#include "kiln/kiln.h"

int main() {
  kiln::Tensor x = kiln::ones({2, 2});
  kiln::Tensor y = kiln::matmul(x, x);
  fmt::print("{}\n", y);
  return kiln::sum(y).item<double>() == 8.0 ? 0 : 1;
}
