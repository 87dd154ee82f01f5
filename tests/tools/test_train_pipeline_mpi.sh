#!/usr/bin/env bash
# `mpirun troupe train` with pipeline.stages: one rank per stage (and per data-parallel replica,
# stage-major), activations and gradients crossing between ranks. The training is the
# unpipelined one with the same global batch: 2 stages on 2 ranks (1f1b) and 3 on 3 (zb) end
# at the one-process run's losses, 2 stages x 2 replicas on 4 ranks (ZeRO 1) at the 2-rank
# data-parallel run's (within 1e-5 relative: float summation order); a pipelined 2-rank
# checkpoint resumes in one process without a pipeline and ends where the unbroken run ends,
# and a 2 x 2 one at ZeRO 0 (one optimizer file per stage) on the same pipeline and on 2
# data-parallel ranks; --export-llmc from the pipeline holds the one-process run's weights;
# ranks that are not a multiple of the stages are refused naming the key, and so is an fp16
# communication_data_type; a transfer whose header does not match fails the job naming both
# stages, a rank that never joins its stage's reductions makes the others name the reduction
# after troupe.comm.timeout_s, and no rank hangs.
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

conf() { # NAME EXTRA_JSON
    cat > "$tmp/$1.json" <<JSON
{ "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "steps_per_print": 5,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } }, $2
  "troupe": { "runtime": { "workers": 1 } } }
JSON
}
args() { # NAME: troupe train's arguments with that config
    a=("${tiny[@]}")
    a[1]=$tmp/$1.json
    a+=(--layers 3 --steps 5 --print-every 1)
}
# train NP NAME [ARGS...]: NAME.out/err; prints "LOSS VAL" (the summary's last train loss and
# the validation loss)
train() {
    local np=$1 name=$2
    args "$name"
    local cmd=("$troupe" train "${a[@]}" "${@:3}")
    [ "$np" -eq 1 ] || cmd=(timeout 100 mpirun --oversubscribe -np "$np" "${cmd[@]}")
    "${cmd[@]}" > "$name.$np.out" 2> "$name.$np.err" ||
        { cat "$name.$np.out" "$name.$np.err" >&2; fail "$name on $np rank(s) did not train"; }
    sed -nE 's/^summary: .*train loss [0-9.]+ -> ([0-9.]+) .*val loss ([0-9.]+).*/\1 \2/p' \
        "$name.$np.out"
}
# same A B: two "LOSS VAL" pairs equal within 1e-5 relative
same() {
    awk -v a="$1" -v b="$2" 'BEGIN { n = split(a, x, " "); if (split(b, y, " ") != n || n != 2)
        exit 1; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d
        if (d > 1e-5 * x[i]) exit 1 } }'
}

conf plain ''
conf s2 '"pipeline": { "stages": 2 },'
conf s3zb '"pipeline": { "stages": 3, "schedule": "zb", "partition": "uniform" },'
conf s2z1 '"pipeline": { "stages": 2 }, "zero_optimization": { "stage": 1 },'

one=$(train 1 plain)
[ -n "$one" ] || fail "no summary from one process"
r=$(train 2 s2); same "$one" "$r" || fail "2 stages on 2 ranks ended at '$r', one process at '$one'"
grep -q "pipeline: stage 1 of 2 (1f1b, partition parameters): layers" s2.2.err ||
    { cat s2.2.err; fail "no stage line on 2 ranks"; }
grep -Eq "^steps: 5 loss: [0-9.]+ iter time \(s\): [0-9.]+ samples/sec: [0-9.]+$" s2.2.out ||
    { cat s2.2.out; fail "no PipelineEngine line on 2 ranks"; }
[ "$(grep -c '^summary:' s2.2.out)" -eq 1 ] || fail "expected one summary (rank 0)"
r=$(train 3 s3zb); same "$one" "$r" || fail "3 stages (zb) on 3 ranks ended at '$r', one process at '$one'"

dp=$(train 2 plain)
r=$(train 4 s2z1); same "$dp" "$r" ||
    fail "2 stages x 2 replicas (ZeRO 1) ended at '$r', 2 data-parallel ranks at '$dp'"

# --export-llmc from the pipeline (rank 0 writes the file: every stage's parameters gathered)
# holds the one-process run's weights within 1e-5, none left at zero
floats() { od -An -v -f -j 1024 "$1" | tr -s ' ' '\n' | grep -v '^$'; }
train 2 s2 --export-llmc pipe.bin > /dev/null
train 1 plain --export-llmc one.bin > /dev/null
paste <(floats pipe.bin) <(floats one.bin) | awk '{ d = $1 - $2; if (d < 0) d = -d
    m = $2 < 0 ? -$2 : $2; if (m < 1) m = 1; if (d > 1e-5 * m || ($1 == 0 && $2 != 0)) bad++ }
    END { exit bad > 0 || NR == 0 }' || fail "the pipeline's --export-llmc differs from one process's"

# a checkpoint of the 2-rank pipeline at step 3, resumed in one process without one
train 2 s2z1 --steps 3 --save-dir ck > /dev/null
[ -f ck/global_step3/optim_states_rank1.trck ] && [ "$(cat ck/latest)" = global_step3 ] ||
    { ls -R ck; fail "the pipelined ranks saved no checkpoint"; }
r=$(train 1 plain --save-dir ck --resume); same "$one" "$r" ||
    fail "resumed in one process: ended at '$r', the unbroken run at '$one'"

# a 2 x 2 checkpoint at ZeRO 0, where a stage's replicas hold the same optimizer state: one
# parameter file and one optimizer file per stage; resumed on the same pipeline, and on 2
# data-parallel ranks without
conf s2z0 '"pipeline": { "stages": 2 },'
train 4 s2z0 --steps 3 --save-dir ck0 > /dev/null
[ -f ck0/global_step3/optim_states_rank1.trck ] && [ ! -f ck0/global_step3/optim_states_rank2.trck ] &&
    [ -f ck0/global_step3/model_states_stage1.trck ] ||
    { ls -R ck0; fail "2 x 2 at ZeRO 0 did not save one parameter file and one optimizer file per stage"; }
cp -r ck0 ck0dp
cp -r ck0 ck0bad
rm ck0bad/global_step3/model_states_stage1.trck # a stage's parameters missing: named, refused
args plain
if "$troupe" train "${a[@]}" --save-dir ck0bad --resume > miss.out 2> miss.err; then
    fail "resumed without stage 1's parameter file"
fi
grep -q "model_states_stage1.trck" miss.err || { cat miss.err; fail "the missing file was not named"; }
r=$(train 4 s2z0 --save-dir ck0 --resume); same "$dp" "$r" ||
    fail "2 x 2 resumed on 2 x 2: ended at '$r', 2 data-parallel ranks at '$dp'"
r=$(train 2 plain --save-dir ck0dp --resume); same "$dp" "$r" ||
    fail "2 x 2 resumed on 2 data-parallel ranks: ended at '$r', unbroken at '$dp'"

# refused before the first step: 2 stages on 3 ranks
args s2
if timeout 60 mpirun --oversubscribe -np 3 "$troupe" train "${a[@]}" > bad.out 2> bad.err; then
    fail "2 stages on 3 ranks trained"
fi
grep -q "pipeline.stages: 2 stages on 3 ranks: the ranks must be a multiple of the stages" \
    bad.err || { cat bad.err; fail "no error naming pipeline.stages"; }
# the stages' reductions are fp32: a 16-bit communication_data_type given is refused, named
conf s2wire '"pipeline": { "stages": 2 }, "communication_data_type": "fp16",'
args s2wire
if timeout 60 mpirun --oversubscribe -np 2 "$troupe" train "${a[@]}" > wire.out 2> wire.err; then
    fail "a pipeline across ranks trained with an fp16 communication_data_type"
fi
grep -q "communication_data_type: a pipeline across ranks reduces its stages' gradients in fp32" \
    wire.err || { cat wire.err; fail "no error naming communication_data_type"; }
args s2
# stage 0's rank sends one element too many: rank 1 names both stages, the job ends
rc=0
TROUPE_FAULT_PIPE_STAGE=0 timeout 60 mpirun --oversubscribe -np 2 -x TROUPE_FAULT_PIPE_STAGE \
    "$troupe" train "${a[@]}" > fault.out 2> fault.err || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat fault.err; fail "exit $rc with a bad header (124: hung)"; }
grep -q "stage 1 received from stage 0 an activation of .* another element count" fault.err ||
    { cat fault.err; fail "the mismatch was not reported naming both stages"; }
# a rank that never joins its stage's reductions: the others give up after troupe.comm.timeout_s
# naming the reduction, and the job ends (no rank hangs)
sed 's/"workers": 1 }/"workers": 1 }, "comm": { "timeout_s": 3 }/' "$tmp/s2.json" > "$tmp/s2silent.json"
args s2silent
rc=0
TROUPE_FAULT_PIPE_SILENT_RANK=1 timeout 60 mpirun --oversubscribe -np 4 \
    -x TROUPE_FAULT_PIPE_SILENT_RANK "$troupe" train "${a[@]}" > silent.out 2> silent.err || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { cat silent.err; fail "exit $rc with a silent rank (124: hung)"; }
grep -Eq "rank [0-9] \(stage [01], replica [01]\): the (stage's gradient all-reduce among its replicas|tied gradients' all-reduce between stages) has been pending for" \
    silent.err || { cat silent.err; fail "the reduction a rank never joined was not named"; }
echo "ok: pipelined troupe train across 2, 3 and 2x2 ranks trains as the unpipelined runs"
