#!/usr/bin/env python3
"""DeepSpeed training llm.c's GPT-2 on CPU: the peer of `troupe train` in the peers' benches.

    DS_ACCELERATOR=cpu deepspeed --num_accelerators N train_ds.py --config DS.json \\
        --checkpoint INIT.bin --train-data 'SHARDS' --steps S [--timing] [--pipeline STAGES]

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

--timing (bench/peers/speed.py) prints no per-step line and adds no collective of its own;
after the last step rank 0 prints
    ds_timing: tokens_per_s TPS peak_rss_mib MAX per_rank R0,R1,...
TPS: the global batch's tokens times (S - 2) over rank 0's wall time from the end of step 2 to
the end of step S (the first two steps left out, as DeepSpeed's RunningAvgSamplesPerSec and
Troupe's do; wall time rather than DeepSpeed's ThroughputTimer, which under gradient
accumulation and in the pipeline engine times micro-steps and forward passes, not whole
steps); MAX the largest of the ranks' getrusage(RUSAGE_SELF).ru_maxrss, gathered after the
timed steps. --pipeline S trains DeepSpeed's PipelineModule of S stages instead
(gpt2_llmc.pipeline_layers, engine.train_batch; --timing only).
"""
import argparse
import json
import os
import resource
import sys
import time
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_llmc import GPT2, Shards, pipeline_layers  # noqa: E402


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the DeepSpeed JSON Troupe reads")
    ap.add_argument("--checkpoint", required=True, help="llm.c fp32 checkpoint to start from")
    ap.add_argument("--train-data", required=True, help="llm.c token shards (a glob)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: cores / ranks)")
    ap.add_argument("--timing", action="store_true", help="tokens/s and peak RSS instead of the steps")
    ap.add_argument("--pipeline", type=int, default=0, help="pipeline stages (PipelineModule)")
    ap.add_argument("--local_rank", type=int, default=-1, help="set by the deepspeed launcher")
    args = ap.parse_args()
    if args.timing and args.steps < 3:
        ap.error("--timing needs --steps 3 or more (the first two are left out)")
    if args.pipeline and not args.timing:
        ap.error("--pipeline runs with --timing only")
    return args


def report_timing(t2, t_end, steps, batch, T):
    """The ds_timing line on rank 0 (the module's doc)."""
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64)
    every = [torch.zeros_like(rss) for _ in range(dist.get_world_size())]
    dist.all_gather(every, rss)
    if dist.get_rank() == 0:
        print("ds_timing: tokens_per_s %.1f peak_rss_mib %.1f per_rank %s" % (
            batch * T * (steps - 2) / (t_end - t2), max(r.item() for r in every),
            ",".join("%.1f" % r.item() for r in every)), flush=True)


def train_pipeline(args, cfg, deepspeed):
    """DeepSpeed's pipeline engine on gpt2_llmc.pipeline_layers, timed (--timing)."""
    from deepspeed.pipe import PipelineModule

    dims, layers, loss_fn = pipeline_layers(args.checkpoint)
    module = PipelineModule(layers=layers, num_stages=args.pipeline, loss_fn=loss_fn,
                            partition_method="parameters")
    wd = cfg.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=groups, config=cfg)
    B, data = engine.train_micro_batch_size_per_gpu(), Shards(args.train_data, dims["maxT"])
    replica, replicas = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()

    def batches():  # a replica's micro-batches, its stages reading the same ones
        k = 0
        while True:
            yield data.micro_batch(k, B, replica, replicas)
            k += 1

    it, t2 = batches(), 0.0
    for step in range(1, args.steps + 1):
        engine.train_batch(it)
        if step == 2:
            t2 = time.perf_counter()
    report_timing(t2, time.perf_counter(), args.steps, engine.train_batch_size(), dims["maxT"])


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
    if args.pipeline:
        return train_pipeline(args, cfg, deepspeed)
    model = GPT2(args.checkpoint)
    wd = cfg.get("optimizer", {}).get("params", {}).get("weight_decay", 0.0)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.decay_groups(wd),
                                           config=cfg)
    gas = engine.gradient_accumulation_steps()
    B = engine.train_micro_batch_size_per_gpu()
    data = Shards(args.train_data, model.dims["maxT"])
    k, t2 = 0, 0.0  # this rank's micro-batch index; the end of step 2 (--timing)
    for step in range(1, args.steps + 1):
        if args.timing:
            for _ in range(gas):
                x, y = data.micro_batch(k, B, rank, world)
                k += 1
                engine.backward(engine(x, y))
                engine.step()
            if step == 2:
                t2 = time.perf_counter()
            continue
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
    if args.timing:
        report_timing(t2, time.perf_counter(), args.steps, engine.train_batch_size(), model.dims["maxT"])
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
