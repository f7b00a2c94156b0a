"""The committed H200 measurements against the model at the clock the profiled GPUs ran at
(ncu_clocks.py: 1.95-1.98 GHz, the model's 1.98 GHz end), at both DRAM latencies: each launch's
loaded estimate from its schedule at 800 and 600 ns and 1.98 GHz, and the measured share as
measured.py reads it. Run from the repository root:
    PYTHONPATH=. python profiling/results/cpu/bound-default-bf16/at_clock.py"""
import json
from pathlib import Path

from profiling.static import model

COPY = model.GPUS["H200"].copy_gbps
print("| fixture | launch | pass | form | model 800 ns, 1.755 GHz (the worst end) | model 800 ns, 1.98 GHz | "
      "model 600 ns, 1.98 GHz | measured |")
print("|---|---|---|---|---|---|---|---|")
for fx in ("measured_h200_a471782", "measured_h200_a8e7b9b"):
    for r in json.loads((Path("tests/fixtures") / fx / "launches.json").read_text())["launches"]:
        ends = {k: 100 * model.loaded(v, COPY) for k, v in r["schedule_gbps"].items()}
        got = 100 * r["dram_bytes"] / r["measured_kernel_us"] / (r["copy_bytes"] / r["copy_kernel_us"])
        print(f"| {fx[-7:]} | {r['workload']} | {r['pass']} | {r.get('form', '—')} | {ends['800ns@1.755GHz']:.1f} | "
              f"{ends['800ns@1.98GHz']:.1f} | {ends['600ns@1.98GHz']:.1f} | {got:.1f} |")
