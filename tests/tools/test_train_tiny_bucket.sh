#!/usr/bin/env bash
# zero_optimization.reduce_bucket_size 1 (DeepSpeed accepts >= 0) on the default GPT (834k
# parameters): the config warns and raises it to TR_CONFIG_BUCKET_MIN, and the run takes its
# steps in seconds. Issue 40: 834k one-element buckets a step, each found by a scan of the comm
# actor's pending table, did not finish 3 steps in 100 s (and SIGTERM's graceful stop timed out).
source "$(dirname "$0")/common.sh"

sed 's/"gradient_accumulation_steps": 1,/&\n  "zero_optimization": { "reduce_bucket_size": 1 },/' "$cfg" > tiny_bucket.json
grep -q '"reduce_bucket_size": 1' tiny_bucket.json || fail "the config was not written"
warning='tiny_bucket.json: zero_optimization.reduce_bucket_size: warning: 1 is below the floor of 16 elements: buckets of 16 elements are used'

expect_cmd 0 "$warning" config check tiny_bucket.json

rc=0
timeout 30 "$troupe" train --deepspeed_config tiny_bucket.json --train-data "$tmp/train.bin" \
    --steps 3 --print-every 1 > run.txt 2> run.err || rc=$?
[ "$rc" -ne 124 ] || fail "3 steps with reduce_bucket_size 1 did not finish in 30 s"
[ "$rc" -eq 0 ] || { cat run.err; fail "troupe train: exit $rc"; }
grep -qF -- "$warning" run.err || { cat run.err; fail "no warning about the bucket floor"; }
grep -q 'bucketer: 834304 gradient elements in 52144 bucket(s) of up to 16' run.err ||
    { cat run.err; fail "the buckets are not 16 elements"; }
grep -q '^step 3/3 ' run.txt || { cat run.txt; fail "no step 3"; }
echo "reduce_bucket_size 1: warned, 16-element buckets, 3 steps done"
