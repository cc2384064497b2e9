"""Per-mark statistics of the busy sockets (send queue > 0) in a sample.sh `ss -tin --tos` file.
Usage: sockets.py cwnd|rto FILE...  (cwnd: windows, unacked segments, send queues; rto: timeouts and round trips)"""
import collections, re, sys


def busy_sockets(path):
    """(tos, send_queue, fields) of every socket sample whose send queue is not empty."""
    hdr = None
    for line in open(path):
        if line.startswith('ESTAB'):
            p = line.split()
            hdr = (int(p[2]), re.search(r'tos:(\S+)', line).group(1))
            continue
        if hdr and line.startswith('\t'):
            if hdr[0] > 0:
                yield hdr[1], hdr[0], dict(re.findall(r'(\w+):([\d./]+)', line))
            hdr = None


def q(a, p):
    a = sorted(a)
    return a[min(len(a) - 1, int(p * len(a)))]


what, names = sys.argv[1], sys.argv[2:]
for name in names:
    if what == 'cwnd':
        cw, un, sq = (collections.defaultdict(list) for _ in range(3))
        for tos, sendq, d in busy_sockets(name):
            cw[tos].append(int(d.get('cwnd', 0))); un[tos].append(int(d.get('unacked', 0))); sq[tos].append(sendq)
        for k in cw:
            print(name, 'tos', k, 'cwnd p10/50/90', q(cw[k], .1), q(cw[k], .5), q(cw[k], .9), ' unacked p50/90',
                  q(un[k], .5), q(un[k], .9), 'sum-mean-unacked', sum(un[k]) / len(un[k]), ' sendq p50/p90',
                  q(sq[k], .5), q(sq[k], .9))
    else:
        vals, rtts = collections.defaultdict(list), collections.defaultdict(list)
        for tos, _, d in busy_sockets(name):
            if 'rto' in d:
                vals[tos].append(float(d['rto'])); rtts[tos].append(float(d['rtt'].split('/')[0]))
        for k in vals:
            v, r = sorted(vals[k]), sorted(rtts[k])
            print(name, 'tos', k, 'n', len(v), 'rto p50/p90/max', q(v, .5), q(v, .9), v[-1], ' rtt p50/p90/max',
                  q(r, .5), q(r, .9), r[-1])
