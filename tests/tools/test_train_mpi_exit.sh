#!/usr/bin/env bash
# Every rank of a 2-rank `troupe train` ends with the same exit status, so mpirun's does not
# depend on which rank exits first: a --resume whose optim_states_rank1.trck is corrupted (only
# rank 1 reads its payload) is a bad checkpoint, status 2, on both ranks, and both name the file.
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# each rank's status and stderr in status.R and err.R (mpirun reports only one status; told not
# to abort the job at the first non-zero one, it lets every rank end by itself)
cat > rank.sh <<'SH'
#!/usr/bin/env bash
"$@" 2> "err.$OMPI_COMM_WORLD_RANK"
rc=$?
echo "$rc" > "status.$OMPI_COMM_WORLD_RANK"
exit "$rc"
SH
chmod +x rank.sh

mpirun --oversubscribe -np 2 "$troupe" train "${z1[@]}" --steps 3 --save-dir ck > out.txt \
    2> err.txt || { cat out.txt err.txt; fail "2 ranks did not save"; }
f=ck/global_step3/optim_states_rank1.trck
size=$(stat -c %s "$f")
printf '\377\377\377\377' | dd of="$f" bs=1 seek=$((size - 8)) conv=notrunc 2> /dev/null
rm -f status.* err.*
timeout -k 5 60 mpirun --oversubscribe --mca orte_abort_on_non_zero_status 0 -np 2 ./rank.sh "$troupe" train "${z1[@]}" --steps 6 \
    --save-dir ck --resume > out.txt 2> mpirun.txt || true
for r in 0 1; do
    [ "$(cat "status.$r" 2> /dev/null)" = 2 ] ||
        { cat err.* mpirun.txt; fail "rank $r exited $(cat "status.$r" 2> /dev/null), expected 2"; }
    grep -q "^troupe train: --resume ck: load: .*$f: checksum: .*(corrupted)" "err.$r" ||
        { cat "err.$r"; fail "rank $r's message does not name $f"; }
done
echo "mpi: a corrupted optim_states_rank1.trck ends both ranks with status 2, naming the file"
