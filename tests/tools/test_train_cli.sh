#!/usr/bin/env bash
# `troupe train`'s command line: --help names every flag; bad flags, missing files and bad
# configs exit 2 with a message naming them, before any training (output paths, tokens past
# the vocabulary); a trailing --local_rank=0 is tolerated; an --export-llmc file loaded with
# --load-llmc gives the same eval loss; the MLP trains; memory running out names the model's
# size.
source "$(dirname "$0")/common.sh"

"$troupe" train --help > help.txt
for f in --deepspeed_config --model --vocab --context --channels --layers --heads --widths \
         --load-llmc --export-llmc --train-data --val-data --val-every --val-batches --seq-len \
         --steps --save-dir --save-every --keep-last --resume --overwrite --seed --sample --trace \
         --local_rank; do
    grep -q -- "^  $f" help.txt || fail "--help does not describe $f"
done

expect_exit 2 "unknown flag '--bogus'" "${tiny[@]}" --steps 1 --bogus
expect_exit 2 "--steps: expected an integer" "${tiny[@]}" --steps abc
expect_exit 2 "--steps N is required" "${tiny[@]}"
expect_exit 2 "--model: expected gpt2 or mlp" "${tiny[@]}" --steps 1 --model rnn
expect_exit 2 "--widths: expected" --deepspeed_config "$cfg" --model mlp --widths 8 --steps 1
# --widths: an empty item is an error (not skipped), a bad one is named once, on one line
mlp=(--deepspeed_config "$cfg" --model mlp --steps 1)
expect_exit 2 "--widths: width 2 is empty in '16,,4'" "${mlp[@]}" --widths 16,,4
expect_exit 2 "--widths: width 3 is empty in '16,4,'" "${mlp[@]}" --widths 16,4,
expect_exit 2 "--widths: width 1 is empty in ',16,4'" "${mlp[@]}" --widths ,16,4
expect_exit 2 "--widths: width 2 is '0' in '16,0,4'; expected an integer from 1 to 65536" \
    "${mlp[@]}" --widths 16,0,4
[ "$(wc -l < err.txt)" -eq 1 ] || { cat err.txt; fail "--widths 16,0,4: more than one line"; }
expect_exit 2 "--widths: width 2 is ' 8' in '16, 8,4'" "${mlp[@]}" --widths "16, 8,4"
expect_exit 2 "--widths: at most 16 widths" "${mlp[@]}" --widths 1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1
expect_exit 2 "--sample: only for --model gpt2" --deepspeed_config "$cfg" --model mlp --sample 5 --steps 1
expect_exit 2 "--resume needs --save-dir" "${tiny[@]}" --steps 1 --resume
expect_exit 2 "--heads: expected NH after it" "${tiny[@]}" --steps 1 --heads
expect_exit 2 "nope.json" --deepspeed_config "$tmp/nope.json" --train-data "$tmp/train.bin" --steps 1
echo '{"train_micro_batch_size_per_gpu": 4, "optimiser": {}}' > bad.json
expect_exit 2 "bad.json" --deepspeed_config bad.json --train-data "$tmp/train.bin" --steps 1
expect_exit 2 "--train-data: no file matches '$tmp/none_\*.bin'" --deepspeed_config "$cfg" \
    --train-data "$tmp/none_*.bin" --steps 1
expect_exit 2 "--load-llmc: .*missing.bin" "${tiny[@]}" --steps 1 --load-llmc "$tmp/missing.bin"
expect_exit 2 "--load-llmc: $tmp: is a directory; expected an llm.c file" "${tiny[@]}" --steps 1 \
    --load-llmc "$tmp"
grep -q truncated err.txt && fail "--load-llmc DIR: still called a truncated header"
expect_exit 2 "--load-llmc and --resume: a resumed run takes its weights from the checkpoint" \
    "${tiny[@]}" --steps 1 --load-llmc "$tmp/missing.bin" --save-dir "$tmp/ck_lr" --resume
expect_exit 2 "--resume and --overwrite: choose one" "${tiny[@]}" --steps 1 --save-dir "$tmp/x" \
    --resume --overwrite
expect_exit 2 "--keep-last needs --save-dir" "${tiny[@]}" --steps 1 --keep-last 2
expect_exit 2 "--seq-len 32: longer than the model's context (16)" "${tiny[@]}" --steps 1 --seq-len 32
# tokens past the vocabulary: found when the shards open, before any step, naming the shard,
# the token's position and value (the first token >= 50 of README.md's bytes: 'T', 84, at 2)
expect_exit 2 "$tmp/train.bin: token 2 (byte offset 1028) is 84, outside the model's vocabulary of 50" \
    --deepspeed_config "$cfg" --train-data "$tmp/train.bin" --steps 1 --vocab 50 --print-every 1
grep -q '^step' out.txt && fail "a token past the vocabulary was found only after training began"
# ... in the val shards too (a copy of the train shard with its last token made 300)
cp train.bin badval.bin
printf '\x2c\x01' | dd of=badval.bin bs=1 seek=$(( $(stat -c %s badval.bin) - 2 )) conv=notrunc status=none
expect_exit 2 "badval.bin: token [0-9]* (byte offset $(( $(stat -c %s badval.bin) - 2 ))) is 300, outside the model's vocabulary of 256" \
    "${tiny[@]}" --val-data "$tmp/badval.bin" --steps 1
# output paths unusable: exit 2 before the first step, naming the flag, the path and why; a
# --save-dir's missing parents are made
touch afile
expect_exit 2 "--save-dir $tmp/afile/ck: $tmp/afile is not a directory" \
    "${tiny[@]}" --steps 1 --print-every 1 --save-dir "$tmp/afile/ck"
grep -q '^step' out.txt && fail "--save-dir under a file was found only after training"
expect_exit 2 "--save-dir $tmp/afile: $tmp/afile is not a directory" "${tiny[@]}" --steps 1 \
    --save-dir "$tmp/afile"
expect_exit 2 "--export-llmc /nonexistent/x.bin: its folder /nonexistent: No such file or directory" \
    "${tiny[@]}" --steps 1 --print-every 1 --export-llmc /nonexistent/x.bin
grep -q '^step' out.txt && fail "--export-llmc into a missing folder was found only after training"
expect_exit 2 "--export-llmc $tmp: is a directory" "${tiny[@]}" --steps 1 --export-llmc "$tmp"
expect_exit 2 "--trace $tmp/afile/tr: $tmp/afile is not a directory" "${tiny[@]}" --steps 1 \
    --trace "$tmp/afile/tr"
"$troupe" train "${tiny[@]}" --steps 1 --save-dir "$tmp/new/deep/ck" > /dev/null 2>&1 &&
    test -f "$tmp/new/deep/ck/latest" || fail "--save-dir did not make its missing parents"
head -c 2000 /dev/urandom > junk.bin
expect_exit 2 "junk.bin" --deepspeed_config "$cfg" --train-data "$tmp/junk.bin" --steps 1

# DeepSpeed's launcher appends --local_rank=N: accepted
"$troupe" train "${tiny[@]}" --steps 3 --export-llmc "$tmp/m.bin" --local_rank=0 > run1.txt 2>err.txt ||
    { cat err.txt; fail "a run with --local_rank=0 failed"; }
grep -q '^summary: done at step 3' run1.txt || fail "no summary line"
loss1=$(sed -n 's/^val: step 3 loss \([0-9.]*\).*/\1/p' run1.txt)
[ -n "$loss1" ] || fail "no final val line"

# the exported llm.c file, loaded back, evaluates to the same loss (no step taken)
"$troupe" train "${tiny[@]}" --load-llmc "$tmp/m.bin" --steps 0 > run2.txt 2>err.txt ||
    { cat err.txt; fail "--load-llmc of the export failed"; }
loss2=$(sed -n 's/^val: step 0 loss \([0-9.]*\).*/\1/p' run2.txt)
[ "$loss1" = "$loss2" ] || fail "export -> load: val loss $loss1 became '$loss2'"
expect_exit 2 "--layers 2 conflicts with .*m.bin's num_layers 1" --deepspeed_config "$cfg" \
    --train-data "$tmp/train.bin" --load-llmc "$tmp/m.bin" --layers 2 --steps 1

# the MLP on the built-in task: loss falls
"$troupe" train --deepspeed_config "$cfg" --model mlp --widths 8,32,4 --steps 300 > mlp.txt 2>err.txt ||
    { cat err.txt; fail "mlp run failed"; }
read -r first last < <(sed -n 's/.*train loss \([0-9.]*\) -> \([0-9.]*\).*/\1 \2/p' mlp.txt)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < 0.5 * a) }' ||
    fail "mlp: loss $first -> $last did not halve"

# out of memory: what was being made and how large (here 268517380 parameters under 2 GiB of
# address space: the weights alone take 1 GiB, their gradients another)
# (a sanitizer build cannot start under such a limit: its shadow memory needs terabytes)
if (ulimit -v 2000000; "$troupe" train --help > /dev/null 2>&1); then
    rc=0
    (ulimit -v 2000000; "$troupe" train "${mlp[@]}" --widths 16384,16384,4 > out.txt 2> err.txt) || rc=$?
    [ "$rc" -eq 1 ] || { cat err.txt; fail "out of memory: exit $rc, expected 1"; }
    grep -q "creating the model: not enough memory (the model has 268517380 parameters: 1024.3 MiB each" \
        err.txt || { cat err.txt; fail "out of memory: the message does not say what and how large"; }
else
    echo "out of memory: not checked (this build cannot start under ulimit -v)"
fi
echo "train cli: flags, errors, --local_rank, export/load ($loss1 = $loss2), mlp ($first -> $last)"
