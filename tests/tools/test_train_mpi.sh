#!/usr/bin/env bash
# `mpirun -np 2 troupe train`: two ranks train the tiny GPT, only rank 0 reports, and the
# result is the same training as one process with twice the accumulation steps (the final
# losses printed agree within 2 in their last digit: float summation order), at ZeRO 0 and at
# ZeRO 2 with overlap_comm; a 2-rank checkpoint resumes in one process and a 1-process one on
# 2 ranks, ending where the unbroken run ends.
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun --oversubscribe -np 2)
# two printed losses (4 decimals) agree within float summation order: 2 in the last digit
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(d <= 2e-4 && -d <= 2e-4) }'; }

"${mpi[@]}" "$troupe" train "${tiny[@]}" --steps 6 --print-every 1 > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "2 ranks did not train"; }
[ "$(grep -c '^summary:' out.txt)" -eq 1 ] || { cat out.txt; fail "expected one summary (rank 0)"; }
two=$(grep '^summary:' out.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')

cat > ds2.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
one_proc=("${tiny[@]}")
one_proc[1]=$tmp/ds2.json
"$troupe" train "${one_proc[@]}" --steps 6 --print-every 1 > out1.txt 2> err1.txt ||
    { cat out1.txt err1.txt; fail "one process did not train"; }
one=$(grep '^summary:' out1.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$two" "$one" || fail "2 ranks ended at loss $two, one process with GAS 2 at $one"

# ZeRO 2 with overlap_comm: gradients reduce-scattered at every micro-step while the backward
# goes on; the same training again
cat > ds_z2.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "zero_optimization": { "stage": 2, "overlap_comm": true, "reduce_bucket_size": 2000 },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
z2=("${tiny[@]}")
z2[1]=$tmp/ds_z2.json
"${mpi[@]}" "$troupe" train "${z2[@]}" --steps 6 --print-every 1 > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "2 ranks at ZeRO 2 did not train"; }
grep -q "ZeRO stage 2: rank 1 updates parameters" err.txt || { cat err.txt; fail "not ZeRO 2"; }
zero2=$(grep '^summary:' out.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$zero2" "$one" || fail "2 ranks at ZeRO 2 ended at loss $zero2, one process at $one"

# ZeRO 3: each rank keeps its slice of the parameters; the fetcher gathers every layer (the
# head with the embedding's tied wte) one at a time, nothing kept for reuse, two worker
# threads; the same training again, and its checkpoint resumes in one process (3 -> 0) and a
# 1-process checkpoint on 2 ranks at stage 3 (0 -> 3)
cat > ds_z3.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "zero_optimization": { "stage": 3, "reduce_bucket_size": 700,
    "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 1,
    "stage3_max_live_parameters": 1, "stage3_max_reuse_distance": 0 },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
z3=("${tiny[@]}")
z3[1]=$tmp/ds_z3.json
"${mpi[@]}" "$troupe" train "${z3[@]}" --steps 6 --print-every 1 > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "2 ranks at ZeRO 3 did not train"; }
grep -q "fetcher: ZeRO stage 3: each rank keeps its slice" err.txt || { cat err.txt; fail "not ZeRO 3"; }
zero3=$(grep '^summary:' out.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$zero3" "$one" || fail "2 ranks at ZeRO 3 ended at loss $zero3, one process at $one"
# --export-llmc gathers the slices (tr_engine_gather_params): the weights ZeRO 2 exports, bit
# for bit (the same reduce-scatters and updates; only where the parameters live differs)
"${mpi[@]}" "$troupe" train "${z3[@]}" --steps 2 --export-llmc z3.bin > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "ZeRO 3 did not export"; }
"${mpi[@]}" "$troupe" train "${z2[@]}" --steps 2 --export-llmc z2.bin > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "ZeRO 2 did not export"; }
cmp -s z3.bin z2.bin || fail "ZeRO 3's export differs from ZeRO 2's"
rm -rf ck3 && "${mpi[@]}" "$troupe" train "${z3[@]}" --steps 3 --save-dir ck3 > out.txt \
    2> err.txt || { cat out.txt err.txt; fail "2 ranks at ZeRO 3 did not save"; }
"$troupe" train "${one_proc[@]}" --steps 6 --save-dir ck3 --resume > out1.txt 2> err1.txt ||
    { cat out1.txt err1.txt; fail "one process did not resume a ZeRO 3 checkpoint"; }
from3=$(grep '^summary:' out1.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$from3" "$one" || fail "one process resumed from ZeRO 3 ends at $from3, unbroken at $one"
rm -rf ck0 && "$troupe" train "${one_proc[@]}" --steps 3 --save-dir ck0 > /dev/null 2>&1 ||
    fail "one process did not save"
"${mpi[@]}" "$troupe" train "${z3[@]}" --steps 6 --save-dir ck0 --resume > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "2 ranks at ZeRO 3 did not resume a 1-process checkpoint"; }
to3=$(grep '^summary:' out.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$to3" "$one" || fail "2 ranks at ZeRO 3 resumed from one process end at $to3, unbroken at $one"
# 3 -> 3 at another world size: 2 ranks with GAS 2 save at step 3, 4 ranks with GAS 1 (the same
# global batch of 16, the same samples in each step) resume it at stage 3, re-partitioning the
# parameters and the optimizer's slices, and end where the unbroken 2-rank run ends
sed 's/"gradient_accumulation_steps": 1/"gradient_accumulation_steps": 2/' ds_z3.json > ds_z3_g2.json
z3g2=("${tiny[@]}")
z3g2[1]=$tmp/ds_z3_g2.json
"${mpi[@]}" "$troupe" train "${z3g2[@]}" --steps 6 > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "2 ranks at ZeRO 3 with GAS 2 did not train"; }
unbroken=$(grep '^summary:' out.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
rm -rf ck33 && "${mpi[@]}" "$troupe" train "${z3g2[@]}" --steps 3 --save-dir ck33 > /dev/null \
    2>&1 || fail "2 ranks at ZeRO 3 with GAS 2 did not save"
mpirun --oversubscribe -np 4 "$troupe" train "${z3[@]}" --steps 6 --save-dir ck33 --resume \
    > out.txt 2> err.txt || { cat out.txt err.txt; fail "4 ranks at ZeRO 3 did not resume"; }
grep -q "^resume: loaded ck33 at step 3" out.txt || { cat out.txt; fail "4 ranks: not resumed at 3"; }
on4=$(grep '^summary:' out.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$on4" "$unbroken" || fail "4 ranks resumed a 2-rank ZeRO 3 save at $on4, unbroken at $unbroken"

# a rank that never answers an all-gather (it stops posting them after step 0): the watchdog
# names it and the all-gather rank 0 waits in, and the job ends on every rank, well inside the
# timeout
sed 's/"workers": 2 }/"workers": 2 }, "comm": { "timeout_s": 2 }/' ds_z3.json > ds_z3_wd.json
grep -q timeout_s ds_z3_wd.json || fail "ds_z3_wd.json: no timeout"
z3wd=("${tiny[@]}")
z3wd[1]=$tmp/ds_z3_wd.json
rc=0
start=$(date +%s)
TROUPE_FAULT_SILENT_GATHER_RANK=1 timeout -k 5 60 "${mpi[@]}" "$troupe" train "${z3wd[@]}" \
    --steps 4 > out.txt 2> err.txt || rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat out.txt err.txt; fail "silent all-gather: exit $rc"; }
grep -q "^troupe train: comm: watchdog: rank 1 diverged: .*rank 0 has waited [0-9.]* s in the header exchange before collective #[0-9]*, the parameter all-gather, [0-9]* bytes of f32, step 1" \
    err.txt || { cat err.txt; fail "the diagnosis does not name the all-gather rank 0 waits in"; }
[ "$took" -lt 30 ] || fail "the job took $took s to end after a 2 s timeout"

# checkpoints: 2 ranks save at step 3 (each rank its optimizer partition at ZeRO 1); one
# process with GAS 2 (the same global batch) resumes there and ends at the loss the 2-rank run
# without a break ends at; 2 ranks resume the 1-process checkpoint and end there as well
"${mpi[@]}" "$troupe" train "${z1[@]}" --steps 3 --save-dir ck > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "2 ranks did not save"; }
[ -f ck/global_step3/optim_states_rank1.trck ] && [ "$(cat ck/latest)" = global_step3 ] ||
    { ls -R ck; fail "2 ranks: no partition of rank 1 or no latest"; }
# a partition missing, or one that overlaps another (rank 0's copied over rank 1's), is
# refused before anything changes, naming the file
rm -rf bad && cp -r ck bad && rm bad/global_step3/optim_states_rank1.trck
expect_exit 2 "bad/global_step3/optim_states_rank1.trck: cannot open" "${one_proc[@]}" \
    --steps 6 --save-dir bad --resume
cp ck/global_step3/optim_states_rank0.trck bad/global_step3/optim_states_rank1.trck
expect_exit 2 "optim_states_rank[01].trck: lo: its slice \[0, [0-9]*) overlaps at" \
    "${one_proc[@]}" --steps 6 --save-dir bad --resume
"$troupe" train "${one_proc[@]}" --steps 6 --save-dir ck --resume --print-every 1 \
    > out1.txt 2> err1.txt || { cat out1.txt err1.txt; fail "one process did not resume"; }
grep -q "^resume: loaded ck at step 3" out1.txt || { cat out1.txt; fail "not resumed at 3"; }
resumed=$(grep '^summary:' out1.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$resumed" "$two" || fail "one process resumed from 2 ranks ends at $resumed, 2 ranks at $two"
rm -rf ck1 && "$troupe" train "${one_proc[@]}" --steps 3 --save-dir ck1 > /dev/null 2>&1 ||
    fail "one process did not save"
"${mpi[@]}" "$troupe" train "${z1[@]}" --steps 6 --save-dir ck1 --resume > out.txt 2> err.txt ||
    { cat out.txt err.txt; fail "2 ranks did not resume a 1-process checkpoint"; }
back=$(grep '^summary:' out.txt | sed -E 's/.*train loss [0-9.]+ -> ([0-9.]+).*/\1/')
close "$back" "$two" || fail "2 ranks resumed from one process end at $back, without a break at $two"
# a rank whose collective differs (an injected wrong header on rank 1) is named at once, with
# both headers, and the job ends non-zero instead of hanging (the CTest timeout would catch it)
rc=0
TROUPE_FAULT_HEADER_RANK=1 "${mpi[@]}" "$troupe" train "${tiny[@]}" --steps 3 > out.txt \
    2> err.txt || rc=$?
[ "$rc" -ne 0 ] || { cat out.txt err.txt; fail "a divergence was not noticed"; }
grep -q "comm: the ranks diverged: rank 1 is at collective #1, the all-reduce of bucket 0, 30660 bytes of f32, step 0, micro-step 0; rank 0 is at collective #1, the all-reduce of bucket 0, 30656 bytes" \
    err.txt || { cat err.txt; fail "the divergence was not named with both headers"; }
# a rank whose collective really differs (its bucket a float short, TROUPE_FAULT_COUNT_RANK):
# the collective is posted beside its header's exchange, and MPI fails it on one rank (a
# message truncated) or completes it; either way every rank names the divergence from the
# headers, not MPI's error, and the job ends non-zero
rc=0
TROUPE_FAULT_COUNT_RANK=1 timeout -k 5 60 "${mpi[@]}" "$troupe" train "${tiny[@]}" --steps 3 \
    > out.txt 2> err.txt || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat out.txt err.txt; fail "a real divergence: exit $rc"; }
for r in 0 1; do # (no ^: Open MPI's own error text may end without a newline before it)
    grep -q "troupe train: comm: the ranks diverged: rank $((1 - r)) is at collective #1, the all-reduce of bucket 0, $((30652 + 4 * r)) bytes of f32, step 0, micro-step 0; rank $r is at collective #1, the all-reduce of bucket 0, $((30656 - 4 * r)) bytes" \
        err.txt || { cat err.txt; fail "rank $r did not name the real divergence with both headers"; }
done
# a rank that goes silent (stops posting collectives after step 0): after troupe.comm.timeout_s
# rank 0 gathers every rank's table of pending operations and prints one diagnosis naming the
# silent rank and the collective the others wait in; the job ends everywhere, non-zero, well
# inside the test's timeout
cat > ds_wd.json <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "troupe": { "runtime": { "workers": 2 }, "comm": { "timeout_s": 2 } } }
JSON
wd=("${tiny[@]}")
wd[1]=$tmp/ds_wd.json
rc=0
start=$(date +%s)
TROUPE_FAULT_SILENT_RANK=1 timeout -k 5 60 "${mpi[@]}" "$troupe" train "${wd[@]}" --steps 4 \
    > out.txt 2> err.txt || rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat out.txt err.txt; fail "silent rank: exit $rc"; }
# (rank 1's last collective is step 0's last; rank 0 waits in step 1's first)
diag="comm: watchdog: rank 1 diverged: the last collective it started is collective #[0-9]*, .*, step 0, micro-step 0, and nothing is pending on it"
grep -q "^troupe train: $diag" err.txt || { cat err.txt; fail "rank 0's diagnosis does not name the silent rank"; }
grep -q "rank 0 has waited [0-9.]* s in the header exchange before collective #[0-9]*, the all-reduce of bucket 0, 30656 bytes of f32, step 1, micro-step 0; the job ends on every rank" \
    err.txt || { cat err.txt; fail "the diagnosis does not name the collective rank 0 waits in"; }
[ "$(grep -c "^troupe train: comm: watchdog:" err.txt)" -eq 1 ] || { cat err.txt; fail "not one diagnosis"; }
grep -q "^troupe train: comm: rank 1: the job ends: rank 0's watchdog diagnosed a hang" err.txt ||
    { cat err.txt; fail "rank 1 did not end with the verdict"; }
[ "$took" -lt 30 ] || fail "the job took $took s to end after a 2 s timeout"
echo "mpi: 2 ranks end at loss $two (ZeRO 2 with overlap: $zero2; ZeRO 3: $zero3) as one process with GAS 2"
echo "     does, and so do runs resumed across 2 -> 1 and 1 -> 2 ranks;"
echo "     a diverged rank is named; a silent one is caught by the watchdog in $took s"
