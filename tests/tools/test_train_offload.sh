#!/usr/bin/env bash
# `troupe train` with the optimizer state offloaded to NVMe (zero_optimization.offload_optimizer
# device "nvme"): the run prints the same steps and validation loss as in memory; the swap file
# lies under nvme_path/troupe_swap/rank0/ while it runs and is removed at its end; a run saved
# at step 3 and resumed to step 6 prints what the straight run prints for steps 4 to 6.
source "$(dirname "$0")/common.sh"

offload=$tmp/offload.json
cat > "$offload" <<JSON
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "zero_optimization": { "sub_group_size": 1000,
    "offload_optimizer": { "device": "nvme", "nvme_path": "$tmp/swapdir", "buffer_count": 3,
                           "pipeline_read": true, "pipeline_write": true } },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
run() { # CONFIG OUT ARGS...: the step and val lines, without the throughput
    local c=$1 out=$2
    shift 2
    "$troupe" train "${tiny[@]}" --deepspeed_config "$c" --print-every 1 "$@" > "$out.txt" \
        2> "$out.err" || { cat "$out.err"; fail "troupe train $c $*"; }
    grep -E '^(step|val:)' "$out.txt" | sed 's/ [0-9]* tok\/s.*//' > "$out"
}

run "$cfg" mem --steps 6
run "$offload" nvme --steps 6
grep -q "swapper: rank 0: optimizer state in $tmp/swapdir/troupe_swap/rank0/optimizer.swp: 8 sub-groups" nvme.err ||
    { cat nvme.err; fail "no swapper line"; }
[ "$(wc -l < mem)" -eq 7 ] || { cat mem; fail "expected 6 steps and a val line"; }
diff mem nvme || fail "offloaded training printed other losses than in memory"
[ ! -e "$tmp/swapdir/troupe_swap/rank0/optimizer.swp" ] || fail "the swap file outlived the run"

run "$offload" half --steps 3 --save-dir ck
run "$offload" resumed --steps 6 --save-dir ck --resume
grep '^step [456]/' nvme > want
grep '^step [456]/' resumed > got
[ "$(wc -l < got)" -eq 3 ] || { cat resumed; fail "the resumed run did not run steps 4 to 6"; }
diff want got || fail "the resumed offloaded run differs from the straight one"
diff <(grep '^val:' nvme) <(grep '^val:' resumed) || fail "val loss differs after resume"
echo "ok: offloaded training in troupe train matches in-memory training and resumes"
