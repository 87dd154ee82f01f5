# Shared by the `troupe train` tests: a tiny byte-level GPT on a shard packed from the README.
# Sourced with $1 = build dir, $2 = source dir; sets what cli.sh sets, and cfg, data, tiny, z1.
source "$(dirname "${BASH_SOURCE[0]}")/cli.sh"
src_dir=$(cd "$2" && pwd)
"$build_dir/tools/pack_text" train.bin val.bin 10 "$src_dir/README.md" "$src_dir/docs/runtime.md" >/dev/null
cfg=$tmp/ds.json
cat > "$cfg" <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
# the tiny model and data, for every run
tiny=(--deepspeed_config "$cfg" --train-data "$tmp/train.bin" --val-data "$tmp/val.bin"
      --context 16 --channels 16 --layers 1 --heads 2 --val-batches 2)

# z1: the tiny model at ZeRO 1 (ds_z1.json), for the runs on several ranks
cat > "$tmp/ds_z1.json" <<'JSON'
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "optimizer": { "type": "AdamW", "params": { "lr": 3e-3 } },
  "zero_optimization": { "stage": 1 },
  "troupe": { "runtime": { "workers": 2 } } }
JSON
z1=("${tiny[@]}")
z1[1]=$tmp/ds_z1.json

# expect_exit CODE PATTERN ARGS...: troupe train ARGS exits CODE and stderr matches PATTERN.
expect_exit() { expect_cmd "$1" "$2" train "${@:3}"; }

# run_steps CONFIG OUT ARGS...: troupe train on the tiny model, printing every step; OUT gets
# the step and val lines without the throughput (OUT.txt, OUT.err: the whole output).
run_steps() {
    local c=$1 out=$2
    shift 2
    "$troupe" train "${tiny[@]}" --deepspeed_config "$c" --print-every 1 "$@" > "$out.txt" \
        2> "$out.err" || { cat "$out.err"; fail "troupe train $c $*"; }
    grep -E '^(step|val:)' "$out.txt" | sed 's/ [0-9]* tok\/s.*//' > "$out"
}

# same_after_resume STRAIGHT RESUMED FROM TO: RESUMED printed what STRAIGHT printed for steps
# FROM..TO (single digits) and the same validation loss.
same_after_resume() {
    grep "^step [$3-$4]/" "$1" > "$1.want"
    grep "^step [$3-$4]/" "$2" > "$2.got"
    [ "$(wc -l < "$2.got")" -eq $(($4 - $3 + 1)) ] || { cat "$2"; fail "the resumed run did not run steps $3 to $4"; }
    diff "$1.want" "$2.got" || fail "the resumed run differs from the straight one ($2)"
    diff <(grep '^val:' "$1") <(grep '^val:' "$2") || fail "val loss differs after resume ($2)"
}

# interrupt_at_step3 SAVE_DIR ARGS...: troupe train on the tiny model with ARGS and --save-dir
# SAVE_DIR, sent SIGINT once it has printed its third step. It must exit 0, saved at the step
# it stopped at, which goes to $step (int.txt, int_err.txt: its output).
interrupt_at_step3() {
    local dir=$1 pid rc=0
    shift
    "$troupe" train "${tiny[@]}" "$@" --steps 1000000 --save-dir "$dir" --print-every 1 \
        > int.txt 2> int_err.txt &
    pid=$!
    for _ in $(seq 600); do # up to 60 s for the third step
        grep -q '^step 3/' int.txt 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    grep -q '^step 3/' int.txt || { cat int.txt int_err.txt; fail "no third step"; }
    kill -INT "$pid"
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ] || { cat int.txt int_err.txt; fail "after SIGINT: exit $rc, expected 0"; }
    step=$(sed -n 's/^summary: stopped (signal) at step \([0-9]*\).*/\1/p' int.txt)
    [ -n "$step" ] || { cat int.txt int_err.txt; fail "no 'stopped' summary"; }
    grep -q "^saved: $dir/global_step$step (latest)" int.txt ||
        { cat int.txt; fail "no 'saved:' line for step $step"; }
}
