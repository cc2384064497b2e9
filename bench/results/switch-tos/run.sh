#!/bin/bash
# vgg19 at 30 Mbit/s (3 Gbit/s at full width), poseidon-overlap, medians of 3: the runtime's defaults
# against every conv layer on the urgent connections with two-band queues at the nodes only, and at the
# nodes and the switch ports (a switch set to trust the mark). 16 nodes run at F = 2; 32 nodes at F = 6,
# what this 2-core machine holds (bench/results/dilation/tos-conv/ ran the same).
# Usage (root, from the repository root): bench/results/switch-tos/run.sh NODES ROUND
set -e
nodes=${1:-16}
round=${2:-a}
case $nodes in
  16) dilation=2 timeout=400 order=(default both-tos-u16 host-tos-u16) ;;
  32) dilation=6 timeout=600 order=(default host-tos-u16 both-tos-u16) ;;
  *) echo "run.sh: NODES must be 16 or 32, got '$nodes'" >&2; exit 2 ;;
esac
out=bench/results/switch-tos
common=(--models vgg19 --systems poseidon-overlap --nodes "$nodes" --rates 30 --iterations 4 --warmup 2
        --run-timeout "$timeout" --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation "$dilation")
for name in "${order[@]}"; do
  case $name in
    default) extra=() ;;
    host-tos-u16) extra=(--urgent-layers 16 --host-queue tos) ;;
    both-tos-u16) extra=(--urgent-layers 16 --host-queue tos --switch-queue tos) ;;
  esac
  build/bin/poseidon bench "${common[@]}" "${extra[@]}" --json "$out/$nodes-$name-$round.json" \
    --markdown "$out/$nodes-$name-$round.md" > "$out/$nodes-$name-$round.log" 2>&1
done
