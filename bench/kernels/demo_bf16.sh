#!/usr/bin/env bash
# make demo's training twice, fp32 and bf16 mixed precision, same data, model and seed: the
# validation loss at the end of each and their ratio (issue target: the bf16 demo within 2% of
# the fp32 one). On a CPU without AVX512-BF16 the bf16 run is emulated (same numerics, slower).
#   bench/kernels/demo_bf16.sh BUILD_DIR STEPS MODEL_FLAGS...
set -euo pipefail
build=${1:?usage: demo_bf16.sh BUILD_DIR STEPS MODEL_FLAGS...}
steps=${2:?steps}
shift 2
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$src/examples/configs/demo.json" "$tmp/fp32.json"
sed 's/^{/{ "bf16": { "enabled": true },/' "$src/examples/configs/demo.json" > "$tmp/bf16.json"
# the monitors write where demo.json says: into the scratch folder instead
sed -i "s|demo-out/|$tmp/|g" "$tmp/fp32.json" "$tmp/bf16.json"
val() { # CONFIG MODEL_FLAGS...: the last validation loss, and the seconds it took
    local c=$1 t0=$SECONDS
    shift
    "$build/troupe" train --deepspeed_config "$c" "$@" --steps "$steps" --val-batches 16 \
        > "$c.out" 2> "$c.err" || { cat "$c.err" >&2; exit 1; }
    echo "$(sed -n 's/^val: step [0-9]* loss \([0-9.]*\).*/\1/p' "$c.out" | tail -1) $((SECONDS - t0))"
}
read -r fp32 fp32_s < <(val "$tmp/fp32.json" "$@")
read -r bf16 bf16_s < <(val "$tmp/bf16.json" "$@")
echo "demo_steps: $steps"
echo "demo_val_loss_fp32: $fp32 ($fp32_s s)"
echo "demo_val_loss_bf16: $bf16 ($bf16_s s)"
awk -v a="$bf16" -v b="$fp32" 'BEGIN { printf "demo_bf16_val_vs_fp32: %.4f (target: within 0.98-1.02)\n", a / b }'
