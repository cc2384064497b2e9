import re,sys
name=sys.argv[1]
samples=[];cur=None;hdr=None
for line in open(name):
    if line.startswith('T '): cur=[];samples.append((float(line.split()[1]),cur));continue
    if line.startswith('ESTAB'):
        p=line.split(); hdr=(int(p[1]),int(p[2]),p[3],p[4],re.search(r'tos:(\S+)',line).group(1) if 'tos:' in line else '?');continue
    if hdr and line.startswith('\t'):
        d=dict(re.findall(r'(\w+):([\d./]+)',line))
        cur.append((hdr,d));hdr=None
t0=samples[0][0]
for t,c in samples:
    back=[(h,d) for h,d in c if int(d.get('backoff','0'))>0]
    sq=[(h,d) for h,d in c if h[1]>0]
    rtx=sum(int(d.get('retrans','0/0').split('/')[1]) for h,d in c)
    if not c: continue
    s=f'{t-t0:6.1f} conns {len(c)} sendq>0 {len(sq)} backoff {len(back)} retrans_total {rtx}'
    for h,d in back[:4]: s+=f" | {h[2]}->{h[3]} tos{h[4]} sq{h[1]} rto{d.get('rto')} bo{d.get('backoff')} lastack{d.get('lastack')} cwnd{d.get('cwnd')}"
    print(s)
