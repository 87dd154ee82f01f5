#!/usr/bin/env python3
"""Troupe beside DeepSpeed, speed and memory: tokens/s and peak RSS per rank, the same config.

    bench/peers/speed.py BUILD_DIR [--steps 10] [--only NAME[,NAME]] [--list] [--keep]

The model is `make bench-dp`'s GPT-2 (V=8192, T=128, C=384, L=6, NH=6: 13.8M parameters), from
one llm.c checkpoint Troupe writes (`troupe train --steps 0 --export-llmc`), trained --steps
steps on BUILD_DIR/demo-data/text_train.bin in fp32 with AdamW (lr 1e-4), a global batch of 8
sequences (8 / ranks per rank, no gradient accumulation; the pipeline: 4 per micro-batch, 2
micro-batches), reduce_bucket_size 6553600, per configuration (a row):
  - Troupe: `troupe train --load-llmc` under `mpirun` with bench/dp/run.sh's placement (one
    rank unbound on every core; n ranks bound to cores / n cores each, oversubscribed beyond
    the cores), its tokens/s its RunningAvgSamplesPerSec x T (steps 3..N, DeepSpeed's
    convention), its peak RSS per rank the largest rank's maxrss (/usr/bin/time per rank);
  - DeepSpeed 0.19 on PyTorch 2, CPU accelerator (bench/peers/deepspeed/train_ds.py --timing
    under the `deepspeed` launcher) with the same JSON minus its "troupe" section, torch given
    cores / ranks threads (at least 1): tokens/s over the same steps (wall time on rank 0),
    peak RSS per rank the largest rank's ru_maxrss. At its best: each row runs once unbound and
    once with the launcher's --bind_cores_to_rank (numactl, cores / ranks cores each), and the
    faster is kept (`_deepspeed_config` says which, and the other's figure or error).
The rows: ZeRO 0, 1 and 2 on 1, 2 and 4 ranks; ZeRO 2 with offload_optimizer device cpu and
device nvme (nvme_path a folder under BUILD_DIR) on 1 and 2 ranks; the pipeline engine, 2
stages on 2 ranks (Troupe `"pipeline": {"stages": 2}`, DeepSpeed a PipelineModule and
train_batch); ZeRO 3 on 2 ranks with DeepSpeed's stage-3 defaults on both sides (no stage3_*
key set: prefetch 5e7, max_live 1e9, reuse distance 1e9, persistence 1e5), without offload
and with offload_optimizer nvme (DeepSpeed swaps optimizer state to NVMe at ZeRO 3 only: at 1
and 2 it takes nvme for cpu, which the ZeRO 2 nvme rows say). The ZeRO 3 rows carry issue 36's
targets, Troupe >= 2x DeepSpeed's tokens/s and <= its peak RSS, and say whether each is met.

Per row, `name: value unit` lines as it goes (speed_ROW_troupe_tokens_per_s, ..._deepspeed_...,
..._peak_rss_per_rank, ..._vs_deepspeed_tokens_per_s (troupe / deepspeed), ..._vs_deepspeed_
peak_rss (troupe / deepspeed), with the target where the row has one); a side that fails prints `speed_ROW_SIDE_error: <one line>`
instead. Then the table. Without the peer environment (bench/peers/setup.sh exits 3) it says
why in one line and prints Troupe's figures alone.
"""
import copy
import json
import os
import re
import shutil
import sys
import tempfile
import time

from peerlib import arguments, chosen, header, last_error, peer_python, run_deepspeed, run_troupe, write_init

DIMS = ["--vocab", "8192", "--context", "128", "--channels", "384", "--layers", "6", "--heads", "6"]
T, BATCH, BUCKET = 128, 8, 6553600


# DeepSpeed 0.19.8's ZeRO 1/2 optimizer has no swapper: device nvme is offload to cpu there.
ZERO3_TARGET = (2.0, 1.0)  # issue 36: ZeRO 3 at >= 2x DeepSpeed's tokens/s, <= its memory
NVME_AT_2 = ("at ZeRO 1/2 DeepSpeed takes device nvme as cpu (runtime/zero/stage_1_and_2.py:220,"
             " cpu_offload = device != none), nvme_path unused; its NVMe swapping is ZeRO 3's")


def row(name, ranks, stage, gas=1, target=None, ds_note=None, **over):
    """target: (least tokens/s ratio, largest peak RSS ratio) Troupe / DeepSpeed, or None."""
    zero = {"stage": stage, "reduce_bucket_size": BUCKET}
    zero.update(over.pop("zero", {}))
    cfg = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH // ranks,
           "gradient_accumulation_steps": gas, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
           "zero_optimization": zero, "troupe": {"data": {"shuffle": False}}}
    cfg.update(over)
    return {"name": name, "ranks": ranks, "cfg": cfg, "target": target, "ds_note": ds_note}


def configs():
    rows = [row("zero%d_%dr" % (s, n), n, s) for n in (1, 2, 4) for s in (0, 1, 2)]
    for dev in ("cpu", "nvme"):
        for n in (1, 2):
            rows.append(row("offload_%s_zero2_%dr" % (dev, n), n, 2, zero={"offload_optimizer": {"device": dev}},
                            ds_note=NVME_AT_2 if dev == "nvme" else None))
    # 2 stages on 2 ranks are one replica: 2 micro-batches of 8 / 2 make the batch of 8
    rows.append(row("pipe2_2r", 2, 0, gas=2, pipeline={"stages": 2}))
    rows.append(row("zero3_2r", 2, 3, target=ZERO3_TARGET))
    rows.append(row("offload_nvme_zero3_2r", 2, 3, target=ZERO3_TARGET, zero={"offload_optimizer": {"device": "nvme"}}))
    return rows


def troupe_side(build, c, cfg_path, init, data, steps):
    """{"tps", "rss"} or {"error"}."""
    p = run_troupe(build, c["ranks"], cfg_path, ["--load-llmc", init, "--train-data", data, "--steps", str(steps),
                                                 "--val-batches", "1"],
                   bind=True, wrap=["/usr/bin/time", "-f", "maxrss_kb: %M"])
    sps = re.findall(r"RunningAvgSamplesPerSec=([0-9.eE+-]+),", p.stdout + p.stderr)
    # not anchored: mpirun forwards each rank's stderr as it comes, so a rank's line can follow
    # another's unfinished one
    rss = [int(k) for k in re.findall(r"maxrss_kb: (\d+)", p.stderr)]
    if p.returncode != 0:
        return {"error": last_error(p)}
    if not sps or len(rss) != c["ranks"]:
        return {"error": "exit 0, but %s" % ("no RunningAvgSamplesPerSec line" if not sps else
                                             "%d of %d ranks' peak RSS lines" % (len(rss), c["ranks"]))}
    return {"tps": float(sps[-1]) * T, "rss": max(rss) / 1024.0}


def deepspeed_side(py, c, cfg_path, init, data, steps, port):
    """The better of unbound and --bind_cores_to_rank: {"tps", "rss", "how"} or {"error"}."""
    args = ["--config", cfg_path, "--checkpoint", init, "--train-data", data, "--steps", str(steps), "--timing"]
    if "pipeline" in c["cfg"]:
        args += ["--pipeline", str(c["cfg"]["pipeline"]["stages"])]
    runs = {}
    for i, (how, launcher) in enumerate((("unbound", []), ("bind_cores_to_rank", ["--bind_cores_to_rank"]))):
        p = run_deepspeed(py, c["ranks"], port + i, args, launcher)
        m = re.search(r"^ds_timing: tokens_per_s (\S+) peak_rss_mib (\S+)", p.stdout, re.M)
        runs[how] = {"tps": float(m.group(1)), "rss": float(m.group(2)), "how": how} if m and p.returncode == 0 \
            else {"error": last_error(p), "how": how}
    ok = [r for r in runs.values() if "tps" in r]
    if not ok:
        return runs["unbound"]
    best = max(ok, key=lambda r: r["tps"])
    other = runs["bind_cores_to_rank" if best["how"] == "unbound" else "unbound"]
    best["how"] += " (%s: %s)" % (other["how"], "%.0f tokens/s" % other["tps"] if "tps" in other else
                                  "failed: " + other["error"])
    return best


def verdict(ratio, bound, op):
    """" (target OP BOUND: met)" or "NOT met"; "" without a bound."""
    if bound is None:
        return ""
    ok = ratio >= bound if op == ">=" else ratio <= bound
    return " (target %s %g: %s)" % (op, bound, "met" if ok else "NOT met")


def main():
    ap = arguments(__doc__, 10)
    args = ap.parse_args()
    rows = chosen(args, configs())
    if rows is None:
        return 0
    if args.steps < 3:
        ap.error("--steps must be 3 or more (tokens/s over steps 3..N)")
    build = os.path.abspath(args.build)
    data = os.path.join(build, "demo-data", "text_train.bin")
    py, why, rc = peer_python()
    if py is None:
        print("speed: DeepSpeed peer skipped: %s; Troupe's figures alone" % why)
        if rc != 3:
            return 1
    t0, work = time.monotonic(), tempfile.mkdtemp(prefix="troupe-speed.")
    nvme = tempfile.mkdtemp(prefix="peers-nvme.", dir=build)
    try:
        try:
            init = write_init(build, work, row("init", 1, 0)["cfg"], DIMS, data)
        except RuntimeError as e:
            print("speed: %s" % e)
            return 1
        header(py, "GPT-2 V=8192 T=128 C=384 L=6 NH=6 (13.8M parameters), fp32, AdamW, global batch %d"
               " sequences, %d steps (tokens/s over steps 3..%d), from one llm.c checkpoint; threads per"
               " rank: cores / ranks (at least 1)" % (BATCH, args.steps, args.steps))
        port = 29400 + os.getpid() % 100 * 2
        for c in rows:
            cfg = copy.deepcopy(c["cfg"])
            cfg["steps_per_print"] = args.steps  # Troupe's RunningAvgSamplesPerSec line at the last step
            off = cfg["zero_optimization"].get("offload_optimizer", {})
            if off.get("device") == "nvme":
                off["nvme_path"] = nvme
            cfg_path = os.path.join(work, c["name"] + ".json")
            with open(cfg_path, "w") as f:
                json.dump(cfg, f, indent=1)
            t = troupe_side(build, c, cfg_path, init, data, args.steps)
            d = {"error": "not run: no peer environment"} if py is None else \
                deepspeed_side(py, c, cfg_path, init, data, args.steps, port)
            port += 2
            c["t"], c["d"] = t, d
            pre = "speed_%s_" % c["name"]
            for side, r in (("troupe", t), ("deepspeed", d)):
                if "tps" in r:
                    print("%s%s_tokens_per_s: %.0f tokens/s" % (pre, side, r["tps"]))
                    print("%s%s_peak_rss_per_rank: %.0f MiB" % (pre, side, r["rss"]))
                elif "error" in r and (py or side == "troupe"):
                    print("%s%s_error: %s" % (pre, side, r["error"]))
            if "how" in d and "tps" in d:
                print(pre + "deepspeed_config: " + d["how"])
            if c["ds_note"] and py:
                print(pre + "deepspeed_note: " + c["ds_note"])
            if "tps" in t and "tps" in d:
                tps, rss, want = t["tps"] / d["tps"], t["rss"] / d["rss"], c["target"]
                print("%svs_deepspeed_tokens_per_s: %.2f x%s" % (pre, tps, verdict(tps, want and want[0], ">=")))
                print("%svs_deepspeed_peak_rss: %.2f x%s" % (pre, rss, verdict(rss, want and want[1], "<=")))
            sys.stdout.flush()
        print("%-22s %5s %12s %12s %6s %11s %11s %6s" % ("config", "ranks", "troupe tok/s", "ds tok/s",
                                                        "ratio", "troupe MiB", "ds MiB", "ratio"))
        for c in rows:
            t, d = c["t"], c["d"]
            cell = lambda r, k, f: f % r[k] if k in r else "-"
            line = "%-22s %5d %12s %12s %6s %11s %11s %6s" % (
                c["name"], c["ranks"], cell(t, "tps", "%.0f"), cell(d, "tps", "%.0f"),
                "%.2f" % (t["tps"] / d["tps"]) if "tps" in t and "tps" in d else "-",
                cell(t, "rss", "%.0f"), cell(d, "rss", "%.0f"),
                "%.2f" % (t["rss"] / d["rss"]) if "tps" in t and "tps" in d else "-")
            notes = [s + ": " + r["error"] for s, r in (("troupe", t), ("deepspeed", d))
                     if "error" in r and (py or s == "troupe")]
            notes += ["deepspeed: " + c["ds_note"]] if c["ds_note"] and py else []
            print(line + ("  " + "; ".join(notes) if notes else ""))
        print("speed_wall_s: %.0f s" % (time.monotonic() - t0))
    finally:
        shutil.rmtree(nvme, ignore_errors=True)
        if args.keep:
            print("work: " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
