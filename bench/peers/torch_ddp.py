#!/usr/bin/env python3
"""PyTorch 2 data parallelism on the GPT-2 of bench_gpt2_step: the peer of `make bench-dp`.

Modes (--mode), all over gloo on the CPU:
  ddp    DistributedDataParallel (25 MiB buckets, its default), AdamW on every rank;
  zero1  DDP with ZeroRedundancyOptimizer (ZeRO-1: each rank keeps AdamW's states for its
         share of the parameters);
  fsdp2  FSDP2, torch.distributed.fsdp.fully_shard on each block then the model (full shard:
         parameters, gradients and AdamW's states partitioned, ZeRO-3), on a CPU device mesh;
  fsdp1  FSDP1, FullyShardedDataParallel with device_id cpu, each block wrapped (full shard).
The model is torch_gpt2_step.py's (V=8192, T=128, C=384, L=6, NH=6). The global batch is
--batch sequences (default 8, as the kernels benchmark), split evenly over the ranks, one
micro-batch per step; fp32, or bf16 under torch.autocast. --compile: torch.compile (inductor,
C++ on the CPU) of the wrapped model; its compilation happens in the warm-up steps, untimed.
Launched by mpirun: the rank and world come from OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE,
the rendezvous is MASTER_ADDR=127.0.0.1 and --port. Threads per rank: --threads.

Tokens/s: after --warmup steps, the global tokens of the --steps timed steps over their wall
time, between two barriers. A configuration slow enough to pass --max-seconds (30) stops
timing after that step (at least one), and its warm-up stops after one step (two with
--compile) once a step takes over a third of that: this bounds the search's time on CPUs where
one is pathological (bf16 autocast where oneDNN has no bf16, an AVX2 CPU: 24 tokens/s).
Memory: each rank's peak resident set (getrusage). Rank 0 prints `name: value unit` lines. A failure (a mode or torch.compile refusing) prints one line
`torch_error: Type: message` and exits 1, which ends the other ranks through mpirun.
"""
import argparse
import datetime
import os
import re
import resource
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2_step import GPT2, Block  # noqa: E402  the same model as the kernels benchmark


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["ddp", "zero1", "fsdp2", "fsdp1"], default="ddp")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (else fp32)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ap.add_argument("--steps", type=int, default=4, help="timed steps")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--max-seconds", type=float, default=30.0,
                    help="fewer timed steps (at least one) once they have taken this long")
    ap.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    ap.add_argument("--port", type=int, default=29517)
    return ap.parse_args()


def setup(args):
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))
    if args.batch % world:
        sys.exit("torch_ddp.py: --batch %d does not split over %d ranks" % (args.batch, world))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=10))
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)  # the same initial model on every rank (DDP broadcasts it anyway)
    return rank, world


def wrap(model, mode, world):
    """The model as the mode trains it, and its optimizer."""
    if mode in ("ddp", "zero1"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, bucket_cap_mb=25)
    elif mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}),
                     device_id=torch.device("cpu"))
    if mode == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      lr=1e-4)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def run(args, rank, world):
    V, T, C, L, NH, B = 8192, 128, 384, 6, 6, args.batch // world
    model, opt = wrap(GPT2(V, T, C, L, NH), args.mode, world)
    if args.compile:
        model = torch.compile(model)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own share of the batch
    tokens = torch.randint(0, V, (B, T), generator=g)
    targets = torch.randint(0, V, (B, T), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = model(tokens, targets)
        loss.backward()
        opt.step()
        return loss

    def agree(flag):  # every rank stops after the same step: any rank's flag decides
        t = torch.tensor([float(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item() > 0

    t0, i = time.perf_counter(), -1
    for i in range(args.warmup):  # a step slower than a third of the cap needs no more warm-up
        t = time.perf_counter()
        step()
        if i >= args.compile and agree(time.perf_counter() - t > args.max_seconds / 3):
            break
    warm_steps, warm = i + 1, time.perf_counter() - t0
    dist.barrier()
    t0 = time.perf_counter()
    done = 0
    while done < args.steps:
        loss = step()
        done += 1
        if agree(time.perf_counter() - t0 > args.max_seconds):
            break
    dist.barrier()
    dt = time.perf_counter() - t0
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    all_rss = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(all_rss, rss)
    if rank == 0:
        name = "torch_%s_%s" % (args.mode, "bf16" if args.bf16 else "fp32")
        print("%s_version: %s" % (name, torch.__version__))
        print("%s_ranks: %d" % (name, world))
        print("%s_threads_per_rank: %d" % (name, torch.get_num_threads()))
        print("%s_compile: %s" % (name, "inductor" if args.compile else "eager"))
        blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
        print("%s_blas: %s" % (name, blas.group(1) if blas else "unknown"))
        print("%s_cpu_capability: %s" % (name, torch.backends.cpu.get_cpu_capability()))
        if args.bf16 and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            print("%s_note: oneDNN has no bf16 on this CPU (it needs AVX-512): autocast's bf16"
                  " matrix products run in ATen's reference kernels" % name)
        print("%s_warmup: %.1f s (%d steps%s)" % (name, warm, warm_steps,
                                                 ", compilation included" if args.compile else ""))
        print("%s_loss: %.4f" % (name, loss.item()))
        print("%s_timed_steps: %d of %d%s" % (name, done, args.steps, "" if done == args.steps
                                               else " (stopped at --max-seconds %g)" % args.max_seconds))
        print("%s_step: %.2f ms" % (name, dt / done * 1e3))
        print("%s_tokens_per_s: %.0f tokens/s" % (name, args.batch * T * done / dt))
        print("%s_maxrss_per_rank: %s MiB" % (name, " ".join("%.0f" % r.item() for r in all_rss)))
        print("%s_maxrss_max: %.0f MiB" % (name, max(r.item() for r in all_rss)))


def main():
    args = parse()
    rank, world = setup(args)
    try:
        run(args, rank, world)
    except Exception as e:  # one line for run.sh: the peer's refusal is a result too
        msg = (str(e).strip().splitlines() or [""])[0][:300]
        print("torch_error: %s: %s" % (type(e).__name__, msg), flush=True)
        os._exit(1)
    # Every rank is done once this barrier passes; leave without tearing gloo down, which was
    # seen to spin for minutes in one rank after the other had exited (torch 1.13).
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
