#pragma once
// `kiln bench conv` and `kiln bench cnn`: issue 16's convolution workloads, Kiln side, with the
// keys of bench/torch_conv_anchor.py (PyTorch on the GPU machine); bench/conv_bench.cpp times
// the same shapes against libtorch on the CPU in one process.
#include <cstdint>
#include <string>
#include <vector>

#include "tools/kiln/workloads.h"

namespace kiln::workloads {

// A conv2d layer of ResNet-50 (v1.5) on [batch, in, size, size] images.
struct ConvShape {
  std::string name;  // the key stem: "res2_3x3" gives conv_res2_3x3_fwd_us
  int64_t in, out, size, kernel, stride, padding;
};
const std::vector<ConvShape>& resnet_conv_shapes();
// The batch the conv workload uses on `device`: 8 on the cpu, 32 elsewhere.
int64_t conv_batch(Device device);

// conv2d (bias-free, float32) of each shape: forward alone, and forward plus backward for the
// input and the weight, after checking one result against a float64 computation. Keys:
// conv_<name>_fwd_us, conv_<name>_fwdbwd_us, and conv_batch.
std::vector<Metric> conv(const Options& o);
// A train step of nn::CNN (forward, cross-entropy, backward, AdamW) on batch 64, eager and
// compiled (a captured graph where the device has them), after checking that the loss falls.
// Keys: cnn_step_us, cnn_step_compiled_us (cnn_step_graph_us on a device with graphs).
std::vector<Metric> cnn(const Options& o);

}  // namespace kiln::workloads
