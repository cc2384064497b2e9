import re,sys
def qdisc_series(path):
    # returns list of (t, {dev_or_handle: (sent_pkts, dropped, backlog_bytes)})
    out=[];cur=None;key=None
    for line in open(path):
        if line.startswith('T '):
            cur={};out.append((float(line.split()[1]),cur));continue
        m=re.match(r'qdisc (\S+) (\S+) (?:dev (\S+) )?',line)
        if m: key=(m.group(3) or '')+':'+m.group(1)+':'+m.group(2);continue
        m=re.search(r'Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+) requeues (\d+)\)',line)
        if m and key: cur[key]=[int(m.group(1)),int(m.group(3)),0]
        m=re.search(r'backlog (\d+)b (\d+)p',line)
        if m and key and key in cur: cur[key][2]=int(m.group(1))
    return out
name=sys.argv[1]
sw=qdisc_series(name+'/switch.txt')
t0=sw[0][0]
# per-port final drops
last=sw[-1][1]
drops={k:v[1] for k,v in last.items() if v[1]}
print('ports with drops (final):',sorted(drops.items(),key=lambda x:-x[1])[:40])
# time series total port drops and max backlog
prev=0
for t,d in sw:
    tot=sum(v[1] for v in d.values()); bl=max([v[2] for v in d.values()] or [0]); sb=sum(v[2] for v in d.values())
    print(f'{t-t0:6.1f} drops {tot:6d} (+{tot-prev:5d}) maxbacklog {bl:7d} sumbacklog {sb:8d}'); prev=tot
