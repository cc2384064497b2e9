#!/bin/bash
# vgg19 at 32 nodes and 30 Mbit/s, poseidon-overlap, F = 6 (what this 2-core machine holds at 32 nodes;
# bench/results/dilation/tos-conv/ ran the same), medians of 3: the runtime's defaults against every conv
# layer on the urgent connections with two-band queues at the nodes, and at the nodes and switch ports.
# Usage (root, from the repository root): bench/results/switch-tos/run32.sh ROUND
set -e
round=${1:-a}
out=bench/results/switch-tos
common=(--models vgg19 --systems poseidon-overlap --nodes 32 --rates 30 --iterations 4 --warmup 2
        --run-timeout 600 --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation 6)
run() {  # name, extra flags
  local name=$1; shift
  build/bin/poseidon bench "${common[@]}" "$@" --json $out/32-$name-$round.json --markdown $out/32-$name-$round.md \
    > $out/32-$name-$round.log 2>&1
}
run default
run host-tos-u16 --urgent-layers 16 --host-queue tos
run both-tos-u16 --urgent-layers 16 --host-queue tos --switch-queue tos
