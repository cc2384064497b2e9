#!/usr/bin/python3
"""Omnivore's Table III for Fashion-MNIST: the best explicit momentum per number of compute groups.

For each g in --groups and each momentum in --momenta (and each learning rate in --lrs) it trains
LeNet with `poseidon train --groups g` on this machine (real processes on loopback, real gradients)
and records the epochs, and the updates per group, until the test accuracy first reaches --target
(evaluated after every epoch of --train-limit images). Writes a Markdown table and the JSON.

Theorem 1 predicts that the best explicit momentum falls as g grows (implicit momentum 1 - 1/g).

  /usr/bin/python3 bench/momentum_grid.py --out bench/results/momentum_grid
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run(binary, g, momentum, lr, a):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "s.json")
        cmd = [binary, "train", "--workers", str(a.workers), "--batch", str(a.batch), "--train-limit",
               str(a.train_limit), "--epochs", str(a.epochs), "--lr", str(lr), "--momentum", str(momentum),
               "--quiet", "--summary", summary, "--timeout", "120000"]
        if g > 1:  # g = 1 is BSP with every layer by PS, the group mode's own g = 1 (bit-identical)
            cmd += ["--groups", str(g)]
        else:
            cmd += ["--scheme", "ps"]
        t0 = time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.time() - t0
        if p.returncode != 0:
            return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
        s = json.load(open(summary))
    curve = [e["test_accuracy"] for e in s["epochs_run"]]
    reached = next((i + 1 for i, acc in enumerate(curve) if acc >= a.target), None)
    steps_per_epoch = a.train_limit // (a.workers * a.batch)
    return {"curve": curve, "epochs_to_target": reached,
            "updates_per_group_to_target": reached * steps_per_epoch if reached else None,
            "final_accuracy": curve[-1] if curve else None, "wall_seconds": round(wall, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "poseidon"))
    ap.add_argument("--groups", default="1,2,4,8")
    ap.add_argument("--momenta", default="0,0.3,0.6,0.9")
    ap.add_argument("--lrs", default="0.05", help="comma-separated learning rates (the paper: eta* and eta*/10)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    ap.add_argument("--train-limit", type=int, default=8192)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.80)
    ap.add_argument("--out", required=True, help="path prefix: writes PREFIX.json and PREFIX.md")
    ap.add_argument("--from-json", action="append", help="do not train: take the runs' accuracy curves from this "
                    "JSON (an earlier --out; repeat to merge runs, e.g. of two learning rates) and count the epochs "
                    "to --target again")
    a = ap.parse_args()
    groups = [int(x) for x in a.groups.split(",")]
    momenta = [float(x) for x in a.momenta.split(",")]
    lrs = [float(x) for x in a.lrs.split(",")]
    results = []
    if a.from_json:
        earlier = [json.load(open(path)) for path in a.from_json]
        for k in ("workers", "batch", "train_limit", "epochs"):
            if len({e["settings"][k] for e in earlier}) != 1:
                sys.exit(f"momentum_grid: the files differ in {k}; merge only runs of the same settings")
            setattr(a, k, earlier[0]["settings"][k])
        steps_per_epoch = a.train_limit // (a.workers * a.batch)
        for r in [r for e in earlier for r in e["results"]]:
            if "curve" in r:
                reached = next((i + 1 for i, acc in enumerate(r["curve"]) if acc >= a.target), None)
                r["epochs_to_target"] = reached
                r["updates_per_group_to_target"] = reached * steps_per_epoch if reached else None
            results.append(r)
    else:
        if not os.access(a.binary, os.X_OK):
            sys.exit(f"momentum_grid: no poseidon binary at {a.binary} (build first or pass --binary)")
        for g in groups:
            for lr in lrs:
                for mu in momenta:
                    r = run(a.binary, g, mu, lr, a)
                    r.update({"groups": g, "momentum": mu, "lr": lr})
                    results.append(r)
                    print(json.dumps(r), flush=True)
    settings = {k: v for k, v in vars(a).items() if k not in ("binary", "out", "from_json")}
    with open(a.out + ".json", "w") as f:
        json.dump({"settings": settings, "results": results}, f, indent=1)

    steps_per_epoch = a.train_limit // (a.workers * a.batch)
    lines = [f"# Best explicit momentum per number of compute groups (Omnivore Table III, Fashion-MNIST)", "",
             f"LeNet, {a.workers} workers x batch {a.batch}, {a.train_limit} training images per epoch "
             f"({steps_per_epoch} updates per group per epoch), test accuracy after every epoch, target "
             f"{a.target:.0%}, at most {a.epochs} epochs. Entries: epochs to the target (- = not reached; "
             f"the final accuracy in brackets). Command: `/usr/bin/python3 bench/momentum_grid.py "
             f"--groups {a.groups} --momenta {a.momenta} --lrs {a.lrs} --epochs {a.epochs} --target {a.target}`.", ""]
    header = "| g | lr | " + " | ".join(f"mu={m:g}" for m in momenta) + " | best mu | 1 - 1/g |"
    lines += [header, "|" + "---|" * (len(momenta) + 4)]
    for g in groups:
        for lr in lrs:
            row = [r for r in results if r["groups"] == g and r["lr"] == lr]
            cells, best, fallback = [], None, None
            for r in row:
                if "error" in r:
                    cells.append("error")
                    continue
                e, final = r["epochs_to_target"], r["final_accuracy"]
                cells.append(f"{e} ({final:.3f})" if e else f"- ({final:.3f})")
                if e and (best is None or e < best[0] or (e == best[0] and final > best[2])):
                    best = (e, r["momentum"], final)
                if fallback is None or final > fallback[1]:
                    fallback = (r["momentum"], final)
            # No run reached the target: the best is the highest final accuracy (marked *).
            chosen = f"{best[1]:g}" if best else (f"{fallback[0]:g}*" if fallback and fallback[1] > 0.2 else "-")
            lines.append(f"| {g} | {lr:g} | " + " | ".join(cells) + f" | {chosen} | {1 - 1 / g:.3f} |")
    lines += ["", "\\* no run reached the target: the momentum with the highest final accuracy. 0.100 is a "
              "diverged run (NaN loss, chance accuracy)."]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}.md and {a.out}.json")


if __name__ == "__main__":
    main()
