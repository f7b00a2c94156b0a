"""Before -> after table (markdown) from many.py's JSONs: estimates against copy at the worst end
(800 ns, 1.755 GHz) for H100 / H200, and the slowest SM's time for the decode step.

    python3 compare.py BEFORE.json[,MORE.json] AFTER.json[,MORE.json] LABEL
"""
import json
import sys


def rows(paths):
    out = {}
    for p in paths.split(","):
        for r in json.load(open(p)):
            out[(r["workload"], r["variant"], r["pass"])] = r
    return out


def cell(r):
    if r["workload"].startswith("decode"):
        return f"{r['time_us_h100']:.2f} / {r['time_us_h200']:.2f} µs"
    return f"{100 * r['estimate_h100']:.1f} / {100 * r['estimate_h200']:.1f}"


def main():
    before, after, label = rows(sys.argv[1]), rows(sys.argv[2]), sys.argv[3]
    print(f"| {label} | pass | before (H100 / H200) | after | registers, spill | KB/SM in flight (800 ns) |")
    print("|---|---|---|---|---|---|")
    for key, a in after.items():
        b = before.get(key)
        e = a["schedule"]["ends"]["800ns@1.755GHz"]
        be = b["schedule"]["ends"]["800ns@1.755GHz"] if b else None
        kb = f"{be['inflight_kb_per_sm']:.1f} → {e['inflight_kb_per_sm']:.1f}" if be else f"{e['inflight_kb_per_sm']:.1f}"
        print(f"| {key[0]} `{key[1]}` | {key[2]} | {cell(b) if b else '—'} | **{cell(a)}** | "
              f"{a['registers']}, {a['spill_bytes']} | {kb} |")


if __name__ == "__main__":
    main()
