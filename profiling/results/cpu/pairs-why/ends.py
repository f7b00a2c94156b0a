"""Each launch of tests/fixtures/measured_h200_a8e7b9b/launches.json: the model's loaded estimate
at its worst and best ends (800 ns / 1.755 GHz, 600 ns / 1.98 GHz) beside the measured DRAM rate
(the bytes the model counts over the kernel's time, against the copy's rate in the same run).
PYTHONPATH=<tree> python ends.py"""
import json
from pathlib import Path

from profiling.static import model

root = Path(__file__).resolve().parents[4]
copy = model.GPUS["H200"].copy_gbps
print("| launch | form | pass | idle × copy | worst | best | measured | |\n|---|---|---|---|---|---|---|---|")
for r in json.loads((root / "tests/fixtures/measured_h200_a8e7b9b/launches.json").read_text())["launches"]:
    g = r["schedule_gbps"]
    lo, hi = model.loaded(min(g.values()), copy), model.loaded(max(g.values()), copy)
    rate = r["copy_bytes"] / r["copy_kernel_us"]
    got = r["dram_bytes"] / r["measured_kernel_us"] / rate
    where = "within" if lo <= got <= hi else ("above" if got > hi else "below")
    print(f"| {r['workload']} | {r['form']} | {r['pass'][:3]} | {min(g.values()) * 1e3 / rate:.2f} | {lo:.3f} | "
          f"{hi:.3f} | {got:.3f} | {where} |")
