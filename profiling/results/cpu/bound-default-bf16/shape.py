"""The loaded-memory step of the model (profiling/static/model.py: loaded(), K = 3, no ceiling)
against other shapes, on the three measured fixtures (tests/fixtures/measured_*): per fixture the
largest miss, the mean miss and how many launches are within 4 points, in points of the measured
copy, for c x (1 + (copy / rate)^K)^(-1/K) at K = 3..8 and a ceiling c of 1.0, 0.97 or 0.96 (a
flat Triton copy moved 0.96-0.97 of memcpy's DRAM rate on the H200: ../../h200/next-f06c2d3/,
docs/kernels.md). The rate is each launch's idle schedule at the worst end, as the tests read it.
A second table leaves out llama-1d's launches (the model counts their tables twice: their
misses are the largest on the H100 and a471782).
    python profiling/results/cpu/bound-default-bf16/shape.py      (from the repository root)"""
import json
import statistics
from pathlib import Path

FIXTURES = {  # name: (launches.json, the model's copy rate for that GPU, GB/s)
    "H100 f1c73eb": ("tests/fixtures/measured_h100_f1c73eb/launches.json", 3000.0),
    "H200 a471782": ("tests/fixtures/measured_h200_a471782/launches.json", 4300.0),
    "H200 a8e7b9b": ("tests/fixtures/measured_h200_a8e7b9b/launches.json", 4300.0),
}


def loaded(rate: float, copy: float, k: float) -> float:
    return (1.0 + (copy / rate) ** k) ** (-1.0 / k)


def table(without: str | None = None):
    data = {}
    for name, (path, copy) in FIXTURES.items():
        rows = [r for r in json.loads(Path(path).read_text())["launches"]
                if without is None or not r["workload"].startswith(without)]
        data[name] = [(min(r["schedule_gbps"].values()),
                       r["dram_bytes"] / r["measured_kernel_us"] / (r["copy_bytes"] / r["copy_kernel_us"]))
                      for r in rows]
    print(f"\nlaunches: {'all' if without is None else 'without ' + without}\n")
    print("| K | ceiling | " + " | ".join(f"{n}: largest / mean miss, within 4" for n in FIXTURES) + " |")
    print("|---|---|" + "---|" * len(FIXTURES))
    for ceiling in (1.0, 0.97, 0.96):
        for k in (3, 4, 5, 6, 8):
            cells = []
            for name, (_, copy) in FIXTURES.items():
                errors = [ceiling * loaded(rate, copy, k) - got for rate, got in data[name]]
                cells.append(f"{100 * max(map(abs, errors)):.1f} / {100 * statistics.mean(errors):+.1f}, "
                             f"{sum(abs(e) <= 0.04 for e in errors)} of {len(errors)}")
            print(f"| {k} | {ceiling:.2f} | " + " | ".join(cells) + " |")


def main():
    table()
    table(without="llama-1d")


if __name__ == "__main__":
    main()
