#!/usr/bin/env python3
"""The next forward's wait for a layer's sync, leg by leg, from a merged bench trace (--trace).

For each measured iteration and each layer named: when the ranks submitted its push, when its
shard got the first and the last push (the "shard" lane, client/node.cc), when the sum went out,
and when the ranks got it; for layer 0 also each push's own way in (submitted -> in at the shard).
Times are emulated milliseconds after the first rank's backward ended (trace times / F).

usage: round_trip.py TRACE[.gz] F LAYER[,LAYER...] [ITERATION ...]
"""
import gzip
import json
import re
import statistics
import sys


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def main():
    path, dilation, layers = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(",")
    events = load(path)
    iteration = lambda e: e.get("args", {}).get("iteration")
    iterations = [int(i) for i in sys.argv[4:]] or sorted(
        {iteration(e) for e in events if e["name"] == "backward (emulated)"})[1:-1]
    for t in iterations:
        ends = [e["ts"] + e["dur"] for e in events if iteration(e) == t and e["name"] == "backward (emulated)"]
        base = min(ends)
        ms = lambda us: (us - base) / 1000 / dilation
        print(f"iteration {t}: backward ends {ms(min(ends)):.0f}..{ms(max(ends)):.0f}")
        for layer in layers:
            sends = {e["pid"]: e["ts"] for e in events if iteration(e) == t and e["name"] == f"send {layer} (ps)"}
            landed = sorted(e["ts"] + e["dur"] for e in events
                            if iteration(e) == t and e["name"] == f"receive {layer} (ps)")
            print(f"  {layer}: submitted {ms(min(sends.values())):.0f}..{ms(max(sends.values())):.0f}")
            for s in (e for e in events if iteration(e) == t and e["name"].startswith(f"shard sums {layer} pair")):
                m = re.search(r"pair (\d+) \(last push from rank (\d+), in at \+(\d+) ms", s["name"])
                pair, last, after = int(m.group(1)), int(m.group(2)), int(m.group(3))
                print(f"    pair {pair} on rank {s['pid']}: first push in {ms(s['ts']):.0f}, last in "
                      f"{ms(s['ts'] + after * 1000):.0f} (from rank {last}, submitted {ms(sends[last]):.0f}), "
                      f"sum out {ms(s['ts'] + s['dur']):.0f}")
            print(f"    landed: first {ms(landed[0]):.0f}, median {ms(landed[len(landed) // 2]):.0f}, "
                  f"last {ms(landed[-1]):.0f}")
            if layer == layers[0]:
                # ("TMP push in from N": the same span, as a scratch build named it in window4608-trace)
                arrivals = {int(re.search(r"push in from (?:rank )?(\d+)", e["name"]).group(1)): e["ts"]
                            for e in events if iteration(e) == t and "push in from " in e["name"]}
                legs = sorted((arrivals[r] - sends[r]) / 1000 / dilation for r in arrivals if r in sends)
                if legs:
                    print(f"    each push's way in (ms): median {statistics.median(legs):.0f}, "
                          f"p90 {legs[int(0.9 * (len(legs) - 1))]:.0f}, max {legs[-1]:.0f}")
        waits = [e["dur"] / 1000 / dilation for e in events
                 if iteration(e) == t + 1 and e["name"] == f"forward waits for {layers[0]}"]
        if waits:
            print(f"  the next forward waits for {layers[0]}: median {statistics.median(waits):.0f} ms, "
                  f"max {max(waits):.0f}")


if __name__ == "__main__":
    main()
