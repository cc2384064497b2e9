import re,sys,collections
for name in sys.argv[1:]:
    vals=collections.defaultdict(list); rtts=collections.defaultdict(list)
    hdr=None
    for line in open(name):
        if line.startswith('ESTAB'):
            p=line.split(); hdr=(int(p[2]), re.search(r'tos:(\S+)',line).group(1)); continue
        if hdr and line.startswith('\t'):
            d=dict(re.findall(r'(\w+):([\d./]+)',line))
            if hdr[0]>0 and 'rto' in d:
                vals[hdr[1]].append(float(d['rto'])); rtts[hdr[1]].append(float(d['rtt'].split('/')[0]))
            hdr=None
    for k in vals:
        v=sorted(vals[k]); r=sorted(rtts[k]); n=len(v)
        q=lambda a,p:a[min(len(a)-1,int(p*len(a)))]
        print(name,'tos',k,'n',n,'rto p50/p90/max',q(v,.5),q(v,.9),v[-1],' rtt p50/p90/max',q(r,.5),q(r,.9),r[-1])
