#!/usr/bin/python3
"""Omnivore's Table III for Fashion-MNIST: the best explicit momentum per number of compute groups.

For each g in --groups and each momentum in --momenta (and each learning rate in --lrs) it trains
LeNet with `poseidon train --groups g` on this machine (real processes on loopback, real gradients)
and records the epochs, and the updates per group, until the test accuracy first reaches --target
(evaluated after every epoch of --train-limit images). Writes a Markdown table and the JSON.

Theorem 1 predicts that the best explicit momentum falls as g grows (implicit momentum 1 - 1/g).

--group-batch B is the paper's setting: each group's batch is B, split over its members, so every
update is on B images whatever g (without it, --batch is per worker and a group's batch grows with
its size). --seeds runs every cell once per seed; the table shows each seed's epochs and picks the
best momentum by the median.

  /usr/bin/python3 bench/momentum_grid.py --out bench/results/momentum_grid
  /usr/bin/python3 bench/momentum_grid.py --group-batch 256 --seeds 1,2,3 --out bench/results/momentum_grid_group_batch
"""
import statistics
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHANCE = 0.1  # a diverged run's accuracy (10 classes)


def steps_per_epoch(a, g):
    """Updates per group per epoch."""
    if a.group_batch:
        return a.train_limit // (g * a.group_batch)
    return a.train_limit // (a.workers * a.batch)


def run(binary, g, momentum, lr, seed, a):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "s.json")
        cmd = [binary, "train", "--workers", str(a.workers), "--train-limit", str(a.train_limit), "--epochs",
               str(a.epochs), "--lr", str(lr), "--momentum", str(momentum), "--seed", str(seed), "--quiet",
               "--allow-divergence",
               "--summary", summary, "--timeout", "120000"]
        if g > 1:  # g = 1 is BSP with every layer by PS, the group mode's own g = 1 (bit-identical)
            cmd += ["--groups", str(g)]
            cmd += ["--group-batch", str(a.group_batch)] if a.group_batch else ["--batch", str(a.batch)]
        else:
            cmd += ["--scheme", "ps", "--batch", str(a.group_batch // a.workers if a.group_batch else a.batch)]
        t0 = time.time()
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wall = time.time() - t0
        if p.returncode != 0:
            return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
        s = json.load(open(summary))
    curve = [e["test_accuracy"] for e in s["epochs_run"]]
    reached = next((i + 1 for i, acc in enumerate(curve) if acc >= a.target), None)
    diverged = bool(s.get("diverged"))  # --allow-divergence: stopped at a non-finite model, a result
    return {"curve": curve, "epochs_to_target": reached,
            "updates_per_group_to_target": reached * steps_per_epoch(a, g) if reached else None,
            "final_accuracy": CHANCE if diverged else (curve[-1] if curve else None), "diverged": diverged,
            "wall_seconds": round(wall, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin", "poseidon"))
    ap.add_argument("--groups", default="1,2,4,8")
    ap.add_argument("--momenta", default="0,0.3,0.6,0.9")
    ap.add_argument("--lrs", default="0.05", help="comma-separated learning rates (the paper: eta* and eta*/10)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32, help="per worker")
    ap.add_argument("--group-batch", type=int, default=0, help="each group's batch, split over its members "
                    "(poseidon train --group-batch; g = 1: BSP with batch B / workers); 0: --batch per worker")
    ap.add_argument("--seeds", default="1", help="comma-separated seeds; every cell runs once per seed")
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
    seeds = [int(x) for x in a.seeds.split(",")]
    if a.group_batch and any(a.group_batch % (a.workers // g) for g in groups):
        sys.exit(f"momentum_grid: --group-batch {a.group_batch} does not split evenly over every group size")
    results = []
    if a.from_json:
        earlier = [json.load(open(path)) for path in a.from_json]
        for k in ("workers", "batch", "group_batch", "train_limit", "epochs"):
            if len({e["settings"].get(k, 0) for e in earlier}) != 1:
                sys.exit(f"momentum_grid: the files differ in {k}; merge only runs of the same settings")
            setattr(a, k, earlier[0]["settings"].get(k, 0))
        for r in [r for e in earlier for r in e["results"]]:
            if "curve" in r:
                reached = next((i + 1 for i, acc in enumerate(r["curve"]) if acc >= a.target), None)
                r["epochs_to_target"] = reached
                r["updates_per_group_to_target"] = reached * steps_per_epoch(a, r["groups"]) if reached else None
            r.setdefault("seed", 1)
            results.append(r)
        seeds = sorted({r["seed"] for r in results})
    else:
        if not os.access(a.binary, os.X_OK):
            sys.exit(f"momentum_grid: no poseidon binary at {a.binary} (build first or pass --binary)")
        for g in groups:
            for lr in lrs:
                for mu in momenta:
                    for seed in seeds:
                        r = run(a.binary, g, mu, lr, seed, a)
                        r.update({"groups": g, "momentum": mu, "lr": lr, "seed": seed})
                        results.append(r)
                        print(json.dumps(r), flush=True)
    settings = {k: v for k, v in vars(a).items() if k not in ("binary", "out", "from_json")}
    with open(a.out + ".json", "w") as f:
        json.dump({"settings": settings, "results": results}, f, indent=1)

    per = (f"each group's batch {a.group_batch} split over its members ({a.train_limit // a.group_batch} updates "
           f"per epoch in all, whatever g)" if a.group_batch else
           f"batch {a.batch} per worker ({steps_per_epoch(a, 1)} updates per group per epoch)")
    seed_text = f", seeds {a.seeds if not a.from_json else ','.join(map(str, seeds))}" if len(seeds) > 1 else ""
    lines = [f"# Best explicit momentum per number of compute groups (Omnivore Table III, Fashion-MNIST)", "",
             f"LeNet, {a.workers} workers, {per}, {a.train_limit} training images per epoch, test accuracy after "
             f"every epoch, target {a.target:.0%}, at most {a.epochs} epochs{seed_text}. Entries: epochs to the "
             f"target per seed (- = not reached) and the median final accuracy in brackets; the best momentum has "
             f"the lowest median epochs (ties: the higher mean final accuracy). Command: `/usr/bin/python3 "
             f"bench/momentum_grid.py --groups {a.groups} --momenta {a.momenta} --lrs {a.lrs} --epochs {a.epochs} "
             f"--target {a.target}" + (f" --group-batch {a.group_batch}" if a.group_batch else "") +
             (f" --seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else "") + "`.", ""]
    header = "| g | lr | " + " | ".join(f"mu={m:g}" for m in momenta) + " | best mu | 1 - 1/g |"
    lines += [header, "|" + "---|" * (len(momenta) + 4)]
    for g in groups:
        for lr in lrs:
            cells, best, fallback = [], None, None
            for mu in momenta:
                runs = [r for r in results if r["groups"] == g and r["lr"] == lr and r["momentum"] == mu]
                ok = [r for r in runs if "error" not in r]
                if not ok:
                    cells.append("error" if runs else "")
                    continue
                epochs = [r["epochs_to_target"] for r in ok]
                finals = [r["final_accuracy"] or 0.0 for r in ok]
                # Not reached counts as more than any epoch count, so the median sees it.
                med = statistics.median([e if e else a.epochs + 1 for e in epochs])
                mean_final = sum(finals) / len(finals)
                cells.append("/".join(str(e) if e else "-" for e in epochs) + f" ({statistics.median(finals):.3f})")
                if med <= a.epochs and (best is None or med < best[0] or (med == best[0] and mean_final > best[2])):
                    best = (med, mu, mean_final)
                if fallback is None or mean_final > fallback[1]:
                    fallback = (mu, mean_final)
            # No median reached the target: the best is the highest mean final accuracy (marked *).
            chosen = f"{best[1]:g}" if best else (f"{fallback[0]:g}*" if fallback and fallback[1] > 0.2 else "-")
            lines.append(f"| {g} | {lr:g} | " + " | ".join(cells) + f" | {chosen} | {1 - 1 / g:.3f} |")
    lines += ["", "\\* no median reached the target: the momentum with the highest mean final accuracy. A "
              "diverged run (a non-finite model, stopped there; --allow-divergence) counts as chance accuracy, "
              "0.100."]
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}.md and {a.out}.json")


if __name__ == "__main__":
    main()
