// kiln::set_flush_denormal: the CPU's flush-to-zero and denormals-are-zero modes.
//
// Note [Flushing denormals]
// The modes are bits of MXCSR, the SSE/AVX control register, which is per thread: bit 15
// (flush to zero: a result below the smallest normal float becomes 0) and bit 6 (denormals are
// zero: such an input is read as 0). PyTorch's torch.set_flush_denormal sets them on the
// calling thread only, which its OpenMP workers see only if they start afterwards (a new thread
// copies its creator's floating-point environment). Kiln sets them on the calling thread and
// on every thread of an OpenMP team as large as any this process has asked for
// (largest_thread_team): OpenMP keeps such a team's threads idle in its pool and reuses them
// for later teams, so every thread the CPU kernels can run on has the mode, and a team enlarged
// beyond that later starts new threads from the caller, which inherit it.
// Threads Kiln does not run kernels on keep their own mode: OpenBLAS's pthread pool (made when
// the library loads; no OpenBLAS call sets it, and small products run on the caller anyway),
// a data loader's thread and the user's threads (each may call set_flush_denormal itself).
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
