"""fp32 x's head-group gathers (no norm), every one kernel_configs lists, with sm_100's register cap
at 168 in place of gather_registers' 128 (the trial of README's last section):

    cd profiling/results/cpu/gate-36-39 && TRITON_CACHE_DIR=<dir> PYTHONPATH=<tree>:. \\
        <python with triton 3.6> fma_dot.py OUT.tsv 100 fp32_gather_168:configs"""
import torch

from rome import launch, launcher


def capped_gathers(cc, x_dtype, cap):
    """kernel_configs(cc)'s head-group gathers of x_dtype (no norm), planned with sm_100's register
    cap for x_dtype at ``cap`` in place of ``launch.gather_registers``' (also
    ../src-again/fp16_gather_128.py). The patch stays for the process: the plans it makes are
    cached, so one process lists one trial (fma_dot.py's worker does)."""
    registers = launch.gather_registers
    launch.gather_registers = lambda arch, dt: cap if arch == 100 and dt == x_dtype else registers(arch, dt)
    name = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[x_dtype]
    return [c for c in launcher.kernel_configs(cc) if c.name.startswith(name) and "product=gather" in c.name
            and c.meta.get("norm") is None]


def configs(cc):
    return capped_gathers(cc, torch.float32, 168)
