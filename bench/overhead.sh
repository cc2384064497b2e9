#!/usr/bin/env bash
# Single-worker overhead: `poseidon train --workers 1` against the same plain
# LibTorch loop (--plain: no Poseidon at all), same model, data and seed,
# alternated A/B/A/B so machine noise hits both. Prints the throughput ratio.
#   bench/overhead.sh [ROUNDS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
steps=${2:-200}
bin=build/bin/poseidon
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(train --workers 1 --batch 64 --max-steps "$steps" --quiet --threads 1)
for r in $(seq 1 "$rounds"); do
  "$bin" "${common[@]}" --plain --summary "$out/plain$r.json" >/dev/null
  "$bin" "${common[@]}" --summary "$out/poseidon$r.json" >/dev/null
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rate = lambda kind: [json.load(open(f"{out}/{kind}{r}.json"))["images_per_sec"] for r in range(1, rounds + 1)]
plain, pos = rate("plain"), rate("poseidon")
mp, mq = statistics.median(plain), statistics.median(pos)
print(f"plain LibTorch:        {mp:8.1f} images/s (runs: {', '.join(f'{x:.1f}' for x in plain)})")
print(f"poseidon --workers 1:  {mq:8.1f} images/s (runs: {', '.join(f'{x:.1f}' for x in pos)})")
print(f"throughput ratio poseidon/plain = {mq / mp:.4f}  (overhead {100 * (1 - mq / mp):+.2f}%; target < 2%)")
PY
