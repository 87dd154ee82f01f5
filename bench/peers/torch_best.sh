#!/usr/bin/env bash
# PyTorch's GPT-2 training step (torch_gpt2_step.py) under every configuration a PyTorch user
# could pick on a CPU, each measured in this run, and the best of them: the peer Troupe's step
# is compared against.
#   bench/peers/torch_best.sh BEST_CORE THREADS [torch_gpt2_step.py args...]
# BEST_CORE: the OPENBLAS_CORETYPE that fits this CPU (bench_gpt2_step's blas_best_core);
# THREADS: the cores Troupe uses. Configurations: precision fp32 or bf16 autocast;
# torch.set_num_threads 1 or THREADS; ATEN_CPU_CAPABILITY as detected or avx512 (where the CPU
# has AVX-512); OpenBLAS's core as it detects it or BEST_CORE; OPENBLAS_NUM_THREADS matched to
# torch's or unset (OpenBLAS then starts a thread per core beside torch's). Prints each
# configuration's `torch_config: ... tokens/s` line, then
#   torch_best_fp32_config / torch_best_fp32_tokens_per_s  (the best fp32 configuration)
#   torch_best_config / torch_best_tokens_per_s            (the best of all)
# and, for running them again (bench/kernels/run.sh does, in turn with Troupe's step):
#   torch_best_fp32_run / torch_best_run: ENV=VALUE... --threads T --autocast P
set -uo pipefail
core=${1:?usage: torch_best.sh BEST_CORE THREADS [args]} threads=${2:?THREADS}
shift 2
peer=$(dirname "$0")/torch_gpt2_step.py
caps=("")
grep -qw avx512f /proc/cpuinfo && caps+=(avx512)
best_fp32=0 best=0 best_fp32_cfg="" best_cfg="" best_fp32_run="" best_run=""
ts=(1)
[ "$threads" != 1 ] && ts+=("$threads")
for prec in none bf16; do
    for t in "${ts[@]}"; do
        for cap in "${caps[@]}"; do
            for ct in "" "$core"; do
                for obt in "$t" ""; do
                    env=()
                    [ -n "$cap" ] && env+=(ATEN_CPU_CAPABILITY="$cap")
                    [ -n "$ct" ] && env+=(OPENBLAS_CORETYPE="$ct")
                    [ -n "$obt" ] && env+=(OPENBLAS_NUM_THREADS="$obt")
                    cfg="precision=$([ $prec = bf16 ] && echo bf16-autocast || echo fp32)"
                    cfg+=" torch_threads=$t aten_cpu_capability=${cap:-detected}"
                    cfg+=" openblas_coretype=${ct:-detected} openblas_num_threads=${obt:-unset}"
                    out=$(env "${env[@]}" /usr/bin/python3 "$peer" --threads "$t" --autocast "$prec" "$@" 2>&1)
                    tps=$(sed -n 's/^torch_train_tokens_per_s: \([0-9.]*\).*/\1/p' <<<"$out")
                    if [ -z "$tps" ]; then
                        echo "torch_config: $cfg: failed: $(tail -1 <<<"$out")"
                        continue
                    fi
                    echo "torch_config: $cfg: $tps tokens/s"
                    run="${env[*]} --threads $t --autocast $prec"
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
done
echo "torch_best_fp32_config: $best_fp32_cfg"
echo "torch_best_fp32_tokens_per_s: $best_fp32 tokens/s"
echo "torch_best_config: $best_cfg"
echo "torch_best_tokens_per_s: $best tokens/s"
echo "torch_best_fp32_run: $best_fp32_run"
echo "torch_best_run: $best_run"
