#!/bin/bash
# Linux's default qdisc itself on the nodes: vgg19 at 30 Mbit/s (3 Gbit/s at full width),
# poseidon-overlap with the runtime's defaults, medians of 3. pfifo_fast: tbf > pfifo_fast on every
# node, which the ranks read for themselves (nothing tells them); tos: the bench's two HTB bands, of
# which the bench tells the ranks (--host-queue tos to each), as in ../urgent-auto/. The two
# interleaved. 16 nodes at F = 2, 32 at F = 6, as ../urgent-auto/.
# Round b at 32 nodes, after round a's pfifo_fast runs came out 1.4-1.8 s: the same defaults again
# (pfifo_fast-b), and 3 urgent layers set by hand on the same queues (pfifo_fast-u3-b).
# Usage (root, from the repository root): bench/results/pfifo-fast/run.sh NODES ROUND
set -e
nodes=${1:-16}
round=${2:-a}
case $nodes in
  16) dilation=2 timeout=400 ;;
  32) dilation=6 timeout=600 ;;
  *) echo "run.sh: NODES must be 16 or 32, got '$nodes'" >&2; exit 2 ;;
esac
out=bench/results/pfifo-fast
common=(--models vgg19 --systems poseidon-overlap --nodes "$nodes" --rates 30 --iterations 4 --warmup 2
        --run-timeout "$timeout" --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation "$dilation")
settings=(pfifo_fast tos)
[ "$nodes-$round" = 32-b ] && settings=(pfifo_fast pfifo_fast-u3)
for name in "${settings[@]}"; do
  case $name in
    pfifo_fast) extra=(--host-queue pfifo_fast) ;;
    tos) extra=(--host-queue tos) ;;
    pfifo_fast-u3) extra=(--host-queue pfifo_fast --urgent-layers 3) ;;
  esac
  POSEIDON_LOG=info build/bin/poseidon bench "${common[@]}" "${extra[@]}" \
    --json "$out/$nodes-$name-$round.json" --markdown "$out/$nodes-$name-$round.md" > "$out/$nodes-$name-$round.log" 2>&1
done
