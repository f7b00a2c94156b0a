"""The committed H200 measurements (tests/fixtures/measured_h200_*: triton 3.6, kernel time beside
a copy of q and k) against the model's loaded estimate of each launch's schedule at its worst and
best ends, as tests/test_bandwidth_model.py reads them: the launch's DRAM bytes per second over
the measured copy's rate. Run from the repository root: python profiling/results/cpu/bound-default-bf16/measured.py"""
import json
from pathlib import Path

from profiling.static import model

COPY = model.GPUS["H200"].copy_gbps
print("| fixture | launch | pass | form | model, worst end | model, best end | measured | worst - measured |")
print("|---|---|---|---|---|---|---|---|")
for fx in ("measured_h200_a471782", "measured_h200_a8e7b9b"):
    for r in json.loads((Path("tests/fixtures") / fx / "launches.json").read_text())["launches"]:
        worst = model.loaded(min(r["schedule_gbps"].values()), COPY)
        best = model.loaded(max(r["schedule_gbps"].values()), COPY)
        got = r["dram_bytes"] / r["measured_kernel_us"] / (r["copy_bytes"] / r["copy_kernel_us"])
        print(f"| {fx[-7:]} | {r['workload']} | {r['pass']} | {r.get('form', '—')} | {100 * worst:.1f} | "
              f"{100 * best:.1f} | {100 * got:.1f} | {100 * (worst - got):+.1f} |")
