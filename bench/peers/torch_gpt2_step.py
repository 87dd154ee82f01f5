#!/usr/bin/env python3
"""PyTorch's training step on the GPT-2 that bench_gpt2_step runs, for comparison.

Same model as Troupe's (and llm.c's): V=8192 (no padding needed), T=128, C=384, L=6, NH=6,
batch 8; pre-LayerNorm blocks, GELU (tanh), causal attention, tied wte / output projection.
--no-optim times forward + backward only; otherwise AdamW (fused=True) is stepped too.
--autocast bf16 runs forward and loss under torch.autocast("cpu", dtype=torch.bfloat16),
PyTorch's mixed precision on the CPU (fp32 master weights; the matrix products in bf16 through
oneDNN). --compile wraps the model in torch.compile (inductor: C++/OpenMP kernels built at the
first steps); the --warmup steps (default 1, 2 with --compile) cover allocation and compilation
and are not timed. Then up to --steps timed steps, fewer when they have taken --budget seconds
(an emulated bf16 step can take many seconds), and the best is kept. A failure (torch.compile
refusing this CPU, say) exits 1 with torch's error in one line on stderr.
bench/peers/torch_best.sh runs every configuration a PyTorch user could pick and keeps the
best. Same FLOP convention as the C benchmark: 6 * params * tokens per step.
Run with the peers' PyTorch 2 (bench/peers/setup.sh --python). Prints `name: value unit` lines.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (a.view(B, T, self.NH, C // self.NH).transpose(1, 2) for a in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        return self.attproj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, V, T, C, L, NH):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, tokens, targets):
        T = tokens.size(1)
        x = self.wte(tokens) + self.wpe(torch.arange(T))
        for block in self.blocks:
            x = block(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied output projection
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def step(model, opt, tokens, targets, autocast):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast == "bf16"):
        loss = model(tokens, targets)
    loss.backward()
    if opt is not None:
        opt.step()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-optim", action="store_true", help="forward + backward only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (at most)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    ap.add_argument("--warmup", type=int, help="untimed steps first (default 1, 2 with --compile)")
    ap.add_argument("--budget", type=float, default=20.0,
                    help="no further timed step once the timed ones took this many seconds")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    V, T, C, L, NH, B = 8192, 128, 384, 6, 6, args.batch
    model = GPT2(V, T, C, L, NH)
    params = sum(p.numel() for p in model.parameters())
    # fused=True: the fastest of torch's CPU AdamW implementations (bench_adam measures them all)
    opt = None if args.no_optim else torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    if args.compile:
        model = torch.compile(model)
    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    warmup = args.warmup if args.warmup is not None else 2 if args.compile else 1
    try:
        t0 = time.perf_counter()
        for _ in range(warmup):  # allocations, oneDNN's primitives, and compilation
            step(model, opt, tokens, targets, args.autocast)
        t_warmup = time.perf_counter() - t0
        times = []
        while len(times) < args.steps and sum(times) < args.budget:
            t0 = time.perf_counter()
            step(model, opt, tokens, targets, args.autocast)
            times.append(time.perf_counter() - t0)
    except Exception as e:  # one line: what torch said
        sys.exit("%s: %s" % (type(e).__name__, (str(e).strip().splitlines() or [""])[0][:200]))
    best = min(times)
    name = "torch_fwdbwd" if args.no_optim else "torch_train"
    print("torch_version: %s" % torch.__version__)
    print("torch_threads: %d" % torch.get_num_threads())
    print("torch_autocast: %s" % args.autocast)
    print("torch_compile: %s" % ("inductor" if args.compile else "eager"))
    print("aten_cpu_capability: %s (ATEN_CPU_CAPABILITY %s)" % (
        torch.backends.cpu.get_cpu_capability(), os.environ.get("ATEN_CPU_CAPABILITY", "unset")))
    print("params: %d" % params)
    print("%s_warmup: %.1f s (%d steps)" % (name, t_warmup, warmup))
    print("%s_timed_steps: %d" % (name, len(times)))
    print("%s_step: %.2f ms" % (name, best * 1e3))
    print("%s_tokens_per_s: %.0f tokens/s" % (name, B * T / best))
    print("%s_gflops: %.1f GFLOP/s" % (name, 6.0 * params * B * T / best / 1e9))


if __name__ == "__main__":
    main()
