#!/usr/bin/env bash
# --val-batches N measures the same N batches at any world size, split over the ranks: one
# checkpoint, evaluated on 1, 2 and 3 ranks (a resumed run with nothing left to train), prints
# the same validation loss up to float summation order, for the GPT on token shards and for
# the MLP on its built-in task (a batch callback).
source "$(dirname "$0")/common.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# two printed losses (6 decimals) agree within float summation order
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(d <= 2e-6 && -d <= 2e-6) }'; }

# val_on RANKS DIR ARGS...: the validation loss of DIR's checkpoint (step 6) on RANKS ranks
val_on() {
    local n=$1 dir=$2
    shift 2
    timeout -k 5 60 mpirun --oversubscribe -np "$n" "$troupe" train "$@" --steps 6 \
        --save-dir "$dir" --resume --val-batches 5 > out.txt 2> err.txt ||
        { cat out.txt err.txt; fail "$n ranks did not evaluate $dir"; }
    grep -q "^resume: loaded $dir at step 6" out.txt || { cat out.txt; fail "$n ranks: no resume"; }
    sed -n 's/^val: step 6 loss \([0-9.]*\) (5 batches)$/\1/p' out.txt
}

check() {
    local dir=$1 one two three
    shift
    "$troupe" train "$@" --steps 6 --save-dir "$dir" --val-batches 5 > out.txt 2> err.txt ||
        { cat out.txt err.txt; fail "saving $dir"; }
    one=$(val_on 1 "$dir" "$@")
    two=$(val_on 2 "$dir" "$@")
    three=$(val_on 3 "$dir" "$@")
    [ -n "$one" ] && [ -n "$two" ] && [ -n "$three" ] || fail "$dir: no val line ($one/$two/$three)"
    close "$one" "$two" && close "$one" "$three" ||
        fail "$dir: the val loss of one checkpoint is $one on 1 rank, $two on 2, $three on 3"
    echo "$dir: val loss $one on 1 rank, $two on 2, $three on 3"
}

check gpt "${tiny[@]}"
check mlp --deepspeed_config "$cfg" --model mlp --widths 8,16,4
