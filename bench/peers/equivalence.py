#!/usr/bin/env python3
"""Troupe beside DeepSpeed, step by step: the same config, weights and data, the losses compared.

    bench/peers/equivalence.py BUILD_DIR [--steps 20] [--only NAME[,NAME]] [--list] [--verbose] [--keep]

A small GPT-2 (vocab 256, bytes; context 64, channels 64, 2 layers, 4 heads) starts from one
llm.c checkpoint that Troupe writes (`troupe train --steps 0 --export-llmc`), and trains
--steps steps on BUILD_DIR/demo-data/text_train.bin, per configuration:
  - Troupe: `troupe train --load-llmc` (under `mpirun -np N` on N ranks), its per-step loss,
    learning rate and fp16 loss scale from the config's csv_monitor (full precision), the
    skipped count from its DeepSpeed-style `[Rank 0] step=..., skipped=...` line;
  - DeepSpeed 0.19 on PyTorch 2 on CPU (bench/peers/deepspeed/train_ds.py under the
    `deepspeed` launcher, the environment of bench/peers/setup.sh) with the same JSON file
    minus its "troupe" section.
The data order is Troupe's unshuffled one (troupe.data.shuffle false; docs/engine.md). Every
row clips the gradient norm at 1.0 (gradient_clipping's default on both sides) unless it says
otherwise; the optimizers get Troupe's weight-decay groups (matrices only).

Per configuration it prints the largest relative difference of the per-step losses
|troupe - deepspeed| / |deepspeed| and the step where it occurs, the same for the learning
rate after each step, the first step whose learning rate (as used) or betas differ, and for
fp16 whether the skipped steps and loss scales agree (where DeepSpeed refuses fp16, as its CPU
accelerator does without AVX512-FP16/AMX-FP16, its own loss scaler class is fed the overflows
of Troupe's run and the scales compared: deepspeed/scaler_ds.py); `ok` when
the loss stays within the row's tolerance (fp32 2e-4), `DIFF` when not, `KNOWN` when not for a
difference docs/config.md records as kept on purpose (the row says which; a companion row
without it must be `ok`). A side that fails shows its error in one line instead. Then `name: value unit` lines.

Without the peer environment (no network, bench/peers/setup.sh exits 3) it says so in one
line and prints no table.

`make bench-peers` runs it (bench/peers/run.sh), then speed.py; what the two share (the
environment, the header, the initial checkpoint, launching each side) is in peerlib.py.
"""
import copy
import csv
import json
import os
import re
import shutil
import sys
import tempfile

from peerlib import HERE, arguments, chosen, header, last_error, one_line, peer_python, run, run_deepspeed, run_troupe, write_init

DIMS = ["--vocab", "256", "--context", "64", "--channels", "64", "--layers", "2", "--heads", "4"]
MICRO = 4  # sequences per rank per micro-step
FP32_TOL = 2e-4
# bf16: both keep fp32 master weights, but round in different places. Troupe rounds only the
# inputs of the matrix products (docs/engine.md "bf16 mixed precision"): its bf16 losses stay
# within 6e-5 of its fp32 ones here. DeepSpeed casts every parameter of the module to bf16
# (runtime/engine.py:2080-2088, _cast_module_mixed_precision), so LayerNorm, GELU, softmax, the
# residual stream and the gains as the forward reads them are bf16 (8 bits of mantissa: 2^-8
# = 3.9e-3 relative; a LayerNorm gain of 1.0 moves in steps of 2^-7, wider than a 1e-3 update).
# Measured here: 9e-3 relative after one step, 9.5e-3 at most in 20; 1e-2 is the bound stated.
BF16_TOL = 1e-2
ADAMW = {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}


def row(name, ranks, gas=1, stage=0, tol=FP32_TOL, known=None, **over):
    cfg = {"train_batch_size": MICRO * gas * ranks, "train_micro_batch_size_per_gpu": MICRO,
           "gradient_accumulation_steps": gas, "steps_per_print": 1,
           "optimizer": copy.deepcopy(ADAMW), "zero_optimization": {"stage": stage}}
    for k, v in over.items():
        cfg[k] = v
    return {"name": name, "ranks": ranks, "tol": tol, "cfg": cfg, "known": known}


def configs():
    adam = lambda w: {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.1, "adam_w_mode": w}}
    sgd = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.0}}
    return [
        row("zero0_1r_adamw", 1),
        row("zero0_2r", 2),
        row("zero1_2r", 2, stage=1),
        row("zero2_2r", 2, stage=2),
        row("zero2_4r", 4, stage=2),
        row("zero2_2r_overlap", 2, stage=2,
            zero_optimization={"stage": 2, "overlap_comm": True, "reduce_bucket_size": 50000}),
        row("gas3_1r", 1, gas=3),
        row("gas3_2r_zero2", 2, gas=3, stage=2),
        row("adam_w_mode_true", 1, optimizer=adam(True)),
        row("adam_w_mode_false", 1, optimizer=adam(False)),
        row("sgd_momentum", 1, optimizer=sgd),
        row("warmuplr_log", 1, scheduler={"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}}),
        row("warmupdecaylr", 1, scheduler={"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 5,
            "total_num_steps": 20}}),
        row("warmupcosinelr", 1, scheduler={"type": "WarmupCosineLR", "params": {
            "warmup_min_ratio": 0.0, "warmup_num_steps": 5, "total_num_steps": 20,
            "cos_min_ratio": 0.1}}),
        row("onecycle", 1, known="DeepSpeed's OneCycle sets beta2 to 0.99, docs/config.md; "
            "onecycle_beta2_0.99 is this row with 0.99 on both sides", scheduler={"type": "OneCycle", "params": {
            "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 5,
            "cycle_second_step_size": 5, "decay_step_size": 5, "decay_lr_rate": 0.1,
            "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}),
        row("onecycle_no_mom", 1, scheduler={"type": "OneCycle", "params": {
            "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 5,
            "cycle_second_step_size": 5, "decay_step_size": 5, "decay_lr_rate": 0.1,
            "cycle_momentum": False}}),
        row("onecycle_beta2_0.99", 1, optimizer={"type": "AdamW", "params": {
            "lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.99]}}, scheduler={
            "type": "OneCycle", "params": {
                "cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 5,
                "cycle_second_step_size": 5, "decay_step_size": 5, "decay_lr_rate": 0.1,
                "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}}),
        row("clip_off_2r", 2, gradient_clipping=0.0),
        row("sgd_clip_0.5_2r", 2, optimizer=sgd, gradient_clipping=0.5),
        row("fp16_dynamic_2r", 2, fp16={"enabled": True, "loss_scale": 0,
                                        "initial_scale_power": 24, "loss_scale_window": 4,
                                        "hysteresis": 2, "min_loss_scale": 1}),
        row("bf16_2r", 2, tol=BF16_TOL, bf16={"enabled": True}),
    ]


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [float(r[1]) for r in list(csv.reader(f))[1:]]


def troupe_side(build, c, cfg_path, init, data, steps, work):
    p = run_troupe(build, c["ranks"], cfg_path, ["--load-llmc", init, "--train-data", data, "--steps",
                                                 str(steps), "--val-batches", "1", "--print-every", "1"])
    if p.returncode != 0:
        err = [l for l in (p.stderr + p.stdout).splitlines() if l.strip()]
        return {"error": one_line(err[-1] if err else "exit %d" % p.returncode)}
    mon = os.path.join(work, "csv", "troupe")
    ranks = re.findall(r"\[Rank 0\] step=\d+, skipped=(\d+), lr=\[[^]]*\], mom=\[\[([^]]*)\]\]", p.stdout)
    # the progress line (--print-every 1), its lr at %.3g: "step N/M loss L lr X" or, under
    # mpirun's pseudo-terminal, "step N/M | loss L | lr X"
    used = re.findall(r"step \d+/\d+ \|? ?loss \S+ \|? ?lr (\S+)", p.stdout)
    return {"loss": read_csv(os.path.join(mon, "Train_Samples_train_loss.csv")),
            "next_lr": read_csv(os.path.join(mon, "Train_Samples_lr.csv")),
            "scale": read_csv(os.path.join(mon, "Train_Samples_loss_scale.csv")),
            "skipped": [int(k) for k, _ in ranks],
            "mom": [tuple(round(float(b), 6) for b in m.split(",")) for _, m in ranks],
            "lr": [float(x) for x in used]}


def deepspeed_side(py, c, cfg_path, init, data, steps, port):
    p = run_deepspeed(py, c["ranks"], port, ["--config", cfg_path, "--checkpoint", init,
                                             "--train-data", data, "--steps", str(steps)])
    out = {"loss": [], "lr": [], "next_lr": [], "scale": [], "skipped": [], "mom": []}
    for m in re.finditer(r"^ds_step: \d+ loss (\S+) lr (\S+) next_lr (\S+) scale (\S+) skipped (\d+) mom (\S+)",
                         p.stdout, re.M):
        out["loss"].append(float(m.group(1)))
        out["lr"].append(float(m.group(2)))
        out["next_lr"].append(float(m.group(3)))
        out["scale"].append(float(m.group(4)))
        out["skipped"].append(int(m.group(5)))
        out["mom"].append(tuple(round(float(b), 6) for b in m.group(6).split(",")) if m.group(6) != "-" else None)
    if "ds_error: " in p.stdout or p.returncode != 0 or len(out["loss"]) != steps:
        out["error"] = last_error(p) if p.returncode != 0 or "ds_error: " in p.stdout else \
            "exit 0 after %d of %d steps" % (len(out["loss"]), steps)
    return out


def scaler_check(py, cfg_path, t):
    """Where DeepSpeed refuses fp16: its own loss scaler (deepspeed/scaler_ds.py) fed the
    overflows of Troupe's run, its scales against Troupe's; one phrase for the row."""
    flags = ["1" if k > (t["skipped"][i - 1] if i else 0) else "0" for i, k in enumerate(t["skipped"])]
    p = run([py, os.path.join(HERE, "deepspeed", "scaler_ds.py"), "--config", cfg_path, "--overflows",
             ",".join(flags)], dict(os.environ, DS_ACCELERATOR="cpu"), 300)
    scales = [float(x) for x in re.findall(r"^ds_scale: \d+ (\S+)$", p.stdout, re.M)]
    if p.returncode != 0 or len(scales) != len(flags):
        return "DeepSpeed's loss scaler failed: " + last_error(p)
    same = [float(x) for x in t["scale"]] == scales
    c = flags.count("1")
    return ("DeepSpeed's own DynamicLossScaler fed Troupe's %d overflow step%s: scales %s (%s)"
            % (c, "" if c == 1 else "s", "same" if same else "DIFFER",
               ", ".join("%g" % x for x in scales[:8]) + (", ..." if len(scales) > 8 else "")))


def max_rel(a, b):
    """(largest |a-b|/|b|, 1-based step) over the common steps."""
    best, at = -1.0, 0
    for i, (x, y) in enumerate(zip(a, b)):
        d = abs(x - y) / abs(y) if y else abs(x - y)
        if d > best:
            best, at = d, i + 1
    return max(best, 0.0), at


def compare(c, t, d, steps):
    if "error" in t:
        return "troupe failed: " + t["error"]
    if "error" in d:
        return "deepspeed failed: " + d["error"] + ("; " + d["scaler"] if "scaler" in d else "")
    if len(t["loss"]) != steps:
        return "troupe wrote %d of %d losses" % (len(t["loss"]), steps)
    rel, at = max_rel(t["loss"], d["loss"])
    lr_rel, lr_at = max_rel(t["next_lr"], d["next_lr"])
    verdict = "ok" if rel <= c["tol"] else "KNOWN" if c["known"] else "DIFF"
    extra = ""
    if c["cfg"].get("fp16", {}).get("enabled"):
        same_skip = t["skipped"] == d["skipped"]
        same_scale = [float(x) for x in t["scale"]] == d["scale"]
        extra = " skipped %s scales %s" % ("same" if same_skip else "DIFFER", "same" if same_scale else "DIFFER")
        if not (same_skip and same_scale):
            verdict = "DIFF"
    # the lr each step used (Troupe's printed at %.3g, so only a mismatch beyond 1e-2 counts)
    for i, (x, y) in enumerate(zip(t["lr"], d["lr"])):
        if abs(x - y) > 1e-2 * max(abs(x), abs(y)):
            extra += "; lr used at step %d: %.3g vs %.3g" % (i + 1, x, y)
            break
    # the optimizer's betas after each step (OneCycle cycles them), where both have betas
    for i, (x, y) in enumerate(zip(t["mom"], d["mom"])):
        if y is not None and x != y:
            extra += "; printed betas after step %d: (%s) vs (%s)" % (
                i + 1, ", ".join("%g" % b for b in x), ", ".join("%g" % b for b in y))
            break
    if verdict == "KNOWN":
        extra += "; kept: " + c["known"]
    c["result"] = {"rel": rel, "at": at, "lr_rel": lr_rel, "lr_at": lr_at, "verdict": verdict}
    return "%-5s loss %.3e at step %2d (tol %.0e); next lr %.1e; final %.6f vs %.6f%s" % (
        verdict, rel, at, c["tol"], lr_rel, t["loss"][-1], d["loss"][-1], extra)


def main():
    ap = arguments(__doc__, 20)
    ap.add_argument("--verbose", action="store_true", help="per-step losses of both sides")
    args = ap.parse_args()
    rows = chosen(args, configs())
    if rows is None:
        return 0
    build = os.path.abspath(args.build)
    data = os.path.join(build, "demo-data", "text_train.bin")
    py, why, rc = peer_python()
    if py is None:
        print("equivalence: skipped, no DeepSpeed peer: " + why)
        return 0 if rc == 3 else 1
    work = tempfile.mkdtemp(prefix="troupe-equiv.")
    try:
        base = row("init", 1)["cfg"]
        base["troupe"] = {"data": {"shuffle": False}}
        try:
            init = write_init(build, work, base, DIMS, data)
        except RuntimeError as e:
            print("equivalence: %s" % e)
            return 1
        header(py, "GPT-2 V=256 T=64 C=64 L=2 NH=4, %d sequences per rank per micro-step, %d steps,"
               " from one llm.c checkpoint" % (MICRO, args.steps))
        print("%-20s %5s  %s" % ("config", "ranks", "largest relative difference (troupe vs deepspeed)"))
        port = 29600 + os.getpid() % 200
        for c in rows:
            cfg = copy.deepcopy(c["cfg"])
            cfg["csv_monitor"] = {"enabled": True, "output_path": os.path.join(work, "csv"), "job_name": "troupe"}
            cfg["troupe"] = {"data": {"shuffle": False}}
            cfg_path = os.path.join(work, c["name"] + ".json")
            with open(cfg_path, "w") as f:
                json.dump(cfg, f, indent=1)
            shutil.rmtree(os.path.join(work, "csv"), ignore_errors=True)
            t = troupe_side(build, c, cfg_path, init, data, args.steps, work)
            shutil.rmtree(os.path.join(work, "csv"), ignore_errors=True)
            port += 1
            d = deepspeed_side(py, c, cfg_path, init, data, args.steps, port)
            if "error" in d and "error" not in t and c["cfg"].get("fp16", {}).get("enabled"):
                d["scaler"] = scaler_check(py, cfg_path, t)
            shutil.rmtree(os.path.join(work, "csv"), ignore_errors=True)
            print("%-20s %5d  %s" % (c["name"], c["ranks"], compare(c, t, d, args.steps)), flush=True)
            if args.verbose:
                for i in range(args.steps):
                    g = lambda s, k: ("%.7g" % s[k][i]) if i < len(s.get(k, [])) else "-"
                    print("    step %2d loss %s %s lr %s %s next_lr %s %s scale %s %s" % (
                        i + 1, g(t, "loss"), g(d, "loss"), g(t, "lr"), g(d, "lr"),
                        g(t, "next_lr"), g(d, "next_lr"), g(t, "scale"), g(d, "scale")))
        verdicts = [c.get("result", {}).get("verdict", "failed") for c in rows]
        print("equivalence: %d within tolerance, %d differ, %d differ as documented, %d did not run"
              " on a side (of %d)" % (verdicts.count("ok"), verdicts.count("DIFF"),
                                      verdicts.count("KNOWN"), verdicts.count("failed"), len(rows)))
        for c in rows:
            if "result" in c:
                print("equiv_%s_loss_max_rel_diff: %.3e" % (c["name"], c["result"]["rel"]))
                print("equiv_%s_loss_max_rel_diff_step: %d" % (c["name"], c["result"]["at"]))
    finally:
        if args.keep:
            print("work: " + work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
