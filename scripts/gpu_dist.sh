#!/usr/bin/env bash
# Issue 18's run on one machine of N GPUs (the device tool's nvidia-h200-x2 or -x4), one stage
# per call so that each fits the device tool's 10 minutes; both sides of every ratio run in the
# same stage. Logs and JSON land in $OUT_DIR (default build/gpu-dist-out).
#   bash scripts/gpu_dist.sh N build        # Kiln's CUDA tests and benchmarks, every core
#                                           # (KILN_GPU_ORACLE=1: the op table test too)
#   bash scripts/gpu_dist.sh N tests        # the NCCL and custom all-reduce tests, a rank a GPU,
#                                           # and the fault scenarios on cuda tensors (2 ranks)
#   bash scripts/gpu_dist.sh N single       # scripts/gpu.sh's single-GPU tests (no workloads)
#   bash scripts/gpu_dist.sh N collectives  # Kiln's sweep against PyTorch's, 8 B to 1 GiB
#   bash scripts/gpu_dist.sh N custom       # the custom all-reduce against NCCL, 8 B to 8 MiB
#                                           # and at DDP gpt's bucket sizes (Kiln only)
#   bash scripts/gpu_dist.sh N gpt W        # the GPT step W (gpt_large_ddp, gpt_large_tp,
#                                           # gpt_large_fsdp, gpt_ddp), Kiln's and PyTorch's
#   bash scripts/gpu_dist.sh N ddp_variants W  # Kiln's DDP step W (gpt_ddp, gpt_large_ddp) at N
#                                           # ranks without its all-reduces (--no-sync: what
#                                           # they cost), with 4 and 2 MiB buckets, with no
#                                           # eager model before it (--compiled-only), with
#                                           # steps back to back, on NCCL or the custom path only
#   bash scripts/gpu_dist.sh N probe        # the device probe (tools/kiln/device_probe.cpp) of
#                                           # Kiln's gpt_ddp around all-reduces, then around
#                                           # eager DDP steps, and PyTorch's around all-reduces
#   bash scripts/gpu_dist.sh N timeline W   # Kiln's step W at 1 and N ranks and at N under
#                                           # --no-sync, every node of its device graphs timed
#                                           # (Note [Graph timelines]): a folder of TSV files each
#   bash scripts/gpu_dist.sh N anchor       # torch_dist_anchor.py from ANCHORS (default
#                                           # ../shared/anchors; the device tool copies only
#                                           # the tree: copy it to build/anchors and carry that)
# The gpt stage runs each workload at 1 rank and at N (DDP's scaling efficiency is tokens/s a
# GPU at N over that at 1). NVLink multicast stays off in every process (NCCL_NVLS_ENABLE=0).
set -uo pipefail
cd "$(dirname "$0")/.."
n=$1
stage=$2
out=${OUT_DIR:-build/gpu-dist-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
torchrun=(python3 -m torch.distributed.run --standalone)

case $stage in
  build)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
    python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' \
      | tee -a "$out/gpu.txt"
    grep -h "define NCCL_M" /usr/include/nccl.h | tee -a "$out/gpu.txt"
    mapfile -t oracle < <(scripts/torch_cmake_flags.sh)
    cmake --preset release -DKILN_BUILD_BENCH=ON -DKILN_BUILD_TESTS=ON -DKILN_WERROR=OFF \
      "${oracle[@]}" > "$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
    targets=(kiln_cli kiln_collectives_bench kiln_nccl_gpt_bench kiln_cuda_nccl_test
             kiln_cuda_custom_allreduce_test kiln_fault_test kiln_cuda_test kiln_cuda_bench)
    [ "${oracle[0]}" = -DKILN_ORACLE_TESTS=ON ] && targets+=(kiln_op_test)
    cmake --build --preset release -j "$(nproc)" --target "${targets[@]}" \
      > "$out/build.log" 2>&1 || { grep -B2 -A12 -m3 error "$out/build.log"; exit 1; }
    echo "built"
    ;;
  tests)
    for t in kiln_cuda_nccl_test kiln_cuda_custom_allreduce_test; do
      timeout 300 scripts/mpirun.sh "$n" "build/release/tests/$t" > "$out/$t.log" 2>&1
      echo "$t on $n ranks: exit $?"
      grep -E '^\[  (FAILED|PASSED) ' "$out/$t.log" | head -5
    done
    # Note [Fault scenarios on cuda tensors] in tests/distributed/fault_test.cpp (2 ranks).
    timeout 300 ctest --preset release -R 'kiln_fault_test\..*cuda' --output-on-failure \
      > "$out/fault_cuda.log" 2>&1
    echo "fault scenarios on cuda: exit $?"
    grep -E 'Test +#|tests passed' "$out/fault_cuda.log"
    ;;
  single)  # kiln_cuda_test and, when built, the op table on CUDA (rank 0's GPU)
    KILN_GPU_QUICK=1 KILN_GPU_NO_BENCH=1 bash scripts/gpu.sh "$out/single"
    ;;
  collectives)
    timeout 280 scripts/mpirun.sh "$n" build/release/bench/kiln_collectives_bench --device cuda \
      --json "$out/kiln_collectives_$n.json" > "$out/kiln_collectives_$n.log" 2>&1
    echo "kiln_collectives_bench: exit $?"
    timeout 280 "${torchrun[@]}" --nproc_per_node="$n" bench/torch_collectives.py \
      --json "$out/torch_collectives_$n.json" > "$out/torch_collectives_$n.log" 2>&1
    echo "torch_collectives.py: exit $?"
    ;;
  custom)  # the custom all-reduce against NCCL only, plus DDP gpt's last bucket, unpadded
           # (3,060,481 floats: its flags made it odd) and padded (Note [Bucket padding]);
           # both are past the custom path's 8 MiB, so both of their rows time NCCL
    timeout 280 scripts/mpirun.sh "$n" build/release/bench/kiln_collectives_bench --device cuda \
      --custom-only --extra-bytes 12241924,12242432 > "$out/kiln_custom_$n.log" 2>&1
    echo "kiln_collectives_bench --custom-only: exit $?"
    cat "$out/kiln_custom_$n.log"
    ;;
  gpt)
    for w in ${3:?which workload: gpt_large_ddp, gpt_large_tp, gpt_large_fsdp or gpt_ddp}; do
      model=${w%_*} mode=${w##*_}
      for ranks in 1 "$n"; do
        timeout 150 scripts/mpirun.sh "$ranks" build/release/kiln bench "$w" --device cuda \
          --amp bf16 --json > "$out/kiln_${w}_$ranks.json" 2> "$out/kiln_${w}_$ranks.err"
        echo "kiln $w $ranks: exit $? $(tr -d '\n' < "$out/kiln_${w}_$ranks.json" | head -c 400)"
        timeout 240 "${torchrun[@]}" --nproc_per_node="$ranks" bench/torch_gpt_dist.py \
          --mode "$mode" --model "$model" --json "$out/torch_${w}_$ranks.json" \
          > "$out/torch_${w}_$ranks.log" 2>&1
        echo "torch $w $ranks: exit $?"
      done
    done
    ;;
  ddp_variants)
    w=${3:?which workload: gpt_ddp or gpt_large_ddp}
    # A variant's NAME=VALUE words go to the environment, the rest to `kiln bench`. The last
    # pairs: eager steps before the compiled one or not, with every all-reduce on NCCL, then on
    # the custom path (bench/gpu_runs.md U1-U7: the order costs gpt_ddp 12%).
    # VARIANTS (variants separated by ';') replaces the list; `--probe` lines are shown.
    variants=("" "--no-sync" "--bucket-mb 4" "--bucket-mb 2" "--compiled-only"
              "--compiled-only --no-sync" "--pipelined" "--compiled-only --pipelined"
              "KILN_CUSTOM_AR=0" "KILN_CUSTOM_AR=0 --compiled-only"
              "KILN_CUSTOM_AR=1 KILN_CUSTOM_AR_MAX_BYTES=16777216"
              "KILN_CUSTOM_AR=1 KILN_CUSTOM_AR_MAX_BYTES=16777216 --compiled-only")
    [ -n "${VARIANTS:-}" ] && IFS=';' read -ra variants <<< "$VARIANTS"
    for v in "${variants[@]}"; do
      SECONDS=0
      envs=() args=()
      for word in $v; do
        if [[ $word == *=* ]]; then envs+=("$word"); else args+=("$word"); fi
      done
      env "${envs[@]}" timeout 150 scripts/mpirun.sh "$n" build/release/kiln bench "$w" \
        --device cuda --amp bf16 --json "${args[@]}" > "$out/variant.json" 2> "$out/variant.err"
      echo "kiln $w $n ${v:-(defaults)}: exit $? $(tr -d '\n' < "$out/variant.json" |
        grep -o '"[a-z0-9_]*graph_tokens_per_s": [0-9.]*') (${SECONDS} s)"
      grep '^probe ' "$out/variant.err"
    done
    ;;
  probe)  # rank 0's lines; Note [The device probe] says how to read them
    for args in "--compiled-only --probe-allreduces 4" ""; do
      # shellcheck disable=SC2086  # the arguments split on purpose
      timeout 150 scripts/mpirun.sh "$n" build/release/kiln bench gpt_ddp --device cuda \
        --amp bf16 --json --probe $args > "$out/probe.json" 2> "$out/probe.err"
      echo "kiln gpt_ddp $n --probe ${args}: exit $? $(tr -d '\n' < "$out/probe.json" |
        grep -o '"[a-z0-9_]*graph_tokens_per_s": [0-9.]*')"
      grep '^probe rank 0 ' "$out/probe.err"
    done
    timeout 150 "${torchrun[@]}" --nproc_per_node="$n" bench/torch_device_probe.py \
      > "$out/torch_probe.log" 2>&1
    echo "torch_device_probe.py: exit $?"
    grep '^torch probe rank 0 ' "$out/torch_probe.log"
    ;;
  timeline)
    w=${3:?which workload: gpt_ddp or gpt_large_ddp}
    for run in "1:" "$n:" "$n:--no-sync"; do
      ranks=${run%%:*} args=${run#*:}
      dir="$out/timeline_${w}_$ranks${args:+_nosync}"
      # shellcheck disable=SC2086  # the arguments split on purpose
      KILN_GRAPH_TIMELINE=$dir timeout 150 scripts/mpirun.sh "$ranks" build/release/kiln bench \
        "$w" --device cuda --amp bf16 --json $args > "$dir.json" 2> "$dir.err"
      echo "kiln $w $ranks ${args:-(defaults)}, nodes timed: exit $? $(tr -d '\n' < "$dir.json" |
        grep -o '"[a-z0-9_]*graph_tokens_per_s": [0-9.]*')"
    done
    ;;
  anchor)
    KILN_ANCHOR_CUDA=1 timeout 280 "${torchrun[@]}" --nproc_per_node="$n" \
      "${ANCHORS:-../shared/anchors}/torch_dist_anchor.py" > "$out/torch_dist_anchor_$n.log" 2>&1
    echo "torch_dist_anchor.py: exit $?"
    ;;
  *)
    echo "gpu_dist.sh: unknown stage '$stage' (build, tests, single, collectives, custom, gpt," \
      "ddp_variants, probe, timeline, anchor)" >&2
    exit 2
    ;;
esac
