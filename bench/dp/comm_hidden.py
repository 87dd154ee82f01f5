#!/usr/bin/env python3
"""The share of one kind of collective's time hidden by compute, from a `troupe train --trace`
folder: `troupe trace summary`'s "comm hidden" (docs/tracing.md, overlap) restricted to the
collective spans of the names given, e.g. ZeRO 3's all-gathers apart from its reduce-scatters.

    bench/dp/comm_hidden.py TRACE_DIR NAME[,NAME...]

Per rank (trace_rank*.json): the time during which some span of those names is in flight on
a comm lane, over the traced steps (the step markers' steps, as the summary counts them), and
the part of it during which some compute lane (an actor of kind compute) is inside a span.
Prints the mean over the ranks of hidden / in flight, in percent, or n/a when no rank has such
a span.

One difference from the summary: the "executor passes" lane is left out. A pass's span runs
from its start to its end, and at ZeRO 3 a pass pauses at each layer until the fetcher's
param_ready: the span would count the executor's waits for a gather as compute hiding that
gather (the summary's figure does). The executor's own lane holds the messages it runs the
layers in (param_ready at stage 3, the whole pass otherwise), so the compute is still
counted (at stages 0-2 the executor's message span holds the whole pass, so leaving the lane
out changes nothing there)."""
import glob
import json
import os
import sys


def union(spans):
    """Sorted, merged (start, end) intervals."""
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def covered(xs, ys):
    """The length of the intersection of two merged interval lists."""
    i = j = 0
    t = 0.0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        t += max(0.0, b - a)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return t


def rank_share(path, names):
    with open(path) as f:
        events = json.load(f)
    kind = {e["tid"]: e["args"].get("kind") for e in events
            if e.get("ph") == "M" and e.get("name") == "thread_name" and not e["args"]["name"].endswith(" passes")}
    steps = {e["args"]["step"] for e in events if e.get("ph") == "i" and e.get("name") == "step"}
    spans = [e for e in events if e.get("ph") == "X" and e.get("args", {}).get("step") in steps]
    comm = union((e["ts"], e["ts"] + e["dur"]) for e in spans
                 if kind.get(e["tid"]) == "comm" and e["name"] in names)
    compute = union((e["ts"], e["ts"] + e["dur"]) for e in spans if kind.get(e["tid"]) == "compute")
    total = sum(b - a for a, b in comm)
    return covered(comm, compute) / total if total > 0 else None


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: comm_hidden.py TRACE_DIR NAME[,NAME...]")
    files = sorted(glob.glob(os.path.join(sys.argv[1], "trace_rank*.json")))
    if not files:
        sys.exit("comm_hidden.py: no trace_rank*.json in " + sys.argv[1])
    r = [x for x in (rank_share(p, set(sys.argv[2].split(","))) for p in files) if x is not None]
    print("%.1f" % (100 * sum(r) / len(r)) if r else "n/a")


if __name__ == "__main__":
    main()
