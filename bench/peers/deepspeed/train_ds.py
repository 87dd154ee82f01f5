#!/usr/bin/env python3
"""DeepSpeed training llm.c's GPT-2 on CPU: the peer of `troupe train` in the equivalence bench.

    DS_ACCELERATOR=cpu deepspeed --num_accelerators N train_ds.py --config DS.json \\
        --checkpoint INIT.bin --train-data 'SHARDS' --steps S

deepspeed.initialize gets the JSON file Troupe reads minus its "troupe" section, the model of
gpt2_llmc.py loaded from the llm.c checkpoint Troupe loads with --load-llmc, and the model's
parameters in two groups (matrices decay, vectors do not: Troupe's recipe); the optimizer and
the scheduler are DeepSpeed's own, built from the config. The data follows Troupe's
unshuffled order (gpt2_llmc.Shards). One micro-batch per engine.forward/backward/step call;
DeepSpeed steps the optimizer at each gradient-accumulation boundary.

Rank 0 prints, per global step, one line:
    ds_step: STEP loss LOSS lr LR next_lr NEXT scale SCALE skipped SKIPPED mom B1,B2
LOSS is the mean of the step's micro-batch losses over every rank (what Troupe reports as a
step's loss), printed with repr so no digit is lost; LR the learning rate the step used (read
before engine.step), NEXT the one after it (what DeepSpeed's monitor and Troupe's write as
Train/Samples/lr); SCALE the fp16 loss scale after the step (1 without fp16); SKIPPED
DeepSpeed's count of steps skipped so far; B1,B2 the optimizer's betas after the step ("-" for
an optimizer without betas). A failure prints `ds_error: <one line>`, exit 1.
"""
import argparse
import json
import os
import sys
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_llmc import GPT2, Shards  # noqa: E402


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the DeepSpeed JSON Troupe reads")
    ap.add_argument("--checkpoint", required=True, help="llm.c fp32 checkpoint to start from")
    ap.add_argument("--train-data", required=True, help="llm.c token shards (a glob)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: cores / ranks)")
    ap.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    return ap.parse_args()


def main():
    args = parse()
    import deepspeed  # after the environment is set: it picks its accelerator at import

    with open(args.config) as f:
        cfg = json.load(f)
    cfg.pop("troupe", None)
    cfg.setdefault("steps_per_print", 10 ** 9)  # keep DeepSpeed's own log out of the output
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // world))
    model = GPT2(args.checkpoint)
    wd = cfg.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.decay_groups(wd),
                                           config=cfg)
    gas = engine.gradient_accumulation_steps()
    B = engine.train_micro_batch_size_per_gpu()
    data = Shards(args.train_data, model.dims["maxT"])
    k = 0  # this rank's micro-batch index
    for step in range(1, args.steps + 1):
        lr = engine.get_lr()[0] if engine.get_lr() else float("nan")
        total = torch.zeros(1, dtype=torch.float64)
        for _ in range(gas):
            x, y = data.micro_batch(k, B, rank, world)
            k += 1
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += loss.detach().double()
        dist.all_reduce(total)
        opt = engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None) or 1.0
        if rank == 0:
            mom = (engine.get_mom() or [None])[0]
            mom = ",".join("%r" % float(b) for b in mom) if isinstance(mom, (tuple, list)) else "-"
            print("ds_step: %d loss %r lr %r next_lr %r scale %r skipped %d mom %s"
                  % (step, total.item() / (gas * world), lr, engine.get_lr()[0], float(scale),
                     engine.skipped_steps, mom), flush=True)
    dist.barrier()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # one line for the table; the trace on stderr
        traceback.print_exc()
        msg = ("%s: %s" % (type(e).__name__, e)).replace("\n", " ")
        print("ds_error: %s" % msg[:300], flush=True)
        sys.exit(1)
