#!/usr/bin/env bash
# Across ranks, a transfer whose header does not match (rank 0 sends one element too many) is
# reported by rank 1 naming both stages; its link tells rank 0, whose run fails too, and the job
# ends instead of hanging. $1: mpiexec,
# $2: test_pipe_mpi.
set -euo pipefail
rc=0
out=$(timeout 50 "$1" --oversubscribe -np 2 "$2" fault 2>&1) || rc=$?
echo "$out" | grep -v '^troupe: WARN'
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL: exit $rc (124: it hung)"; exit 1; }
echo "$out" | grep -q "^fault: rank 1: reported" ||
    { echo "FAIL: rank 1 did not report the mismatch naming both stages"; exit 1; }
echo "$out" | grep -q "^fault: rank 0: .*rank 0's stage stopped: the pipeline failed on another rank" ||
    { echo "FAIL: rank 0 was not told"; exit 1; }
echo "ok: the mismatch across ranks was reported by rank 1, rank 0 was told, the job ended"
