#!/bin/bash
# vgg19 at 16 nodes and 30 Mbit/s (3 Gbit/s at full width), poseidon-overlap, F = 2, medians of 3:
# the runtime's defaults against every conv layer on the urgent connections with two-band queues at
# the nodes and at the switch ports (a switch set to trust the mark), and at the nodes only.
# Usage (root, from the repository root): bench/results/switch-tos/run.sh ROUND
set -e
round=${1:-a}
out=bench/results/switch-tos
common=(--models vgg19 --systems poseidon-overlap --nodes 16 --rates 30 --iterations 4 --warmup 2
        --run-timeout 400 --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation 2)
run() {  # name, extra flags
  local name=$1; shift
  build/bin/poseidon bench "${common[@]}" "$@" --json $out/16-$name-$round.json --markdown $out/16-$name-$round.md \
    > $out/16-$name-$round.log 2>&1
}
run default
run both-tos-u16 --urgent-layers 16 --host-queue tos --switch-queue tos
run host-tos-u16 --urgent-layers 16 --host-queue tos
