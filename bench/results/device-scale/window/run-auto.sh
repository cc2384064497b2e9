#!/bin/bash
# As run.sh, the 256 KB window with the runtime's own urgent layers (no --urgent-layers: on nodes told
# their queue is two-band, past 16 peers, every layer below the FC stack, vgg19's 16 conv layers), at
# F = 32: what the default send window on two-band nodes past 8 peers gives with the other defaults.
# Usage (root, from the checkout): bench/results/device-scale/window/run-auto.sh [path/to/poseidon]
B=${1:-build/bin/poseidon}
F=${F:-32}
d=$(dirname "$0")
export POSEIDON_SOURCE=${POSEIDON_SOURCE:-$PWD}
for r in a b c; do
  n=32-s2-f$F-w256k-auto-$r
  "$B" bench --rates 120 --repeat 1 --retries 0 --machine-rates 83,26.4,1.77 --json "$d/$n.json" \
    --markdown "$d/$n.md" --models vgg19 --iterations 4 --warmup 2 --run-timeout 400 --scale 0.2 \
    --time-dilation $F --systems poseidon-overlap --nodes 32 --host-queue tos --send-window 9216 >"$d/$n.log" 2>&1
done
