"""Poseidon and DDP from 1 to 32 emulated nodes, the planner's predictions next to them and beyond
(to 256 nodes), and the paper's published speedups: bench/results/scale.md and a Fig. 8-shaped plot
per model (issue 13 items 1 and 2).

Reads the `poseidon bench --json` files of the scale sweep (bench/run_full.sh stage G), asks
`poseidon plan --check` for the planner's prediction of every measured point and `poseidon plan
--sweep` for full-width predictions at 1-256 nodes, and writes Markdown and gnuplot PNGs.
Needs only the standard library and gnuplot.
"""
import argparse
import json
import os
import subprocess
import tempfile

# What the paper states in numbers (ATC'17 section 5 and its abstract), for the plots. Each entry:
# (model, nodes, speedup, bandwidth, system, where).
PUBLISHED = [
    ("vgg19", 16, 8.0, "10GbE", "PS (Caffe+WFBP)", "5.2: 'using PS on 16 nodes can only be accelerated by 8x'"),
    ("vgg19", 32, 30.0, "40GbE", "Poseidon-Caffe", "Fig. 5 (read off the figure: ~30x)"),
    ("vgg19-22k", 16, 15.5, "10GbE", "Poseidon", "abstract: '15.5x speed-up on 16 single-GPU machines ... 10GbE'"),
    ("vgg19-22k", 16, 4.0, "10GbE", "PS", "1: 'a PS-based parallelization which only achieves 4x'"),
    ("vgg19-22k", 32, 29.5, "40GbE", "Poseidon-Caffe", "5.1: 29.5x on 32 nodes"),
    ("googlenet", 32, 31.0, "40GbE", "Poseidon-Caffe", "Fig. 5 (read off the figure: ~31x)"),
]
SWEEP = [1, 2, 4, 8, 16, 32, 64, 128, 256]


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", help="poseidon bench --json files, one model each")
    ap.add_argument("--cli", default="build/bin/poseidon")
    ap.add_argument("--markdown", required=True)
    ap.add_argument("--plots", help="directory for one PNG per model")
    a = ap.parse_args()

    md = ["# Scale: 1 to 32 emulated nodes, and the planner to 256",
          "",
          "Made by `bench/scale_report.py` from " + ", ".join(os.path.basename(r) for r in a.results) +
          " (`poseidon bench`, 4 measured iterations per point, one run each, `--tcp-rcvbuf 16384`) and the",
          "planner (`poseidon plan --check` for the measured points, `poseidon plan --sweep` at full width",
          "beyond). Speedup = throughput over one node's. `meas` = measured, `plan` = the planner's prediction of",
          "that same run (the emulated cluster: 92% link efficiency, the host's 2 cores shared by the nodes);",
          "HOST-BOUND runs (the ranks used > 80% of the host's cores) do not count and are not predicted.",
          "Rates are the emulated ones; at full width (s = 0.1) 100 Mbit/s is 10 Gbit/s and 30 Mbit/s is 3 Gbit/s.",
          ""]
    worst = []
    for path in a.results:
        doc = json.load(open(path))
        config = doc["config"]
        scale = config["scale"]
        model = config["models"][0]
        check = run_json([a.cli, "plan", "--check", path, "--json"])
        predicted = {(r["system"], r["nodes"], r["link_mbit"]): r for r in check["rows"]}
        worst += [(abs(r["error"]), model, r) for r in check["rows"] if r["nodes"] > 1]
        runs = {(r["system"], r["nodes"], r["link_mbit"]): r for r in doc["runs"]}
        systems = [s for s in config["systems"] if any(k[0] == s for k in runs)]
        md += [f"## {model}", ""]
        for rate in config["rates_mbit"]:
            md.append(f"### {rate:g} Mbit/s ({rate / 1000 / scale / scale:g} Gbit/s at full width)")
            md.append("")
            head = "| nodes |" + "".join(f" {s} meas | {s} plan |" for s in systems) + " host CPU (poseidon) |"
            md += [head, "|" + "---|" * (1 + 2 * len(systems) + 1)]
            for n in config["nodes"]:
                cells = [str(n)]
                host = ""
                for s in systems:
                    r = runs.get((s, n, rate))
                    if not r:  # one node runs once, at the first rate
                        cells += ["-", "-"]
                        continue
                    if not r.get("ok"):
                        cells += ["failed", "-"]
                        continue
                    mark = " HOST-BOUND" if r.get("host_bound") else ""
                    cells.append(f"{r['speedup']:.2f}x ({r['iteration_seconds']:.3f} s){mark}")
                    p = predicted.get((s, n, rate))
                    # the same one-node baseline: speedup x measured / predicted seconds
                    cells.append(f"{r['speedup'] * r['iteration_seconds'] / p['predicted_seconds']:.2f}x "
                                 f"({p['predicted_seconds']:.3f} s, {p['error'] * 100:+.1f}%)" if p else "-")
                    if s == "poseidon":
                        host = f"{r.get('host_cpu_share', 0) * 100:.0f}%"
                cells.append(host)
                md.append("| " + " | ".join(cells) + " |")
            md.append("")
        # Full width, the planner alone, to 256 nodes.
        md.append(f"### The planner at full width, 1-256 nodes ({model})")
        md.append("")
        sweeps = {}
        for rate in config["rates_mbit"]:
            gbit = rate / 1000 / scale / scale
            sweeps[rate] = run_json([a.cli, "plan", "--sweep", ",".join(map(str, SWEEP)), "--model", model,
                                     "--rate", f"{gbit:g}", "--systems", "poseidon,poseidon-overlap,ddp", "--json"])
            md.append(f"{gbit:g} Gbit/s: " + "; ".join(
                f"P={p['workers']} {p['system']} {p['speedup']:.1f}x" for p in sweeps[rate]["predictions"]
                if p["workers"] in (16, 32, 64, 128, 256) and p["system"] != "poseidon-overlap"))
            md.append("")
        pub = [p for p in PUBLISHED if p[0] == model]
        if pub:
            md.append("Published (ATC'17): " + "; ".join(f"{p[4]} {p[2]:g}x on {p[1]} nodes at {p[3]} ({p[5]})"
                                                         for p in pub))
            md.append("")
        if a.plots:
            plot(a.plots, model, runs, config, sweeps, pub)
    worst.sort(key=lambda w: -w[0])
    counted = len(worst)
    beyond = [w for w in worst if w[0] > 0.15]
    md += ["## The planner against every measured point", "",
           f"{counted} points (2-32 nodes, both rates, every model and system above, HOST-BOUND ones left out): "
           f"{len(beyond)} beyond 15%; mean error "
           f"{sum(w[0] for w in worst) / max(1, counted) * 100:.1f}%; the worst five:", ""]
    for e, model, r in worst[:5]:
        md.append(f"- {model} {r['system']} {r['nodes']} nodes @ {r['link_mbit']:g} Mbit/s: measured "
                  f"{r['measured_seconds']:.3f} s, predicted {r['predicted_seconds']:.3f} s ({r['error'] * 100:+.1f}%)")
    md.append("")
    with open(a.markdown, "w") as f:
        f.write("\n".join(md))


def plot(directory, model, runs, config, sweeps, published):
    """Speedup against nodes at the higher rate (the paper's Fig. 8 shape), with the planner to 256."""
    os.makedirs(directory, exist_ok=True)
    rate = max(config["rates_mbit"])
    scale = config["scale"]
    gbit = rate / 1000 / scale / scale
    with tempfile.TemporaryDirectory() as tmp:
        series = []

        def data(name, points):
            path = os.path.join(tmp, name + ".dat")
            with open(path, "w") as f:
                for x, y in points:
                    f.write(f"{x} {y}\n")
            return path

        for s in ("poseidon", "ddp"):
            pts = [(n, runs[(s, n, rate)]["speedup"]) for n in config["nodes"]
                   if (s, n, rate) in runs and runs[(s, n, rate)].get("ok") and not runs[(s, n, rate)].get("host_bound")]
            series.append((data("meas-" + s, pts), f"{s}, measured", "points pt 7 ps 1.5"))
        for s in ("poseidon", "ddp"):
            pts = [(p["workers"], p["speedup"]) for p in sweeps[rate]["predictions"] if p["system"] == s]
            series.append((data("plan-" + s, pts), f"{s}, planner", "lines lw 2"))
        series.append((data("ideal", [(n, n) for n in SWEEP]), "linear", "lines dt 2 lc rgb 'gray'"))
        for i, (bw, system) in enumerate(sorted({(p[3], p[4]) for p in published})):
            pts = [(p[1], p[2]) for p in published if (p[3], p[4]) == (bw, system)]
            series.append((data(f"paper{i}", pts), f"paper: {system}, {bw}", f"points pt {5 + 2 * i} ps 2"))
        out = os.path.join(os.path.abspath(directory), f"{model}-{rate:g}mbit.png")
        gp = os.path.join(tmp, "plot.gp")
        with open(gp, "w") as f:
            f.write("set terminal pngcairo size 900,600\n")
            f.write(f"set output '{out}'\n")
            f.write(f"set title '{model}: speedup over one node, {gbit:g} Gbit/s links (emulated {rate:g} Mbit/s at s = {scale:g})'\n")
            f.write("set xlabel 'nodes'\nset ylabel 'speedup'\nset logscale xy 2\nset key top left\nset grid\n")
            f.write("plot " + ", ".join(f"'{p}' using 1:2 with {style} title '{t}'" for p, t, style in series) + "\n")
        subprocess.run(["gnuplot", gp], check=True)


if __name__ == "__main__":
    main()
