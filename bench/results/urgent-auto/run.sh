#!/bin/bash
# vgg19 at 30 Mbit/s (3 Gbit/s at full width), poseidon-overlap, medians of 3: the runtime's automatic
# urgent layers (no --urgent-layers) on FIFO node queues and on two-band ones, whose ranks are told
# their queue serves the mark first (the bench passes --host-queue tos to them), against a fixed 3 or
# 16 layers on the same two-band queues. 16 nodes at F = 2, 32 at F = 6, as ../switch-tos/. Rounds a
# and b at 16 nodes (host-tos-rule2-*) and round a at 32 ran the day's trial rule (16 layers past 8
# peers) and host-tos-u3 in place of host-tos-u16; README.md says which file ran what.
# Usage (root, from the repository root): bench/results/urgent-auto/run.sh NODES ROUND
set -e
nodes=${1:-16}
round=${2:-a}
case $nodes in
  16) dilation=2 timeout=400 order=(default host-tos host-tos-u16) ;;
  32) dilation=6 timeout=600 order=(default host-tos host-tos-u3) ;;
  *) echo "run.sh: NODES must be 16 or 32, got '$nodes'" >&2; exit 2 ;;
esac
out=bench/results/urgent-auto
common=(--models vgg19 --systems poseidon-overlap --nodes "$nodes" --rates 30 --iterations 4 --warmup 2
        --run-timeout "$timeout" --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation "$dilation")
for name in "${order[@]}"; do
  case $name in
    default) extra=() ;;
    host-tos) extra=(--host-queue tos) ;;
    host-tos-u3) extra=(--urgent-layers 3 --host-queue tos) ;;
    host-tos-u16) extra=(--urgent-layers 16 --host-queue tos) ;;
  esac
  build/bin/poseidon bench "${common[@]}" "${extra[@]}" --json "$out/$nodes-$name-$round.json" \
    --markdown "$out/$nodes-$name-$round.md" > "$out/$nodes-$name-$round.log" 2>&1
done
