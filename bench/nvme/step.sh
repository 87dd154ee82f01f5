#!/usr/bin/env bash
# A GPT-2 training step with the optimizer state on NVMe against in memory, and a checkpoint
# save's stall on the training loop, blocking against background (`make bench-nvme` runs it
# after run.sh).
#
#   bench/nvme/step.sh BUILD_DIR [--dir DIR] [--steps N]
#
# The model: a byte-level GPT-2 (vocab 256, context 128, 256 channels, 6 layers, 8 heads:
# 4.8 M parameters, 38 MB of AdamW moments) on the demo's text (build/demo-data), micro-batch
# 8, one process, two runtime workers. Three runs of `troupe train`:
#   mem:  the state in memory;
#   nvme: offload_optimizer nvme under DIR, sub_group_size 500000 (10 sub-groups), 4 buffers
#     (the first 4 sub-groups are read ahead during the forward and backward, the other 6
#     during the step, behind the write-backs that free their buffers);
#   nvme10: the same with 10 buffers, every sub-group read ahead (the buffers then hold the
#     whole state: what the prefetch can hide at best);
#   both traced for 10 steps after 5; `troupe trace summary --json` gives each step's wall time
#   (median over the traced steps) and, for nvme, the swapper's I/O time and the share of it
#   that overlapped compute ("io hidden").
# The drive's bound: `troupe nvme-bench` on DIR (256 MiB, the config's aio defaults) gives read
# and write GB/s; a step moves the state once each way, so bytes/GB/s is the least I/O time a
# step can cost on this drive, and the step ratio is compared with it.
# Saves: N steps saving every 5, checkpoint.writer.decoupled true (background) and false
# (blocking); `troupe train` prints how long each save call held the training loop ("the save
# paused training X ms"); the medians are reported. A background save's cost is the copy of
# the state (parameters and moments, 57 MB here) into the checkpointer's buffers.
# Defaults: DIR = BUILD_DIR/bench-nvme-step (created and removed), N = 30.
set -euo pipefail
usage="usage: step.sh BUILD_DIR [--dir DIR] [--steps N]"
build=$(cd "${1:?$usage}" && pwd)
shift
dir="" steps=30
while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || { echo "step.sh: $1 needs a value" >&2; exit 2; }
    case $1 in
        --dir) dir=$2 ;;
        --steps) steps=$2 ;;
        *) echo "step.sh: unknown option $1 ($usage)" >&2; exit 2 ;;
    esac
    shift 2
done
[[ $steps =~ ^[1-9][0-9]*$ ]] && [ "$steps" -ge 10 ] ||
    { echo "step.sh: --steps: expected an integer >= 10, got '$steps'" >&2; exit 2; }
troupe=$build/troupe
data=$build/demo-data/text_train.bin
[ -x "$troupe" ] && [ -f "$data" ] || { echo "step.sh: build first (make build): $troupe, $data" >&2; exit 1; }
own=0
if [ -z "$dir" ]; then dir=$build/bench-nvme-step; own=1; fi
mkdir -p "$dir"
work=$(mktemp -d)
trap 'rm -rf "$work"; [ "$own" -eq 0 ] || rm -rf "$dir"' EXIT
model=(--model gpt2 --vocab 256 --context 128 --channels 256 --layers 6 --heads 8
       --train-data "$data" --val-every 0)

config() { # NAME BUFFERS(0: in memory) DECOUPLED(true|false) TRACE(0|1)
    local off="" tr=""
    [ "$2" -gt 0 ] && off=', "sub_group_size": 500000, "offload_optimizer": {"device": "nvme",
        "nvme_path": "'"$dir"'", "buffer_count": '"$2"', "pipeline_read": true, "pipeline_write": true}'
    [ "$4" -eq 1 ] && tr=', "trace": {"steps": {"wait": 5, "warmup": 0, "active": 10, "repeat": 1}}'
    cat > "$work/$1.json" <<JSON
{ "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
  "optimizer": { "type": "AdamW", "params": { "lr": 1e-3, "weight_decay": 0.01 } },
  "zero_optimization": { "stage": 0$off },
  "checkpoint": { "writer": { "decoupled": $3 } },
  "troupe": { "runtime": { "workers": 2 }$tr } }
JSON
}

median_step_ms() { # TRACE_DIR -> median wall ms of the traced steps
    "$troupe" trace summary "$1" --json | python3 -c '
import json, statistics, sys
s = json.load(sys.stdin)["per_rank"][0]["steps"]
print("%.3f" % statistics.median(x["wall_ms"] for x in s))'
}

io_figures() { # TRACE_DIR -> "busy_ms hidden_fraction" summed over the traced steps
    "$troupe" trace summary "$1" --json | python3 -c '
import json, sys
s = json.load(sys.stdin)["per_rank"][0]["steps"]
busy = sum(x["overlap"]["io_busy_ms"] for x in s)
hid = sum(x["overlap"]["io_busy_ms"] * (x["overlap"]["io"] or 0) for x in s)
print("%.3f %.4f" % (busy / len(s), hid / busy if busy else 0))'
}

for kind in mem nvme nvme10; do
    case $kind in mem) bufs=0 ;; nvme) bufs=4 ;; nvme10) bufs=10 ;; esac
    config "$kind" "$bufs" true 1
    "$troupe" train "${model[@]}" --deepspeed_config "$work/$kind.json" --steps 16 \
        --trace "$work/tr_$kind" > "$work/$kind.out" 2> "$work/$kind.err" ||
        { cat "$work/$kind.err" >&2; echo "step.sh: the $kind run failed" >&2; exit 1; }
done
mem_ms=$(median_step_ms "$work/tr_mem")
nvme_ms=$(median_step_ms "$work/tr_nvme")
read -r io_ms hidden < <(io_figures "$work/tr_nvme")
nvme10_ms=$(median_step_ms "$work/tr_nvme10")
read -r io10_ms hidden10 < <(io_figures "$work/tr_nvme10")

# the drive: read and write GB/s on DIR with the config's aio defaults
"$troupe" nvme-bench --dir "$dir" --io-size 268435456 > "$work/drive.txt"
read_gbs=$(sed -n 's/^nvme.read: \([0-9.]*\) GB.*/\1/p' "$work/drive.txt")
write_gbs=$(sed -n 's/^nvme.write: \([0-9.]*\) GB.*/\1/p' "$work/drive.txt")
[ -n "$read_gbs" ] && [ -n "$write_gbs" ] || { cat "$work/drive.txt" >&2; echo "step.sh: no GB/s from nvme-bench" >&2; exit 1; }
state_bytes=$(sed -n 's/.*optimizer state in .*: \([0-9]*\) sub-groups of \([0-9]*\) elements.*/\1 \2/p' \
    "$work/nvme.err" | awk '{print $1 * $2 * 8}')
bound_ms=$(awk -v b="$state_bytes" -v r="$read_gbs" -v w="$write_gbs" 'BEGIN{printf "%.3f", b/(r*1e6) + b/(w*1e6)}')

pauses() { # NAME DECOUPLED -> median pause ms over the run's saves
    config "$1" 0 "$2" 0
    "$troupe" train "${model[@]}" --deepspeed_config "$work/$1.json" --steps "$steps" \
        --save-every 5 --save-dir "$work/ck_$1" > "$work/$1.out" 2> "$work/$1.err" ||
        { cat "$work/$1.err" >&2; echo "step.sh: the $1 run failed" >&2; exit 1; }
    sed -n 's/.*the save paused training \([0-9.]*\) ms/\1/p' "$work/$1.out" |
        sort -n | awk '{a[NR]=$1} END{if (NR) print a[int((NR+1)/2)]; else print "nan"}'
}
blocking=$(pauses blocking false)
background=$(pauses background true)

echo "nvme.step.params: 4.8e6 (GPT-2 vocab 256, 256 channels, 6 layers; AdamW state $((state_bytes / 1000000)) MB)"
echo "nvme.step.mem_ms: $mem_ms ms"
echo "nvme.step.nvme_ms: $nvme_ms ms"
awk -v a="$nvme_ms" -v b="$mem_ms" 'BEGIN{printf "nvme.step.ratio: %.3f (offloaded over in memory)\n", a/b}'
echo "nvme.step.io_ms: $io_ms ms (swapper busy per step)"
awk -v h="$hidden" 'BEGIN{printf "nvme.step.io_hidden: %.3f (share of the swapper'"'"'s I/O time that overlapped compute)\n", h}'
echo "nvme.step10.nvme_ms: $nvme10_ms ms (buffer_count 10: every sub-group read ahead; the buffers hold the whole state)"
awk -v a="$nvme10_ms" -v b="$mem_ms" 'BEGIN{printf "nvme.step10.ratio: %.3f\n", a/b}'
echo "nvme.step10.io_ms: $io10_ms ms"
awk -v h="$hidden10" 'BEGIN{printf "nvme.step10.io_hidden: %.3f\n", h}'
echo "nvme.drive.read_gbs: $read_gbs GB/s"
echo "nvme.drive.write_gbs: $write_gbs GB/s"
echo "nvme.step.io_bound_ms: $bound_ms ms (the state read and written once at the drive's speed)"
awk -v io="$io_ms" -v b="$bound_ms" 'BEGIN{printf "nvme.step.io_vs_bound: %.3f (swapper time over the drive bound)\n", io/b}'
echo "nvme.save.blocking_pause_ms: $blocking ms"
echo "nvme.save.background_pause_ms: $background ms"
awk -v a="$background" -v b="$blocking" 'BEGIN{printf "nvme.save.pause_ratio: %.3f (background over blocking)\n", a/b}'
echo "device: $(findmnt -no SOURCE,FSTYPE -T "$dir" 2>/dev/null || echo unknown)"
