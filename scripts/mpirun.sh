#!/usr/bin/env bash
# Runs a program on N ranks of this machine the way the tests and benchmarks do:
#   scripts/mpirun.sh N program [args...]
# Open MPI binds each rank to one core at two ranks or fewer and refuses root without being
# told; tests oversubscribe a 2-core machine, so ranks are unbound, single-threaded, talk over
# shared memory (vader) and yield while they wait. Sanitizer options reach every rank.
set -euo pipefail
n=$1
shift
args=(-n "$n" --oversubscribe --bind-to none --mca btl self,vader --mca mpi_yield_when_idle 1
      -x OMP_NUM_THREADS=1 -x OPENBLAS_NUM_THREADS=1)
[ "$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
# LeakSanitizer needs whole stacks to match Open MPI's own leaks to scripts/lsan.supp's lines
# (see there): the fast unwinder stops in the plugins MPI_Finalize has unloaded.
[ -n "${ASAN_OPTIONS:-}" ] && export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0"
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS KILN_DIST_TIMEOUT KILN_DIST_DEBUG \
         KILN_DIST_DUMP_DIR KILN_PLUGIN_PATH; do
  [ -n "${!v:-}" ] && args+=(-x "$v")
done
exec "${MPIRUN:-mpirun}" "${args[@]}" ${KILN_MPIRUN_EXTRA:-} "$@"
