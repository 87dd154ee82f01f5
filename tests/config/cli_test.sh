#!/bin/sh
# `troupe config`: every example config is accepted (exit 0, batch triple printed); every
# broken config in tests/config/bad/ is rejected (exit 2) with each line of its .expect file
# among the errors; usage mistakes exit 2. Usage: cli_test.sh TROUPE SOURCE_DIR
set -u
troupe=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

cd "$src/examples/configs" || exit 1
n=0
for f in *.json; do
    n=$((n + 1))
    "$troupe" config check "$f" >"$tmp/out" 2>"$tmp/err" || { bad "$f rejected"; cat "$tmp/err"; }
    grep -q "^$f: ok: train_batch_size [0-9]* = " "$tmp/out" || bad "$f: no batch line"
    "$troupe" config show "$f" >"$tmp/show" 2>/dev/null || bad "$f: show failed"
    grep -q '// default' "$tmp/show" || bad "$f: show marks no default"
done
[ "$n" -ge 10 ] || bad "only $n example configs"

cd "$src/tests/config/bad" || exit 1
m=0
for f in *.json; do
    m=$((m + 1))
    "$troupe" config check "$f" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ "$rc" -eq 2 ] || bad "$f: exit $rc, expected 2"
    [ -f "${f%.json}.expect" ] || bad "$f: no ${f%.json}.expect"
    while IFS= read -r line; do
        grep -qxF -- "$line" "$tmp/err" || { bad "$f: missing '$line'"; cat "$tmp/err"; }
    done <"${f%.json}.expect"
done
[ "$m" -ge 20 ] || bad "only $m broken configs"

"$troupe" config --help >/dev/null || bad "--help"
"$troupe" config check >/dev/null 2>&1; [ $? -eq 2 ] || bad "no file: expected exit 2"
"$troupe" config check x.json --world-size 0 >/dev/null 2>&1; [ $? -eq 2 ] || bad "world 0"
"$troupe" config check /nonexistent.json >/dev/null 2>&1; [ $? -eq 2 ] || bad "missing file"
"$troupe" config check "$src/examples/configs/zero2_bf16_adamw_cosine.json" --world-size 8 \
    | grep -q "train_batch_size 512 = train_micro_batch_size_per_gpu 8 \* gradient_accumulation_steps 8 \* world_size 8" \
    || bad "--world-size 8 not applied"

# an evaluation-only run needs no "optimizer" section
echo '{"train_micro_batch_size_per_gpu": 4}' >"$tmp/noopt.json"
(cd "$tmp" && "$troupe" train --deepspeed_config noopt.json --steps 0 --model mlp) \
    >"$tmp/out" 2>&1 || { bad "train --steps 0 without an optimizer section"; cat "$tmp/out"; }

# docs/config.md's key reference is the generated one
sed -n '/^<!-- reference: begin -->$/,/^<!-- reference: end -->$/p' "$src/docs/config.md" \
    | sed '1d;$d' >"$tmp/doc"
"$troupe" config reference >"$tmp/ref" || bad "reference failed"
cmp -s "$tmp/doc" "$tmp/ref" || bad "docs/config.md is stale: regenerate with troupe config reference"

echo "$n examples accepted, $m broken configs rejected, $fails failures"
[ "$fails" -eq 0 ]
