#!/bin/bash
# Does CURVE's encryption pace the egress? The planner says so: for vgg19 at 32 nodes, FIFO nodes,
# 3 Gbit/s at full width and 2 I/O threads, it predicts 1.136 s with encryption at 1.2 GB/s per
# thread, 1.182 at 1.75 and 1.201 without CURVE (plan --predict). This runs the same cluster as
# ../run-fifo.sh's default rows (s = 0.2, 120 Mbit/s, F = 32, the default send window) with
# encryption charged at 1.2 GB/s, and without CURVE; ../32-s2-f32-fifo-default-* are 1.77 GB/s.
# One invocation a file, a, b, c. Usage (root, from the checkout): bench/results/device-scale/window/pacing/run.sh [poseidon]
B=${1:-build/bin/poseidon}
d=$(dirname "$0")
export POSEIDON_SOURCE=${POSEIDON_SOURCE:-$PWD}
for r in a b c; do
  n=32-s2-f32-fifo-crypto12-$r
  "$B" bench --rates 120 --repeat 1 --retries 0 --machine-rates 83,26.4,1.2 --json "$d/$n.json" \
    --markdown "$d/$n.md" --models vgg19 --iterations 4 --warmup 2 --run-timeout 400 --scale 0.2 \
    --time-dilation 32 --systems poseidon-overlap,poseidon-overlap-nocurve --nodes 32 >"$d/$n.log" 2>&1
done
