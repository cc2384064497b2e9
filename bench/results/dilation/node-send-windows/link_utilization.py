# Lines up one node's link samples (its interface's byte counters every ~3 ms: 'unix-time tx rx') with
# the rank's spans in a bench --trace file. Usage: link_utilization.py SAMPLES TRACE [RANK] [F]
import gzip,json,glob,sys
F=float(sys.argv[4]) if len(sys.argv)>4 else 3; rate=26.367e6/8/F  # the emulated link's bytes/s, real time
S=[tuple(map(float,l.split())) for l in open(sys.argv[1])]
ev=json.load(gzip.open(sys.argv[2]) if sys.argv[2].endswith('.gz') else open(sys.argv[2])); ev=ev if isinstance(ev,list) else ev['traceEvents']
X=[e for e in ev if e.get('ph')=='X' and e['pid']==(int(sys.argv[3]) if len(sys.argv)>3 else 5)]
bw=sorted([e for e in X if e['name'].startswith('backward')], key=lambda e:e['ts'])
fw=sorted([e for e in X if e['name'].startswith('forward (emulated, layer')], key=lambda e:e['ts'])
import bisect
ts=[s[0] for s in S]
def bytes_at(t, k):
    i=bisect.bisect_left(ts,t); i=min(max(i,1),len(S)-1)
    a,b=S[i-1],S[i]; f=(t-a[0])/(b[0]-a[0]) if b[0]>a[0] else 0
    return a[k]+(b[k]-a[k])*f
for it in range(1,len(bw)-1):
    b0=bw[it]['ts']/1e6; b1=b0+bw[it]['dur']/1e6; f1=bw[it+1]['ts']/1e6
    line=[]
    for k,name in ((1,'tx'),(2,'rx')):
        # bins of 0.05 emulated s
        bins=[]; t=b0; step=0.05*F
        while t < f1-1e-9:
            e=min(t+step,f1); bins.append((bytes_at(e,k)-bytes_at(t,k))/((e-t)*rate)); t=e
        nb=int(round((b1-b0)/step))
        s=''.join(str(min(9,int(x*10))) for x in bins)
        print(f"it{it} {name} bwd|fwd: {s[:nb]}|{s[nb:]}  util bwd {(bytes_at(b1,k)-bytes_at(b0,k))/((b1-b0)*rate):.2f} fwd {(bytes_at(f1,k)-bytes_at(b1,k))/((f1-b1)*rate):.2f} total {(bytes_at(f1,k)-bytes_at(b0,k))/((f1-b0)*rate):.2f} iter {(f1-b0)/F:.3f}")
print()
for it in range(1,len(bw)-1):
    b1=(bw[it]['ts']+bw[it]['dur'])/1e6; f1=bw[it+1]['ts']/1e6
    for e in sorted(X, key=lambda e:e['ts']):
        t=e['ts']/1e6
        if b1-0.01 <= t <= f1 and (e['cat'] in ('wait','compute') or 'reconstruct' in e['name'] or 'conv5' in e['name'] or 'fc' in e['name']):
            print(f"it{it} {(t-b1)/F:6.3f} +{e['dur']/1e6/F:6.3f} {e['name']}")
    print(f"it{it} next backward at {(f1-b1)/F:.3f}")
