#!/usr/bin/env bash
# `troupe train --resume` refuses a checkpoint it cannot trust, with exit 2 (a bad file) and a
# message naming the file: missing, truncated, corrupted (its data, or a length in its header),
# a `latest` naming no tag, another model's (a field of its description: heads, context), and a
# tag whose model and optimizer files come from different saves (another step, another config,
# another format version), naming both files and the field. A checkpoint of format version 1
# (tests/tools/data/ckpt_v1, written before the cross-check fields existed) still resumes, and so
# does one of version 3 (tests/tools/data/ckpt_v3, written before the model's description).
source "$(dirname "$0")/common.sh"

mlp=(--deepspeed_config "$cfg" --model mlp --widths 2,2)
# resume_fails DIR PATTERN: --resume from DIR exits 2 and stderr matches PATTERN
resume_fails() {
    expect_exit 2 "$2" "${mlp[@]}" --steps 20 --save-dir "$1" --resume --print-every 1
    grep -q '^step' out.txt && fail "--resume $1: trained on a refused checkpoint"
    return 0
}
fresh() { # DIR STEPS [ARGS]: a run from scratch saving at its end
    local d=$1 n=$2
    shift 2
    rm -rf "$d"
    "$troupe" train "${mlp[@]}" --steps "$n" --save-dir "$d" "$@" > /dev/null 2> err.txt ||
        { cat err.txt; fail "training $d"; }
}

# --- a tag mixing the files of two saves ---------------------------------------------------
fresh a 5
fresh b 10
cp b/global_step10/optim_states_rank0.trck a/global_step5/
resume_fails a "a/global_step5: model_states.trck has step 5 but optim_states_rank0.trck has step 10: the tag mixes the files of different saves"
# the same step under another config (its hash differs)
sed 's/3e-3/1e-3/' "$cfg" > other.json
fresh a 5
rm -rf c
"$troupe" train --deepspeed_config other.json --model mlp --widths 2,2 --steps 5 --save-dir c \
    > /dev/null 2>&1 || fail "training c"
cp c/global_step5/optim_states_rank0.trck a/global_step5/
resume_fails a "a/global_step5: model_states.trck and optim_states_rank0.trck are of the same step 5 and world size 1 but of different configs (config_hash [0-9]* and [0-9]*)"
# an optimizer file of format version 1 beside a version 4 model file
fresh a 3
cp "$src_dir/tests/tools/data/ckpt_v1/global_step3/optim_states_rank0.trck" a/global_step3/
resume_fails a "a/global_step3: model_states.trck has version 4 but optim_states_rank0.trck has version 1"

# --- bad files: exit 2, the file named -------------------------------------------------------
fresh a 3
rm a/global_step3/optim_states_rank0.trck
resume_fails a "--resume a: load: .*a/global_step3/optim_states_rank0.trck: cannot open: No such file"
fresh a 3
size=$(stat -c %s a/global_step3/model_states.trck)
printf '\x55' | dd of=a/global_step3/model_states.trck bs=1 seek=$((size - 20)) conv=notrunc status=none
resume_fails a "a/global_step3/model_states.trck: checksum: .*(corrupted)"
fresh a 3
truncate -s 100 a/global_step3/model_states.trck
resume_fails a "a/global_step3/model_states.trck: length: .*(truncated?)"
# a corrupted length in a header (byte 21: the payload length's sixth byte) of a whole file
fresh a 3
printf '\xff' | dd of=a/global_step3/model_states.trck bs=1 seek=21 conv=notrunc status=none
resume_fails a "a/global_step3/model_states.trck: corrupted header: payload length [0-9]* bytes is more than the whole file's"
grep -qF "(truncated?)" err.txt && fail "a corrupted header is called truncated"
fresh a 3
printf '\xff' | dd of=a/global_step3/optim_states_rank0.trck bs=1 seek=21 conv=notrunc status=none
resume_fails a "a/global_step3/optim_states_rank0.trck: corrupted header: payload length [0-9]* bytes is more than the whole file's"
fresh a 3
echo global_step99 > a/latest
resume_fails a "a/global_step99/model_states.trck: cannot open"
fresh a 3
rm -rf d
"$troupe" train --deepspeed_config "$cfg" --model mlp --widths 2,3 --steps 3 --save-dir d \
    > /dev/null 2>&1 || fail "training d"
cp d/global_step3/* a/global_step3/
resume_fails a "a/global_step3/model_states.trck: layer 0 ('fc0') out_dim 3, this model has 2"

# --- another model's checkpoint: every field of its description is compared (format 4) -----
gpt=(--deepspeed_config "$cfg" --train-data "$tmp/train.bin" --val-data "$tmp/val.bin"
     --channels 16 --layers 1 --val-batches 2)
rm -rf g
"$troupe" train "${gpt[@]}" --context 16 --heads 4 --steps 3 --save-dir g > /dev/null 2> err.txt ||
    { cat err.txt; fail "training g"; }
# heads change no parameter's shape: only the description tells the models apart
expect_exit 2 "--resume g: load: g/global_step3/model_states.trck: heads 4, this model has 2" \
    "${gpt[@]}" --context 16 --heads 2 --steps 5 --save-dir g --resume --print-every 1
grep -q '^step' out.txt && fail "trained on another model's checkpoint (heads)"
expect_exit 2 "--resume g: load: g/global_step3/model_states.trck: context 16, this model has 32" \
    "${gpt[@]}" --context 32 --heads 4 --steps 5 --save-dir g --resume --print-every 1
grep -q '^step' out.txt && fail "trained on another model's checkpoint (context)"
"$troupe" train "${gpt[@]}" --context 16 --heads 4 --steps 5 --save-dir g --resume > g.txt 2>&1 ||
    { cat g.txt; fail "the same model does not resume"; }
grep -q "^resume: loaded g at step 3" g.txt || { cat g.txt; fail "g: not resumed at 3"; }

# --- format version 1 still resumes ----------------------------------------------------------
cp -r "$src_dir/tests/tools/data/ckpt_v1" v1
"$troupe" train "${mlp[@]}" --steps 5 --save-dir v1 --resume > v1.txt 2>err.txt ||
    { cat v1.txt err.txt; fail "--resume of a version 1 checkpoint"; }
grep -q "^resume: loaded v1 at step 3" v1.txt || { cat v1.txt; fail "version 1: not resumed at 3"; }
grep -q "^summary: done at step 5" v1.txt || fail "version 1: the resumed run did not finish"
# --- format version 3 (written before the model's description) still resumes ------------------
cp -r "$src_dir/tests/tools/data/ckpt_v3" v3
"$troupe" train "${mlp[@]}" --steps 5 --save-dir v3 --resume > v3.txt 2>err.txt ||
    { cat v3.txt err.txt; fail "--resume of a version 3 checkpoint"; }
grep -q "^resume: loaded v3 at step 3" v3.txt || { cat v3.txt; fail "version 3: not resumed at 3"; }
grep -q "^summary: done at step 5" v3.txt || fail "version 3: the resumed run did not finish"
echo "train resume: mixed tags (step, config_hash, version) and bad files refused with exit 2; versions 1 and 3 resume"
