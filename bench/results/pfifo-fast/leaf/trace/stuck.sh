#!/bin/bash
# Usage (root): stuck.sh htb-pfifo_fast|htb-pfifo|tbf-pfifo_fast|tbf-pfifo
# Does a pfifo_fast leaf under HTB (or tbf) drain after the sender stops? Send 200 UDP packets at once
# into a 1 Mbit/s class, then watch the leaf's backlog for 6 s with nothing else sent.
set -e
kind=$1   # htb-pfifo_fast | htb-pfifo | tbf-pfifo_fast | tbf-pfifo
ns=stk$$; nb=stkb$$; ip netns add $ns; ip netns add $nb; trap "ip netns del $ns; ip netns del $nb" EXIT
ip -n $ns link add va type veth peer name vb netns $nb; ip -n $ns addr add 10.9.0.1/24 dev va; ip -n $nb addr add 10.9.0.2/24 dev vb
ip -n $ns link set va up; ip -n $nb link set vb up; ip -n $ns link set lo up
ip -n $ns neigh add 10.9.0.2 lladdr $(ip -n $nb -o link show vb | grep -o "link/ether [0-9a-f:]*" | cut -d" " -f2) dev va
ip -n $ns link set va txqueuelen 1000
leaf=${kind#*-}
case $kind in
  htb-*) ip netns exec $ns tc qdisc add dev va root handle 2: htb default 1
         ip netns exec $ns tc class add dev va parent 2: classid 2:1 htb rate 1mbit ceil 1mbit burst 4k cburst 4k
         ip netns exec $ns tc qdisc add dev va parent 2:1 handle 20: $leaf ;;
  tbf-*) ip netns exec $ns tc qdisc add dev va root handle 2: tbf rate 1mbit burst 4k latency 10s
         ip netns exec $ns tc qdisc add dev va parent 2:1 handle 20: $leaf ;;
esac
# 200 datagrams of 1000 bytes to the other end, one burst (routes via va? both addrs local: force via SO_BINDTODEVICE)
ip netns exec $ns /usr/bin/python3 - <<'PY'
import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
for i in range(200): s.sendto(b"x"*1000, ("10.9.0.2", 9))
PY
for t in 0 1 2 3 4 5 6; do
  echo "t=$t $(ip netns exec $ns tc -s qdisc show dev va | grep -A2 "qdisc $leaf" | grep -o 'Sent [0-9]* bytes [0-9]* pkt\|backlog [0-9]*b [0-9]*p' | tr '\n' ' ')"
  sleep 1
done
