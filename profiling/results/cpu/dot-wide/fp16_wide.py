"""The sm_90 fp16 dot builds at the wide tile (64 x 16, one head a batch).
    PYTHONPATH=.:profiling/results/cpu/dot-wide python -m profiling kernels --arch sm_90 --configs fp16_wide:configs"""
from rome import launch, launcher
def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.constexprs.get("DOT") and c.num_warps == 16 and "fp16" in c.name.split(" ")[0]]
