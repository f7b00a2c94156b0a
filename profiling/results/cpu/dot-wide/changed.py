"""The sm_90 builds the wide dot tile changes: the head groups' dot with two heads a batch
(rome.launch.dot_wide, dot_depth).
    PYTHONPATH=.:profiling/results/cpu/dot-wide python -m profiling kernels --arch sm_90 --configs changed:configs"""
from rome import launch, launcher


def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.constexprs.get("DOT") and c.constexprs.get("DEPTH") == 2]
