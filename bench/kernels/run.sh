#!/usr/bin/env bash
# Runs the kernel benchmarks (Adam, the thread budget's GEMMs beside the gradient norm, a
# GPT-2 step) and the step's PyTorch peer on the same model, side by side.
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
out=$("$build/bench/kernels/bench_gpt2_step" "$@")
echo "$out"
core=$(sed -n 's/^blas_best_core: //p' <<<"$out")
threads=$(sed -n 's/^threads: //p' <<<"$out")
ours=$(sed -n 's/^gpt2_step_tokens_per_s: \([0-9.]*\).*/\1/p' <<<"$out")
ours_bf16=$(sed -n 's/^gpt2_step_bf16_tokens_per_s: \([0-9.]*\).*/\1/p' <<<"$out")
# PyTorch at its best: every configuration a PyTorch user could pick (precision, threads, ATen's
# CPU capability, OpenBLAS's core and threads), measured here, the best kept
peer=$("$(dirname "$0")/../peers/torch_best.sh" "$core" "$threads" "$@")
echo "$peer"
fp32=$(sed -n 's/^torch_best_fp32_tokens_per_s: \([0-9.]*\).*/\1/p' <<<"$peer")
best=$(sed -n 's/^torch_best_tokens_per_s: \([0-9.]*\).*/\1/p' <<<"$peer")
awk -v a="$ours" -v b="$fp32" 'BEGIN { if (b > 0) printf "gpt2_step_vs_torch_best: %.2f x\n", a / b }'
awk -v a="$ours" -v b="$best" 'BEGIN { if (b > 0) printf "gpt2_step_fp32_vs_torch_best_of_all: %.2f x\n", a / b }'
# Troupe's bf16 step against PyTorch's best of all (its bf16 autocast where the CPU has
# AVX512-BF16); gpt2_step_bf16_of_bound above is against the bf16 products' own rate
awk -v a="$ours_bf16" -v b="$best" 'BEGIN { if (b > 0) printf "gpt2_step_bf16_vs_torch_best: %.2f x\n", a / b }'
