#!/usr/bin/python3
"""One rank's iteration from a `poseidon bench --trace` file, drawn with gnuplot.

    /usr/bin/python3 bench/trace_timeline.py TRACE.json --rank 0 --iteration 6 --out timeline.png

x: seconds from the start of the iteration's forward pass. Bands on top: the emulated forward and
backward passes (and, without the overlap, the wait at the barrier). Below, one row per layer in
forward order (layer 0 at the top): a bar from the moment its gradient was submitted to the moment
its synchronized result landed (the end of its "receive" span). Under the barrier the lowest layers
land last; with priority-scheduled links they land first, and the next forward starts on them.
Needs only the standard library and gnuplot.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--iteration", type=int, required=True, help="the iteration whose backward and sync to draw")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    with open(a.trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    spans = [e for e in events if e.get("ph") == "X" and e.get("pid") == a.rank]
    mine = [e for e in spans if e.get("args", {}).get("iteration") == a.iteration]
    nxt = [e for e in spans if e.get("args", {}).get("iteration") == a.iteration + 1 and e.get("cat") == "compute"]
    if not mine:
        sys.exit(f"no spans of rank {a.rank} at iteration {a.iteration} in {a.trace}")
    t0 = min(e["ts"] for e in mine if e.get("cat") == "compute")

    def sec(ts):
        return (ts - t0) / 1e6

    # Layers in forward order: backward submits them last-first.
    sends = sorted((e for e in mine if e["name"].startswith("send ")), key=lambda e: e["ts"])
    order = []
    for e in reversed(sends):
        layer = e["name"][len("send "):]
        if layer not in order:
            order.append(layer)
    landed = {}
    for e in mine:
        if e["name"].startswith("receive ") or e["name"].startswith("reconstruct "):
            layer = e["name"].split(" ", 1)[1].replace(" (sfb GEMM)", " (sfb)")
            landed[layer] = max(landed.get(layer, 0), e["ts"] + e["dur"])
    submitted = {e["name"][len("send "):]: e["ts"] for e in sends}
    with tempfile.TemporaryDirectory() as tmp:
        bars = os.path.join(tmp, "bars.dat")
        with open(bars, "w") as f:
            for i, layer in enumerate(order):
                if layer in landed:
                    f.write(f"{sec(submitted[layer]):.6f} {sec(landed[layer]):.6f} {i}\n")
        comp = os.path.join(tmp, "compute.dat")
        colors = {"forward": 1, "backward": 2, "wait": 3}
        with open(comp, "w") as f:
            for e in [e for e in mine if e.get("cat") in ("compute", "wait")] + nxt:
                if e.get("cat") == "wait":
                    kind = "wait"
                else:
                    kind = "forward" if e["name"].startswith("forward") else "backward"
                f.write(f"{sec(e['ts']):.6f} {sec(e['ts'] + e['dur']):.6f} {colors[kind]}\n")
        n = len(order)
        title = a.title or f"rank {a.rank}, iteration {a.iteration}: {os.path.basename(a.trace)}"
        gp = os.path.join(tmp, "plot.gp")
        with open(gp, "w") as f:
            f.write(f"""set terminal pngcairo size 1000,600 noenhanced
set output '{a.out}'
set title '{title}'
set xlabel 'seconds from the start of the forward pass'
set ylabel 'layer (forward order)'
set yrange [{n + 0.5}:-4]
set key outside bottom center horizontal
set style fill solid 0.8
plot '{comp}' using (($1+$2)/2):(-2):(($2-$1)/2):(1):3 with boxxyerror lc variable \\
       title 'compute: forward (purple), backward (green), barrier wait (blue), next forward', \\
     '{bars}' using (($1+$2)/2):3:(($2-$1)/2):(0.4) with boxxyerror lc rgb '#c0504d' \\
       title 'each layer: submitted -> synchronized result in'
""")
        subprocess.run(["gnuplot", gp], check=True)
    print(a.out)


if __name__ == "__main__":
    main()
