#include "kiln/data/fashion_mnist.h"

#include <filesystem>

#include "kiln/core/error.h"

namespace kiln::data {

FashionMnist load_fashion_mnist(const std::string& dir) {
  std::error_code ec;
  KILN_CHECK(std::filesystem::is_directory(dir, ec),
             "[fashion_mnist] '{}' is not a directory: Debian's dataset-fashion-mnist package "
             "installs the data set in {}",
             dir, kFashionMnistDir);
  auto load = [&](const char* split) {
    return load_labelled_idx(fmt::format("{}/{}-images-idx3-ubyte.gz", dir, split),
                             fmt::format("{}/{}-labels-idx1-ubyte.gz", dir, split), {-1, 28, 28},
                             10);
  };
  return {load("train"), load("t10k")};
}

}  // namespace kiln::data
