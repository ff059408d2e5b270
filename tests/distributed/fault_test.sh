#!/usr/bin/env bash
# Runs one scenario of kiln_fault_test (fault_test.cpp) on 2 ranks and checks that every rank
# that lives ends with a clear message, that the job ends non-zero, and that it ends within the
# deadline plus a margin, never hangs. See Note [Fault tests] in fault_test.cpp.
#   tests/distributed/fault_test.sh path/to/kiln_fault_test SCENARIO
set -uo pipefail
prog=$1
scenario=$2
root=$(cd "$(dirname "$0")/../.." && pwd)

dump=$(mktemp -d)
trap 'rm -rf "$dump"' EXIT
export KILN_DIST_DUMP_DIR=$dump KILN_DIST_TIMEOUT=5
unset KILN_DIST_DEBUG KILN_MPIRUN_EXTRA
deadline_s=5
margin_s=20  # mpirun's start on an oversubscribed machine, ASan
case $scenario in
  *_detail | detail_agree) export KILN_DIST_DEBUG=detail ;;
  guard | guard_sim | setup_timeout) export KILN_DIST_TIMEOUT=60 ;;  # 5 s of a guard or group
  kill) export KILN_MPIRUN_EXTRA=--enable-recovery ;;
esac
case $scenario in  # Note [Fault scenarios on cuda tensors] in fault_test.cpp
  *_nccl_cuda*) export KILN_CUSTOM_AR=0 ;;
  *_cuda*) export KILN_CUSTOM_AR=1 ;;  # eager calls this small take NCCL in Auto
esac

# Each rank runs under a shell that reports its exit status: under --enable-recovery mpirun
# exits 0 whatever its ranks did (Open MPI 4.1).
start=$(date +%s%N)
# shellcheck disable=SC2016  # the inner shell expands $0, $@ and $?
# The job's own limit stays under ctest's TIMEOUT (tests/CMakeLists.txt), so that a hung job
# still prints what its ranks said and this script's verdict.
out=$(timeout -k 5 $((deadline_s * 8)) "$root/scripts/mpirun.sh" 2 bash -c \
  '"$0" "$@"; s=$?; echo "kiln-fault-test: rank ${OMPI_COMM_WORLD_RANK:-?} exited $s" >&2; exit $s' \
  "$prog" "$scenario" 2>&1)
rc=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
printf '%s\n' "$out"
for f in "$dump"/kiln_flight_rank*.txt; do
  [ -e "$f" ] && { echo "== $f"; cat "$f"; }
done
echo "fault_test.sh: $scenario: mpirun exited $rc after $elapsed_ms ms"

# Where the machine has no GPU for each rank, the *_cuda scenarios skip (ctest's SKIP_RETURN_CODE).
if grep -q "^kiln-fault-test: rank [01] skipped: " <<<"$out"; then
  echo "fault_test.sh: $scenario: skipped"
  exit 77
fi

failed=0
fail() {
  echo "fault_test.sh: $scenario: FAILED: $*"
  failed=1
}
has() { grep -Eq -- "$1" <<<"$out" || fail "no line matches: $1"; }
lacks() { ! grep -Eq -- "$1" <<<"$out" || fail "a line matches: $1"; }
file_has() { grep -Eq -- "$2" "$1" 2>/dev/null || fail "no line of $1 matches: $2"; }
job_failed() { [ "$rc" -ne 0 ] || fail "mpirun exited 0"; }
within_deadline() {
  [ "$elapsed_ms" -lt $(((deadline_s + margin_s) * 1000)) ] ||
    fail "took $elapsed_ms ms, over the deadline of $deadline_s s plus $margin_s s"
}
# The watchdog's message (Note [Deadlines] in mpi_comm.cpp): op, milliseconds, group rank,
# collective number, elements (and the peer where there is one).
timed_out() {  # OP RANK SEQ NUMEL
  echo "kiln: DistributedError: \[$1\] timed out after 5000 ms on group world \(rank $2 of 2\), collective $3 of its communicator, $4 float32 elements(, peer [0-9]+)?; flight recorder written to $dump/kiln_flight_rank$2.txt"
}
# NCCL's (Note [NCCL deadlines] in kiln/backend/cuda/nccl.cpp), raised again by synchronize.
nccl_timed_out() {  # RANK SEQ NUMEL
  echo "\[all_reduce_?\] timed out after 5000 ms on group world \(rank $1 of 2\), collective $2 of its NCCL communicator, $3 float32 elements on cuda:$1; its NCCL communicator was aborted \(ncclCommAbort\)"
}
# The custom all-reduce kernel's own deadline (custom_allreduce.cpp), raised by synchronize.
custom_timed_out() {  # RANK
  echo "kiln-fault-test: rank $1 raised: .*\[all_reduce\] the custom all-reduce of group world \(rank $1 of 2\) on cuda:$1 timed out waiting for a peer"
}
disagree() {  # SEQ CALLS...
  echo "raised DistributedError: \[[a-z_]+\] ranks disagree on collective $1 of group world \(KILN_DIST_DEBUG=detail\): $2"
}

case $scenario in
  ops)  # both ranks wait; whichever deadline fires first ends the job
    has "$(timed_out '(all_reduce_?|broadcast_?)' '[01]' 2 4)"
    job_failed
    within_deadline
    ;;
  ops_detail | sizes_detail | sizes_sim_detail | sizes_async_detail | sizes_cuda_detail | \
    sizes_nccl_cuda_detail)  # every rank raises at once
    seq=2  # after agree()'s collective on the same communicator
    case $scenario in
      ops_detail) calls='rank 0: all_reduce_? of 4 float32 .*; rank 1: broadcast_? of 4 float32 .*' ;;
      sizes_detail | sizes_*cuda_detail) calls='rank 0: all_reduce_? of 4 float32 .*; rank 1: all_reduce_? of 8 float32 .*' ;;
      sizes_sim_detail)  # the sim stream's first collective, raised by synchronize
        seq=1
        calls='rank 0: all_reduce_? of 4 float32 .*; rank 1: all_reduce_? of 8 float32 .*' ;;
      *) calls='rank 0: all_reduce_async of 4 float32 .*; rank 1: all_reduce_async of 8 float32 .*' ;;
    esac
    has "kiln-fault-test: rank 0 $(disagree $seq "$calls")"
    has "kiln-fault-test: rank 1 $(disagree $seq "$calls")"
    lacks 'timed out'
    job_failed
    ;;
  sizes)  # Open MPI reports truncation on one rank; the other then waits at the barrier
    for r in 0 1; do
      has "kiln-fault-test: rank $r raised DistributedError: \[all_reduce_?\] MPI_Allreduce failed on group world \(rank $r of 2\), collective 2 of its communicator, [48] float32 elements: MPI_ERR_TRUNCATE|kiln: DistributedError: \[[a-z_]+\] timed out after 5000 ms on group world \(rank $r of 2\)"
    done
    lacks 'finished'
    lacks '\[barrier\] timed out.* elements'  # a barrier moves none
    job_failed
    within_deadline
    ;;
  skip)
    has "$(timed_out 'all_reduce_?' 0 2 4)"
    f=$dump/kiln_flight_rank0.txt
    file_has "$f" '^# kiln flight recorder, rank 0'
    file_has "$f" '^all_reduce_? group world seq 1 numel 4 float32 completed'
    file_has "$f" '^all_reduce_? group world seq 2 numel 4 float32 started'
    job_failed
    within_deadline
    ;;
  skip_nccl_cuda)  # rank 0's watchdog aborts the communicator, and synchronize raises
    has "kiln: DistributedError: $(nccl_timed_out 0 2 4)"
    has "kiln-fault-test: rank 0 raised DistributedError: $(nccl_timed_out 0 2 4)"
    file_has "$dump/kiln_flight_rank0.txt" '^all_reduce_? group world seq 2 numel 4 float32'
    job_failed
    within_deadline
    ;;
  skip_cuda)  # the custom all-reduce's kernel gives up waiting
    has "$(custom_timed_out 0)"
    job_failed
    within_deadline
    ;;
  sizes_nccl_cuda)  # NCCL cannot tell: a rank may finish with a wrong sum, the other times out
    has "kiln-fault-test: rank [01] raised DistributedError: \[all_reduce_?\] timed out after 5000 ms on group world"
    for r in 0 1; do
      has "kiln-fault-test: rank $r (raised DistributedError: $(nccl_timed_out $r 2 '[48]')|finished)"
    done
    job_failed
    within_deadline
    ;;
  skip_async)
    has "$(timed_out 'all_reduce_?' 0 2 4)"
    file_has "$dump/kiln_flight_rank0.txt" '^all_reduce_? group world seq 2 numel 4 float32 started'
    job_failed
    within_deadline
    ;;
  throw)
    has 'kiln-fault-test: rank 1 raised: \[fault_test\] rank 1 failed mid-step'
    has "$(timed_out 'all_reduce_?' 0 2 4)"
    job_failed
    within_deadline
    ;;
  throw_first)  # rank 0 waits while setting up the group's CPU backend or its communicator
    has 'kiln-fault-test: rank 1 raised: \[fault_test\] rank 1 failed before its first collective'
    has 'kiln: DistributedError: \[distributed\] MPI_(Comm_dup|Allgather) timed out after 5000 ms on rank 0 of 2'
    job_failed
    within_deadline
    ;;
  throw_uncaught)  # std::terminate: the launcher ends the job, no deadline needed
    has "what\(\): +\[fault_test\] rank 1 failed mid-step"
    lacks 'timed out'
    job_failed
    within_deadline
    ;;
  kill)
    has 'kiln-fault-test: rank 1 kills itself'
    has "$(timed_out 'all_reduce_?' 0 2 4)"
    has 'kiln-fault-test: rank 0 exited [1-9]'
    within_deadline
    ;;
  guard)
    has "$(timed_out 'all_reduce_?' 0 2 4)"
    job_failed
    within_deadline
    ;;
  guard_sim)
    has "$(timed_out 'broadcast_?' 0 2 4)"
    job_failed
    within_deadline
    ;;
  setup_timeout)
    has 'kiln: DistributedError: \[distributed\] MPI_Comm_dup timed out after 5000 ms on rank 0 of 2'
    job_failed
    within_deadline
    ;;
  detail_agree | exit_in_flight)  # no fault: both ranks finish and exit cleanly
    has 'kiln-fault-test: rank 0 finished'
    has 'kiln-fault-test: rank 1 finished'
    has 'kiln-fault-test: rank 0 exited 0'
    has 'kiln-fault-test: rank 1 exited 0'
    [ "$scenario" = detail_agree ] || has 'kiln-fault-test: rank [01] ran its queued all-reduce: 3$'
    [ "$scenario" = detail_agree ] || [ "$(grep -c 'ran its queued all-reduce: 3$' <<<"$out")" -eq 2 ] ||
      fail "not both ranks ran their queued all-reduce"
    lacks 'timed out|raised|signal|Segmentation'
    [ "$rc" -eq 0 ] || fail "mpirun exited $rc"
    ;;
  *)
    fail "no such scenario"
    ;;
esac
[ "$failed" -eq 0 ] && echo "fault_test.sh: $scenario: passed"
exit "$failed"
