#!/usr/bin/env bash
# The pipeline's bubble measured with stage actors against 1F1B's theory (S-1)/(M+S-1), for
# DeepSpeed's 1F1B and Troupe's zb schedule (`make bench-pipeline`).
#
#   bench/pipeline/run.sh BUILD_DIR [--layer-cost-ms X] [--batches N]
#
# For each (S, M) in (2, 4), (4, 8), (4, 16), (8, 32): examples/pipeline/pipeline_demo runs N
# batches (default 5) of 4 synthetic layers per stage, each X ms forward (default 2) and 2X
# backward, split X + X in zb (sleeps: a stage costs no core while it "computes", so S stages
# show the schedule's shape on a two-core machine), and reports the median bubble,
# 1 - busy / (S makespan), busy being the time stages spent in compute. Then `troupe pipeline
# simulate` gives the same shapes in virtual time (unit costs: forward 1, backward 2), where
# 1F1B's bubble is theory's exactly. Prints `name: value` lines; the difference to theory is in
# points (percentage points of the step).
set -euo pipefail
usage="usage: run.sh BUILD_DIR [--layer-cost-ms X] [--batches N]"
build=$(cd "${1:?$usage}" && pwd)
shift
cost=2 batches=5
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "run.sh: $1 needs a value" >&2; exit 2; }
    case $1 in
        --layer-cost-ms) cost=$2 ;;
        --batches) batches=$2 ;;
        *) echo "run.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
    esac
    shift 2
done
demo=$build/examples/pipeline/pipeline_demo
[ -x "$demo" ] || { echo "run.sh: $demo is not built (make build)" >&2; exit 1; }
echo "pipeline.layer_cost_ms: $cost ms forward, $(awk -v c="$cost" 'BEGIN{print 2*c}') ms backward per layer, 4 layers per stage"
for sm in "2 4" "4 8" "4 16" "8 32"; do
    set -- $sm
    out=$("$demo" --stages "$1" --micro-batches "$2" --layer-cost-ms "$cost" --batches "$batches")
    for kind in 1f1b zb; do
        line=$(grep "^$kind: " <<< "$out")
        b=$(sed -n 's/.*bubble \([0-9.]*\) measured.*/\1/p' <<< "$line")
        t=$(sed -n 's/.*theory \([0-9.]*\) .*/\1/p' <<< "$line")
        ms=$(sed -n 's/.*makespan \([0-9.]*\) ms.*/\1/p' <<< "$line")
        awk -v k="$kind" -v s="$1" -v m="$2" -v b="$b" -v t="$t" -v ms="$ms" 'BEGIN{
            printf "pipeline.S%s_M%s.%s.bubble: %.3f (theory %.3f, %+.1f points; makespan %s ms)\n",
                   s, m, k, b, t, (b - t) * 100, ms }'
    done
    "$build/troupe" pipeline simulate --stages "$1" --micro-batches "$2" |
        sed -n "s/^pipeline\.\(1f1b\|zb\)\.bubble: \([0-9.]*\) (theory \([0-9.]*\))/pipeline.S$1_M$2.\1.virtual_bubble: \2 (theory \3)/p"
done

# Real layers across ranks: the byte-level GPT (192 channels, 4 blocks, context 64, 4 sequences
# per micro-batch, 8 micro-batches a step) trained by `mpirun -np 2 troupe train` with 2 stages,
# one rank (and one core) each, under 1F1B and zb alternately; each figure the median of the
# runs' tokens/s (3 runs of 12 steps). zb's backward is split on these layers (GPT-2 blocks).
if command -v mpirun > /dev/null && [ -f "$build/demo-data/text_train.bin" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    for kind in 1f1b zb; do
        cat > "$tmp/$kind.json" <<JSON
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8, "steps_per_print": 1000,
  "optimizer": { "type": "AdamW", "params": { "lr": 1e-3 } },
  "pipeline": { "stages": 2, "schedule": "$kind" }, "troupe": { "runtime": { "workers": 1 } } }
JSON
    done
    for run in 1 2 3; do
        for kind in 1f1b zb; do
            mpirun --oversubscribe -np 2 "$build/troupe" train --deepspeed_config "$tmp/$kind.json" \
                --train-data "$build/demo-data/text_train.bin" --context 64 --channels 192 \
                --layers 4 --heads 4 --steps 12 2> /dev/null |
                sed -n 's/^summary: .*, \([0-9]*\) tokens\/s.*/\1/p' >> "$tmp/$kind.tps"
        done
    done
    med() { sort -n "$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
    a=$(med "$tmp/1f1b.tps") b=$(med "$tmp/zb.tps")
    echo "pipeline.gpt_2ranks.1f1b.tokens_per_s: $a tokens/s"
    echo "pipeline.gpt_2ranks.zb.tokens_per_s: $b tokens/s"
    awk -v a="$a" -v b="$b" 'BEGIN { printf "pipeline.gpt_2ranks.zb_vs_1f1b: %.2f x\n", b / a }'
fi
