"""fp32 x's head-group gathers (no norm), every one kernel_configs lists, with sm_100's register cap
at 168 in place of gather_registers' 128 (the trial of README's last section):

    cd profiling/results/cpu/gate-36-39 && TRITON_CACHE_DIR=<dir> PYTHONPATH=<tree>:. \\
        <python with triton 3.6> fma_dot.py OUT.tsv 100 fp32_gather_168:configs"""
import torch

from rome import launch, launcher

_registers = launch.gather_registers
launch.gather_registers = lambda arch, x_dtype: 168 if arch == 100 and x_dtype == torch.float32 \
    else _registers(arch, x_dtype)


def configs(cc):
    return [c for c in launcher.kernel_configs(cc) if c.name.startswith("fp32") and "product=gather" in c.name
            and c.meta.get("norm") is None]
