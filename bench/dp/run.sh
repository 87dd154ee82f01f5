#!/usr/bin/env bash
# Data-parallel benchmarks (`make bench-dp`), everything in one run so the ratios compare
# figures taken side by side:
#  1. collectives: bench_collectives on 2 and 4 ranks, the comm actor against bare MPI;
#  2. training: `troupe train` on the kernels benchmark's GPT-2 (V=8192, T=128, C=384, L=6,
#     NH=6; bench/kernels/bench_gpt2_step.c), global batch 8 sequences split over the ranks,
#     on 1, 2 and 4 ranks x ZeRO stage 0/1/2 x overlap_comm on/off (1 rank: stage 0 only,
#     since nothing is partitioned or communicated there): tokens/s in steady state
#     (DeepSpeed's RunningAvgSamplesPerSec, which leaves out the first two steps, x T), the
#     engine's memory per rank (its start-up line), peak RSS per rank, and the fraction of
#     communication hidden behind compute (`troupe trace summary` on the last steps);
#  3. the peer: PyTorch DDP (gloo) and ZeroRedundancyOptimizer on the same model, batch and
#     ranks, fp32 and bf16 autocast (bench/peers/torch_ddp.py), each at its best thread
#     setting, then our tokens/s over theirs in the same precision (Troupe's bf16 runs: ZeRO 0
#     and 1, the stages the peer's two modes compare with).
#
#   bench/dp/run.sh BUILD_DIR [--steps N] [--ranks "1 2 4"] [--sizes 1,4,16,64] [--reps R]
#                             [--no-peer] [--long]
# --long: 30 training steps and 20 collective repetitions instead of 8 and 10.
#
# Placement: ranks get cores / ranks threads each, at least one, by the launcher's binding
# (one rank: unbound, both cores; two: one core each; four: two per core, oversubscribed);
# Troupe's compute budget follows the affinity mask (docs/threads.md) and PyTorch is given
# the same count. Bucket size: 6553600 elements (25 MiB, DDP's default bucket_cap_mb) for
# both. Runs as root in CI, hence OMPI_ALLOW_RUN_AS_ROOT.
set -euo pipefail
build=$(cd "${1:?usage: run.sh BUILD_DIR [--steps N] [--ranks LIST] [--sizes LIST] [--reps R] [--no-peer] [--long]}" && pwd)
shift
here=$(cd "$(dirname "$0")" && pwd)
steps=8 ranks="1 2 4" sizes=1,4,16,64 reps=10 peer=1
while [ $# -gt 0 ]; do
    case $1 in
        --steps) steps=$2; shift 2 ;;
        --ranks) ranks=$2; shift 2 ;;
        --sizes) sizes=$2; shift 2 ;;
        --reps) reps=$2; shift 2 ;;
        --no-peer) peer=0; shift ;;
        --long) steps=30 reps=20; shift ;;
        *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$steps" -ge 5 ] || { echo "run.sh: --steps must be 5 or more (2 warm-up steps, a trace)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d /tmp/troupe-bench-dp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)
T=128 batch=8 bucket=6553600

# mpirun with this file's placement for n ranks.
launch() {
    local n=$1
    shift
    if [ "$n" -eq 1 ]; then mpirun -np 1 --bind-to none "$@"
    elif [ "$n" -le "$cores" ]; then mpirun -np "$n" --map-by core --bind-to core "$@"
    else mpirun --oversubscribe -np "$n" --map-by core --bind-to core:overload-allowed "$@"
    fi
}
threads_per_rank() { local t=$((cores / $1)); echo $((t > 0 ? t : 1)); }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores CPUs, $(nproc --all) online"
echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "load_average_at_start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "steps: $steps (tokens/s over steps 3..$steps), collective reps: $reps"

# --- 1. collectives --------------------------------------------------------------------------
for n in $ranks; do
    [ "$n" -gt 1 ] || continue
    echo "== collectives, $n ranks"
    launch "$n" "$build/bench/dp/bench_collectives" --sizes "$sizes" --reps "$reps" \
        2> "$tmp/coll$n.err" || { cat "$tmp/coll$n.err" >&2; exit 1; }
done

# --- 2. troupe train ------------------------------------------------------------------------
# One run: n ranks, ZeRO stage, overlap_comm (true|false), precision (fp32, the default, or
# bf16). Prints its lines and records tokens/s in $tmp/tps_<prec>_<n>_<stage>_<overlap>.
train_run() {
    local n=$1 stage=$2 ov=$3 prec=${4:-fp32} cfg=$tmp/ds.json
    local tag="dp_${1}r_stage${2}_overlap_${3}$([ "$prec" = bf16 ] && echo _bf16)" wait=$((steps - 3))
    cat > "$cfg" <<JSON
{ "train_batch_size": $batch, "train_micro_batch_size_per_gpu": $((batch / n)),
  "bf16": { "enabled": $([ "$prec" = bf16 ] && echo true || echo false) },
  "gradient_accumulation_steps": 1, "steps_per_print": $steps,
  "optimizer": { "type": "AdamW", "params": { "lr": 1e-4 } },
  "zero_optimization": { "stage": $stage, "overlap_comm": $ov, "reduce_bucket_size": $bucket },
  "troupe": { "trace": { "steps": { "wait": $wait, "active": 2, "repeat": 1 } } } }
JSON
    rm -rf "$tmp/trace"
    launch "$n" /usr/bin/time -f 'maxrss_kb: %M' "$build/troupe" train --deepspeed_config "$cfg" \
        --model gpt2 --vocab 8192 --context $T --channels 384 --layers 6 --heads 6 \
        --train-data "$build/demo-data/text_train.bin" --val-batches 1 --steps "$steps" \
        --trace "$tmp/trace" > "$tmp/out" 2> "$tmp/err" ||
        { cat "$tmp/out" "$tmp/err" >&2; echo "run.sh: $tag failed" >&2; exit 1; }
    local sps tps mem rss hidden
    sps=$(sed -n 's/.*RunningAvgSamplesPerSec=\([0-9.e+-]*\),.*/\1/p' "$tmp/out" | tail -1)
    tps=$(awk -v s="$sps" -v t=$T 'BEGIN { printf "%.0f", s * t }')
    mem=$(sed -n 's/.*engine: memory on rank .*; total \([0-9.]*\) MiB.*/\1/p' "$tmp/err" | sort -n | tail -1)
    rss=$(sed -n 's/^maxrss_kb: //p' "$tmp/err" | sort -n | tail -1)
    hidden=n/a # one rank communicates nothing: its comm lane holds only local no-ops
    [ "$n" -eq 1 ] || hidden=$("$build/troupe" trace summary "$tmp/trace" --json | python3 -c '
import json, sys
r = [p["total"]["overlap"]["comm"] for p in json.load(sys.stdin)["per_rank"]]
r = [x for x in r if x is not None]
print("%.1f" % (100 * sum(r) / len(r)) if r else "n/a")')
    echo "${tag}_tokens_per_s: $tps tokens/s"
    echo "${tag}_engine_memory_per_rank: $mem MiB"
    echo "${tag}_maxrss_per_rank: $(awk -v k="$rss" 'BEGIN { printf "%.0f", k / 1024 }') MiB"
    echo "${tag}_comm_hidden: $hidden %"
    echo "$tps" > "$tmp/tps_${prec}_${n}_${stage}_${ov}"
    grep -h "warning" "$tmp/err" | sed 's|^troupe: warning: ||; s|^[^ ]*ds.json: ||' | sort -u |
        sed "s/^/${tag}_note: /" | head -3 || true
}

# --- 3. the peer -----------------------------------------------------------------------------
best_ours() { # prec n stage: the better of overlap_comm off and on
    cat "$tmp/tps_${1}_${2}_${3}_"* 2>/dev/null | sort -n | tail -1
}
if [ "$peer" -eq 1 ] && ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "peer: skipped: PyTorch is not installed for /usr/bin/python3 (make bench-dp installs" \
         "Debian's python3-torch; or scripts/install-deps.sh python3-torch)"
    peer=0
fi
core=$("$build/bench/dp/bench_collectives" --blas-info | sed -n 's/^blas_best_core: //p')
# ATen's widest kernels this CPU runs (torch 1.13: avx512 measured faster than avx2 here);
# ATEN_CPU_CAPABILITY in the environment overrides.
cap=${ATEN_CPU_CAPABILITY:-$(grep -qw avx512f /proc/cpuinfo && echo avx512 || echo avx2)}
port=29517
# The peer on n ranks at its best: each precision and mode under every thread setting a
# PyTorch user could pick (torch threads 1 or as many as the rank's cores; OpenBLAS's threads
# matched to torch's or unset), the best kept and printed, then our tokens/s over it (Troupe's
# run in the same precision).
peer_once() { # n th obt prec mode: the peer's output
    local n=$1 th=$2 obt=$3 prec=$4 mode=$5 flags fwd=(-x OPENBLAS_CORETYPE -x OMP_NUM_THREADS)
    port=$((port + 1))
    flags=(--threads "$th" --steps $((steps - 2)) --warmup 2 --batch $batch --port $port)
    [ "$prec" = bf16 ] && flags+=(--bf16)
    [ "$mode" = zero1 ] && flags+=(--zero)
    [ -n "$obt" ] && fwd+=(-x OPENBLAS_NUM_THREADS)
    ( export OPENBLAS_CORETYPE=$core OMP_NUM_THREADS=$th ATEN_CPU_CAPABILITY=$cap
      if [ -n "$obt" ]; then export OPENBLAS_NUM_THREADS=$obt; else unset OPENBLAS_NUM_THREADS; fi
      launch "$n" "${fwd[@]}" -x ATEN_CPU_CAPABILITY \
          /usr/bin/python3 "$here/../peers/torch_ddp.py" "${flags[@]}" 2> "$tmp/perr" ) ||
        { cat "$tmp/perr" >&2; echo "run.sh: torch $mode $prec on $n ranks failed" >&2; exit 1; }
}
peer_runs() {
    local n=$1 cores_each prec mode out theirs stage ours best best_out best_cfg th obt tps
    cores_each=$(threads_per_rank "$n")
    echo "== PyTorch, $n rank(s), $cores_each core(s) each, OPENBLAS_CORETYPE=$core, ATEN_CPU_CAPABILITY=$cap"
    for prec in fp32 bf16; do
        for mode in ddp zero1; do
            best=0 best_out="" best_cfg=""
            for th in $(seq 1 "$cores_each" | sed -n '1p;$p' | sort -u); do
                for obt in "$th" ""; do
                    out=$(peer_once "$n" "$th" "$obt" "$prec" "$mode")
                    tps=$(sed -n 's/^torch_.*_tokens_per_s: \([0-9.]*\).*/\1/p' <<<"$out")
                    echo "torch_${n}r_${mode}_${prec}_config: torch_threads=$th openblas_num_threads=${obt:-unset}: $tps tokens/s"
                    if awk -v a="$tps" -v b="$best" 'BEGIN { exit !(a > b) }'; then
                        best=$tps best_out=$out best_cfg="torch_threads=$th openblas_num_threads=${obt:-unset}"
                    fi
                done
            done
            echo "$best_out" | sed "s/^torch_/torch_${n}r_/"
            echo "torch_${n}r_${mode}_${prec}_best_config: $best_cfg"
            theirs=$best
            stage=$([ $mode = ddp ] || [ "$n" -eq 1 ] && echo 0 || echo 1) # 1 rank: stage 0 only
            ours=$(best_ours "$prec" "$n" "$stage")
            [ -n "$ours" ] || continue
            why="(same precision; target >= 1.5: met)"
            awk -v a="$ours" -v b="$theirs" 'BEGIN { exit !(a / b < 1.5) }' &&
                why="(same precision; target >= 1.5: NOT met)"
            [ $prec = bf16 ] && ! grep -qw avx512_bf16 /proc/cpuinfo &&
                why="(same precision; bf16 emulated on both sides: no AVX512-BF16 here)"
            echo "dp_${n}r_stage${stage}_vs_torch_${mode}_${prec}: $(awk -v a="$ours" -v b="$theirs" \
                'BEGIN { printf "%.2f", a / b }') x $why"
        done
    done
}

# Troupe, then the peer, rank count by rank count: what the machine is doing at the time
# weighs on both sides of a ratio alike.
for n in $ranks; do
    echo "== troupe train, $n rank(s), $(threads_per_rank "$n") thread(s) each"
    if [ "$n" -eq 1 ]; then
        train_run 1 0 false
        train_run 1 0 false bf16
        [ "$peer" -eq 0 ] || peer_runs 1
        continue
    fi
    for stage in 0 1 2; do
        for ov in false true; do train_run "$n" "$stage" "$ov"; done
    done
    for stage in 0 1; do # the stages the peer's DDP and ZeroRedundancyOptimizer compare with
        for ov in false true; do train_run "$n" "$stage" "$ov" bf16; done
    done
    [ "$peer" -eq 0 ] || peer_runs "$n"
done
