#!/usr/bin/env python3
"""PyTorch's training step on the GPT-2 that bench_gpt2_fwdbwd runs, for comparison.

Same model as Troupe's (and llm.c's): V=8192 (no padding needed), T=128, C=384, L=6, NH=6,
batch 8; pre-LayerNorm blocks, GELU (tanh), causal attention, tied wte / output projection.
--no-optim times forward + backward only (what bench_gpt2_fwdbwd measures); otherwise AdamW
is stepped too. --autocast bf16 runs forward and loss under torch.autocast("cpu",
dtype=torch.bfloat16), PyTorch's mixed precision on the CPU (fp32 master weights; the matrix
products in bf16 through oneDNN). bench/peers/torch_best.sh runs every configuration a PyTorch
user could pick and keeps the best. Same FLOP convention as the C benchmark: 6 * params * tokens per step.
Run with the system Python (Debian's python3-torch installs there), with OPENBLAS_CORETYPE
set as the C benchmark's blas_best_core line says (bench/kernels/run.sh does both).
Prints `name: value unit` lines.
"""
import argparse
import math
import os
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-optim", action="store_true", help="forward + backward only")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    V, T, C, L, NH, B = 8192, 128, 384, 6, 6, args.batch
    model = GPT2(V, T, C, L, NH)
    params = sum(p.numel() for p in model.parameters())
    opt = None if args.no_optim else torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))
    best = float("inf")
    for step in range(args.steps + 1):  # step 0 warms up
        t0 = time.perf_counter()
        model.zero_grad(set_to_none=True)
        if args.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(tokens, targets)
        else:
            loss = model(tokens, targets)
        loss.backward()
        if opt is not None:
            opt.step()
        dt = time.perf_counter() - t0
        if step > 0:
            best = min(best, dt)
    name = "torch_fwdbwd" if args.no_optim else "torch_train"
    print("torch_version: %s" % torch.__version__)
    print("torch_threads: %d" % torch.get_num_threads())
    print("torch_autocast: %s" % args.autocast)
    print("aten_cpu_capability: %s" % os.environ.get("ATEN_CPU_CAPABILITY", "(default)"))
    print("openblas_coretype: %s" % os.environ.get("OPENBLAS_CORETYPE", "(unset)"))
    print("openblas_num_threads: %s" % os.environ.get("OPENBLAS_NUM_THREADS", "(unset)"))
    print("params: %d" % params)
    print("%s_step: %.2f ms" % (name, best * 1e3))
    print("%s_tokens_per_s: %.0f tokens/s" % (name, B * T / best))
    print("%s_gflops: %.1f GFLOP/s" % (name, 6.0 * params * B * T / best / 1e9))


if __name__ == "__main__":
    main()
