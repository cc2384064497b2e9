#!/usr/bin/env python3
"""Where an overlapped forward waits, from a merged bench trace (--trace).

Prints, over the measured iterations, each layer's "forward waits for LAYER" per rank and iteration
(the mean over ranks), the ranks' spread of backward ends per iteration (the shard of layer 0 sums
only when the last rank's push is in), and each rank's waits beyond layer 0. Times are emulated
milliseconds (trace times / F).

usage: forward_waits.py TRACE[.gz] F [FIRST_MEASURED_ITERATION]
"""
import collections
import gzip
import json
import sys


def main():
    path, dilation = sys.argv[1], float(sys.argv[2])
    first = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    it = lambda e: e.get("args", {}).get("iteration")
    ms = lambda us: us / 1000 / dilation
    backward = [e for e in events if e["name"] == "backward (emulated)"]
    iterations = sorted({it(e) for e in backward if it(e) is not None and it(e) >= first})
    ranks = sorted({e["pid"] for e in backward})
    waits = [e for e in events if e["name"].startswith("forward waits for ") and it(e) in iterations]
    n = len(ranks) * len(iterations)
    per_layer = collections.defaultdict(float)
    per_rank = collections.defaultdict(float)
    layer0 = None
    for e in waits:
        per_layer[e["name"][len("forward waits for "):]] += ms(e["dur"]) / n
    order = sorted(per_layer.items(), key=lambda kv: -kv[1])
    layer0 = order[0][0] if order else None
    print(f"{len(ranks)} ranks, iterations {iterations}: the forward's waits, ms per rank and iteration")
    for name, v in order:
        print(f"  {name:12s} {v:7.1f}")
    print(f"  {'all':12s} {sum(per_layer.values()):7.1f}")
    for t in iterations:
        ends = {e["pid"]: e["ts"] + e["dur"] for e in backward if it(e) == t}
        last = sorted(ends, key=ends.get)[-4:]
        print(f"iteration {t}: backward ends spread {ms(max(ends.values()) - min(ends.values())):.0f} ms, "
              f"last ranks {last}")
    for e in waits:
        if not e["name"].endswith(" " + str(layer0)):
            per_rank[e["pid"]] += ms(e["dur"]) / len(iterations)
    print("waits beyond the first layer's, ms per iteration, by rank:")
    print("  " + " ".join(f"{r}:{per_rank[r]:.0f}" for r in ranks))


if __name__ == "__main__":
    main()
