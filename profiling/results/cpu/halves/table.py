"""before -> after from many.py JSONs: python table.py DIR (DIR holding base36, after36, base39, after39 .json; ../pairs/ uses it too)"""
import json, sys, collections
d = sys.argv[1]
def load(tag):
    rows = json.load(open(f"{d}/{tag}.json"))
    out = collections.OrderedDict()
    seen = collections.Counter()
    for r in rows:
        key = (r["workload"], r["variant"], r["pass"])
        out[key] = r
    return out
for ver in ("36", "39"):
    b, a = load("base" + ver), load("after" + ver)
    print(f"\n### triton 3.{ver[1]}\n")
    print("| workload | variant | pass | H100 800 ns (600 ns) | H200 800 ns (600 ns) | µs H200 800 ns | KB/SM in flight | registers, spill |")
    print("|---|---|---|---|---|---|---|---|")
    for key, rb in b.items():
        ra = a[key]
        def f(r, g, end):
            return 100 * r[f"estimates_{g}"][end]
        def cell(g):
            wb, wa = f(rb, g, "800ns@1.755GHz"), f(ra, g, "800ns@1.755GHz")
            bb, ba = f(rb, g, "600ns@1.98GHz"), f(ra, g, "600ns@1.98GHz")
            s = f"{wb:.1f} → {wa:.1f} ({bb:.1f} → {ba:.1f})"
            return f"**{s}**" if abs(wa - wb) >= 0.05 else s
        decode = key[0].startswith("decode")
        kb = lambda r: r["schedule"]["ends"]["800ns@1.755GHz"]["inflight_kb_per_sm"]
        us = f"{rb['time_us_h200']:.2f} → {ra['time_us_h200']:.2f}"
        print(f"| {key[0]} | {key[1].removeprefix('rome.')} | {key[2]} | {cell('h100')} | {cell('h200')} | {us} | {kb(rb):.1f} → {kb(ra):.1f} | {rb['registers']}, {rb['spill_bytes']} → {ra['registers']}, {ra['spill_bytes']} |")
