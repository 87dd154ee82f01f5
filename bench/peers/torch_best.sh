#!/usr/bin/env bash
# PyTorch 2's GPT-2 training step (torch_gpt2_step.py) under every configuration a PyTorch user
# could pick on a CPU, each measured in this run, and the best of them: the peer Troupe's step
# is compared against.
#   bench/peers/torch_best.sh THREADS [torch_gpt2_step.py args...]
# THREADS: the cores Troupe uses. The python is $TR_BENCH_PYTHON, else the peers' environment's
# (bench/peers/setup.sh --python; exit 3 when it cannot be had). Configurations: eager or
# torch.compile (inductor; its compilation in the untimed warm-up steps); precision fp32 or bf16
# autocast; torch.set_num_threads 1 or THREADS; ATEN_CPU_CAPABILITY as detected or avx512
# (where the CPU has AVX-512). (PyPI's torch multiplies with MKL and oneDNN, so OpenBLAS's
# settings, searched for Debian's torch 1.13, no longer apply.) Prints torch_version, each
# configuration's `torch_config: ... tokens/s` line with its warm-up (compilation included) and
# timed steps, or its error in one line, then
#   torch_best_fp32_config / torch_best_fp32_tokens_per_s  (the best fp32 configuration)
#   torch_best_config / torch_best_tokens_per_s            (the best of all)
# and, for running them again (bench/kernels/run.sh does, in turn with Troupe's step):
#   torch_best_fp32_run / torch_best_run: [ENV=VALUE...] --threads T --autocast P [--compile]
set -euo pipefail
threads=${1:?usage: torch_best.sh THREADS [args]}
shift
here=$(dirname "$0")
py=${TR_BENCH_PYTHON:-$("$here/setup.sh" --python)} || exit 3
echo "torch_version: $("$py" -c 'import torch; print(torch.__version__)')"
caps=("")
grep -qw avx512f /proc/cpuinfo && caps+=(avx512)
ts=(1)
[ "$threads" != 1 ] && ts+=("$threads")
num() { sed -n "s/^$1: \([0-9.]*\).*/\1/p" <<<"$out"; } # NAME: the number of its line in $out
best_fp32=0 best=0 best_fp32_cfg="" best_cfg="" best_fp32_run="" best_run=""
for mode in eager compile; do
    for prec in none bf16; do
        for t in "${ts[@]}"; do
            for cap in "${caps[@]}"; do
                env=()
                [ -n "$cap" ] && env+=(ATEN_CPU_CAPABILITY="$cap")
                a=(--threads "$t" --autocast "$prec")
                [ $mode = compile ] && a+=(--compile)
                run="${env[*]:+${env[*]} }${a[*]}"
                cfg="mode=$mode precision=$([ $prec = bf16 ] && echo bf16-autocast || echo fp32)"
                cfg+=" torch_threads=$t aten_cpu_capability=${cap:-detected}"
                out=$(env "${env[@]}" "$py" "$here/torch_gpt2_step.py" "${a[@]}" "$@" 2>&1) || true
                tps=$(num torch_train_tokens_per_s)
                if [ -z "$tps" ]; then
                    echo "torch_config: $cfg: failed: $(tail -1 <<<"$out")"
                    continue
                fi
                echo "torch_config: $cfg: $tps tokens/s (warm-up $(num torch_train_warmup) s," \
                    "best of $(num torch_train_timed_steps) timed steps)"
                if awk -v a="$tps" -v b="$best" 'BEGIN { exit !(a > b) }'; then
                    best=$tps best_cfg=$cfg best_run=$run
                fi
                if [ $prec = none ] && awk -v a="$tps" -v b="$best_fp32" 'BEGIN { exit !(a > b) }'; then
                    best_fp32=$tps best_fp32_cfg=$cfg best_fp32_run=$run
                fi
            done
        done
    done
done
echo "torch_best_fp32_config: $best_fp32_cfg"
echo "torch_best_fp32_tokens_per_s: $best_fp32 tokens/s"
echo "torch_best_config: $best_cfg"
echo "torch_best_tokens_per_s: $best tokens/s"
echo "torch_best_fp32_run: $best_fp32_run"
echo "torch_best_run: $best_run"
