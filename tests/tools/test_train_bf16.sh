#!/usr/bin/env bash
# `troupe train` with "bf16": {"enabled": true}: the losses track the fp32 run's (within 2% at
# every step and at validation) without being equal to them (the bf16 products really ran);
# on a CPU without AVX512-BF16 one warning says the products are emulated; a bf16 run saved at
# step 4 and resumed to step 8 prints what the straight bf16 run prints; the llm.c export of a
# bf16 run holds the fp32 master weights (its size is the fp32 file's, and it loads back).
source "$(dirname "$0")/common.sh"

bf16=$tmp/bf16.json
sed 's/"gradient_accumulation_steps": 1,/"gradient_accumulation_steps": 1, "bf16": { "enabled": true },/' \
    "$cfg" > "$bf16"
grep -q '"bf16"' "$bf16" || fail "could not write the bf16 config"
loss_of() { sed -n 's/.*loss \([0-9.]*\).*/\1/p' "$1"; }

run_steps "$cfg" fp32 --steps 8 --export-llmc fp32.bin
run_steps "$bf16" bf16 --steps 8 --export-llmc bf16.bin
[ "$(wc -l < bf16)" -eq 9 ] || { cat bf16; fail "expected 8 steps and a val line"; }
paste <(loss_of fp32) <(loss_of bf16) | awk '
    { r = ($1 - $2) / $1; if (r < 0) r = -r; if (r > 0.02) bad = bad " " $1 "/" $2; if ($1 != $2) differ = 1 }
    END { if (bad) { print "bf16 losses beyond 2% of fp32:" bad; exit 1 }
          if (!differ) { print "bf16 printed exactly the fp32 losses: the bf16 path did not run"; exit 1 } }' ||
    { paste fp32 bf16; fail "bf16 does not track fp32"; }
warnings=$(grep -c 'AVX512-BF16' bf16.err || true)
if grep -q avx512_bf16 /proc/cpuinfo; then
    [ "$warnings" -eq 0 ] || { cat bf16.err; fail "a warning on a CPU with AVX512-BF16"; }
else
    [ "$warnings" -eq 1 ] || { cat bf16.err; fail "expected one warning that bf16 is emulated"; }
fi

run_steps "$bf16" half --steps 4 --save-dir ck
run_steps "$bf16" resumed --steps 8 --save-dir ck --resume
same_after_resume bf16 resumed 5 8

[ "$(stat -c %s bf16.bin)" -eq "$(stat -c %s fp32.bin)" ] || fail "the bf16 export is not fp32-sized"
cmp -s bf16.bin fp32.bin && fail "the bf16 export equals the fp32 one"
run_steps "$cfg" loaded --steps 1 --load-llmc bf16.bin
echo "ok: bf16 tracks fp32 within 2%, resumes bitwise, exports fp32"
