"""llm.c's GPT-2 in PyTorch, its checkpoint file and Troupe's data order: the DeepSpeed peer's model.

The model is llm.c's (train_gpt2.py, and Troupe's model/gpt2.c): token and position
embeddings, L pre-LayerNorm blocks (LayerNorm eps 1e-5; causal attention scaled by
1/sqrt(C/NH); an MLP of width 4C with GELU's tanh approximation), a final LayerNorm, and the
logits as lnf @ wte^T with wte tied, over the padded vocabulary Vp of which the loss reads the
first V (llm.c's softmax ignores the padding). The loss is llm.c's: the mean cross-entropy over
the B*T positions. pipeline_layers gives the same model as the layers of DeepSpeed's
PipelineModule (the embedding tied between the first and last stages).

The parameters are llm.c's tensors, one nn.Parameter each, in the checkpoint's order (each kind
for all L layers at once: wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C),
qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C), fcw (L, 4C, C),
fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C), lnfb (C)), so a checkpoint loads by
reading the floats straight into them and the two sides start bit-identical.

The data: Troupe's order (actors/data/dataset.c; docs/engine.md "The data order") with
troupe.data.shuffle false: every shard of the glob in sorted order; a sample is a window of
T+1 tokens starting at a multiple of T inside one shard, numbered across shards; rank r of W
takes samples r, W + r, 2W + r, ...; each micro-batch is that rank's next B samples, so the
micro-batch m of global step s on rank r holds samples ((s GAS + m) B + b) W + r, b < B.
"""
import glob
import math

import numpy as np
import torch
import torch.nn.functional as F

MODEL_MAGIC, MODEL_VERSION_FP32 = 20240326, 3
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1
HEADER_INTS = 256
NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb", "ln2w", "ln2b",
         "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]


def shapes(maxT, V, Vp, L, NH, C):
    return {"wte": (Vp, C), "wpe": (maxT, C), "ln1w": (L, C), "ln1b": (L, C),
            "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C), "attprojw": (L, C, C),
            "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C), "fcw": (L, 4 * C, C),
            "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C), "lnfw": (C,),
            "lnfb": (C,)}


def read_checkpoint(path):
    """(dims, {name: float32 array}) from an llm.c fp32 checkpoint (version 3)."""
    with open(path, "rb") as f:
        h = np.frombuffer(f.read(HEADER_INTS * 4), dtype=np.int32)
        if h[0] != MODEL_MAGIC or h[1] != MODEL_VERSION_FP32:
            raise SystemExit("%s: not an llm.c fp32 checkpoint (magic %d version %d)"
                             % (path, h[0], h[1]))
        dims = dict(maxT=int(h[2]), V=int(h[3]), L=int(h[4]), NH=int(h[5]), C=int(h[6]),
                    Vp=int(h[7]))
        data = np.frombuffer(f.read(), dtype=np.float32)
    tensors, at = {}, 0
    for name, shp in shapes(**dims).items():
        n = math.prod(shp)
        if at + n > data.size:
            raise SystemExit("%s: truncated at %s" % (path, name))
        tensors[name] = data[at:at + n].reshape(shp)
        at += n
    if at != data.size:
        raise SystemExit("%s: %d floats after the last tensor" % (path, data.size - at))
    return dims, tensors


class GPT2(torch.nn.Module):
    def __init__(self, path):
        super().__init__()
        self.dims, tensors = read_checkpoint(path)
        for name in NAMES:
            self.register_parameter(name, torch.nn.Parameter(torch.from_numpy(tensors[name].copy())))

    def decay_groups(self, weight_decay):
        """Troupe's (and llm.c's) weight-decay recipe as optimizer groups: matrices decay,
        biases and LayerNorm weights do not (model/model.c, no_decay = ndim < 2 per tensor;
        the stacked per-layer vectors here are (L, n), one vector per layer)."""
        per_layer_vectors = {"ln1w", "ln1b", "qkvb", "attprojb", "ln2w", "ln2b", "fcb", "fcprojb"}
        decay, no_decay = [], []
        for name in NAMES:
            p = getattr(self, name)
            (no_decay if name in per_layer_vectors or p.dim() < 2 else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]

    def forward(self, idx, targets):
        d = self.dims
        B, T = idx.shape
        x = self.wte[idx] + self.wpe[:T]  # (B, T, C)
        for l in range(d["L"]):
            x = block(x, d["NH"], *(getattr(self, n)[l] for n in BLOCK))
        x = F.layer_norm(x, (d["C"],), self.lnfw, self.lnfb, 1e-5)
        return loss(x @ self.wte.t(), targets, d["V"])


BLOCK = NAMES[2:14]  # one layer's tensors, in the checkpoint's order


def block(x, NH, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb):
    """One pre-LayerNorm transformer block of llm.c's GPT-2 on x (B, T, C)."""
    B, T, C = x.shape
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    h = F.layer_norm(x, (C,), ln1w, ln1b, 1e-5)
    qkv = h @ qkvw.t() + qkvb  # (B, T, 3C)
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, C // NH).transpose(1, 2)  # (B, NH, T, hs)
    k = k.view(B, T, NH, C // NH).transpose(1, 2)
    v = v.view(B, T, NH, C // NH).transpose(1, 2)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // NH))  # (B, NH, T, T)
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
    x = x + y @ attprojw.t() + attprojb
    h = F.layer_norm(x, (C,), ln2w, ln2b, 1e-5)
    h = F.gelu(h @ fcw.t() + fcb, approximate="tanh")  # (B, T, 4C)
    return x + h @ fcprojw.t() + fcprojb


def loss(logits, targets, V):
    """llm.c's loss: the mean cross-entropy over B*T, the padded vocabulary rows left out."""
    logits = logits[:, :, :V]
    return F.cross_entropy(logits.reshape(-1, V).float(), targets.reshape(-1))


def pipeline_layers(path):
    """The same model as DeepSpeed's PipelineModule wants it: (dims, layer specs, loss_fn).
    The embedding is a TiedLayerSpec ("wte"), built on the first and last stages and kept
    equal by DeepSpeed (ReduceTiedGrads), the head reusing its wte; each block a LayerSpec
    holding its layer's slices of the checkpoint; the final LayerNorm its own layer."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    dims, t = read_checkpoint(path)
    param = lambda a: torch.nn.Parameter(torch.from_numpy(a.copy()))

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = param(t["wte"]), param(t["wpe"])

        def forward(self, idx):
            return self.wte[idx] + self.wpe[: idx.shape[1]]

    class Block(torch.nn.Module):
        def __init__(self, l):
            super().__init__()
            for n in BLOCK:
                self.register_parameter(n, param(t[n][l]))

        def forward(self, x):
            return block(x, dims["NH"], *(getattr(self, n) for n in BLOCK))

    class FinalNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lnfw, self.lnfb = param(t["lnfw"]), param(t["lnfb"])

        def forward(self, x):
            return F.layer_norm(x, (dims["C"],), self.lnfw, self.lnfb, 1e-5)

    layers = [TiedLayerSpec("wte", Embed, tied_weight_attr=["wte"])]
    layers += [LayerSpec(Block, l) for l in range(dims["L"])]
    layers += [LayerSpec(FinalNorm),
               TiedLayerSpec("wte", Embed, forward_fn=lambda m, x: x @ m.wte.t(), tied_weight_attr=["wte"])]
    return dims, layers, lambda logits, targets: loss(logits, targets, dims["V"])


class Shards:
    """Troupe's unshuffled sample order over llm.c token shards (the module's doc)."""

    def __init__(self, pattern, T):
        self.T, self.shards, self.first = T, [], [0]
        for path in sorted(glob.glob(pattern)):
            with open(path, "rb") as f:
                h = np.frombuffer(f.read(HEADER_INTS * 4), dtype=np.int32)
            if h[0] != TOKENS_MAGIC or h[1] != TOKENS_VERSION:
                raise SystemExit("%s: not an llm.c token shard" % path)
            tok = np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_INTS * 4, shape=(int(h[2]),))
            self.shards.append(tok)
            self.first.append(self.first[-1] + (len(tok) - 1) // T if len(tok) > T else self.first[-1])
        if not self.shards:
            raise SystemExit("%s: no file matches" % pattern)
        self.n = self.first[-1]

    def sample(self, s):
        i = max(j for j in range(len(self.shards)) if self.first[j] <= s)
        w = self.shards[i][(s - self.first[i]) * self.T:][: self.T + 1].astype(np.int64)
        return w[:-1], w[1:]

    def micro_batch(self, k, B, rank, world):
        """The k-th micro-batch (B samples) of rank of world, epochs wrapping as Troupe's."""
        per_epoch = self.n // world
        xs, ys = [], []
        for b in range(B):
            c = (k * B + b) % per_epoch
            x, y = self.sample(c * world + rank)
            xs.append(x)
            ys.append(y)
        return torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys))
