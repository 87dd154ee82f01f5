#!/usr/bin/env bash
# ZeRO 3 with the parameters on NVMe (offload_param nvme, beside the optimizer's state): 2 ranks
# train the tiny GPT to the same losses as with the parameters in memory, and remove their swap
# files at the end. A parameter swap file damaged or deleted under the running job, on one rank,
# ends the job on every rank within the watchdog's timeout, with an error naming the file; a
# disk without room for it is refused at start-up, naming the file and the key.
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe -np 2)
summary() { grep '^summary:' "$1" | sed -E 's/.*train loss ([0-9.]+ -> [0-9.]+).*/\1/'; }

# every layer gathered one at a time and re-read from the file in each pass (a cache of 2 of
# its 13 sub-groups of 300 parameters per rank); a 2 s watchdog for the faults
cat > mem.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "zero_optimization": { "stage": 3, "reduce_bucket_size": 700, "sub_group_size": 300,
    "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 1,
    "stage3_max_live_parameters": 1, "stage3_max_reuse_distance": 0 },
  "troupe": { "runtime": { "workers": 2 }, "comm": { "timeout_s": 2 } } }
JSON
swap_config() { # $1: the folder for both swap files ($2: the parameters' own, if given)
    sed "s|\"stage3_max_reuse_distance\": 0 }|\"stage3_max_reuse_distance\": 0,\
 \"offload_optimizer\": { \"device\": \"nvme\", \"nvme_path\": \"$1\" },\
 \"offload_param\": { \"device\": \"nvme\", \"nvme_path\": \"${2:-$1}\", \"buffer_count\": 2 } }|" \
        mem.json
}
swap_config "$tmp/swap" > swap.json
grep -q '"offload_param"' swap.json || fail "swap.json: no offload_param"
args() { echo --deepspeed_config "$1" --train-data "$tmp/train.bin" --val-data "$tmp/val.bin" \
    --context 16 --channels 16 --layers 1 --heads 2 --val-batches 2; }

"${mpi[@]}" "$troupe" train $(args mem.json) --steps 6 > out_mem.txt 2> err_mem.txt ||
    { cat out_mem.txt err_mem.txt; fail "in memory: did not train"; }
"${mpi[@]}" "$troupe" train $(args swap.json) --steps 6 > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "parameters on NVMe: did not train"; }
grep -q "rank 1: parameters \[[0-9]*, [0-9]*) in $tmp/swap/troupe_swap/rank1/params.swp" err.txt ||
    { cat err.txt; fail "no parameter swap file on rank 1"; }
[ "$(summary out.txt)" = "$(summary out_mem.txt)" ] ||
    fail "parameters on NVMe: $(summary out.txt), in memory: $(summary out_mem.txt)"
[ -z "$(find "$tmp/swap" -name '*.swp')" ] || fail "swap files left behind: $(find "$tmp/swap")"

# a fault on rank 1 while the job trains: $1 names it, $2 the command that makes it (run once,
# or again and again with `loop`), $3 what the error must say
fault() {
    local what=$1 make=$2 want=$3 rc=0
    rm -f out.txt err.txt
    timeout -k 5 60 "${mpi[@]}" "$troupe" train $(args swap.json) --steps 100000 \
        --print-every 1 > out.txt 2> err.txt &
    local pid=$!
    for _ in $(seq 300); do grep -aq 'step 3/' out.txt 2>/dev/null && break; sleep 0.1; done
    grep -aq 'step 3/' out.txt || { kill "$pid"; cat out.txt err.txt; fail "$what: no step 3"; }
    local start=$SECONDS
    if [ "$make" = loop ]; then # damage it faster than the steps rewrite it
        while kill -0 "$pid" 2>/dev/null; do
            printf 'garbage!garbage!' | dd of="$tmp/swap/troupe_swap/rank1/params.swp" bs=1 \
                seek=100 conv=notrunc status=none 2>/dev/null
            sleep 0.05
        done
    else
        $make
    fi
    wait "$pid" || rc=$?
    local took=$((SECONDS - start))
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] ||
        { cat err.txt; fail "$what: exit $rc"; }
    grep -Eq "troupe train: swapper: (reading|writing) $tmp/swap/troupe_swap/rank1/params.swp: .*$want" err.txt ||
        { cat err.txt; fail "$what: the error does not name the file and what happened"; }
    grep -q "troupe train: comm: watchdog: rank 1 diverged" err.txt ||
        { cat err.txt; fail "$what: rank 0 did not name rank 1"; }
    [ "$took" -lt 30 ] || fail "$what: the job took $took s to end after a 2 s timeout"
    rm -f flight_rank*.json
}
fault "a damaged swap file" loop "sub-group [0-9]* at offset [0-9]* .*: CRC32C mismatch"
fault "a deleted swap file" "rm $tmp/swap/troupe_swap/rank1/params.swp" \
    "the swap file is gone .deleted while training used it."

# a disk without room for the parameters (a 64 KiB tmpfs; the optimizer's state on the real
# disk): refused before the first step, naming the file and the key; skipped where tmpfs cannot
# be mounted (not root)
mkdir -p small
if mount -t tmpfs -o size=64k tmpfs small 2>/dev/null; then
    trap 'umount "$tmp/small" 2>/dev/null; rm -rf "$tmp"' EXIT
    head -c 60000 /dev/zero > small/filler # what the tmpfs has left is less than a slice
    swap_config "$tmp/swap" "$tmp/small" > full.json
    rc=0
    timeout -k 5 60 "${mpi[@]}" "$troupe" train $(args full.json) --steps 6 > out.txt 2> err.txt ||
        rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat err.txt; fail "full disk: exit $rc"; }
    grep -q "small/troupe_swap/rank[01]/params.swp.*the disk is full: zero_optimization.offload_param.nvme_path needs room for this rank's parameters" \
        err.txt || { cat err.txt; fail "full disk: the error does not name the file and the key"; }
    ! grep -q '^step ' out.txt || fail "full disk: training started"
else
    echo "test_param_swap_mpi: full disk: skipped (cannot mount a tmpfs here)"
fi
echo "param swap: 2 ranks train as in memory ($(summary out_mem.txt)); a damaged or deleted"
echo "     parameter swap file ends the job on every rank, named; a full disk is refused at start"
