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

run_steps "$cfg" mem --steps 6
run_steps "$offload" nvme --steps 6
grep -q "swapper: rank 0: optimizer state in $tmp/swapdir/troupe_swap/rank0/optimizer.swp: 8 sub-groups" nvme.err ||
    { cat nvme.err; fail "no swapper line"; }
[ "$(wc -l < mem)" -eq 7 ] || { cat mem; fail "expected 6 steps and a val line"; }
diff mem nvme || fail "offloaded training printed other losses than in memory"
[ ! -e "$tmp/swapdir/troupe_swap/rank0/optimizer.swp" ] || fail "the swap file outlived the run"

run_steps "$offload" half --steps 3 --save-dir ck
run_steps "$offload" resumed --steps 6 --save-dir ck --resume
same_after_resume nvme resumed 4 6
# SIGINT: the step ends and the save (both need the swapped state) completes before the
# swapper stops; the run exits 0 and resumes (the swapper once stopped at the signal, and the
# optimizer's next request failed the engine: exit 1, nothing saved)
interrupt_at_step3 sig --deepspeed_config "$offload"
run_steps "$offload" sigres --steps $((step + 1)) --save-dir sig --resume
grep -q "^resume: loaded sig at step $step" sigres.txt || { cat sigres.txt; fail "not resumed at $step"; }
echo "ok: offloaded training in troupe train matches in-memory training, resumes, and stops on SIGINT"
