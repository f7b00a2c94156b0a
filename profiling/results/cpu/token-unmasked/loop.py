"""The token loop of one.py's backward.sass (the backward branch spanning the most code): its
instruction count and opcode histogram.  python3 loop.py OUT/backward.sass"""
import re,collections,sys
lines=open(sys.argv[1]).read().splitlines()
ins=[]
for l in lines:
    m=re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);',l)
    if m: ins.append((int(m.group(1),16),m.group(2).strip()))
# the loop: the backward branch spanning the most code
best=None
for a,t in ins:
    m=re.search(r'BRA (0x[0-9a-f]+)',t)
    if m and int(m.group(1),16)<a:
        span=a-int(m.group(1),16)
        if best is None or span>best[0]: best=(span,int(m.group(1),16),a)
_,lo,hi=best
body=[t for a,t in ins if lo<=a<=hi]
def op(t):
    t=re.sub(r'^@!?U?P[T0-9]+\s+','',t); return t.split()[0]
c=collections.Counter(op(t).split('.')[0] for t in body)
print('loop',hex(lo),hex(hi),len(body),'instructions')
print(c.most_common())
