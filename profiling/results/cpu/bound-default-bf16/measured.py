"""The committed H200 measurements (tests/fixtures/measured_h200_*: triton 3.6, kernel time beside
a copy of q and k) against the model's loaded estimate of each launch's schedule, as
tests/test_bandwidth_model.py reads them: the launch's DRAM bytes per second over the measured
copy's rate. Two tables: the model's worst and best ends; then its 1.98 GHz end at both latencies
(the clock the committed profiles ran at: ncu_clocks.py). Run from the repository root:
    PYTHONPATH=. python profiling/results/cpu/bound-default-bf16/measured.py"""
import json
from pathlib import Path

from profiling.static import model

COPY = model.GPUS["H200"].copy_gbps


def launches():
    """(fixture, launch row, the model's loaded % at each end, the measured %) of both fixtures."""
    for fx in ("measured_h200_a471782", "measured_h200_a8e7b9b"):
        for r in json.loads((Path("tests/fixtures") / fx / "launches.json").read_text())["launches"]:
            ends = {k: 100 * model.loaded(v, COPY) for k, v in r["schedule_gbps"].items()}
            got = 100 * r["dram_bytes"] / r["measured_kernel_us"] / (r["copy_bytes"] / r["copy_kernel_us"])
            yield fx[-7:], r, ends, got


def main():
    rows = list(launches())
    print("| fixture | launch | pass | form | model, worst end | model, best end | measured | worst - measured |")
    print("|---|---|---|---|---|---|---|---|")
    for fx, r, ends, got in rows:
        worst, best = min(ends.values()), max(ends.values())
        print(f"| {fx} | {r['workload']} | {r['pass']} | {r.get('form', '—')} | {worst:.1f} | "
              f"{best:.1f} | {got:.1f} | {worst - got:+.1f} |")
    print()
    print("| fixture | launch | pass | form | model 800 ns, 1.755 GHz (the worst end) | model 800 ns, 1.98 GHz | "
          "model 600 ns, 1.98 GHz | measured |")
    print("|---|---|---|---|---|---|---|---|")
    for fx, r, ends, got in rows:
        print(f"| {fx} | {r['workload']} | {r['pass']} | {r.get('form', '—')} | {ends['800ns@1.755GHz']:.1f} | "
              f"{ends['800ns@1.98GHz']:.1f} | {ends['600ns@1.98GHz']:.1f} | {got:.1f} |")


if __name__ == "__main__":
    main()
