#!/usr/bin/env python3
"""What each measured iteration's forward waits for, layer by layer, from a merged bench trace (--trace).

For every "forward waits for LAYER" span: the median and max over the ranks of its length per
iteration, in emulated ms (trace times / F), the layers in the order the forward meets them (those
that kept some rank waiting 5 ms or more), and each rank's total wait.

usage: forward_waits.py TRACE[.gz] F
"""
import collections
import gzip
import json
import statistics
import sys


def main():
    path, dilation = sys.argv[1], float(sys.argv[2])
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    iteration = lambda e: e.get("args", {}).get("iteration")
    measured = sorted({iteration(e) for e in events if e["name"] == "backward (emulated)"})[1:]
    for t in measured:
        waits = collections.defaultdict(dict)  # layer -> rank -> ms
        order = {}
        for e in events:
            if iteration(e) == t and e["name"].startswith("forward waits for "):
                layer = e["name"][len("forward waits for "):]
                waits[layer][e["pid"]] = waits[layer].get(e["pid"], 0) + e["dur"] / 1000 / dilation
                order[layer] = min(order.get(layer, e["ts"]), e["ts"])
        total = collections.defaultdict(float)
        for layer in waits:
            for rank, ms in waits[layer].items():
                total[rank] += ms
        if total:
            print(f"iteration {t}: the forward waits {statistics.median(total.values()):.0f} ms (median rank), "
                  f"{max(total.values()):.0f} (max)")
        for layer in sorted(waits, key=order.get):
            v = list(waits[layer].values())
            if max(v) >= 5:
                print(f"  {layer:>10}: median {statistics.median(v):4.0f} ms, max {max(v):4.0f} ({len(v)} ranks)")


if __name__ == "__main__":
    main()
