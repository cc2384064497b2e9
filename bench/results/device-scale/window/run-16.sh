#!/bin/bash
# 16 nodes with the same settings as run.sh (two-band nodes, 6 urgent layers, s = 0.2, 120 Mbit/s), at
# F = 16 (two host cores per node per emulated second, as F = 32 gives 32 nodes): 1 MB send windows
# (--send-window 36864 at vgg19's s' = 6/32) against the runtime's default since 2026-12-06 (256 KB
# past 8 peers on two-band nodes: 9,216 bytes here). Does the smaller window cost anything where the
# planner has the two within 0.3%? One invocation a file, interleaved.
# Usage (root, from the checkout): bench/results/device-scale/window/run-16.sh [path/to/poseidon]
B=${1:-build/bin/poseidon}
F=${F:-16}
d=$(dirname "$0")
export POSEIDON_SOURCE=${POSEIDON_SOURCE:-$PWD}
for r in a b c; do
  for w in 36864 default; do
    n=16-s2-f$F-$([[ $w == default ]] && echo w256k-default || echo w1m)-$r
    extra=(); [[ $w != default ]] && extra=(--send-window "$w")
    "$B" bench --rates 120 --repeat 1 --retries 0 --machine-rates 83,26.4,1.77 --json "$d/$n.json" \
      --markdown "$d/$n.md" --models vgg19 --iterations 4 --warmup 2 --run-timeout 400 --scale 0.2 \
      --time-dilation $F --systems poseidon-overlap --nodes 16 --urgent-layers 6 --host-queue tos \
      "${extra[@]}" >"$d/$n.log" 2>&1
  done
done
