#!/usr/bin/env bash
# `troupe nvme-bench`: each bad flag exits 2 naming the flag and what was expected; a small
# real run prints the write and read throughput and leaves no file behind.
source "$(dirname "$0")/cli.sh"

# bench_fails PATTERN ARGS...: nvme-bench with ARGS exits 2 with stderr matching PATTERN
bench_fails() { expect_cmd 2 "$1" nvme-bench "${@:2}"; }

bench_fails "--dir is required" --io-size 1M
bench_fails "unknown flag '--depth'" --dir "$tmp" --depth 4
bench_fails "--block_size: expected a size from 512 to" --dir "$tmp" --block_size 100
bench_fails "--block_size: expected a size" --dir "$tmp" --block_size 4X
bench_fails "--queue_depth: expected a size from 1 to 65536" --dir "$tmp" --queue_depth 0
bench_fails "--queue_depth: expected a size" --dir "$tmp" --queue_depth -3
bench_fails "--io-size: expected a size" --dir "$tmp" --io-size ""
bench_fails "--overlap_events: expected 0 or 1, got 'yes'" --dir "$tmp" --overlap_events yes
bench_fails "--io-size: expected a multiple of --intra_op_parallelism" --dir "$tmp" \
    --io-size 1001 --intra_op_parallelism 2
bench_fails "--io-size: expected a value after it" --dir "$tmp" --io-size
bench_fails "aio.block_size is 1000: expected a multiple of 512" --dir "$tmp" \
    --io-size 1M --block_size 1000

"$troupe" nvme-bench --help | grep -q -- "--queue_depth" || fail "--help lacks --queue_depth"
"$troupe" help | grep -q "nvme-bench" || fail "troupe help lacks nvme-bench"

"$troupe" nvme-bench --dir "$tmp" --io-size 8M --block_size 256K --queue_depth 4 \
    --intra_op_parallelism 2 > "$tmp/out" || fail "a small run failed"
grep -Eq '^nvme.write: [0-9.]+ GB/s$' "$tmp/out" || { cat "$tmp/out"; fail "no nvme.write line"; }
grep -Eq '^nvme.read: [0-9.]+ GB/s$' "$tmp/out" || { cat "$tmp/out"; fail "no nvme.read line"; }
grep -q '^nvme.block_size: 262144 bytes$' "$tmp/out" || { cat "$tmp/out"; fail "--block_size not used"; }
[ -z "$(ls "$tmp" | grep troupe_nvme_bench || true)" ] || fail "the bench file was left behind"

# --deepspeed_config: the options come from the config's aio section (as the swapper reads
# it); the aio flags override it wherever they stand; a bad config or section exits 2.
cat > "$tmp/ds.json" <<'JSON'
{"train_batch_size": 8,
 "aio": {"block_size": 131072, "queue_depth": 4, "intra_op_parallelism": 2,
         "single_submit": true, "overlap_events": false}}
JSON
"$troupe" nvme-bench --dir "$tmp" --io-size 4M --deepspeed_config "$tmp/ds.json" > "$tmp/out" \
    || fail "a run with --deepspeed_config failed"
for want in "block_size: 131072 bytes" "queue_depth: 4" "intra_op_parallelism: 2" \
    "single_submit: 1" "overlap_events: 0"; do
    grep -q "^nvme.$want$" "$tmp/out" || { cat "$tmp/out"; fail "config's aio not used: $want"; }
done
"$troupe" nvme-bench --queue_depth 16 --dir "$tmp" --io-size 4M --deepspeed_config "$tmp/ds.json" \
    --overlap_events 1 > "$tmp/out" || fail "a run with --deepspeed_config and flags failed"
for want in "block_size: 131072 bytes" "queue_depth: 16" "overlap_events: 1"; do
    grep -q "^nvme.$want$" "$tmp/out" || { cat "$tmp/out"; fail "flags over the config: $want"; }
done
echo '{"train_batch_size": 8, "aio": {"queue_depth": 0}}' > "$tmp/bad.json"
bench_fails "aio.queue_depth" --dir "$tmp" --deepspeed_config "$tmp/bad.json"
bench_fails "--deepspeed_config $tmp/none.json" --dir "$tmp" --deepspeed_config "$tmp/none.json"
bench_fails "--deepspeed_config: expected a value after it" --dir "$tmp" --deepspeed_config
echo "nvme-bench: bad flags refused with exit 2; a run prints write and read GB/s"
