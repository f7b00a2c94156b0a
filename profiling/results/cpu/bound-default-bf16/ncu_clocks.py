"""The SM clock the committed Nsight Compute profiles of rome's kernels ran at (ncu --clock-control
none: the GPU's own clocks), read from their exports: the raw CSVs of make gpu's ncu part
(gpc__cycles_elapsed.avg.per_second) and the text reports of the QK-norm calls (SpeedOfLight's
"SM Frequency"), beside each kernel's duration and DRAM rate where the export has them.
    python profiling/results/cpu/bound-default-bf16/ncu_clocks.py      (from the repository root)"""
import csv
import re
from pathlib import Path

RESULTS = Path("profiling/results")


def from_csv(path: Path):
    rows = list(csv.reader(path.open()))
    head = rows[0]
    for r in rows[2:]:  # (row 1: the units)
        get = lambda k: r[head.index(k)].replace(",", "")
        yield (r[head.index("Kernel Name")], float(get("gpc__cycles_elapsed.avg.per_second")) / 1e9,
               float(get("gpu__time_duration.sum")) / 1e3, float(get("dram__bytes.sum.per_second")) / 1e12)


def from_text(path: Path):
    kernel = None
    for line in path.read_text().splitlines():
        m = re.match(r"\s+(\w+) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if m:
            kernel, clock, duration = m.group(1), None, None
        m = re.match(r"\s+SM Frequency\s+Ghz\s+([\d.]+)", line)
        if m:
            clock = float(m.group(1))
        m = re.match(r"\s+Duration\s+(us|ms)\s+([\d.,]+)", line)
        if m and kernel:
            duration = float(m.group(2).replace(",", "")) * (1000 if m.group(1) == "ms" else 1)
            yield kernel, clock, duration, None


def main():
    print("| GPU | profile | kernel | SM clock, GHz | duration, us | DRAM, TB/s |")
    print("|---|---|---|---|---|---|")
    for gpu in ("h100", "h200"):
        for path in sorted((RESULTS / gpu).glob("**/*-raw.csv")) + sorted((RESULTS / gpu).glob("**/ncu-*.txt")):
            rows = from_csv(path) if path.suffix == ".csv" else from_text(path)
            for kernel, clock, us, tbs in rows:
                print(f"| {gpu.upper()} | {path.relative_to(RESULTS)} | {kernel} | {clock:.3f} | {us:,.1f} | "
                      f"{'' if tbs is None else f'{tbs:.2f}'} |")


if __name__ == "__main__":
    main()
