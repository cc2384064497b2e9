#!/usr/bin/env bash
# The main job's defaults at every worker count (docs/hyperparameters.md): runs
#   poseidon train --workers W --epochs 1 --seed S
# for each W and S, with nothing else set, and prints a Markdown table of the test accuracies, the
# diverged runs and the cost. One epoch is enough to see a divergence: with the defaults it would
# come in the first few hundred steps (without a warm-up at lr 0.05 it came at step 14-34).
#
# usage: bench/default_grid.sh [OUT_DIR] [WORKERS] [SEEDS] [-- EXTRA TRAIN FLAGS]
#   OUT_DIR  where each run's summary and log go (default: bench/results/default_grid); runs whose
#            summary is there already are not run again, so an interrupted grid resumes
#   WORKERS  e.g. "1 2 3 5 8" (default: 1 to 16);  SEEDS  e.g. "1 7" (default: 1 to 10)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results/default_grid}
workers=${2:-$(seq -s' ' 1 16)}
seeds=${3:-$(seq -s' ' 1 10)}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
exe=${POSEIDON:-build/bin/poseidon}
mkdir -p "$out"
for s in $seeds; do
  for w in $workers; do
    summary="$out/w$w-s$s.json"
    [ -s "$summary" ] && continue
    start=$(date +%s%N)
    rc=0
    "$exe" train --workers "$w" --epochs 1 --seed "$s" --quiet --summary "$summary" "$@" >"$out/w$w-s$s.log" 2>&1 || rc=$?
    end=$(date +%s%N)
    echo "{\"rc\": $rc, \"wall\": $(((end - start) / 1000000)).0e-3}" >"$out/w$w-s$s.run"
    echo "W=$w seed=$s: exit $rc" >&2
  done
done
/usr/bin/python3 - "$out" "$workers" "$seeds" <<'EOF'
import json, os, sys
out, workers, seeds = sys.argv[1], [int(w) for w in sys.argv[2].split()], [int(s) for s in sys.argv[3].split()]
print("| workers | global batch | lr | " + " | ".join("seed %d" % s for s in seeds) + " | min | diverged | s/run |")
print("|---|---|---|" + "---|" * len(seeds) + "---|---|---|")
total, runs, diverged_all = 0.0, 0, 0
for w in workers:
    accs, cells, diverged, walls, lr, batch = [], [], 0, [], None, None
    for s in seeds:
        try:
            d = json.load(open(os.path.join(out, "w%d-s%d.json" % (w, s))))
            r = json.load(open(os.path.join(out, "w%d-s%d.run" % (w, s))))
        except (OSError, ValueError):
            cells.append("-")
            continue
        lr, batch = d["lr"], d["workers"] * d["batch"]
        walls.append(r["wall"])
        if d.get("diverged"):
            diverged += 1
            cells.append("**diverged at %d** (exit %d)" % (d["diverged_at_step"], r["rc"]))
        else:
            accs.append(d["test_accuracy"])
            cells.append("%.1f%%" % (100 * d["test_accuracy"]))
    total += sum(walls)
    runs += len(walls)
    diverged_all += diverged
    print("| %d | %s | %s | %s | %s | %d | %.0f |" % (
        w, batch if batch else "-", "%.4g" % lr if lr else "-", " | ".join(cells),
        "%.1f%%" % (100 * min(accs)) if accs else "-", diverged, sum(walls) / max(len(walls), 1)))
print()
print("%d runs, %d diverged; %.0f s of wall time in all (%.1f s a run)." % (runs, diverged_all, total,
                                                                          total / max(runs, 1)))
EOF
