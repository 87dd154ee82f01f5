#!/usr/bin/env bash
# Checkpoints on several ranks (test_engine_ckpt_dp.c says what each job checks): 4 ranks save
# and continue; 2 ranks, then 1, then 2 at stage 0 resume from it with the same losses; a save
# called on rank 0 only is reported on both ranks at once, writes no latest, and the job ends
# instead of hanging. $1: mpiexec, $2: the test program.
set -euo pipefail
mpiexec=$1 prog=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mpi() { local np=$1; shift; "$mpiexec" --oversubscribe -np "$np" "$prog" "$@"; }

mpi 4 save "$tmp/ck" || fail "4 ranks: save and continue"
mpi 2 resume "$tmp/ck" || fail "resume on 2 ranks, then 1, then 2 at stage 0"

rc=0
start=$(date +%s)
timeout 100 "$mpiexec" --oversubscribe -np 2 "$prog" partial "$tmp/p" > out.txt 2> err.txt || rc=$?
took=$(( $(date +%s) - start ))
cat out.txt
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat err.txt; fail "partial save: exit $rc"; }
for r in 0 1; do
    grep -q "^partial: rank $r: reported" out.txt ||
        { cat err.txt; fail "partial save: rank $r was not told"; }
done
grep -q "^partial: latest not written" out.txt || fail "partial save: latest was written"
echo "checkpoints on several ranks: 4 -> 2 -> 1 -> 2 (stage 0) resume within tolerance;"
echo "     a save on rank 0 only was reported on both ranks and the job ended in $took s"
