#!/usr/bin/env bash
# A validation that fails, mid-run or at the end, costs neither the checkpoint nor the llm.c
# export: both are written, then the run exits 1 with the validation's error.
#
# How the validation is made to fail: the val shard is clean when the run opens (and scans)
# it; once the run is past its start-up it is patched in place with a token outside the
# vocabulary, which the mapping sees and the evaluation reports. To patch at a known point,
# troupe's stdout is a FIFO the test has filled: the run blocks writing its first line (step 1,
# after start-up) until the test, having patched the shard, starts reading.
source "$(dirname "$0")/common.sh"

# The kernel names the wait of a write to a full pipe pipe_write (anon_pipe_write since 6.x).
blocked_on_write() { [[ "$(cat "/proc/$1/wchan" 2>/dev/null)" == *pipe_write ]]; }

# run_patched NAME ARGS...: troupe train ARGS with the val shard patched after step 1; sets
# rc; stdout in NAME.out, stderr in NAME.err.
run_patched() {
    local name=$1 pid
    shift
    cp "$tmp/val.bin" "$tmp/val_$name.bin"
    rm -f "$name.fifo" && mkfifo "$name.fifo"
    exec 3<>"$name.fifo" # a reader, so that troupe's open does not wait
    python3 -c '
import fcntl, os
fl = fcntl.fcntl(3, fcntl.F_GETFL)
fcntl.fcntl(3, fcntl.F_SETFL, fl | os.O_NONBLOCK)
try:
    while True:
        os.write(3, b"\n" * 4096)
except BlockingIOError:
    pass
try:
    while True:
        os.write(3, b"\n")
except BlockingIOError:
    pass
fcntl.fcntl(3, fcntl.F_SETFL, fl)'
    "$troupe" train --deepspeed_config "$cfg" --train-data "$tmp/train.bin" \
        --val-data "$tmp/val_$name.bin" --context 16 --channels 16 --layers 1 --heads 2 \
        --val-batches 2 --print-every 1 "$@" > "$name.fifo" 2> "$name.err" 3<&- &
    pid=$!
    for _ in $(seq 600); do # up to 60 s for the run to block on its first line
        blocked_on_write "$pid" && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    blocked_on_write "$pid" || {
        kill -9 "$pid"
        cat "$name.err"
        fail "$name: the run did not block on its first line"
    }
    printf '\xff\xff' | dd of="$tmp/val_$name.bin" bs=1 seek=1024 conv=notrunc status=none
    exec 4< "$name.fifo" # the reader is open before the test's end closes: no SIGPIPE
    cat <&4 > "$name.out" 3<&- 4<&- &
    local reader=$!
    exec 3<&- 4<&-
    rc=0
    wait "$pid" || rc=$?
    wait "$reader"
}

expect_kept() { # NAME STEP: exit 1, the validation's error, the checkpoint and the export
    local name=$1 step=$2
    sed -i '/^$/d' "$name.out" # the test's filler
    [ "$rc" -eq 1 ] || { cat "$name.out" "$name.err"; fail "$name: exit $rc, expected 1"; }
    grep -q "validation at step $step: .*val_$name.bin: token 0 is 65535, outside the model's vocabulary of 256" \
        "$name.err" || { cat "$name.err"; fail "$name: no validation error naming the shard"; }
    grep -q "^saved: $tmp/ck_$name/global_step$step (latest)" "$name.out" ||
        { cat "$name.out"; fail "$name: the checkpoint of step $step was not saved"; }
    [ "$(tr -d '\n' < "$tmp/ck_$name/latest")" = "global_step$step" ] ||
        fail "$name: latest does not name global_step$step"
    grep -q "^exported: $tmp/$name.llmc.bin" "$name.out" || fail "$name: no export"
    test -s "$tmp/$name.llmc.bin" || fail "$name: the export is missing"
    grep -q "^summary: validation failed at step $step" "$name.out" ||
        { cat "$name.out"; fail "$name: the summary does not say the validation failed"; }
}

# mid-run: the validation of step 3 fails; the run stops there, saved and exported
run_patched mid --steps 6 --val-every 3 --save-dir "$tmp/ck_mid" --export-llmc "$tmp/mid.llmc.bin"
expect_kept mid 3
grep -q '^step 4/' mid.out && fail "mid: training went on past the failed validation"

# at the end: the final validation fails after the last step's save
run_patched end --steps 4 --save-dir "$tmp/ck_end" --export-llmc "$tmp/end.llmc.bin"
expect_kept end 4

# the saved checkpoint of the failed run resumes (with a clean val shard)
"$troupe" train "${tiny[@]}" --steps 5 --save-dir "$tmp/ck_mid" --resume > res.txt 2>&1 ||
    { cat res.txt; fail "resuming the checkpoint saved before the failed validation"; }
grep -q "^resume: loaded $tmp/ck_mid at step 3" res.txt || { cat res.txt; fail "not resumed at 3"; }
echo "train val fail: a failing validation mid-run (step 3) and at the end (step 4) kept the checkpoint and the export"
