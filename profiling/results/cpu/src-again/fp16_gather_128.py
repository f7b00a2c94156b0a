"""fp16 x's head-group gathers (no norm) on sm_100, every one kernel_configs lists, at a register cap
of 128 in place of gather_registers' 168 (before SRC_AGAIN two heads a batch spilled 8 B at 128:
docs/kernels.md), to see whether the reread's fewer registers let them fit (a trial, not a choice):

    cd profiling/results/cpu/gate-36-39 && TRITON_CACHE_DIR=<dir> PYTHONPATH=<tree>:.:../src-again \\
        <python> fma_dot.py OUT.tsv 100 fp16_gather_128:configs"""
import torch

from rome import launch, launcher

_registers = launch.gather_registers
launch.gather_registers = lambda arch, x_dtype: 128 if arch == 100 and x_dtype == torch.float16 \
    else _registers(arch, x_dtype)


def configs(cc):
    return [c for c in launcher.kernel_configs(cc) if c.name.startswith("fp16") and "product=gather" in c.name
            and c.meta.get("norm") is None]
