#!/usr/bin/env python3
"""PyTorch 2's torch.optim.Adam on one fp32 tensor, the peer of bench/kernels/bench_adam.

Usage: torch_adam.py N THREADS, with the peers' python (bench/peers/setup.sh --python;
bench_adam runs it with $TR_BENCH_PYTHON). Runs each implementation a user can pick on a CPU:
the for-loop (foreach=False, the CPU default), foreach=True and fused=True, each the best of
several steps after warm-up steps that allocate the optimizer state, and prints a
'# torch adam IMPL, N threads: RATE params/s' line for each (an implementation that fails prints
its error instead), then 'torch_adam_best: RATE IMPL' for the fastest. Same math as the C
side: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay, bias correction.
"""
import sys
import time

import torch

IMPLS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def best_rate(n, impl, reps):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.rand(n, dtype=torch.float32) - 0.5)
    p.grad = torch.rand(n, dtype=torch.float32) * 0.1 - 0.05
    opt = torch.optim.Adam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                           **IMPLS[impl])
    with torch.no_grad():
        for _ in range(2):
            opt.step()
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            opt.step()
            best = min(best, time.perf_counter() - t0)
    return n / best


def main():
    n, threads = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    reps = 4 if n > 20_000_000 else 8
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}")
    rates = {}
    for impl in IMPLS:
        try:
            rates[impl] = best_rate(n, impl, reps)
            print(f"# torch adam {impl}, {threads} threads: {rates[impl]:.4g} params/s")
        except Exception as e:  # one line: what torch said
            print(f"# torch adam {impl}, {threads} threads: failed: {type(e).__name__}: "
                  f"{(str(e).strip().splitlines() or [''])[0][:160]}")
    if rates:
        impl = max(rates, key=rates.get)
        print(f"torch_adam_best: {rates[impl]:.6g} {impl}")


if __name__ == "__main__":
    main()
