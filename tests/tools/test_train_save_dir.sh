#!/usr/bin/env bash
# `troupe train`'s save dir: a new run into a folder holding checkpoints is refused (exit 2,
# saying how to continue or replace) and leaves them untouched; --overwrite replaces them at
# its first save; --keep-last N keeps the N newest tags and never the one `latest` names; the
# temporary file of a process killed during a save is removed at the next save of the folder;
# a --save-dir that cannot be created or written (/proc/ck, a read-only folder) is refused
# before the first step, naming the path and errno's text.
source "$(dirname "$0")/common.sh"

mlp=(--deepspeed_config "$cfg" --model mlp --widths 2,2)
tags() { (cd "$1" && ls -d global_step* 2>/dev/null | sort -V | tr '\n' ' '); }
latest() { tr -d '\n' < "$1/latest"; }

# --- a folder holding checkpoints ------------------------------------------------------------
"$troupe" train "${mlp[@]}" --steps 4 --save-dir ck > /dev/null 2>&1 || fail "first run"
sum=$(cat ck/global_step4/* | md5sum)
expect_exit 2 "--save-dir ck already holds checkpoints (latest names 'global_step4', 1 global_step tag); a new run would overwrite them: add --resume to continue from them, or --overwrite to replace them" \
    "${mlp[@]}" --steps 2 --save-dir ck --print-every 1
grep -q '^step' out.txt && fail "the refused run trained"
[ "$(latest ck)" = global_step4 ] && [ "$(cat ck/global_step4/* | md5sum)" = "$sum" ] ||
    fail "the refused run changed the checkpoint"
# global_step tags without a latest (a first save killed before it) count too
mkdir -p bare/global_step7
expect_exit 2 "--save-dir bare already holds checkpoints (1 global_step tag)" "${mlp[@]}" \
    --steps 2 --save-dir bare
# --overwrite: the earlier run's tags go at this run's first save
"$troupe" train "${mlp[@]}" --steps 2 --save-dir ck --overwrite > ow.txt 2>&1 ||
    { cat ow.txt; fail "--overwrite run"; }
grep -q "^overwrite: ck holds 1 tag(s) of an earlier run" ow.txt || { cat ow.txt; fail "no overwrite line"; }
[ "$(tags ck)" = "global_step2 " ] && [ "$(latest ck)" = global_step2 ] ||
    fail "after --overwrite: tags '$(tags ck)', latest $(latest ck)"

# --- --keep-last ---------------------------------------------------------------------------
"$troupe" train "${mlp[@]}" --steps 5 --save-dir kl --save-every 1 --keep-last 2 > kl.txt 2>&1 ||
    { cat kl.txt; fail "--keep-last run"; }
[ "$(tags kl)" = "global_step4 global_step5 " ] || fail "--keep-last 2 left '$(tags kl)'"
grep -q "^keep-last 2: removed kl/global_step3" kl.txt || fail "no keep-last line"
# never the tag latest names: from tags 1..3, latest turned back to global_step2 and a stale
# global_step9 (newest by number), a resumed run saves global_step3 (latest); --keep-last 1
# keeps global_step9 (the newest) and global_step3 (latest), removes global_step2, and keeps
# global_step1 because it holds a file that is not a checkpoint's
"$troupe" train "${mlp[@]}" --steps 3 --save-dir kl2 --save-every 1 > /dev/null 2>&1 || fail "kl2"
cp -r kl2/global_step3 kl2/global_step9
echo "mine" > kl2/global_step1/notes.txt
echo global_step2 > kl2/latest
"$troupe" train "${mlp[@]}" --steps 3 --save-dir kl2 --resume --save-every 1 --keep-last 1 \
    > kl2.txt 2>&1 || { cat kl2.txt; fail "--keep-last after --resume"; }
grep -q "^resume: loaded kl2 at step 2" kl2.txt || { cat kl2.txt; fail "kl2: not resumed at 2"; }
[ "$(tags kl2)" = "global_step1 global_step3 global_step9 " ] ||
    { cat kl2.txt; fail "--keep-last 1 left '$(tags kl2)'"; }
[ "$(latest kl2)" = global_step3 ] || fail "latest is $(latest kl2)"
grep -q "warning: kept kl2/global_step1: it holds notes.txt" kl2.txt ||
    { cat kl2.txt; fail "no warning for the tag with a foreign file"; }
test -f kl2/global_step1/notes.txt || fail "a foreign file was removed"

# --- a save dir that cannot be written: refused before step 1 -------------------------------
# The check makes the folder and writes a probe file in it: a path that only looks usable (the
# nearest existing ancestor is a directory root can write) is refused, naming errno's text.
expect_exit 2 "--save-dir /proc/ck: cannot create /proc/ck: No such file or directory" \
    "${mlp[@]}" --steps 2 --save-dir /proc/ck --print-every 1
grep -q '^step' out.txt && fail "--save-dir /proc/ck was found only after training"
expect_exit 2 "--trace /proc/tr: cannot create /proc/tr: No such file or directory" \
    "${mlp[@]}" --steps 2 --trace /proc/tr
# a read-only folder (root writes anywhere: the run drops CAP_DAC_OVERRIDE with setpriv)
mkdir ro && chmod 555 ro
as_user=()
[ "$(id -u)" -eq 0 ] && as_user=(setpriv --bounding-set=-dac_override,-dac_read_search)
if [ "$(id -u)" -ne 0 ] || command -v setpriv > /dev/null; then
    rc=0
    "${as_user[@]}" "$troupe" train "${mlp[@]}" --steps 2 --save-dir ro --print-every 1 \
        > ro.txt 2> ro.err || rc=$?
    [ "$rc" -eq 2 ] || { cat ro.txt ro.err; fail "read-only --save-dir: exit $rc, expected 2"; }
    grep -q "^troupe train: --save-dir ro: cannot write in ro (a probe file ro/.troupe-probe.*): Permission denied" \
        ro.err || { cat ro.err; fail "read-only --save-dir: no clear error"; }
    grep -q '^step' ro.txt && fail "a read-only --save-dir was found only after training"
    rc=0
    "${as_user[@]}" "$troupe" train "${mlp[@]}" --steps 2 --save-dir ro/deep/ck > ro.txt 2> ro.err ||
        rc=$?
    [ "$rc" -eq 2 ] && grep -q "cannot create ro/deep/ck: Permission denied" ro.err ||
        { cat ro.err; fail "--save-dir under a read-only folder: exit $rc"; }
fi
# a usable one keeps no probe file
"$troupe" train "${mlp[@]}" --steps 1 --save-dir pr/deep > /dev/null 2>&1 || fail "pr/deep"
[ -z "$(find pr -name '.troupe-probe*')" ] || fail "the probe file was left in pr/deep"

# --- a save killed in the middle -----------------------------------------------------------
# Under a 16 KiB file-size limit the first checkpoint file (the tiny GPT's 30 KB of weights)
# cannot be written whole: SIGXFSZ kills the run in the middle of the save.
rc=0
(ulimit -f 16; "$troupe" train "${tiny[@]}" --steps 1 --save-dir kill > k1.txt 2>&1) 2>/dev/null || rc=$?
[ "$rc" -eq $((128 + 25)) ] || { cat k1.txt; fail "the save was not killed by SIGXFSZ (exit $rc)"; }
left=$(find kill -name "*.tmp.*" | wc -l)
[ "$left" -eq 1 ] || fail "the killed save left $left temporary files, expected 1"
"$troupe" train "${tiny[@]}" --steps 1 --save-dir kill --resume > k2.txt 2>&1 ||
    { cat k2.txt; fail "the run after the killed save"; }
grep -q "checkpoint: removed 1 temporary file(s) (16384 bytes) that processes killed during a save left in kill" \
    k2.txt || { cat k2.txt; fail "the stale temporary file was not reported removed"; }
left=$(find kill -name "*.tmp.*" | wc -l)
[ "$left" -eq 0 ] || fail "$left temporary files are still there"
[ "$(latest kill)" = global_step1 ] || fail "no checkpoint after the killed save"
echo "train save dir: refused without --resume/--overwrite, --overwrite, --keep-last, a killed save's tmp removed"
