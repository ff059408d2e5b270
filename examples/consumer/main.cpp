// Builds against the installed Kiln package: find_package(Kiln CONFIG) -> Kiln::kiln. Also
// loads the installed sim plugin (libkiln_sim.so beside libkiln) and compiles a step on it.
#include "kiln/kiln.h"

int main() {
  kiln::Tensor x = kiln::ones({2, 2});
  kiln::Tensor y = kiln::matmul(x, x);
  fmt::print("{}\n", y);
  if (kiln::sum(y).item<double>() != 8.0) return 1;

  kiln::load_backend("sim");
  kiln::Device sim("sim");
  kiln::CompiledFunction f =
      kiln::compile([](const kiln::Tensor& t) { return kiln::matmul(t, t); });
  kiln::Tensor s;
  for (int i = 0; i < 3; ++i) s = f({x.to(sim)})[0];  // the third call replays a device graph
  fmt::print("{} (device graphs: {})\n", s, f.entries().at(0).device_graphs);
  return kiln::sum(s).item<double>() == 8.0 && f.entries().at(0).device_graphs ? 0 : 1;
}
