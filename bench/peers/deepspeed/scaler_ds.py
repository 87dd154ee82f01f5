#!/usr/bin/env python3
"""DeepSpeed's own dynamic loss scaler, fed a sequence of overflows: the scales it gives.

    DS_ACCELERATOR=cpu python scaler_ds.py --config DS.json --overflows 1,1,0,0,...

Where DeepSpeed refuses fp16 (its CPU accelerator wants AVX512-FP16 or AMX-FP16), the
equivalence bench cannot compare whole runs; it still compares the loss-scale rule: the config's
fp16 section parsed by DeepSpeed (precision_config.get_float16_config), the scaler built as
its engine builds it (fp16.loss_scaler.CreateLossScaler with dynamic_loss_scale_args), and
update_scale(overflow) called once per step as its ZeRO and FP16 optimizers do, with the
overflows Troupe's run saw. Prints one line per step:
    ds_scale: STEP SCALE
the scale after the step (what Troupe writes as Train/Samples/loss_scale), or
`ds_error: <one line>` where DeepSpeed raises (e.g. the scale already at its minimum).
"""
import argparse
import json
import os
import socket
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler  # noqa: E402
from deepspeed.runtime.precision_config import get_float16_config  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the DeepSpeed JSON Troupe reads")
    ap.add_argument("--overflows", required=True, help="comma-separated 0/1, one per step")
    args = ap.parse_args()
    with open(args.config) as f:
        c = get_float16_config(json.load(f))
    if not c.enabled or c.loss_scale != 0:
        sys.exit("ds_error: the config's fp16 section is not dynamic loss scaling")
    # update_scale logs through deepspeed.comm: a process group of one, on a free port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    scaler = CreateLossScaler(torch.half, c.loss_scale, True, c.dynamic_loss_scale_args())
    for step, o in enumerate(args.overflows.split(","), 1):
        try:
            scaler.update_scale(o == "1")
        except Exception as e:  # DeepSpeed stops the run here; so the row says where
            print("ds_error: step %d: %s" % (step, " ".join(str(e).split())))
            return 1
        print("ds_scale: %d %r" % (step, float(scaler.cur_scale)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
