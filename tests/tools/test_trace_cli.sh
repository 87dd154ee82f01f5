#!/usr/bin/env bash
# `troupe trace plot`'s numbers are checked, never read as 0 or NaN: --width takes an integer
# from 400 to 100000 pixels, --from and --to finite microseconds >= 0 with --to after --from;
# each bad value exits 2 naming the flag and the value. Good values draw the picture.
# `troupe trace summary` counts a span nested in another of its lane (a pipeline stage's
# forward inside the message that ran it) once: busy 140 of 180 us, not 260.
# An empty window and huge timestamps end, bounded; merge never overwrites an input; the
# runtime's shutdown messages are in no step (below).
set -euo pipefail
troupe=$(cd "$1" && pwd)/troupe
trace=$(cd "$2" && pwd)/tests/monitor/data/killed_rank1.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# plot_fails PATTERN ARGS...: trace plot with ARGS exits 2, stderr matching PATTERN, no picture
plot_fails() {
    local pattern=$1 rc=0
    shift
    rm -f "$tmp/t.svg"
    "$troupe" trace plot "$trace" -o "$tmp/t.svg" "$@" > /dev/null 2> "$tmp/err" || rc=$?
    [ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "trace plot $*: exit $rc, expected 2"; }
    grep -q -- "$pattern" "$tmp/err" || { cat "$tmp/err"; fail "trace plot $*: stderr lacks '$pattern'"; }
    [ ! -e "$tmp/t.svg" ] || fail "trace plot $*: drew a picture"
}

for w in abc 0 -1 399 100001 800x ""; do
    plot_fails "--width: expected an integer from 400 to 100000 (pixels), got '$w'" --width "$w"
done
for t in nan inf -1 1e400 abc ""; do
    plot_fails "--from: expected a finite number of microseconds >= 0, got '$t'" --from "$t"
    plot_fails "--to: expected a finite number of microseconds >= 0, got '$t'" --to "$t"
done
plot_fails "--to 5: expected a time after --from 10" --from 10 --to 5
plot_fails "--width: expected a value after it" --width

"$troupe" trace plot "$trace" -o "$tmp/t.svg" --width 800 --from 1000000 --to 1005000 2> /dev/null ||
    fail "trace plot with good values failed"
grep -q 'width="800"' "$tmp/t.svg" || fail "--width 800 was not used"

nested=$(cd "$2" && pwd)/tests/monitor/data/nested_rank0.json
"$troupe" trace summary "$nested" > "$tmp/sum" || fail "trace summary of nested spans failed"
grep -q "busy: stage0 0.140 ms (78%), comm 0.060 ms (33%)" "$tmp/sum" ||
    { cat "$tmp/sum"; fail "nested spans: stage0 should be busy 0.140 ms (78%)"; }
path="critical path: 0.180 ms over 3 spans (0.180 ms busy): stage0/pipe_xfer(ForwardPass,"
path+="BackwardPass) 0.100 -> comm/allreduce 0.040 -> stage0/pipe_xfer(ForwardPass) 0.040"
grep -qF "$path" "$tmp/sum" ||
    { cat "$tmp/sum"; fail "nested spans: the critical path should be 3 outer spans"; }
# issue 40 defect 2: a window that selects no span is refused naming --from/--to, and a trace
# with nanosecond-size timestamps (ts 1.7e18 us, where t0 + 1 == t0 in double) draws a bounded
# picture. Each run is bounded in time (timeout) and in file size (ulimit -f, 1 KiB blocks), so
# a plot that never ends fails this test instead of filling the disk.
bounded_plot() { (ulimit -f 8192; timeout 10 "$troupe" trace plot "$@"); }
rm -f "$tmp/t.svg"
rc=0
bounded_plot "$trace" -o "$tmp/t.svg" --from 1e16 > /dev/null 2> "$tmp/err" || rc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/err"; fail "trace plot --from 1e16: exit $rc, expected 1"; }
grep -q -- "--from 1e+16: no span of the trace lies in this window" "$tmp/err" ||
    { cat "$tmp/err"; fail "trace plot --from 1e16: stderr should name the empty window"; }
[ ! -e "$tmp/t.svg" ] || fail "trace plot --from 1e16: left a file behind"
rc=0
bounded_plot "$trace" -o "$tmp/t.svg" --from 1e16 --to 2e16 > /dev/null 2> "$tmp/err" || rc=$?
[ "$rc" -eq 1 ] || { cat "$tmp/err"; fail "trace plot --from 1e16 --to 2e16: exit $rc, expected 1"; }
grep -q -- "--from 1e+16 --to 2e+16: no span" "$tmp/err" ||
    { cat "$tmp/err"; fail "trace plot --from 1e16 --to 2e16: stderr should name the window"; }
huge=$(cd "$2" && pwd)/tests/monitor/data/huge_ts_rank0.json
rc=0
bounded_plot "$huge" -o "$tmp/t.svg" > /dev/null 2> "$tmp/err" || rc=$?
[ "$rc" -eq 0 ] || { cat "$tmp/err"; fail "trace plot of ts 1.7e18: exit $rc, expected 0"; }
size=$(stat -c %s "$tmp/t.svg")
[ "$size" -lt 100000 ] || fail "trace plot of ts 1.7e18: $size bytes, expected a small picture"
grep -q '</svg>' "$tmp/t.svg" || fail "trace plot of ts 1.7e18: the picture is not complete"

# issue 40 defect 9: merge refuses an output that is one of its inputs (by file identity, any
# spelling), leaving it intact, and the loader warns when two files claim the same rank.
mkdir "$tmp/run"
cp "$nested" "$tmp/run/trace_rank0.json"
cp "$trace" "$tmp/run/trace_rank1.json"
cp "$tmp/run/trace_rank0.json" "$tmp/rank0.orig"
for out in "$tmp/run/trace_rank0.json" "$tmp/run/./trace_rank0.json" "$tmp/run/../run/trace_rank1.json"; do
    rc=0
    "$troupe" trace merge "$tmp/run" -o "$out" > /dev/null 2> "$tmp/err" || rc=$?
    [ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "trace merge -o $out (an input): exit $rc, expected 2"; }
    grep -qF -- "-o $out: is one of the input trace files" "$tmp/err" ||
        { cat "$tmp/err"; fail "trace merge -o $out: stderr should name the output as an input"; }
done
cmp -s "$tmp/run/trace_rank0.json" "$tmp/rank0.orig" || fail "trace merge overwrote its input"
cmp -s "$tmp/run/trace_rank1.json" "$trace" || fail "trace merge overwrote its input"
rc=0
"$troupe" trace merge "$tmp/run/trace_rank1.json" -o "$tmp/run/trace_rank1.json" 2> "$tmp/err" || rc=$?
[ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "trace merge FILE -o FILE: exit $rc, expected 2"; }
"$troupe" trace merge "$tmp/run" -o "$tmp/run/merged.json" 2> "$tmp/err" ||
    { cat "$tmp/err"; fail "trace merge -o DIR/merged.json (not an input) failed"; }
cp "$tmp/run/trace_rank1.json" "$tmp/run/trace_rank9.json"
"$troupe" trace summary "$tmp/run" > /dev/null 2> "$tmp/err" || fail "trace summary of a copied rank failed"
grep -q "trace_rank1.json and .*trace_rank9.json both claim rank 1" "$tmp/err" ||
    { cat "$tmp/err"; fail "two files of rank 1: no warning on stderr"; }

# issue 40 defect 6: the runtime's shutdown traffic (kill/stop/exit, carrying step 0) is no
# step's work: step 0 stays 0.050 ms, step 1 (0.070 ms) is the slowest, no path goes via kill.
shutdown=$(cd "$2" && pwd)/tests/monitor/data/shutdown_rank0.json
"$troupe" trace summary "$shutdown" > "$tmp/sum" || fail "trace summary of a shutdown failed"
grep -qF "rank 0: 2 steps (4 spans outside any step left out: kill/stop/exit, no step)" "$tmp/sum" ||
    { cat "$tmp/sum"; fail "shutdown: the 4 kill/stop/exit spans should be left out of every step"; }
grep -qE "^ +0 +0\.050 " "$tmp/sum" || { cat "$tmp/sum"; fail "shutdown: step 0 should be 0.050 ms"; }
grep -qF "slowest step 1 (0.070 ms)" "$tmp/sum" ||
    { cat "$tmp/sum"; fail "shutdown: step 1 should be the slowest"; }
! grep -qE "kill|exit|stop" <(grep "critical path" "$tmp/sum") ||
    { cat "$tmp/sum"; fail "shutdown: the critical path goes through shutdown traffic"; }
"$troupe" trace summary "$shutdown" --json > "$tmp/sum.json"
grep -q '"nonstep_spans": *4' "$tmp/sum.json" ||
    { cat "$tmp/sum.json"; fail "shutdown: --json should count nonstep_spans 4"; }

echo "trace cli: bad --width/--from/--to refused with exit 2; nested spans counted once;"
echo "shutdown's kill/stop/exit in no step;"
echo "merge refuses an output that is an input; two files of one rank warned about;"
echo "an empty window refused naming --from/--to; nanosecond-size timestamps plotted, bounded"
