#!/usr/bin/env bash
# `troupe train`'s command line: --help names every flag; bad flags, missing files and bad
# configs exit 2 with a message naming them; a trailing --local_rank=0 is tolerated; an
# --export-llmc file loaded with --load-llmc gives the same eval loss; the MLP trains.
source "$(dirname "$0")/common.sh"

"$troupe" train --help > help.txt
for f in --deepspeed_config --model --vocab --context --channels --layers --heads --widths \
         --load-llmc --export-llmc --train-data --val-data --val-every --val-batches --seq-len \
         --steps --save-dir --save-every --resume --seed --sample --trace --local_rank; do
    grep -q -- "^  $f" help.txt || fail "--help does not describe $f"
done

expect_exit 2 "unknown flag '--bogus'" "${tiny[@]}" --steps 1 --bogus
expect_exit 2 "--steps: expected an integer" "${tiny[@]}" --steps abc
expect_exit 2 "--steps N is required" "${tiny[@]}"
expect_exit 2 "--model: expected gpt2 or mlp" "${tiny[@]}" --steps 1 --model rnn
expect_exit 2 "--widths: expected" --deepspeed_config "$cfg" --model mlp --widths 8 --steps 1
expect_exit 2 "--sample: only for --model gpt2" --deepspeed_config "$cfg" --model mlp --sample 5 --steps 1
expect_exit 2 "--resume needs --save-dir" "${tiny[@]}" --steps 1 --resume
expect_exit 2 "--heads: expected NH after it" "${tiny[@]}" --steps 1 --heads
expect_exit 2 "nope.json" --deepspeed_config "$tmp/nope.json" --train-data "$tmp/train.bin" --steps 1
echo '{"train_micro_batch_size_per_gpu": 4, "optimiser": {}}' > bad.json
expect_exit 2 "bad.json" --deepspeed_config bad.json --train-data "$tmp/train.bin" --steps 1
expect_exit 2 "--train-data: no file matches '$tmp/none_\*.bin'" --deepspeed_config "$cfg" \
    --train-data "$tmp/none_*.bin" --steps 1
expect_exit 2 "--load-llmc: .*missing.bin" "${tiny[@]}" --steps 1 --load-llmc "$tmp/missing.bin"
expect_exit 2 "--seq-len 32: longer than the model's context (16)" "${tiny[@]}" --steps 1 --seq-len 32
# tokens past the vocabulary are found by the loader, while training: exit 1, the engine's word
expect_exit 1 "the model's vocabulary has 50" --deepspeed_config "$cfg" --train-data "$tmp/train.bin" \
    --steps 1 --vocab 50
# a save folder that cannot be made: exit 1, naming it and why; its missing parents are made
touch afile
expect_exit 1 "saving to .*afile/ck: save: cannot create .*afile/ck/global_step1: not a directory" \
    "${tiny[@]}" --steps 1 --save-dir "$tmp/afile/ck"
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
echo "train cli: flags, errors, --local_rank, export/load ($loss1 = $loss2), mlp ($first -> $last)"
