#!/usr/bin/env bash
# `troupe memory`: the bytes per rank by kind that `troupe train` with the same config and
# flags takes, printed before anything is allocated. Checked against the formulas of
# docs/engine.md written out here (a GPT-2's parameters, AdamW's two moments, ZeRO 2's
# partition on 2 ranks, bf16's copies and wire), against the engine's own start-up line for
# the same flags (troupe train), for a GPT-2 of the XL shape predicted in a few MiB of resident
# memory (nothing of its 6 GB allocated), and the budget table's verdicts and exit status; bad
# flags and budgets exit 2 naming the flag.
source "$(dirname "$0")/common.sh"

# bytes KIND FILE: the exact figure `troupe memory` printed for KIND
bytes() { sed -n "s/^  $1 .*(\([0-9]*\) bytes)\$/\1/p" "$2"; }

# A GPT-2 of the tiny flags (common.sh: context 16, channels 16, 1 layer, 2 heads, vocab 256):
# N = Vp C + maxT C + 12 C^2 + 13 C + 2 C = 4096 + 256 + 3280 + 32.
N=7664
"$troupe" memory "${tiny[@]}" --steps 3 --budget 1GiB > tiny.txt 2> tiny.err ||
    { cat tiny.txt tiny.err; fail "troupe memory on the tiny model"; }
grep -q "gpt2 of $N parameters, micro-batch 4 x 16 positions, 1 rank(s)" tiny.txt ||
    { cat tiny.txt; fail "the header line"; }
[ "$(bytes parameters tiny.txt)" -eq $((4 * N)) ] || fail "parameters: expected 4N"
[ "$(bytes 'gradients (the backward.s)' tiny.txt)" -eq $((4 * N)) ] || fail "gradients: 4N"
[ "$(bytes 'optimizer states' tiny.txt)" -eq $((8 * N)) ] || fail "AdamW's moments: 8N"
sum=0
for k in parameters 'gradients (the backward.s)' 'gradients (reduced partition)' \
    'optimizer states' 'swap buffers' 'communication buffers' batches \
    'bf16 weight copies' activations; do
    v=$(bytes "$k" tiny.txt)
    [ -n "$v" ] || fail "no line for $k"
    sum=$((sum + v))
done
[ "$(bytes total tiny.txt)" -eq "$sum" ] || fail "the total is not the kinds' sum"
grep -q '^0     none .* yes  <- the config$' tiny.txt || { cat tiny.txt; fail "the config's row"; }

# ZeRO 2 on 2 ranks with bf16: rank 0's partition S = ceil(N / 4) 2; bf16 copies 2N; the
# backward's window min(N, b + Lmax) = N for the default bucket, and the tied wte (Vp C = 4096)
# on top; communication: the 16-bit wire's copy and MPI's of the window in flight, 2N each
cat > z2.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "zero_optimization": { "stage": 2 }, "bf16": { "enabled": true } }
JSON
S=$(( (N + 3) / 4 * 2 ))
"$troupe" memory --deepspeed_config z2.json --context 16 --channels 16 --layers 1 --heads 2 \
    --world-size 2 --budget 1GiB > z2.txt
[ "$(bytes 'optimizer states' z2.txt)" -eq $((8 * S)) ] || { cat z2.txt; fail "ZeRO 2: 8S"; }
[ "$(bytes 'gradients (reduced partition)' z2.txt)" -eq $((4 * S)) ] || fail "ZeRO 2: 4S"
[ "$(bytes 'gradients (the backward.s)' z2.txt)" -eq $((4 * (N + 4096))) ] || fail "ZeRO 2: the window"
[ "$(bytes 'bf16 weight copies' z2.txt)" -eq $((2 * N)) ] || fail "bf16 copies: 2N"
[ "$(bytes 'communication buffers' z2.txt)" -eq $((4 * N)) ] || fail "bf16 wire and MPI's: 4N"
# stage 3 and offload_param: what this build does, said
sed 's/"stage": 2 }/"stage": 3, "offload_param": { "device": "cpu" } }/' z2.json > z3.json
"$troupe" memory --deepspeed_config z3.json --context 16 --channels 16 --layers 1 --heads 2 \
    --world-size 2 --budget 1GiB > z3.txt 2> z3.err || { cat z3.txt z3.err; fail "stage 3"; }
grep -q 'offload_param cpu: the partition lives in its own host buffer' z3.txt ||
    fail "no offload_param note"
grep -q '^3     none+p:cpu .* yes  <- the config$' z3.txt || { cat z3.txt; fail "the stage-3 row"; }
grep -q '^3     nvme+p:nvme ' z3.txt || { cat z3.txt; fail "no row with both on NVMe"; }

# the engine's own start-up line for the same flags, kind by kind (MiB, one decimal)
cat > mid.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } }, "bf16": { "enabled": true },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
mid=(--deepspeed_config mid.json --train-data "$tmp/train.bin" --context 32 --channels 64
     --layers 2 --heads 2 --val-batches 1)
"$troupe" memory "${mid[@]}" --steps 1 > mid.txt
"$troupe" train "${mid[@]}" --steps 1 > train.txt 2> train.err ||
    { cat train.err; fail "troupe train on the mid model"; }
line=$(grep 'engine: memory on rank 0 of 1' train.err) || { cat train.err; fail "no memory line"; }
grep -q 'differs from its prediction' train.err && { cat train.err; fail "the engine disagrees"; }
mib() { awk -v b="$(bytes "$1" mid.txt)" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
for pair in "parameters:parameters" "gradients:gradients (the backward.s)" \
    "optimizer states:optimizer states" "bf16 weight copies:bf16 weight copies" \
    "activations:activations" "batches:batches"; do
    engine_kind=${pair%%:*}
    echo "$line" | grep -q "$engine_kind $(mib "${pair#*:}")" ||
        { echo "$line"; cat mid.txt; fail "$engine_kind: the engine's figure is not troupe memory's"; }
done
echo "$line" | grep -q "total $(mib total)" || { echo "$line"; fail "total differs"; }

# GPT-2 XL (1.56 B parameters, 6 GB each for weights and gradients): predicted in a few MiB
/usr/bin/time -f 'maxrss_kb: %M' "$troupe" memory --deepspeed_config z2.json --vocab 50257 \
    --context 1024 --channels 1600 --layers 48 --heads 25 --world-size 2 --budget 4GiB \
    > xl.txt 2> xl.err && fail "GPT-2 XL at ZeRO 2 fits 4 GiB per rank?"
grep -q 'gpt2 of 1557686400 parameters' xl.txt || { cat xl.txt xl.err; fail "GPT-2 XL's parameters"; }
[ "$(bytes parameters xl.txt)" -eq $((4 * 1557686400)) ] || fail "XL: parameters"
rss=$(sed -n 's/^maxrss_kb: //p' xl.err)
[ "$rss" -lt 65536 ] || fail "troupe memory took $rss KiB predicting GPT-2 XL: it allocated"

# the budget: the config's row and the exit status
"$troupe" memory "${tiny[@]}" --budget 1KiB > small.txt && fail "1 KiB fits?"
grep -q '^0     none .* no  <- the config$' small.txt || { cat small.txt; fail "no 'no' row"; }
"$troupe" memory "${tiny[@]}" --budget=2.5GB > /dev/null || fail "--budget=2.5GB"
"$troupe" memory "${tiny[@]}" > machine.txt || fail "the machine's budget"
grep -q "this machine's available memory" machine.txt || fail "no machine budget line"
"$troupe" memory --deepspeed_config "$cfg" --model mlp --widths 8,32,3 --budget 1MiB > mlp.txt ||
    fail "mlp"
grep -q "mlp of $((8 * 32 + 32 + 32 * 3 + 3)) parameters" mlp.txt || { cat mlp.txt; fail "mlp's N"; }

# bad flags and budgets
expect_cmd 2 "troupe memory: --budget '4XB': expected a positive size such as 512MiB" memory "${tiny[@]}" --budget 4XB
expect_cmd 2 "troupe memory: --budget '0': expected a positive size" memory "${tiny[@]}" --budget 0
expect_cmd 2 "troupe memory: --budget '-1GiB'" memory "${tiny[@]}" --budget -1GiB
expect_cmd 2 "troupe memory: --budget: expected a value after it" memory "${tiny[@]}" --budget
expect_cmd 2 "troupe memory: --world-size: expected an integer from 1" memory "${tiny[@]}" --world-size 0
expect_cmd 2 "troupe memory: unknown flag '--bogus' (see troupe memory --help)" memory "${tiny[@]}" --bogus
expect_cmd 2 "troupe memory: --deepspeed_config FILE is required" memory --model mlp
expect_cmd 2 "troupe memory: --seq-len 99: longer than the model's context (16)" memory "${tiny[@]}" --seq-len 99
expect_cmd 2 "troupe memory: --vocab: expected an integer" memory "${tiny[@]}" --vocab x
expect_cmd 2 "channels 16 is not a multiple of num_heads 3" memory "${tiny[@]}" --heads 3
expect_cmd 2 "troupe memory: --widths: only for --model mlp" memory "${tiny[@]}" --widths 4,2
expect_cmd 2 "nope.json" memory --deepspeed_config nope.json
"$troupe" memory --help | grep -q '^usage: troupe memory' || fail "--help"
"$troupe" help | grep -q '^  memory ' || fail "troupe help lists no memory command"
echo "$line"
echo "troupe memory: kinds as the formulas and the engine say, XL predicted in $rss KiB, errors named"
