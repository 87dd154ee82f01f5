# Shared by the `troupe train` tests: a tiny byte-level GPT on a shard packed from the README.
# Sourced with $1 = build dir, $2 = source dir; sets what cli.sh sets, and cfg, data, tiny.
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

# expect_exit CODE PATTERN ARGS...: troupe train ARGS exits CODE and stderr matches PATTERN.
expect_exit() { expect_cmd "$1" "$2" train "${@:3}"; }
