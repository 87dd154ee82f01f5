#!/usr/bin/env bash
# `troupe train` with pipeline.stages > 1, and with activation checkpointing (without stages:
# the same losses, fewer activations): each step's gradient_accumulation_steps micro-batches
# run through stage actors (1F1B or zb) and the step that follows is the unpipelined one: the
# printed losses and validation loss equal a run without stages within 1e-5 relative (the tied
# wte's gradient is summed in another order); rank 0 names each stage's layers and
# parameters; DeepSpeed's PipelineEngine line comes at steps_per_print; a config the pipeline
# cannot run is refused before the first step, naming the key.
source "$(dirname "$0")/common.sh"

run() { # NAME PIPELINE_JSON: the step and val lines, without the throughput
    local name=$1 c=$tmp/$1.json
    cat > "$c" <<JSON
{ "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "steps_per_print": 5,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } }, $2
  "troupe": { "runtime": { "workers": 2 } } }
JSON
    "$troupe" train "${tiny[@]}" --deepspeed_config "$c" --layers 3 --steps 5 --print-every 1 \
        > "$name.txt" 2> "$name.err" || { cat "$name.err"; fail "troupe train ($name)"; }
    grep -E '^(step [0-9]|val:)' "$name.txt" | sed 's/ [0-9]* tok\/s.*//' > "$name"
}

run plain ''
run s2 '"pipeline": { "stages": 2 },'
run s3zb '"pipeline": { "stages": 3, "schedule": "zb", "partition": "uniform" },'
run s5 '"pipeline": { "stages": 5, "partition": "type:block|head|embed" },'
run ckpt '"pipeline": { "activation_checkpoint_interval": 1 },'
run timers '"pipeline": { "stages": 2 }, "wall_clock_breakdown": true,'
run s2ckpt '"pipeline": { "stages": 2, "activation_checkpoint_interval": 1 },'
[ "$(wc -l < plain)" -eq 6 ] || { cat plain; fail "expected 5 steps and a val line"; }
# same_within A B: the same lines, numbers equal within 1e-5 relative (the tied wte's
# gradient is summed in another order, and the kernels' threads split work differently when
# stages run at once: the last printed digit may move)
same_within() {
    [ "$(wc -l < "$1")" -eq "$(wc -l < "$2")" ] || return 1
    paste -d '\n' "$1" "$2" | awk '
        NR % 2 == 1 { n = split($0, a, /[ \/]+/); next }
        { m = split($0, b, /[ \/]+/); if (m != n) exit 1
          for (i = 1; i <= n; i++) {
              if (a[i] == b[i]) continue
              if (a[i] !~ /^-?[0-9.]+$/ || b[i] !~ /^-?[0-9.]+$/) exit 1
              d = a[i] - b[i]; if (d < 0) d = -d
              r = a[i] < 0 ? -a[i] : a[i]
              if (d > 1e-5 * r + 1e-6) exit 1 } }'
}
for p in s2 s3zb s5 ckpt timers s2ckpt; do
    same_within plain "$p" ||
        { diff plain "$p"; fail "pipelined ($p) printed other losses than the unpipelined run"; }
done
grep -q "pipeline: stage 0 of 2 (1f1b, partition parameters): layers 0 to" s2.err ||
    { cat s2.err; fail "no stage line"; }
grep -q "pipeline: stage 2 of 3 (zb, partition uniform): layers 4 to 4 (head .. head)" s3zb.err ||
    { cat s3zb.err; fail "no zb stage line"; }
grep -q "activation checkpointing every 1 layers: activations .* MiB instead of .* the backward runs the forward of 4 of 5 layers again" ckpt.err ||
    { cat ckpt.err; fail "no activation checkpointing line"; }
grep -Eq "^steps: 5 loss: [0-9.]+ iter time \(s\): [0-9.]+ samples/sec: [0-9.]+$" s2.txt ||
    { cat s2.txt; fail "no PipelineEngine line at steps_per_print"; }
! grep -q "^steps: " plain.txt || fail "the PipelineEngine line without a pipeline"
grep -Eq "time \(ms\) \| pipe_send_output: [0-9.]+ \| pipe_send_grad: [0-9.]+ \| pipe_recv_input: [0-9.]+ \| pipe_recv_grad: [0-9.]+$" timers.txt ||
    { cat timers.txt; fail "no pipeline timers with wall_clock_breakdown"; }
# every timer of a tiny model's step is milliseconds, not garbage
awk -F'[:|]' '/time \(ms\)/ { for (i = 3; i <= NF; i += 2) if ($i + 0 > 10000) bad = 1 }
              END { exit bad }' timers.txt || { cat timers.txt; fail "a timer is absurd"; }

bad() { # PATTERN PIPELINE_JSON [ZERO]
    cat > "$tmp/bad.json" <<JSON
{ "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } }, $2
  "zero_optimization": { "stage": ${3:-0} } }
JSON
    expect_exit 2 "$1" "${tiny[@]}" --deepspeed_config "$tmp/bad.json" --steps 1
}
bad 'pipeline.stages 9: the model has 3 layers' '"pipeline": { "stages": 9 },'
bad 'pipeline.schedule: expected "1f1b" or "zb", got "gpipe"' '"pipeline": { "stages": 2, "schedule": "gpipe" },'
bad 'ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism' '"pipeline": { "stages": 2 },' 2
bad "pipeline.partition: 'profile': expected" '"pipeline": { "stages": 2, "partition": "profile" },'
echo "ok: pipelined troupe train (2 stages 1f1b, 3 zb, 5 by type) prints the unpipelined losses"
