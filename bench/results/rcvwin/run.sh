#!/bin/bash
# vgg19 at 30 Mbit/s, poseidon-overlap, medians of 3, on the bench's FIFO nodes (its default host
# queue), as ../urgent-auto/'s default rows: 16 nodes at F = 2, 32 at F = 6.
# Usage (root, repository root): bench/results/rcvwin/run.sh NODES NAME [bench flags...]
set -e
nodes=$1 name=$2; shift 2
case $nodes in
  16) dilation=2 timeout=400 ;;
  32) dilation=6 timeout=600 ;;
  *) echo "run.sh: NODES must be 16 or 32, got '$nodes'" >&2; exit 2 ;;
esac
out=bench/results/rcvwin
build/bin/poseidon bench --models vgg19 --systems poseidon-overlap --nodes "$nodes" --rates 30 --iterations 4 \
  --warmup 2 --run-timeout "$timeout" --repeat 3 --machine-rates 83,26.4,1.77 --time-dilation "$dilation" "$@" \
  --json "$out/$nodes-$name.json" --markdown "$out/$nodes-$name.md" > "$out/$nodes-$name.log" 2>&1
grep "poseidon-overlap $nodes" "$out/$nodes-$name.log" | tail -1
