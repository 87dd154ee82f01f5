#!/usr/bin/env bash
# `troupe nvme-tune`: bad flags and a directory it cannot write exit 2 naming the flag; a
# small sweep says how many configurations it measured, prints one line per configuration,
# the best read and write, and an `aio` section that parses as JSON, that `troupe config
# check` accepts, and that is the measured configuration with the best read/write harmonic
# mean; it leaves no file behind.
source "$(dirname "$0")/cli.sh"

# tune_fails PATTERN ARGS...: nvme-tune with ARGS exits 2 with stderr matching PATTERN
tune_fails() { expect_cmd 2 "$1" nvme-tune "${@:2}"; }

tune_fails "--dir is required" --io-size 1M
tune_fails "unknown flag '--block_size'" --dir "$tmp" --block_size 1M
tune_fails "--io-size: expected a size from 65536 to" --dir "$tmp" --io-size 4K
tune_fails "--io-size: expected a multiple of 64K" --dir "$tmp" --io-size 100K
tune_fails "--io-size: expected a size" --dir "$tmp" --io-size lots
tune_fails "--budget-s: expected seconds, more than 0" --dir "$tmp" --budget-s 0
tune_fails "--budget-s: expected seconds" --dir "$tmp" --budget-s 2x
tune_fails "--budget-s: expected a value after it" --dir "$tmp" --budget-s
tune_fails "--dir: expected an existing directory, got '$tmp/none'" --dir "$tmp/none"
touch "$tmp/file"
tune_fails "--dir: expected an existing directory" --dir "$tmp/file"
# /proc refuses new files even to root, which chmod cannot make a directory do
tune_fails "--dir: expected a directory this process can write, got '/proc'" --dir /proc
rm "$tmp/file"

"$troupe" nvme-tune --help | grep -q -- "--budget-s" || fail "--help lacks --budget-s"
"$troupe" help | grep -q "nvme-tune" || fail "troupe help lacks nvme-tune"

"$troupe" nvme-tune --dir "$tmp" --io-size 1M --budget-s 2 > "$tmp/out" || fail "a small sweep failed"
cat "$tmp/out"
measured=$(sed -n 's/^nvme-tune.measured: \([0-9]*\) of 144 configurations in .*/\1/p' "$tmp/out")
[ -n "$measured" ] && [ "$measured" -ge 1 ] || fail "no 'nvme-tune.measured: K of 144' line"
rows=$(grep -cE '^ *[0-9]+ +[0-9]+ +[0-9]+ +[01] +[01] +[0-9.]+ +[0-9.]+$' "$tmp/out")
[ "$rows" -eq "$measured" ] || fail "$rows result lines for $measured configurations"
grep -Eq '^nvme-tune.best_read: [0-9.]+ GB/s \(block_size' "$tmp/out" || fail "no best_read line"
grep -Eq '^nvme-tune.best_write: [0-9.]+ GB/s \(block_size' "$tmp/out" || fail "no best_write line"

sed -n '/^{$/,/^}$/p' "$tmp/out" > "$tmp/aio.json"
python3 -c 'import json, sys; a = json.load(open(sys.argv[1]))["aio"]; assert set(a) == {
    "block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events"}, a' \
    "$tmp/aio.json" || fail "the aio section is not the JSON expected"
# the section is the measured row with the best harmonic mean of write and read GB/s
python3 - "$tmp/out" "$tmp/aio.json" <<'PY' || fail "the best lines or the aio section are not the best rows"
import json, re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r"^ *\d+ +\d+ +\d+ +[01] +[01] ", l)]
best = max(rows, key=lambda r: 2 / (1 / float(r[5]) + 1 / float(r[6])))
a = json.load(open(sys.argv[2]))["aio"]
got = [a["block_size"], a["queue_depth"], a["intra_op_parallelism"],
       int(a["single_submit"]), int(a["overlap_events"])]
assert got == [int(x) for x in best[:5]], (got, best)
text = open(sys.argv[1]).read()
for what, col in (("read", 6), ("write", 5)):
    top = max(rows, key=lambda r: float(r[col]))
    line = re.search(r"^nvme-tune.best_%s: (\S+) GB/s" % what, text, re.M).group(1)
    assert line == top[col], (what, line, top)
PY
python3 - "$tmp/aio.json" "$tmp/ds.json" <<'PY'
import json, sys
cfg = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8}
cfg.update(json.load(open(sys.argv[1])))
json.dump(cfg, open(sys.argv[2], "w"), indent=2)
PY
"$troupe" config check "$tmp/ds.json" --world-size 1 > "$tmp/check" 2>&1 || { cat "$tmp/check"; fail "config check refused the tuned section"; }
[ -z "$(ls "$tmp" | grep -E 'troupe_nvme_(bench|tune)' || true)" ] || fail "a file was left behind"
echo "nvme-tune: bad flags refused with exit 2; $measured configurations measured; the aio section parses and checks"
