// kiln::set_flush_denormal: the CPU's flush-to-zero and denormals-are-zero modes.
//
// Note [Flushing denormals]
// The modes are bits of MXCSR, the SSE/AVX control register, which is per thread: bit 15
// (flush to zero: a result below the smallest normal float becomes 0) and bit 6 (denormals are
// zero: such an input is read as 0). PyTorch's torch.set_flush_denormal sets them on the
// calling thread only, which its OpenMP workers see only if they start afterwards (a new thread
// copies its creator's floating-point environment). Kiln sets them on the calling thread and on
// every thread of an OpenMP team as large as any this process has asked for
// (largest_thread_team): OpenMP keeps a thread's pool of workers, idle ones included, and
// reuses them for its later teams, so the caller's CPU kernels run with the mode on every
// thread, and a team enlarged beyond that later starts new workers from the caller, which
// inherit it. Other threads keep their mode: each thread that runs kernels has a pool of its
// own (call set_flush_denormal on it: a sim stream's worker, a user's thread), and OpenBLAS's
// pthread pool is made when the library loads and reached by no OpenBLAS call (a product on
// one thread runs on the caller; larger ones use that pool).
#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "kiln/backend/cpu/loops.h"
#include "kiln/ops/ops.h"

namespace kiln {

bool set_flush_denormal(bool on) {
#if defined(__x86_64__) || defined(__i386__)
  constexpr unsigned kFlushToZero = 1u << 15, kDenormalsAreZero = 1u << 6;
  constexpr unsigned kBoth = kFlushToZero | kDenormalsAreZero;
  auto apply = [on] { _mm_setcsr(on ? (_mm_getcsr() | kBoth) : (_mm_getcsr() & ~kBoth)); };
  apply();
#pragma omp parallel num_threads(cpu::largest_thread_team())
  apply();
  return true;
#else
  (void)on;
  return false;
#endif
}

}  // namespace kiln
