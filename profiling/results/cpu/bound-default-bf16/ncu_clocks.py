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


FIELDS = (  # (key, a line of ncu's text report: its sections and --metrics; the value's group)
    ("sm_ghz", r"\s+SM Frequency\s+Ghz\s+([\d.,]+)"),
    ("issued_per_scheduler", r"\s+Issued Warp Per Scheduler\s+([\d.,]+)"),
    ("duration_us", r"\s+Duration\s+(us|ms)\s+([\d.,]+)"),
    ("inst", r"\s+sm__inst_executed\.sum\s+\S+\s+([\d.,]+)"),
    ("read", r"\s+dram__bytes_read\.sum\s+(\S+)\s+([\d.,]+)"),
    ("write", r"\s+dram__bytes_write\.sum\s+(\S+)\s+([\d.,]+)"),
)
SCALE = {"us": 1, "ms": 1e3, "byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}  # (ncu scales units)


def kernels(text: str) -> list[dict]:
    """Each kernel of an ncu text report, in order: ``name`` and the ``FIELDS`` it prints (durations
    in us, bytes in bytes), the first of each."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s+(\w+) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", line)
        if m:
            out.append({"name": m.group(1)})
            continue
        for key, pattern in FIELDS if out else ():
            m = re.match(pattern, line)
            if m and key not in out[-1]:
                *unit, value = m.groups()
                out[-1][key] = float(value.replace(",", "")) * (SCALE[unit[0].lower()] if unit else 1)
    return out


def from_text(path: Path):
    for k in kernels(path.read_text()):
        yield k["name"], k.get("sm_ghz"), k.get("duration_us"), None


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
