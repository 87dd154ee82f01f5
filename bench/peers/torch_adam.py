#!/usr/bin/python3
"""PyTorch's torch.optim.Adam on one fp32 tensor, the peer of bench/kernels/bench_adam.

Usage: torch_adam.py N THREADS. Prints '# ...' lines with the settings and
'torch_adam_best: <params/s>' for the best of foreach=False and foreach=True (each the best
of several steps after warm-up steps that allocate the optimizer state). Same math as the
C side: lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay, bias correction.
"""
import os
import sys
import time

# Adam uses no BLAS, but give OpenBLAS the right core type for this Zen CPU anyway (it must
# be set before torch loads OpenBLAS); an explicit setting from the caller wins.
os.environ.setdefault("OPENBLAS_CORETYPE", "ZEN")

import torch  # noqa: E402


def best_rate(n, threads, foreach, reps):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.rand(n, dtype=torch.float32) - 0.5)
    p.grad = torch.rand(n, dtype=torch.float32) * 0.1 - 0.05
    opt = torch.optim.Adam([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                           foreach=foreach)
    with torch.no_grad():
        for _ in range(2):
            opt.step()
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            opt.step()
            best = min(best, time.perf_counter() - t0)
    del opt, p
    return n / best


def main():
    n, threads = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(threads)
    reps = 4 if n > 20_000_000 else 8
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"OPENBLAS_CORETYPE={os.environ['OPENBLAS_CORETYPE']}")
    rates = {}
    for foreach in (False, True):
        rates[foreach] = best_rate(n, threads, foreach, reps)
        print(f"# torch foreach={foreach}: {rates[foreach]:.4g} params/s")
    print(f"torch_adam_best: {max(rates.values()):.6g}")


if __name__ == "__main__":
    main()
