#!/usr/bin/env python3
"""An independent GPT-2 forward in NumPy (float64), for Troupe's tests.

Writes, into the folder given as the first argument (default: this script's folder):
  gpt2_tiny.bin           an llm.c checkpoint (version 3, fp32) of a tiny GPT-2 whose
                          parameters come from numpy's legacy RandomState(1234)
  gpt2_tiny_expected.txt  the batch (tokens, targets; -100 = ignored), the mean loss and the
                          logits (B, T, V) this script computes from those fp32 parameters.
The model is GPT-2 as in the paper / Hugging Face / llm.c: pre-LayerNorm blocks, causal
self-attention, GELU (tanh) MLP, final LayerNorm, logits = lnf @ wte^T (tied).
Nothing here is shared with the C code: it is written from the definitions.
"""
import os
import struct
import sys

import numpy as np

MAXT, V, VP, L, NH, C = 8, 13, 16, 2, 2, 8
B, T = 2, 7


def make_params(rng):
    """Parameters in llm.c's file order, each (name, array) with llm.c's shapes."""
    def normal(*shape, std=0.3):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def around_one(*shape):
        return (1.0 + rng.standard_normal(shape) * 0.1).astype(np.float32)

    wte = normal(VP, C, std=0.5)
    wte[V:] = 0.0  # padded rows, as llm.c's checkpoints have them
    return [
        ("wte", wte), ("wpe", normal(MAXT, C)),
        ("ln1w", around_one(L, C)), ("ln1b", normal(L, C, std=0.1)),
        ("qkvw", normal(L, 3 * C, C)), ("qkvb", normal(L, 3 * C, std=0.1)),
        ("attprojw", normal(L, C, C)), ("attprojb", normal(L, C, std=0.1)),
        ("ln2w", around_one(L, C)), ("ln2b", normal(L, C, std=0.1)),
        ("fcw", normal(L, 4 * C, C)), ("fcb", normal(L, 4 * C, std=0.1)),
        ("fcprojw", normal(L, C, 4 * C, std=0.2)), ("fcprojb", normal(L, C, std=0.1)),
        ("lnfw", around_one(C)), ("lnfb", normal(C, std=0.1)),
    ]


def layernorm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(qkv):
    """qkv (B, T, 3C) -> (B, T, C), causal, NH heads."""
    hs = C // NH
    q, k, v = np.split(qkv, 3, axis=-1)
    split = lambda a: a.reshape(B, T, NH, hs).transpose(0, 2, 1, 3)  # (B, NH, T, hs)
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)  # (B, NH, T, T)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    att = scores / scores.sum(-1, keepdims=True)
    return (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)


def forward(p, tokens, targets):
    p = {name: a.astype(np.float64) for name, a in p}
    x = p["wte"][tokens] + p["wpe"][:T]  # (B, T, C)
    for l in range(L):
        h = layernorm(x, p["ln1w"][l], p["ln1b"][l])
        x = x + attention(h @ p["qkvw"][l].T + p["qkvb"][l]) @ p["attprojw"][l].T + p["attprojb"][l]
        h = layernorm(x, p["ln2w"][l], p["ln2b"][l])
        x = x + gelu(h @ p["fcw"][l].T + p["fcb"][l]) @ p["fcprojw"][l].T + p["fcprojb"][l]
    x = layernorm(x, p["lnfw"], p["lnfb"])
    logits = x @ p["wte"][:V].T  # (B, T, V): the padding never enters the softmax
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = targets != -100
    loss = -logp[keep, targets[keep]].mean()
    return logits, loss


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    rng = np.random.RandomState(1234)
    params = make_params(rng)
    tokens = rng.randint(0, V, size=(B, T))
    targets = rng.randint(0, V, size=(B, T))
    targets[1, 2] = -100
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, MAXT, V, L, NH, C, VP]
    with open(os.path.join(out, "gpt2_tiny.bin"), "wb") as f:
        f.write(header.tobytes())
        for _, a in params:
            f.write(a.astype("<f4").tobytes())
    logits, loss = forward(params, tokens, targets)
    with open(os.path.join(out, "gpt2_tiny_expected.txt"), "w") as f:
        f.write("B %d T %d V %d\n" % (B, T, V))
        f.write("tokens " + " ".join(map(str, tokens.ravel())) + "\n")
        f.write("targets " + " ".join(map(str, targets.ravel())) + "\n")
        f.write("loss %.9g\n" % loss)
        f.write("logits " + " ".join("%.9g" % v for v in logits.ravel()) + "\n")


if __name__ == "__main__":
    main()
