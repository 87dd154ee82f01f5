#!/usr/bin/env bash
# Checkpoints on several ranks (test_engine_ckpt_dp.c says what each job checks): 4 ranks save
# and continue; 2 ranks, then 1, then 2 at stage 0 resume from it with the same losses; a save
# that rank 1 cannot write fails on both, its tag removed on both, the next one works; a save
# called on rank 0 only is reported on both ranks at the next step (or, when rank 1 calls
# nothing, by the watchdog 2 s into rank 0's wait for it), writes no latest, and the job ends
# instead of hanging. $1: mpiexec, $2: the test program.
set -euo pipefail
mpiexec=$1 prog=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }
mpi() { local np=$1; shift; "$mpiexec" --oversubscribe -np "$np" "$prog" "$@"; }

mpi 4 save "$tmp/ck" || fail "4 ranks: save and continue"
mpi 2 resume "$tmp/ck" || fail "resume on 2 ranks, then 1, then 2 at stage 0"
mpi 2 failing "$tmp/f" || fail "a save rank 1 cannot write: removed on both ranks, then one that works"

rc=0
start=$(date +%s)
timeout 100 "$mpiexec" --oversubscribe -np 2 "$prog" partial "$tmp/p" > out.txt 2> err.txt || rc=$?
took=$(( $(date +%s) - start ))
cat out.txt
[ "$rc" -eq 0 ] || { cat err.txt; fail "partial save: exit $rc (each rank exits 0 once told)"; }
for r in 0 1; do
    grep -q "^partial: rank $r: reported" out.txt ||
        { cat err.txt; fail "partial save: rank $r was not told"; }
done
grep -q "^partial: latest not written" out.txt || fail "partial save: latest was written"
# rank 0 saves, rank 1 calls nothing: the watchdog ends the save after 2 s, the job ends
rc=0
start=$(date +%s)
timeout 100 "$mpiexec" --oversubscribe -np 2 "$prog" idle "$tmp/i" > out.txt 2> err.txt || rc=$?
idle_took=$(( $(date +%s) - start ))
cat out.txt
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat err.txt; fail "idle rank: exit $rc"; }
grep -q "^idle: rank 0: reported" out.txt || { cat err.txt; fail "idle rank: rank 0 was not told"; }
grep -q "^idle: latest not written" out.txt || fail "idle rank: latest was written"
[ "$idle_took" -lt 40 ] || fail "idle rank: the job took $idle_took s to end after a 2 s timeout"
echo "checkpoints on several ranks: 4 -> 2 -> 1 -> 2 (stage 0) resume within tolerance;"
echo "     a save on rank 0 only was reported on both ranks and the job ended in $took s;"
echo "     with rank 1 idle, the watchdog reported it and the job ended in $idle_took s"
