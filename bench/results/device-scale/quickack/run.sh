#!/usr/bin/env bash
# The 32-node points of ../README.md, "The delayed ACK off" (F = 6, the 2-core machine). Run from anywhere.
cd "$(dirname "$0")/../../../.."
for cfg in "tos12k-quickack:--tcp-rcvbuf 12288 --host-queue tos --tcp-quickack" "tos12k:--tcp-rcvbuf 12288 --host-queue tos" "fifo-quickack:--tcp-quickack"; do
  name=${cfg%%:*}; flags=${cfg#*:}
  ./build/bin/poseidon bench --models vgg19 --systems poseidon-overlap --nodes 32 --rates 30 --iterations 4 --warmup 2 --run-timeout 900 --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation 6 $flags --json bench/results/device-scale/quickack/32-f6-$name.json --markdown bench/results/device-scale/quickack/32-f6-$name.md > bench/results/device-scale/quickack/32-f6-$name.log 2>&1
done
