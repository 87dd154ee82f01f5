#!/usr/bin/env bash
# Runs the kernel benchmarks (Adam, the thread budget's GEMMs beside the gradient norm, a
# GPT-2 step in fp32 and bf16) and the step's PyTorch peer on the same model, side by side;
# the ratios come from ROUNDS (3) head-to-head rounds after the peer's search.
#   bench/kernels/run.sh BUILD_DIR [--steps N]
# The C benchmark says which OpenBLAS core fits this CPU (blas_best_core) and how many threads
# Troupe uses; bench/peers/torch_best.sh runs PyTorch under every configuration a user could
# pick (fp32 and bf16 autocast, 1 thread or as many as Troupe, ATen's CPU capability, OpenBLAS's
# core and thread count) and the ratios are against its best: fp32 against the best fp32
# configuration, and against the best of all. PyTorch runs with the system Python, where
# Debian's python3-torch installs.
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [--steps N]}
shift
"$build/bench/kernels/bench_adam"
"$build/bench/kernels/bench_parallel"
num() { sed -n "s/^$1: \([0-9.]*\).*/\1/p"; } # NAME: the number of a `NAME: value unit` line
out=$("$build/bench/kernels/bench_gpt2_step" "$@")
echo "$out"
core=$(sed -n 's/^blas_best_core: //p' <<<"$out")
threads=$(sed -n 's/^threads: //p' <<<"$out")
# PyTorch at its best: every configuration a PyTorch user could pick (precision, threads, ATen's
# CPU capability, OpenBLAS's core and threads), measured here, the best kept
peer=$("$(dirname "$0")/../peers/torch_best.sh" "$core" "$threads" "$@")
echo "$peer"
# Head to head: the search above ran PyTorch minutes after Troupe's step, on a machine whose
# speed drifts; so PyTorch's best configurations and Troupe's step now run in turn, ROUNDS
# times, and the ratios are of the medians (each side's runs are printed).
rounds=${ROUNDS:-3}
torch_run() { # ENV... --threads T --autocast P: tokens/s of one run
    local env=()
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do env+=("$1"); shift; done
    env "${env[@]}" /usr/bin/python3 "$(dirname "$0")/../peers/torch_gpt2_step.py" "$@" "${args[@]}" 2>&1 |
        num torch_train_tokens_per_s
}
median() { tr ' ' '\n' | sed '/^$/d' | sort -n |
    awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
args=("$@")
read -r -a fp32_run <<<"$(sed -n 's/^torch_best_fp32_run: //p' <<<"$peer")"
read -r -a best_run <<<"$(sed -n 's/^torch_best_run: //p' <<<"$peer")"
h_ours="" h_ours_bf16="" h_fp32="" h_best=""
for _ in $(seq "$rounds"); do
    o=$("$build/bench/kernels/bench_gpt2_step" "$@")
    h_ours+="$(num gpt2_step_tokens_per_s <<<"$o") "
    h_ours_bf16+="$(num gpt2_step_bf16_tokens_per_s <<<"$o") "
    h_fp32+="$(torch_run "${fp32_run[@]}") "
    if [ "${best_run[*]}" != "${fp32_run[*]}" ]; then h_best+="$(torch_run "${best_run[@]}") "; fi
done
h_best=${h_best:-$h_fp32}
echo "head_to_head_rounds: $rounds"
echo "head_to_head_troupe_fp32: ${h_ours}tokens/s"
echo "head_to_head_troupe_bf16: ${h_ours_bf16}tokens/s"
echo "head_to_head_torch_best_fp32: ${h_fp32}tokens/s"
echo "head_to_head_torch_best: ${h_best}tokens/s"
ours=$(median <<<"$h_ours") ours_bf16=$(median <<<"$h_ours_bf16")
fp32=$(median <<<"$h_fp32") best=$(median <<<"$h_best")
awk -v a="$ours" -v b="$fp32" 'BEGIN { if (b > 0) printf "gpt2_step_vs_torch_best: %.2f x\n", a / b }'
awk -v a="$ours" -v b="$best" 'BEGIN { if (b > 0) printf "gpt2_step_fp32_vs_torch_best_of_all: %.2f x\n", a / b }'
# Troupe's bf16 step against PyTorch's best of all (its bf16 autocast where the CPU has
# AVX512-BF16); gpt2_step_bf16_of_bound above is against the bf16 products' own rate
awk -v a="$ours_bf16" -v b="$best" 'BEGIN { if (b > 0) printf "gpt2_step_bf16_vs_torch_best: %.2f x\n", a / b }'
