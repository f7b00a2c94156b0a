"""The sm_100 builds that kept a stack frame in this folder's full gates (before-*.tsv), listed for
``python -m profiling kernels`` to compile with their SASS:

    cd profiling/results/cpu/gate-36-39 && PYTHONPATH=<tree>:. <python with triton 3.6 or 3.9> \\
        -m profiling kernels --arch sm_100 --configs sm100_spilled:configs --out DIR
    python stack_where.py DIR/sm_100"""
from pathlib import Path

from rome import launcher

_HERE = Path(__file__).resolve().parent
NAMES = {line.split("\t")[-1].strip() for f in sorted(_HERE.glob("before-*-sm80-sm100.tsv"))
         for line in f.read_text().splitlines()[1:]
         if line.startswith("sm_100") and (line.split("\t")[2] != "0" or line.split("\t")[3] != "0")}


def configs(cc):
    return [c for c in launcher.kernel_configs(cc) if c.name in NAMES]
