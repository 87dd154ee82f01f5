#!/usr/bin/env bash
# `troupe train` stopped from outside: SIGINT finishes the step, saves (--save-dir), exits 0,
# and --resume continues from that checkpoint; a crash in the middle of a save (forced with
# TR_CKPT_CRASH_AFTER=1: exit 86 right after the first checkpoint file is renamed into place)
# leaves `latest` naming the previous complete checkpoint, from which --resume works; so does
# one in a save written in the background while training goes on (--save-every).
source "$(dirname "$0")/common.sh"

latest() { tr -d '\n' < "$1/latest"; }

# --- SIGINT ------------------------------------------------------------------------------
interrupt_at_step3 "$tmp/ck"
grep -q 'SIGINT received' int_err.txt || fail "the signal was not reported"
[ "$(latest "$tmp/ck")" = "global_step$step" ] || fail "latest is not global_step$step"
"$troupe" train "${tiny[@]}" --steps $((step + 2)) --save-dir "$tmp/ck" --resume > res.txt 2>err.txt ||
    { cat err.txt; fail "--resume after SIGINT failed"; }
grep -q "^resume: loaded $tmp/ck at step $step" res.txt || { cat res.txt; fail "not resumed at $step"; }
grep -q "^summary: done at step $((step + 2))" res.txt || fail "resumed run did not reach $((step + 2))"

# --- a crash during a save ---------------------------------------------------------------
"$troupe" train "${tiny[@]}" --steps 4 --save-dir "$tmp/cr" > a.txt 2>&1 || { cat a.txt; fail "first run"; }
[ "$(latest "$tmp/cr")" = global_step4 ] || fail "latest after the first run"
rc=0
TR_CKPT_CRASH_AFTER=1 "$troupe" train "${tiny[@]}" --steps 6 --save-dir "$tmp/cr" --resume \
    > b.txt 2>&1 || rc=$?
[ "$rc" -eq 86 ] || { cat b.txt; fail "forced crash: exit $rc, expected 86"; }
[ "$(latest "$tmp/cr")" = global_step4 ] || fail "after a crash mid-save latest is '$(latest "$tmp/cr")'"
"$troupe" train "${tiny[@]}" --steps 6 --save-dir "$tmp/cr" --resume > c.txt 2>&1 ||
    { cat c.txt; fail "--resume after the crash failed"; }
grep -q "^resume: loaded $tmp/cr at step 4" c.txt || { cat c.txt; fail "not resumed from step 4"; }
[ "$(latest "$tmp/cr")" = global_step6 ] || fail "latest after the resumed run"
# --- a crash during a background save, training going on -----------------------------------
# --save-every 2: the save at step 2 is settled at step 4's save, whose first file is the 3rd
rc=0
TR_CKPT_CRASH_AFTER=3 "$troupe" train "${tiny[@]}" --steps 8 --save-every 2 --save-dir "$tmp/bg" \
    > d.txt 2>&1 || rc=$?
[ "$rc" -eq 86 ] || { cat d.txt; fail "crash during a background save: exit $rc, expected 86"; }
[ "$(latest "$tmp/bg")" = global_step2 ] ||
    fail "after a crash in a background save latest is '$(latest "$tmp/bg")'"
"$troupe" train "${tiny[@]}" --steps 6 --save-dir "$tmp/bg" --resume > e.txt 2>&1 ||
    { cat e.txt; fail "--resume after the background crash failed"; }
grep -q "^resume: loaded $tmp/bg at step 2" e.txt || { cat e.txt; fail "not resumed from step 2"; }
echo "train signals: SIGINT at step $step saved and resumed; a crash mid-save kept global_step4;"
echo "     a crash in a background save while training went on kept global_step2"
