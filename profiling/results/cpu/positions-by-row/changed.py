"""The builds that read positions by row (kernel._by_axis): the gather kernel's launches on
positions on 2-4 axes (``AXES`` > 0), every x dtype, D, pass and product of the static table.
    PYTHONPATH=.:profiling/results/cpu/positions-by-row python -m profiling kernels --arch sm_90 --configs changed:configs"""
from rome import launch, launcher


def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.constexprs.get("AXES")]


def d128(cc):
    """``configs``' builds at D = 128 (the subset compiled this session)."""
    return [c for c in configs(cc) if c.constexprs.get("BLOCK_D") == 128 and "D=128 " in c.name]
