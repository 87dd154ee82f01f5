#!/usr/bin/env bash
# Runs the kernel benchmarks (Adam, the thread budget's GEMMs beside the gradient norm, a
# GPT-2 step) and the step's PyTorch peer on the same model, side by side.
#   bench/kernels/run.sh BUILD_DIR [--steps N]
# The C benchmark says which OpenBLAS core fits this CPU (blas_best_core); PyTorch gets the
# same OPENBLAS_CORETYPE so both run the best kernels OpenBLAS has, and the same thread count
# (torch's intra-op threads and OpenBLAS's). PyTorch runs with the
# system Python, where Debian's python3-torch installs.
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
# torch.set_num_threads does not reach OpenBLAS's own pool: cap it to the same count
peer=$(OPENBLAS_CORETYPE=$core OPENBLAS_NUM_THREADS=$threads /usr/bin/python3 "$(dirname "$0")/../peers/torch_gpt2_step.py" "$@")
echo "$peer"
theirs=$(sed -n 's/^torch_train_tokens_per_s: \([0-9.]*\).*/\1/p' <<<"$peer")
awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "gpt2_step_vs_torch: %.2f x\n", a / b }'
