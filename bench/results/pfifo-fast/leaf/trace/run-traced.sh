#!/bin/bash
# run-one.sh with the sampler (sample.sh) beside it: the switch ports' and nodes 0, 1, 9's qdiscs and
# sockets every ~0.5 s, every node's TCP counters every ~3 s, into /tmp/trace32/NAME (~21 MB a run).
# Usage (root, from the repository root): bench/results/pfifo-fast/leaf/trace/run-traced.sh NAME [bench flags...]
# Then: python3 parse.py /tmp/trace32/NAME (ports), parsen.py .../node1.qdisc, parss.py .../node1.ss, sockets.py cwnd|rto .../node1.ss
name=$1; shift
here=bench/results/pfifo-fast/leaf
"$here/trace/sample.sh" "/tmp/trace32/$name" &
"$here/run-one.sh" "$name" "$@"
wait
