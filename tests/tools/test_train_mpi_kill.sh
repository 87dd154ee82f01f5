#!/usr/bin/env bash
# A rank killed mid-step (TROUPE_FAULT_KILL_RANK=1, TROUPE_FAULT_KILL_STEP=1: SIGKILL when step
# 1's first bucket reaches its comm actor) ends a 2-rank `troupe train` non-zero, well inside
# the test's timeout, with a line naming what happened: mpirun's own when it notices the dead
# process; and, when mpirun is told not to abort the job (orte_abort_on_non_zero_status 0, as a
# launcher that does not watch its ranks), rank 0's watchdog diagnosis after
# troupe.comm.timeout_s, naming the rank that did not answer.
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cat > ds_wd.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "troupe": { "runtime": { "workers": 2 }, "comm": { "timeout_s": 2 } } }
JSON
wd=("${tiny[@]}")
wd[1]=$tmp/ds_wd.json
export TROUPE_FAULT_KILL_RANK=1 TROUPE_FAULT_KILL_STEP=1

# run_killed LIMIT MPIRUN_ARGS...: the killed run; sets rc and took
run_killed() {
    local limit=$1 start
    shift
    rc=0
    start=$(date +%s)
    timeout -k 5 50 mpirun --oversubscribe "$@" -np 2 "$troupe" train "${wd[@]}" --steps 4 \
        > out.txt 2> err.txt || rc=$?
    took=$(( $(date +%s) - start ))
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat out.txt err.txt; fail "killed rank: exit $rc"; }
    [ "$took" -lt "$limit" ] || { cat err.txt; fail "the job took $took s to end (limit $limit)"; }
    grep -q "comm: rank 1: TROUPE_FAULT_KILL_RANK: killing this process (SIGKILL) in step 1" \
        err.txt || { cat err.txt; fail "rank 1 was not killed by the injected fault"; }
}

run_killed 20
grep -q "mpirun noticed that process rank 1 .* exited on signal 9" err.txt ||
    { cat err.txt; fail "mpirun did not name the killed rank"; }
noticed=$took

run_killed 30 --mca orte_abort_on_non_zero_status 0
grep -q "^troupe train: comm: watchdog: rank 1 diverged: it did not answer within 3 s (dead, or its comm actor is blocked); rank 0 has waited [0-9.]* s in the header exchange before collective #[0-9]*" \
    err.txt || { cat err.txt; fail "rank 0's watchdog did not name the dead rank"; }
echo "mpi: a killed rank ends the job in $noticed s (mpirun noticed) and in $took s when only"
echo "     the watchdog (troupe.comm.timeout_s 2) can notice it"
