import sys
sys.argv=[sys.argv[0]]+sys.argv[1:]
exec(open('parse.py').read().split("name=sys.argv[1]")[0])
for name in sys.argv[1:]:
    s=qdisc_series(name)
    t0=s[0][0]; prev={}
    print(name, list(s[-1][1].keys()))
    for t,d in s:
        row=' '.join(f"{k.split(':')[1]}{k.split(':')[2]} d{v[1]} b{v[2]}" for k,v in d.items())
        print(f'{t-t0:6.1f} {row}')
