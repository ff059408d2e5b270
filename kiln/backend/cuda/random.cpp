// CUDA kernels of the random factories (rand, randn, randint), native_dropout and the range
// factories (arange, linspace): validation as the CPU's, then the launches of random.cu.
#include "kiln/backend/cuda/random.h"

#include "kiln/backend/cuda/common.h"
#include "kiln/core/generator.h"
#include "kiln/ops/other_meta.h"

namespace kiln::cuda {
namespace {

// A factory's device with its index resolved (-1 is the type's default, 0).
Device resolved(Device device) { return device.index() < 0 ? Device(device.type(), 0) : device; }

// Runs launch(PhiloxArgs) for a draw of n values, per_block per Philox block, on device
// `index`. A caller's generator reserves the blocks now and passes (seed, offset) by value;
// without one the kernel reads the device's state and a following kernel advances its offset,
// so a captured graph draws fresh values on every replay with no host involvement.
template <class F>
void draw(const char* op, Generator* gen, int index, int64_t n, int per_block, F launch) {
  if (n == 0) return;
  // A captured graph would replay the (seed, offset) given now: the same numbers every time.
  KILN_CHECK_DEVICE(!(gen && capturing(index)),
                    "[{}] a draw from a generator of the caller's cannot be captured into a graph "
                    "(its state would be frozen at capture, cudaErrorStreamCaptureUnsupported); "
                    "draw from the device's default generator",
                    op);
  uint64_t blocks = static_cast<uint64_t>((n + per_block - 1) / per_block);
  cudaStream_t stream = current_stream(index);
  PhiloxArgs ph;
  if (gen) {
    ph.seed = gen->seed();
    ph.offset = gen->advance(blocks * 4);
  } else {
    ph.state = philox_state(index);
  }
  launch(ph, stream);
  check_launch(op);
  if (!gen) {
    advance_philox(philox_state(index), blocks, stream);
    check_launch(op);
  }
}

Tensor cuda_rand(IntArrayRef sizes, Generator* gen, DType dtype, Device device) {
  meta::factory("rand", sizes, dtype);
  KILN_CHECK_TYPE(is_floating(dtype), "[rand] expected a floating-point dtype, got {}", dtype);
  Device dev = resolved(device);
  Tensor out = empty_cuda(sizes, dtype, dev);
  draw("rand", gen, dev.index(), out.numel(), rand_per_block(dt(dtype)),
       [&](PhiloxArgs ph, cudaStream_t s) {
         launch_rand(dt(dtype), out.impl()->data(), out.numel(), ph, s);
       });
  return out;
}

Tensor cuda_randn(IntArrayRef sizes, Generator* gen, DType dtype, Device device) {
  meta::factory("randn", sizes, dtype);
  KILN_CHECK_TYPE(is_floating(dtype), "[randn] expected a floating-point dtype, got {}", dtype);
  Device dev = resolved(device);
  Tensor out = empty_cuda(sizes, dtype, dev);
  draw("randn", gen, dev.index(), out.numel(), randn_per_block(dt(dtype)),
       [&](PhiloxArgs ph, cudaStream_t s) {
         launch_randn(dt(dtype), out.impl()->data(), out.numel(), ph, s);
       });
  return out;
}

Tensor cuda_randint(int64_t low, int64_t high, IntArrayRef sizes, Generator* gen, DType dtype,
                    Device device) {
  meta::randint(low, high, sizes, dtype);
  Device dev = resolved(device);
  Tensor out = empty_cuda(sizes, dtype, dev);
  uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  draw("randint", gen, dev.index(), out.numel(), kRandintPerBlock,
       [&](PhiloxArgs ph, cudaStream_t s) {
         launch_randint(dt(dtype), out.impl()->data(), out.numel(), low, range, ph, s);
       });
  return out;
}

// (out, mask): out in x's dtype, mask bool, both contiguous with x's shape.
TensorPair cuda_dropout(const Tensor& x, double p, Generator* gen) {
  TensorSpec s = meta::native_dropout(x, p, gen);
  Tensor mask = empty_cuda(s.sizes, kBool, x.device());
  Tensor out = empty_cuda(s.sizes, s.dtype, x.device());
  Tensor cx = contiguous_as(x, x.dtype());
  draw("native_dropout", gen, x.device().index(), out.numel(), kDropoutPerBlock,
       [&](PhiloxArgs ph, cudaStream_t st) {
         launch_dropout(dt(x.dtype()), cx.impl()->data(), out.impl()->data(),
                        static_cast<bool*>(mask.impl()->data()), out.numel(), p, ph, st);
       });
  return {out, mask};
}

Tensor cuda_arange(const Scalar& start, const Scalar& end, const Scalar& step, DType dtype,
                   Device device) {
  meta::arange(start, end, step, dtype);
  int64_t n = meta::arange_length(start, end, step);
  Device dev = resolved(device);
  Tensor out = empty_cuda({n}, dtype, dev);
  if (n == 0) return out;
  launch_arange(dt(dtype), out.impl()->data(), n, start.to_double(), step.to_double(),
                start.to_int(), step.to_int(), current_stream(dev.index()));
  check_launch("arange");
  return out;
}

Tensor cuda_linspace(const Scalar& start, const Scalar& end, int64_t steps, DType dtype,
                     Device device) {
  meta::linspace(start, end, steps, dtype);
  Device dev = resolved(device);
  Tensor out = empty_cuda({steps}, dtype, dev);
  if (steps == 0) return out;
  launch_linspace(dt(dtype), out.impl()->data(), steps, start.to_double(), end.to_double(),
                  current_stream(dev.index()));
  check_launch("linspace");
  return out;
}

}  // namespace

KILN_CUDA_KERNELS(backend_kernel(ops::op_rand, &cuda_rand),
                  backend_kernel(ops::op_randn, &cuda_randn),
                  backend_kernel(ops::op_randint, &cuda_randint),
                  backend_kernel(ops::op_native_dropout, &cuda_dropout),
                  backend_kernel(ops::op_arange, &cuda_arange),
                  backend_kernel(ops::op_linspace, &cuda_linspace));

}  // namespace kiln::cuda
