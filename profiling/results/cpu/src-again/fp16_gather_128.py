"""fp16 x's head-group gathers (no norm) on sm_100, every one kernel_configs lists, at a register cap
of 128 in place of gather_registers' 168 (before SRC_AGAIN two heads a batch spilled 8 B at 128:
docs/kernels.md), to see whether the reread's fewer registers let them fit (a trial, not a choice):

    cd profiling/results/cpu/gate-36-39 && TRITON_CACHE_DIR=<dir> PYTHONPATH=<tree>:.:../src-again \\
        <python> fma_dot.py OUT.tsv 100 fp16_gather_128:configs"""
import torch

from fp32_gather_168 import capped_gathers  # (gate-36-39's, on the path)


def configs(cc):
    return capped_gathers(cc, torch.float16, 128)
