#!/bin/bash
# One 32-node run of vgg19 @30 Mbit/s (poseidon-overlap, F = 6, 4 iterations after 2, one repeat),
# as every file in this folder was made. Usage (root, from the repository root):
#   bench/results/pfifo-fast/leaf/run-one.sh NAME [bench flags...]
# The HTB-leaf variants need a build with scratch-leaves.patch applied and one of its variables:
#   POSEIDON_SCRATCH_LEAVES=pfifo:pfifo ... run-one.sh htb16-pp --host-queue tos
#   POSEIDON_SCRATCH_LEAVES=pfifo_fast:pfifo_fast ... run-one.sh htb16-ff --host-queue tos
#   POSEIDON_SCRATCH_HTBPF=1 ... run-one.sh htbpf16 --host-queue pfifo_fast --urgent-layers 16
#   POSEIDON_SCRATCH_FLOOR=0.0002 ... run-one.sh htb16-floor0002 --host-queue tos
set -e
name=$1; shift
out=bench/results/pfifo-fast/leaf
POSEIDON_LOG=info build/bin/poseidon bench --models vgg19 --systems poseidon-overlap --nodes 32 --rates 30 \
  --iterations 4 --warmup 2 --run-timeout 600 --repeat 1 --machine-rates 83,26.4,1.77 --time-dilation 6 "$@" \
  --json "$out/$name.json" > "$out/$name.log" 2>&1
grep "poseidon-overlap 32" "$out/$name.log"
