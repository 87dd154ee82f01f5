#!/usr/bin/env bash
# Ranks launched with different configs (an mpirun MPMD job): the ranks agree on their resolved
# configs before step 1, so configs that differ only in the learning rate end the job on every
# rank, non-zero, before any step or checkpoint, naming rank 1 and the key with both values (at
# ZeRO 2 and at ZeRO 0); keys that only say how one process runs (troupe.runtime.workers) may
# differ, and such a job's checkpoint resumes.
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rest=("${tiny[@]:2}") # the tiny model and data without its --deepspeed_config

# config STAGE LR WORKERS: a config file's path
config() {
    local f=$tmp/ds_z$1_$2_$3.json
    cat > "$f" <<JSON
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": $2 } },
  "zero_optimization": { "stage": $1 },
  "troupe": { "runtime": { "workers": $3 } } }
JSON
    echo "$f"
}

# mpmd CONFIG0 CONFIG1 ARGS...: rank 0 with CONFIG0, rank 1 with CONFIG1; sets rc
mpmd() {
    local a=$1 b=$2
    shift 2
    rc=0
    timeout -k 5 60 mpirun --oversubscribe -np 1 "$troupe" train --deepspeed_config "$a" \
        "${rest[@]}" "$@" : -np 1 "$troupe" train --deepspeed_config "$b" "${rest[@]}" "$@" \
        > out.txt 2> err.txt || rc=$?
}

for stage in 2 0; do
    rm -rf ck
    mpmd "$(config $stage 0.001 2)" "$(config $stage 0.0005 2)" --steps 3 --save-dir ck \
        --print-every 1
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] ||
        { cat out.txt err.txt; fail "ZeRO $stage: ranks with different lr: exit $rc"; }
    ! grep -q "step 1/" out.txt || { cat out.txt; fail "ZeRO $stage: a step ran"; }
    [ ! -e ck/latest ] && [ -z "$(ls -A ck 2>/dev/null)" ] ||
        { ls -R ck; fail "ZeRO $stage: a checkpoint was written"; }
    want="rank 1's config differs from rank 0's: optimizer.params.lr 0.001 vs 0.0005"
    [ "$(grep -c "^troupe train: .*$want" err.txt)" -eq 2 ] ||
        { cat err.txt; fail "ZeRO $stage: not every rank named rank 1 and lr with both values"; }
done

# per-process keys may differ: 1 and 2 worker threads train, save and resume together
rm -rf ck
mpmd "$(config 2 0.001 1)" "$(config 2 0.001 2)" --steps 2 --save-dir ck
[ "$rc" -eq 0 ] || { cat out.txt err.txt; fail "different troupe.runtime.workers: exit $rc"; }
mpmd "$(config 2 0.001 1)" "$(config 2 0.001 2)" --steps 3 --save-dir ck --resume
[ "$rc" -eq 0 ] && grep -q "^resume: loaded ck at step 2" out.txt ||
    { cat out.txt err.txt; fail "the checkpoint of ranks with different workers did not resume"; }
echo "mpi: ranks whose configs differ in lr stop before step 1 naming the key; workers may differ"
