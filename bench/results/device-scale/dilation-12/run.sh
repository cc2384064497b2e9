#!/usr/bin/env bash
# The 32-node points of ../README.md, "Dilation 12 on the 2-core machine". Run from anywhere.
cd "$(dirname "$0")/../../../.."
for cfg in "fifo:" "tos12k:--tcp-rcvbuf 12288 --host-queue tos"; do
  name=${cfg%%:*}; flags=${cfg#*:}
  ./build/bin/poseidon bench --models vgg19 --systems poseidon-overlap --nodes 32 --rates 30 --iterations 4 --warmup 2 --run-timeout 900 --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation 12 $flags --json bench/results/device-scale/dilation-12/32-f12-$name.json --markdown bench/results/device-scale/dilation-12/32-f12-$name.md > bench/results/device-scale/dilation-12/32-f12-$name.log 2>&1
done
