"""The table of README.md from the *.json files of this folder (many.py's rows).
    python table.py"""
import json, os

RUNS = [("../loop-sets/base36.json", "2d44a1d (3.6)"), ("split36.json", "split sin (3.6)"),
        ("base36-k3.json", "2d44a1d, 3 heads a batch (3.6)"), ("split36-k3.json", "split sin, 3 heads a batch (3.6)"),
        ("split-pau36.json", "split sin + the partner read at use (3.6)"),
        ("split-lateg36.json", "split sin + the partner read after the moves, carried (3.6)"),
        ("../loop-sets/base39.json", "2d44a1d (3.9)"), ("split39.json", "split sin (3.9)")]
here = os.path.dirname(os.path.abspath(__file__))
print("| build | workload | pass | registers, spill B | H100 / H200 % of copy, worst end | H200 µs | KB/SM in flight | issue busy |")
print("|---|---|---|---|---|---|---|---|")
for name, label in RUNS:
    for r in json.load(open(os.path.join(here, name))):
        print(f"| {label} | {r['workload']} | {r['pass']} | {r['registers']}, {r['spill_bytes']} | "
              f"{100 * r['estimate_h100']:.1f} / {100 * r['estimate_h200']:.1f} | {r['time_us_h200']:.1f} | "
              f"{r['inflight_kb_per_sm']:.1f} | {r['issue_busy']:.2f} |")
