import re,sys,collections
for name in sys.argv[1:]:
    cw=collections.defaultdict(list); un=collections.defaultdict(list); sq=collections.defaultdict(list)
    hdr=None
    for line in open(name):
        if line.startswith('ESTAB'):
            p=line.split(); hdr=(int(p[2]), re.search(r'tos:(\S+)',line).group(1)); continue
        if hdr and line.startswith('\t'):
            d=dict(re.findall(r'(\w+):([\d./]+)',line))
            if hdr[0]>0:
                cw[hdr[1]].append(int(d.get('cwnd',0))); un[hdr[1]].append(int(d.get('unacked',0))); sq[hdr[1]].append(hdr[0])
            hdr=None
    q=lambda a,p:sorted(a)[min(len(a)-1,int(p*len(a)))]
    for k in cw:
        print(name,'tos',k,'cwnd p10/50/90',q(cw[k],.1),q(cw[k],.5),q(cw[k],.9),' unacked p50/90',q(un[k],.5),q(un[k],.9),'sum-mean-unacked',sum(un[k])/len(un[k]), ' sendq p50/p90',q(sq[k],.5),q(sq[k],.9))
