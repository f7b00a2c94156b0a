"""before -> after from many.py's JSON files in this folder (or the folder given): python table.py [DIR]
(base36/after36: triton 3.6, base39/after39: 3.9). Decode rows as µs on the slowest SM at the
worst end (the schedule's time: one program an SM, so a chain of round trips, not a rate); the
others as % of copy at the worst end (800 ns, 1.755 GHz) and the best (600 ns, 1.98 GHz)."""
import json
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent


def load(tag):
    return {(r["workload"], r["variant"], r["pass"]): r for r in json.loads((HERE / f"{tag}.json").read_text())}


def main():
    for ver in ("36", "39"):
        b, a = load("base" + ver), load("after" + ver)
        keys = [k for k in a if k in b]
        print(f"\n### triton 3.{ver[1]}\n")
        if any(k[0].startswith("decode") for k in keys):
            print("| workload | variant | pass | µs, slowest SM, 800 ns | registers, spill |")
            print("|---|---|---|---|---|")
        for k in keys:
            if not k[0].startswith("decode"):
                continue
            us = lambda r: r["schedule"]["ends"]["800ns@1.755GHz"]["us"]
            s = f"{us(b[k]):.2f} → {us(a[k]):.2f}"
            s = f"**{s}**" if abs(us(a[k]) - us(b[k])) >= 0.005 else s
            print(f"| {k[0]} | {k[1].removeprefix('rome.')} | {k[2]} | {s} | {b[k]['registers']}, {b[k]['spill_bytes']} → "
                  f"{a[k]['registers']}, {a[k]['spill_bytes']} |")
        if any(k[0].startswith("decode") for k in keys):
            print()
        print("| workload | variant | pass | H100 % of copy, 800 ns (600 ns) | H200 % of copy, 800 ns (600 ns) | KB/SM in flight | registers, spill |")
        print("|---|---|---|---|---|---|---|")
        for k in keys:
            if k[0].startswith("decode"):
                continue
            rb, ra = b[k], a[k]

            def cell(g):
                f = lambda r, e: 100 * r[f"estimates_{g}"][e]
                wb, wa = f(rb, "800ns@1.755GHz"), f(ra, "800ns@1.755GHz")
                s = f"{wb:.1f} → {wa:.1f} ({f(rb, '600ns@1.98GHz'):.1f} → {f(ra, '600ns@1.98GHz'):.1f})"
                return f"**{s}**" if abs(wa - wb) >= 0.05 else s
            kb = lambda r: r["schedule"]["ends"]["800ns@1.755GHz"]["inflight_kb_per_sm"]
            print(f"| {k[0]} | {k[1].removeprefix('rome.')} | {k[2]} | {cell('h100')} | {cell('h200')} | "
                  f"{kb(rb):.1f} → {kb(ra):.1f} | {rb['registers']}, {rb['spill_bytes']} → {ra['registers']}, {ra['spill_bytes']} |")


if __name__ == "__main__":
    main()
