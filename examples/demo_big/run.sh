#!/usr/bin/env bash
# `make demo-big`: trains a GPT-2 of the GPT-2 XL shape (48 layers, 1600 channels, 25 heads,
# vocabulary 50257: 1.56 B parameters) from scratch for a few steps on 2 ranks of this
# machine, bf16, ZeRO 3 with offload_param and offload_optimizer on NVMe
# (examples/demo_big/ds_config.json), so each rank's RAM holds only its working window while
# the whole training state (~25 GB) lives in swap files. A bench-style demo, not a test.
#
#   examples/demo_big/run.sh BUILD_DIR [--shape xl|small] [--steps N] [--seq-len T] [--dir DIR]
#
# --shape small: the same run on a GPT-2 of 4 layers, 512 channels, 8 heads (vocabulary 50257:
#   38.9 M parameters), under a minute: a check of the harness on a machine too small for xl.
# --steps N (1-100, default 5), --seq-len T (default 128): positions per sequence; micro-batch 1.
# --dir DIR: where the swap folder is made (default BUILD_DIR/demo-big): a fresh folder
#   DIR/swap.XXXXXX is the config's nvme_path; it must be on a disk, not in RAM (tmpfs).
#
# Before anything runs it refuses, saying why, when mpirun or /usr/bin/time is missing, when
# DIR is in RAM, when `troupe memory` predicts that a rank does not fit this machine's memory,
# or when the disk has less free space than the swap files can take (an upper bound computed
# from the parameter count: 16 bytes per parameter of optimizer state, AdamW's two fp32
# moments plus room for the fp32 master weights and the gradient partition, and 4 bytes per
# parameter for the parameters' own swap, plus 1 GiB).
#
# It prints, in `name: value unit` lines:
#   - per rank, the predicted memory (the engine's start-up line: tr_engine_memory_predict,
#     which `troupe memory` prints before the run too) and the measured peak RSS (VmHWM, from
#     /usr/bin/time's maxrss), against the target of 4 GiB per rank;
#   - the loss of every step, the run's tokens/s (`troupe train`'s summary) and the steady
#     state's (DeepSpeed's RunningAvgSamplesPerSec, from step 3, x T);
#   - per rank, from the actor trace (`troupe trace summary --json`, every step traced, the
#     first step left out when there are more): the median step time, the swapper's I/O time
#     per step and the share of it that overlapped compute ("io hidden"), and the share of
#     the collectives hidden ("comm hidden");
#   - the disk space the swap files took at their peak (du of the swap folder, sampled every
#     second while the run lasts: the engine removes its swap files when it ends).
# The swap folder is removed at the end, also when the run fails or is interrupted (SIGINT,
# SIGTERM, SIGHUP: mpirun is stopped first). Logs, the config and the trace stay in
# BUILD_DIR/demo-big/ (console.log: every rank's output, tagged [job,rank]).
set -euo pipefail
usage="usage: run.sh BUILD_DIR [--shape xl|small] [--steps N] [--seq-len T] [--dir DIR]"
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
build=$(cd "$1" && pwd) || { echo "run.sh: $1: no such build folder ($usage)" >&2; exit 2; }
shift
here=$(cd "$(dirname "$0")" && pwd)
shape=xl steps=5 seq=128 base=""
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "run.sh: $1 needs a value ($usage)" >&2; exit 2; }
    case $1 in
        --shape) shape=$2 ;;
        --steps) steps=$2 ;;
        --seq-len) seq=$2 ;;
        --dir) base=$2 ;;
        *) echo "run.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
    esac
    shift 2
done
case $shape in
    xl) dims=(--vocab 50257 --context 1024 --channels 1600 --layers 48 --heads 25)
        what="GPT-2 XL: 48 layers, 1600 channels, 25 heads, vocabulary 50257" ;;
    small) dims=(--vocab 50257 --context 1024 --channels 512 --layers 4 --heads 8)
        what="the harness's check: 4 layers, 512 channels, 8 heads, vocabulary 50257" ;;
    *) echo "run.sh: --shape: expected xl or small, got '$shape'" >&2; exit 2 ;;
esac
[[ $steps =~ ^[1-9][0-9]*$ ]] && [ "$steps" -le 100 ] ||
    { echo "run.sh: --steps: expected an integer from 1 to 100, got '$steps'" >&2; exit 2; }
[[ $seq =~ ^[1-9][0-9]*$ ]] && [ "$seq" -le 1024 ] ||
    { echo "run.sh: --seq-len: expected an integer from 1 to 1024 (the context), got '$seq'" >&2; exit 2; }
ranks=2
troupe=$build/troupe
train_data=$build/demo-data/text_train.bin val_data=$build/demo-data/text_val.bin
logs=$build/demo-big
base=${base:-$logs}

# --- what must be there before anything runs -----------------------------------------------
[ -x "$troupe" ] && [ -f "$train_data" ] && [ -f "$val_data" ] ||
    { echo "run.sh: build first (make build): $troupe and $build/demo-data/ are needed" >&2; exit 2; }
command -v mpirun >/dev/null ||
    { echo "run.sh: mpirun not found in PATH: the demo runs $ranks ranks under MPI (Debian: apt-get install openmpi-bin)" >&2; exit 2; }
[ -x /usr/bin/time ] ||
    { echo "run.sh: /usr/bin/time not found: it measures each rank's peak RSS (Debian: apt-get install time)" >&2; exit 2; }
mkdir -p "$logs" "$base"
base=$(cd "$base" && pwd)
fs=$(stat -f -c %T "$base")
case $fs in
    tmpfs|ramfs)
        echo "run.sh: --dir $base is on $fs, which is RAM: the swap files would take the memory the demo keeps free; give a folder on a disk" >&2
        exit 2 ;;
esac
rm -rf "$logs/trace" "$logs"/maxrss.* "$logs/du.txt" "$logs/console.log" "$logs"/trace_summary.*
sed "s|\"nvme_path\": \"[^\"]*\"|\"nvme_path\": \"SWAP_DIR\"|" "$here/ds_config.json" > "$logs/ds_config.json"
model=(--model gpt2 "${dims[@]}" --seq-len "$seq")

# the prediction (rank 0, the largest partition), the parameter count, and whether it fits
set +e
"$troupe" memory --deepspeed_config "$logs/ds_config.json" "${model[@]}" --world-size $ranks \
    > "$logs/memory.txt" 2> "$logs/memory.err"
fits=$?
set -e
[ $fits -le 1 ] || { cat "$logs/memory.err" >&2; echo "run.sh: troupe memory refused the config or the flags" >&2; exit 2; }
params=$(sed -n 's/.*, gpt2 of \([0-9]*\) parameters,.*/\1/p' "$logs/memory.txt")
predicted=$(sed -n 's/^  total  *\([0-9.]* [KMG]*i*B\) .*/\1/p' "$logs/memory.txt")
[ -n "$params" ] && [ -n "$predicted" ] ||
    { cat "$logs/memory.txt" >&2; echo "run.sh: no parameter count or total in troupe memory's output" >&2; exit 2; }
if [ $fits -eq 1 ]; then
    sed -n '1,/^budget:/p' "$logs/memory.txt" >&2
    echo "run.sh: troupe memory predicts $predicted per rank, more than this machine's memory shared by $ranks ranks (above; $logs/memory.txt has every stage): not started" >&2
    exit 1
fi
need=$(awk -v n="$params" 'BEGIN { printf "%.0f", n * 20 + 1073741824 }')
free=$(df -P -B1 "$base" | awk 'NR == 2 { print $4 }')
gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }
[ "$free" -ge "$need" ] ||
    { echo "run.sh: $base has $(gib "$free") free; the swap files of $params parameters can take up to $(gib "$need") (20 bytes per parameter and 1 GiB): free some space or give --dir on another disk" >&2; exit 2; }

# --- the run ---------------------------------------------------------------------------------
swap=$(mktemp -d "$base/swap.XXXXXX")
sed -i "s|SWAP_DIR|$swap|" "$logs/ds_config.json"
mpirun_pid="" sampler_pid=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM HUP
    if [ -n "$mpirun_pid" ] && kill -0 "$mpirun_pid" 2>/dev/null; then
        echo "run.sh: stopping the run (mpirun $mpirun_pid)" >&2
        kill -TERM "$mpirun_pid" 2>/dev/null || true
        for _ in $(seq 1 20); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$mpirun_pid" 2>/dev/null || true
        wait "$mpirun_pid" 2>/dev/null || true
    fi
    [ -z "$sampler_pid" ] || { kill "$sampler_pid" 2>/dev/null || true; wait "$sampler_pid" 2>/dev/null || true; }
    rm -rf "$swap"
    if [ -e "$swap" ]; then echo "demo_big.swap_removed: NO ($swap is still there)"
    else echo "demo_big.swap_removed: yes ($swap)"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# the swap folder's disk use, every second, until the run ends
(while :; do du -s -B1 "$swap" 2>/dev/null | cut -f1; sleep 1; done) > "$logs/du.txt" &
sampler_pid=$!

cores=$(nproc)
place=(--bind-to none)
[ "$cores" -ge $ranks ] && place=(--map-by "slot:PE=$((cores / ranks))" --bind-to core)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "demo_big.shape: $shape ($what; $params parameters; micro-batch 1 x $seq positions, $ranks ranks, $steps steps)"
echo "demo_big.swap_dir: $swap ($fs, $(gib "$free") free, up to $(gib "$need") needed)"
echo "demo_big.predicted_memory_per_rank: $predicted (troupe memory, rank 0, before the run)"
start=$(date +%s)
# each rank's peak RSS into maxrss.<rank> (the MPI launcher's rank variable)
mpirun -np $ranks "${place[@]}" --tag-output \
    bash -c 'exec /usr/bin/time -f "%M" -o "$0/maxrss.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-x}}}" "$@"' "$logs" \
    "$troupe" train --deepspeed_config "$logs/ds_config.json" "${model[@]}" \
    --train-data "$train_data" --val-data "$val_data" --val-batches 1 --steps "$steps" \
    --print-every 1 --trace "$logs/trace" > "$logs/console.log" 2>&1 &
mpirun_pid=$!
set +e
wait "$mpirun_pid"
run_rc=$?
set -e
mpirun_pid=""
kill "$sampler_pid" 2>/dev/null || true
wait "$sampler_pid" 2>/dev/null || true
sampler_pid=""
echo "demo_big.wall_s: $(( $(date +%s) - start )) s (start-up, $steps steps, one validation batch)"
if [ $run_rc -ne 0 ]; then
    tail -n 40 "$logs/console.log" >&2
    echo "run.sh: the run failed (mpirun exit status $run_rc; every rank's output in $logs/console.log)" >&2
    exit 1
fi

# --- the figures -----------------------------------------------------------------------------
out=$(tr -d '\r' < "$logs/console.log") # rank 0's progress lines start with a carriage return
grep -E 'warning: engine: memory on rank .* differs' <<<"$out" | sed 's/^/demo_big.note: /' || true
for r in $(seq 0 $((ranks - 1))); do
    line=$(grep -o "engine: memory on rank $r of .*" <<<"$out" | head -1 || true)
    total=$(sed -n 's/.*; total \([0-9.]*\) MiB.*/\1/p' <<<"$line")
    echo "demo_big.rank$r.predicted_peak: ${total:-n/a} MiB (the engine's start-up line, tr_engine_memory_predict)"
    kb=$(tail -n 1 "$logs/maxrss.$r" 2>/dev/null || true)
    if [[ $kb =~ ^[0-9]+$ ]]; then
        awk -v k="$kb" -v p="${total:-0}" -v r="$r" 'BEGIN { m = k / 1024
            printf("demo_big.rank%d.peak_rss: %.0f MiB (VmHWM; target <= 4096 MiB: %s%s)\n", r, m,
                   (m <= 4096 ? "met" : "NOT met"), (p > 0 ? sprintf("; %.2fx the prediction", m / p) : "")) }'
    else
        echo "demo_big.rank$r.peak_rss: n/a (no maxrss.$r from /usr/bin/time)"
    fi
done
sed -n 's/.*<stdout>:step \([0-9]*\)\/[0-9]* | loss \([0-9.na]*\) .*/demo_big.loss.step\1: \2/p' <<<"$out"
sed -n 's/.*<stdout>:val: step \([0-9]*\) loss \([0-9.na]*\).*/demo_big.val_loss: \2 (after step \1, one batch)/p' <<<"$out"
tps=$(sed -n 's/.*<stdout>:summary: .*, \([0-9.]*\) tokens\/s, .*/\1/p' <<<"$out")
echo "demo_big.tokens_per_s: ${tps:-n/a} tokens/s (troupe train's summary, both ranks)"
sps=$(sed -n 's/.*RunningAvgSamplesPerSec=\([0-9.e+-]*\),.*/\1/p' <<<"$out" | tail -n 1)
[ -z "$sps" ] || awk -v s="$sps" -v t="$seq" 'BEGIN {
    printf "demo_big.tokens_per_s_steady: %.1f tokens/s (RunningAvgSamplesPerSec x T, from step 3)\n", s * t }'
"$troupe" trace summary "$logs/trace" --json > "$logs/trace_summary.json" 2> "$logs/trace_summary.err" &&
    python3 - "$logs/trace_summary.json" <<'PY' || echo "demo_big.io: n/a (the trace summary could not be read: $logs/trace_summary.err)"
import json, statistics, sys
for p in json.load(open(sys.argv[1]))["per_rank"]:
    steps = p["steps"][1:] if len(p["steps"]) > 1 else p["steps"]
    if not steps:
        print("demo_big.rank%d.io: n/a (no traced step)" % p["rank"])
        continue
    first, last = steps[0]["step"] + 1, steps[-1]["step"] + 1
    span = "step %d" % first if first == last else "steps %d-%d" % (first, last)
    wall = statistics.median(s["wall_ms"] for s in steps)
    def hidden(kind):
        busy = sum(s["overlap"][kind + "_busy_ms"] for s in steps)
        hid = sum(s["overlap"][kind + "_busy_ms"] * (s["overlap"][kind] or 0) for s in steps)
        return busy / len(steps), (100.0 * hid / busy if busy else float("nan"))
    io, io_hid = hidden("io")
    comm, comm_hid = hidden("comm")
    r = p["rank"]
    print("demo_big.rank%d.step_ms: %.0f ms (median, %s)" % (r, wall, span))
    print("demo_big.rank%d.io_ms_per_step: %.0f ms (the swapper's reads and writes; %.0f%% of the step)"
          % (r, io, 100.0 * io / wall if wall else 0))
    print("demo_big.rank%d.io_hidden: %.1f %% (of that I/O time, the share that overlapped compute)" % (r, io_hid))
    print("demo_big.rank%d.comm_hidden: %.1f %% (of the collectives' time: all-gathers and reduce-scatters)" % (r, comm_hid))
PY
peak=$(sort -n "$logs/du.txt" | tail -n 1)
if [ -n "$peak" ]; then
    echo "demo_big.swap_disk_peak: $(gib "$peak") ($peak bytes: du of $swap at its peak, sampled every second; the bound checked at start: $(gib "$need"))"
else
    echo "demo_big.swap_disk_peak: n/a (no sample of $swap)"
fi
echo "demo_big.logs: $logs (console.log, memory.txt, ds_config.json, trace/, trace_summary.json)"
