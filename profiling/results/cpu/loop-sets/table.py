"""The tables of README.md from the *.json files of this folder (many.py's rows): triton 3.6's
runs, then with --39 triton 3.9's; or another folder's runs, named (../fewer-registers/).
    python table.py [--39]
    python table.py DIR RUN [RUN ...]"""
import json, os, sys

RUNS = ["base36", "ping2-k4", "ring4-k2", "slots4-k2", "slots4-k2-latep", "slots4-k3-latep",
        "slots4-k2-regs168", "ring4-k2-unrolled", "slots4-k2-unrolled"]
if "--39" in sys.argv:
    RUNS = ["base39", "ping2-k4-39", "ring4-k2-39", "slots4-k2-39", "slots4-k2-unrolled-39"]
here = os.path.dirname(os.path.abspath(__file__))
named = [a for a in sys.argv[1:] if not a.startswith("--")]
if named:
    here, RUNS = os.path.abspath(named[0]), named[1:]
print("| run | pass | registers, spill B | H100 / H200 % of copy, worst end | H200 at 600 ns, 1.98 GHz | H200 µs | KB/SM in flight | issue busy |")
print("|---|---|---|---|---|---|---|---|")
for name in RUNS:
    for r in json.load(open(os.path.join(here, name + ".json"))):
        e = r["estimates_h200"]
        print(f"| {name} | {r['pass']} | {r['registers']}, {r['spill_bytes']} | {100 * r['estimate_h100']:.1f} / "
              f"{100 * r['estimate_h200']:.1f} | {100 * e['600ns@1.98GHz']:.1f} | {r['time_us_h200']:.1f} | "
              f"{r['inflight_kb_per_sm']:.1f} | {r['issue_busy']:.2f} |")
