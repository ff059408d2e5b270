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
# KILN_MPI_PRELOAD: a library to LD_PRELOAD into every rank (not mpirun): scripts/test.sh's
# sanitizer stage passes scripts/keep_dsos.cpp's, so that Open MPI's leaks match
# scripts/lsan.supp (see there). ASan's runtime then no longer comes first, which it accepts
# when told.
if [ -n "${KILN_MPI_PRELOAD:-}" ]; then
  args+=(-x "LD_PRELOAD=$KILN_MPI_PRELOAD")
  if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:verify_asan_link_order=0"; fi
fi
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS KILN_DIST_TIMEOUT KILN_DIST_DEBUG \
         KILN_DIST_DUMP_DIR KILN_PLUGIN_PATH KILN_CUSTOM_AR KILN_CUSTOM_AR_MAX_BYTES \
         KILN_CUSTOM_AR_LL_MAX_BYTES KILN_CPU_SHM_MIN_BYTES KILN_CPU_CMA KILN_CPU_CMA_MIN_BYTES \
         KILN_CPU_CMA_CHUNK_BYTES KILN_GRAPH_TIMELINE KILN_GRAPH_TIMELINE_MATCH NCCL_NVLS_ENABLE; do
  [ -n "${!v:-}" ] && args+=(-x "$v")
done
exec "${MPIRUN:-mpirun}" "${args[@]}" ${KILN_MPIRUN_EXTRA:-} "$@"
