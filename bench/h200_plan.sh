#!/usr/bin/env bash
# The planner on today's hardware (issue 32, docs/bench.md "Today's hardware"): vgg19, resnet-152 and
# inception-v3 on H200 compute (fp32, and bf16 autocast with the 16-bit wire) at 10/25/100/400 GbE,
# 8 to 256 nodes, Poseidon against DDP and DDP-fp16; then, at 8 and 32 nodes, the link rate from
# which each of the runtime's own costs binds (--limits), with CURVE on 2 and on 8 I/O threads and
# without it. Writes bench/results/h200/plan_predict.txt and plan_limits.txt (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/h200
bin=build/bin/poseidon
models=(vgg19 resnet-152 inception-v3)
{
  echo "# made by bench/h200_plan.sh on $(date -u +%Y-%m-%d); host copies 55 GB/s pinned (the default on h200)"
  for m in "${models[@]}"; do
    for rate in 10 25 100 400; do
      echo "### $m, ${rate} GbE, fp32, CURVE on 8 I/O threads (poseidon train's default on a 16-core node)"
      "$bin" plan --sweep 8,32,128,256 --model "$m" --compute h200 --rate "$rate" \
        --systems poseidon,poseidon-overlap,ddp,ddp-fp16
      echo "### $m, ${rate} GbE, fp32, --transport-security none (--crypto 0)"
      "$bin" plan --sweep 8,32,128,256 --model "$m" --compute h200 --rate "$rate" --crypto 0 \
        --systems poseidon,poseidon-overlap
      echo "### $m, ${rate} GbE, bf16 autocast and the 16-bit wire, CURVE on 8 I/O threads"
      "$bin" plan --sweep 8,32,128,256 --model "$m" --compute h200-bf16 --rate "$rate" --wire bf16 \
        --systems poseidon,poseidon-overlap,ddp-fp16
    done
  done
} > "$out/plan_predict.txt"
{
  echo "# made by bench/h200_plan.sh on $(date -u +%Y-%m-%d): where each of the runtime's own costs binds"
  for m in "${models[@]}"; do
    for threads in 2 8; do
      echo "### $m, h200, fp32, CURVE on $threads I/O threads, at 100 GbE"
      "$bin" plan --sweep 8,32 --model "$m" --compute h200 --rate 100 --io-threads "$threads" \
        --systems poseidon,poseidon-overlap,ddp,ddp-fp16 --limits
    done
    echo "### $m, h200, fp32, without CURVE (--crypto 0), at 100 GbE"
    "$bin" plan --sweep 8,32 --model "$m" --compute h200 --rate 100 --crypto 0 \
      --systems poseidon,poseidon-overlap,ddp,ddp-fp16 --limits
  done
} > "$out/plan_limits.txt"
echo "wrote $out/plan_predict.txt and $out/plan_limits.txt"
