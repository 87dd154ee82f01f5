#!/usr/bin/env bash
# A 2-rank `troupe train` stopped from outside ends cleanly on every rank: the ranks agree on
# the stop in a step's loss all-reduce, so they stop after the same step, save it whole and
# exit 0, and mpirun exits 0; the checkpoint resumes on 2 ranks. SIGUSR1 to mpirun (Open MPI
# forwards it to every rank) and SIGINT to rank 1 alone both do this. (SIGINT to mpirun
# itself cannot: Open MPI 4.1 refuses to forward SIGINT and aborts the job instead, SIGTERM to
# the ranks and SIGKILL a second later, exit 1; see README.)
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# stop_at_step3 DIR HOW: 2 ranks train into DIR; once step 3 is printed, HOW is "usr1" (SIGUSR1
# to mpirun) or "rank1" (SIGINT to rank 1's process). mpirun must exit 0 with the run stopped
# and saved whole at the step it names ($step).
stop_at_step3() {
    local dir=$1 how=$2 pid rc=0
    timeout -k 5 80 mpirun --oversubscribe -np 2 "$troupe" train "${z1[@]}" --steps 1000000 \
        --save-dir "$dir" --print-every 1 > int.txt 2> int_err.txt &
    pid=$!
    for _ in $(seq 600); do # up to 60 s for the third step
        grep -aq 'step 3/' int.txt 2> /dev/null && break
        sleep 0.1
    done
    grep -aq 'step 3/' int.txt || { cat int.txt int_err.txt; fail "$how: no third step"; }
    if [ "$how" = usr1 ]; then
        kill -USR1 "$(pgrep -P "$pid" -x mpirun || echo "$pid")"
    else
        local r1=""
        for p in $(pgrep -f "^$troupe train .*--save-dir $dir"); do # the ranks, not mpirun
            tr '\0' '\n' < "/proc/$p/environ" | grep -qx OMPI_COMM_WORLD_RANK=1 && r1=$p
        done
        [ -n "$r1" ] || fail "rank 1's process not found"
        kill -INT "$r1"
    fi
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ] || { cat int.txt int_err.txt; fail "$how: mpirun exited $rc, expected 0"; }
    step=$(sed -n 's/^summary: stopped (signal) at step \([0-9]*\).*/\1/p' int.txt)
    [ -n "$step" ] || { cat int.txt int_err.txt; fail "$how: no 'stopped' summary"; }
    [ "$(tr -d '\n' < "$dir/latest")" = "global_step$step" ] &&
        [ -f "$dir/global_step$step/model_states.trck" ] &&
        [ -f "$dir/global_step$step/optim_states_rank0.trck" ] &&
        [ -f "$dir/global_step$step/optim_states_rank1.trck" ] ||
        { ls -R "$dir"; fail "$how: the checkpoint of step $step is not whole"; }
    ! grep -q "diverged" int_err.txt || { cat int_err.txt; fail "$how: the ranks diverged"; }
}

stop_at_step3 "$tmp/ck" usr1
grep -q "SIGUSR1 received" int_err.txt || { cat int_err.txt; fail "SIGUSR1 was not reported"; }
mpirun --oversubscribe -np 2 "$troupe" train "${z1[@]}" --steps $((step + 2)) --save-dir \
    "$tmp/ck" --resume > res.txt 2> err.txt || { cat err.txt; fail "--resume after SIGUSR1"; }
grep -q "^resume: loaded $tmp/ck at step $step" res.txt || { cat res.txt; fail "not resumed"; }
usr1=$step

stop_at_step3 "$tmp/ck2" rank1
[ "$(grep -c "SIGINT received" int_err.txt)" -eq 1 ] || { cat int_err.txt; fail "not one SIGINT"; }
echo "mpi: SIGUSR1 to mpirun stopped 2 ranks at step $usr1, SIGINT to rank 1 at step $step;"
echo "     saved whole, exit 0 on every rank and from mpirun"
