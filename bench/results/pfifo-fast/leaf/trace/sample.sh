#!/bin/bash
# Sample the emulated cluster (the bench's psd* namespaces) until they are gone: the switch's qdiscs and nodes
# 0, 1 and 9's qdisc and sockets every ~0.5 s, every node's TCP counters every 5th round. Usage: sample.sh OUTDIR
out=$1; mkdir -p "$out"
while ! ip netns list | grep -q '^psd[0-9]*sw'; do sleep 0.2; done
sw=$(ip netns list | awk '/^psd[0-9]*sw/{print $1; exit}'); p=${sw%sw}
echo "prefix $p" > "$out/meta"
while ip netns list | grep -q "^$sw"; do
  t=$(date +%s.%N)
  { echo "T $t"; ip netns exec $sw tc -s qdisc show 2>/dev/null; } >> "$out/switch.txt"
  for n in 0 1 9; do
    { echo "T $t"; ip netns exec ${p}n$n tc -s qdisc show dev eth0 2>/dev/null; } >> "$out/node$n.qdisc"
    { echo "T $t"; ip netns exec ${p}n$n ss -tin --tos 2>/dev/null; } >> "$out/node$n.ss"
  done
  i=$((i+1)); [ $((i % 5)) -eq 1 ] && for n in $(seq 0 31); do
    { echo "T $t n$n"; ip netns exec ${p}n$n nstat -az TcpRetransSegs TcpExtTCPTimeouts TcpExtTCPLossProbes TcpExtTCPSpuriousRTOs 2>/dev/null | tail -n +2; } >> "$out/nstat.txt" 2>/dev/null
  done
  sleep 0.5
done
