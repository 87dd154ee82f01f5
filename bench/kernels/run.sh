#!/usr/bin/env bash
# Runs the kernel benchmarks (Adam, the thread budget's GEMMs beside the gradient norm, a
# GPT-2 step in fp32 and bf16) and their PyTorch 2 peers on the same work, side by side; the
# step's ratios come from ROUNDS (3) head-to-head rounds after the peer's search.
#   bench/kernels/run.sh BUILD_DIR [--steps N]
# PyTorch 2 is the peers' environment (bench/peers/setup.sh --python, `make peers`); bench_adam
# gets its python through TR_BENCH_PYTHON. bench/peers/torch_best.sh runs PyTorch's step under
# every configuration a user could pick (eager or torch.compile, fp32 or bf16 autocast, 1
# thread or as many as Troupe, ATen's CPU capability) and the ratios are against its best: fp32
# against the best fp32 configuration, and against the best of all. Without the environment
# (setup.sh exits 3) one line says why, and Troupe's figures print without the ratios.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [--steps N]}
shift
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
peer=1
if py=$("$here/../peers/setup.sh" --python 2> "$tmp/setup.err"); then
    cat "$tmp/setup.err" >&2
    export TR_BENCH_PYTHON=$py
else
    rc=$?
    [ $rc -eq 3 ] || { cat "$tmp/setup.err" >&2; exit $rc; }
    echo "peer: skipped: $(sed -n 's/^peers: skipped: //p' "$tmp/setup.err" | tail -1)" \
        "(Troupe's figures follow, without the ratios to PyTorch)"
    unset TR_BENCH_PYTHON
    peer=0
fi
"$build/bench/kernels/bench_adam"
"$build/bench/kernels/bench_parallel"
num() { sed -n "s/^$1: \([0-9.]*\).*/\1/p"; } # NAME: the number of a `NAME: value unit` line
out=$("$build/bench/kernels/bench_gpt2_step" "$@")
echo "$out"
threads=$(sed -n 's/^threads: //p' <<<"$out")
[ $peer -eq 1 ] || exit 0
# PyTorch at its best: every configuration a PyTorch user could pick (eager or compiled,
# precision, threads, ATen's CPU capability), measured here, the best kept; each line as it comes
"$here/../peers/torch_best.sh" "$threads" "$@" | tee "$tmp/search"
search=$(cat "$tmp/search")
# Head to head: the search above ran PyTorch minutes after Troupe's step, on a machine whose
# speed drifts; so PyTorch's best configurations and Troupe's step now run in turn, ROUNDS
# times, and the ratios are of the medians (each side's runs are printed).
rounds=${ROUNDS:-3}
torch_run() { # [ENV=VALUE...] --threads T --autocast P [--compile]: tokens/s of one run
    local env=()
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do env+=("$1"); shift; done
    { env "${env[@]}" "$py" "$here/../peers/torch_gpt2_step.py" "$@" "${args[@]}" 2>&1 || true; } |
        num torch_train_tokens_per_s
}
median() { tr ' ' '\n' | sed '/^$/d' | sort -n |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
args=("$@")
read -r -a fp32_run <<<"$(sed -n 's/^torch_best_fp32_run: //p' <<<"$search")"
read -r -a best_run <<<"$(sed -n 's/^torch_best_run: //p' <<<"$search")"
if [ ${#best_run[@]} -eq 0 ]; then
    echo "head_to_head: none (no PyTorch configuration ran; their errors are above)"
    exit 0
fi
h_ours="" h_ours_bf16="" h_fp32="" h_best=""
for _ in $(seq "$rounds"); do
    o=$("$build/bench/kernels/bench_gpt2_step" "$@")
    h_ours+="$(num gpt2_step_tokens_per_s <<<"$o") "
    h_ours_bf16+="$(num gpt2_step_bf16_tokens_per_s <<<"$o") "
    if [ ${#fp32_run[@]} -gt 0 ]; then h_fp32+="$(torch_run "${fp32_run[@]}") "; fi
    if [ "${best_run[*]}" != "${fp32_run[*]}" ]; then h_best+="$(torch_run "${best_run[@]}") "; fi
done
if [ "${best_run[*]}" = "${fp32_run[*]}" ]; then
    h_best=$h_fp32
elif [ -z "$h_best" ]; then
    echo "head_to_head_torch_best: its configuration (${best_run[*]}) failed in every round: no best-of-all ratio"
fi
echo "head_to_head_rounds: $rounds"
echo "head_to_head_troupe_fp32: ${h_ours}tokens/s"
echo "head_to_head_troupe_bf16: ${h_ours_bf16}tokens/s"
echo "head_to_head_torch_best_fp32: ${h_fp32}tokens/s"
echo "head_to_head_torch_best: ${h_best}tokens/s"
ours=$(median <<<"$h_ours") ours_bf16=$(median <<<"$h_ours_bf16")
fp32=$(median <<<"$h_fp32") best=$(median <<<"$h_best")
awk -v a="$ours" -v b="$fp32" 'BEGIN { if (b > 0) printf "gpt2_step_vs_torch_best: %.2f x\n", a / b; else print "gpt2_step_vs_torch_best: unavailable: PyTorch'"'"'s runs failed in every round" }'
awk -v a="$ours" -v b="$best" 'BEGIN { if (b > 0) printf "gpt2_step_fp32_vs_torch_best_of_all: %.2f x\n", a / b; else print "gpt2_step_fp32_vs_torch_best_of_all: unavailable: PyTorch'"'"'s runs failed in every round" }'
# Troupe's bf16 step against PyTorch's best of all (its bf16 autocast where the CPU has
# AVX512-BF16); gpt2_step_bf16_of_bound above is against the bf16 products' own rate
awk -v a="$ours_bf16" -v b="$best" 'BEGIN { if (b > 0) printf "gpt2_step_bf16_vs_torch_best: %.2f x\n", a / b; else print "gpt2_step_bf16_vs_torch_best: unavailable: PyTorch'"'"'s runs failed in every round" }'
