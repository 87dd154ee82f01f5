#!/usr/bin/env bash
# `troupe launch`: DeepSpeed's hostfile, --include/--exclude, --num_nodes/--num_gpus become
# the right mpirun command (--dry-run), bad hostfiles and flags are refused with exit 2 naming
# the line or flag, and (with MPI) a local launch of `train` runs two ranks that report once.
source "$(dirname "$0")/common.sh"
root=""
[ "$(id -u)" -eq 0 ] && root=" --allow-run-as-root"
printf '# two workers\nworker-0 slots=4\nworker-1 slots=4   # the second\n\n' > hf

dry() { # EXPECTED ARGS...: the dry run prints EXPECTED
    local want=$1
    shift
    local got
    got=$("$troupe" launch --dry-run "$@") || fail "troupe launch $*: failed"
    [ "$got" = "$want" ] || fail "troupe launch $*: printed '$got', expected '$want'"
}
dry "mpirun -np 8 --host worker-0:4,worker-1:4$root $troupe train --steps 1" \
    --hostfile hf train --steps 1
dry "mpirun -np 2 --host worker-1:2$root ./a.out x" --hostfile hf --include "worker-1:0,2" ./a.out x
dry "mpirun -np 5 --host worker-0:1,worker-1:4$root ./a.out" \
    --hostfile hf --exclude "worker-0:0,1,2" ./a.out
dry "mpirun -np 4 --host worker-0:2,worker-1:2$root ./a.out" --hostfile hf --num_gpus 2 ./a.out
dry "mpirun -np 4 --host worker-0:4 --oversubscribe$root ./a.out" \
    --hostfile hf --num_nodes 1 --oversubscribe ./a.out
dry "mpirun -np 3 --host localhost:3$root ./a.out" --num_gpus 3 ./a.out

refused() { # PATTERN ARGS...: exit 2 with PATTERN on stderr
    local pattern=$1 rc=0
    shift
    "$troupe" launch "$@" > out.txt 2> err.txt || rc=$?
    [ "$rc" -eq 2 ] || fail "troupe launch $*: exit $rc, expected 2"
    grep -q -- "$pattern" err.txt || { cat err.txt; fail "troupe launch $*: no '$pattern'"; }
}
printf 'worker-0 slots=4\nworker-1 slotz=2\n' > bad1
printf 'worker-0 slots=4\nworker-0 slots=2\n' > bad2
refused "bad1:2: expected \`hostname slots=N\`, got \"worker-1 slotz=2\"" --hostfile bad1 ./a.out
refused "bad2:2: host 'worker-0' is listed twice" --hostfile bad2 ./a.out
refused "--hostfile nope: No such file or directory" --hostfile nope ./a.out
refused "--include and --exclude cannot be combined" --hostfile hf --include worker-0 \
    --exclude worker-1 ./a.out
refused "--include: slot '9' is not one of the host's" --hostfile hf --include worker-0:9 ./a.out
refused "--num_gpus: expected a positive integer, got 'x'" --num_gpus x ./a.out
refused "no program to run" --hostfile hf
refused "unknown flag '--nodes'" --nodes 2 ./a.out

if [ -z "${TROUPE_TEST_NO_MPI:-}" ] && "$troupe" version | grep -q "mpi yes"; then
    "$troupe" launch --num_gpus 2 --oversubscribe train "${tiny[@]}" --steps 3 > out.txt \
        2> err.txt || { cat out.txt err.txt; fail "a local launch of train failed"; }
    [ "$(grep -c '^summary:' out.txt)" -eq 1 ] || { cat out.txt; fail "expected one summary"; }
    grep -q "rank 1 of 2" err.txt || { cat err.txt; fail "the ranks did not start"; }
    # from a hostfile, with ZeRO 2 and overlap_comm
    echo "localhost slots=2" > hf_local
    cat > z2.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "zero_optimization": { "stage": 2, "overlap_comm": true },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
    z2=("${tiny[@]}")
    z2[1]=$tmp/z2.json
    "$troupe" launch --hostfile hf_local --oversubscribe train "${z2[@]}" --steps 3 > out.txt \
        2> err.txt || { cat out.txt err.txt; fail "a hostfile launch of train failed"; }
    [ "$(grep -c '^summary:' out.txt)" -eq 1 ] || { cat out.txt; fail "expected one summary"; }
    grep -q "ZeRO stage 2: rank 1 updates parameters" err.txt ||
        { cat err.txt; fail "the hostfile launch did not run ZeRO 2 on 2 ranks"; }
fi
echo "launch: hostfile, filters and counts become mpirun's flags; a local launch trains, and"
echo "        so does one from a hostfile at ZeRO 2 with overlap_comm"
