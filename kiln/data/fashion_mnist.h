#pragma once
// Fashion-MNIST (Zalando's 28x28 grey images of clothes in 10 classes) as Debian's
// dataset-fashion-mnist package installs it: four gzip-compressed IDX files.
#include <string>

#include "kiln/data/idx.h"

namespace kiln::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
// The training images' pixel mean and standard deviation, in [0, 1] (x / 255), over all
// 47,040,000 pixels: what Normalize takes.
inline constexpr double kFashionMnistMean = 0.2860406;
inline constexpr double kFashionMnistStd = 0.3530242;

struct FashionMnist {
  LabelledSet train;  // 60,000 images [60000, 28, 28] uint8, labels [60000] int64 in [0, 10)
  LabelledSet test;   // 10,000 of each
};

// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `dir` (load_labelled_idx: 28x28
// images, 10 classes). ValueError naming the package when `dir` does not exist, and the reader's
// errors for the files.
FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDir);

}  // namespace kiln::data
