#!/bin/bash
# The planner's link-scheduling study (docs/planner.md, "Scheduling the links"): vgg19's
# poseidon-overlap at 16 and 32 nodes and 3 Gbit/s (the bench's 30 Mbit/s at s = 0.1), the bench's
# 2 I/O threads, under each way of sharing the links. Virtual clock: ~2 minutes on 2 cores. Since
# 2026-12-06 the default window on two-band nodes past 8 peers is 256 KB (Van::defaultSendWindow), so
# rows that meant 1 MB there say so.
# Usage: bench/results/link-scheduling/run.sh [path/to/poseidon] > bench/results/link-scheduling/out.txt
B=${1:-build/bin/poseidon}
run() {  # label, then plan flags
  local label=$1; shift
  for n in 16 32; do
    local row
    row=$($B plan --predict --model vgg19 --workers $n --rate 3 --io-threads 2 --systems poseidon-overlap "$@" 2>&1 |
      grep '^poseidon-overlap')
    printf '%-58s %3d  %s\n' "$label" "$n" "$(echo "$row" | awk '{printf "%s s  %.2fx own bound (%s)", $2, $2 / $6, $6}')"
  done
}
run "as built (default: 1 MB fragments, 3 urgent layers)"
run "as built, 64 KB fragments" --send-window 65536
run "as built, host queue tos, 6 urgent layers, 1 MB fragments" --host-queue tos --urgent-layers 6 --send-window 1048576
run "as built, host queue tos, 6 urgent layers, 256 KB fragments" --host-queue tos --urgent-layers 6 --send-window 262144
run "as built, host queue tos, 6 urgent layers, 64 KB fragments" --host-queue tos --urgent-layers 6 --send-window 65536
run "as built, host queue tos, the runtime's urgent layers and window" --host-queue tos
run "as built, host and switch queues tos, 16 urgent layers, 1 MB" --host-queue tos --switch-queue tos --urgent-layers 16 --send-window 1048576
for w in 2 4 8 16 32; do
  run "credits, ${w} MB window" --links credits --credit-window $((w * 1048576))
done
run "credits, 16 MB window, 64 KB fragments" --links credits --send-window 65536
run "ideal" --links ideal
run "ideal, 64 KB fragments" --links ideal --send-window 65536
