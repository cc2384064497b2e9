#!/bin/bash
# vgg19, 32 nodes, poseidon-overlap on two-band nodes with 6 urgent layers, at s = 0.2 (120 Mbit/s, the
# same 3 Gbit/s at full width) and F = 16 on the 2-core machine: the default send window (1 MB at
# full width, 36 KB at vgg19's s' = 6/32) against 256 KB (9,216 bytes). One invocation a file, in the
# order a, b, c, the two windows interleaved; rates pinned as the other device-scale files.
# F (time dilation, default 16) names the files too: F=32 gives each of the 32 nodes 2 of this host's
# cores per emulated second, as F = 4 does on a 16-core machine.
# Usage (root, from the checkout): [F=32] bench/results/device-scale/window/run.sh [path/to/poseidon]
B=${1:-build/bin/poseidon}
F=${F:-16}
d=$(dirname "$0")
export POSEIDON_SOURCE=${POSEIDON_SOURCE:-$PWD}
for r in a b c; do
  for w in 0 9216; do
    n=32-s2-f$F-$([[ $w == 0 ]] && echo default || echo w256k)-$r
    "$B" bench --rates 120 --repeat 1 --retries 0 --machine-rates 83,26.4,1.77 --json "$d/$n.json" \
      --markdown "$d/$n.md" --models vgg19 --iterations 4 --warmup 2 --run-timeout 400 --scale 0.2 \
      --time-dilation $F --systems poseidon-overlap --nodes 32 --urgent-layers 6 --host-queue tos \
      --send-window $w >"$d/$n.log" 2>&1
  done
done
