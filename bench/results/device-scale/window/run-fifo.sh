#!/bin/bash
# vgg19, 32 nodes, poseidon-overlap on FIFO nodes (no --host-queue; the runtime's urgent layers), at
# s = 0.2 (120 Mbit/s, 3 Gbit/s at full width) and F = 32 on the 2-core machine: the default send
# window (1 MB on FIFO nodes, 36 KB at vgg19's s' = 6/32) against 256 KB (9,216 bytes), the window the
# runtime takes on two-band nodes past 8 peers. One invocation a file, a, b, c, interleaved.
# Usage (root, from the checkout): [F=32] bench/results/device-scale/window/run-fifo.sh [path/to/poseidon]
B=${1:-build/bin/poseidon}
F=${F:-32}
d=$(dirname "$0")
export POSEIDON_SOURCE=${POSEIDON_SOURCE:-$PWD}
for r in a b c; do
  for w in 0 9216; do
    n=32-s2-f$F-fifo-$([[ $w == 0 ]] && echo default || echo w256k)-$r
    "$B" bench --rates 120 --repeat 1 --retries 0 --machine-rates 83,26.4,1.77 --json "$d/$n.json" \
      --markdown "$d/$n.md" --models vgg19 --iterations 4 --warmup 2 --run-timeout 400 --scale 0.2 \
      --time-dilation $F --systems poseidon-overlap --nodes 32 --send-window $w >"$d/$n.log" 2>&1
  done
done
