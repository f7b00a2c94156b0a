"""The builds this change touches: the head groups' dot (``DOT``), every x dtype, D, pass and
matrix of the static table.
    PYTHONPATH=.:profiling/results/cpu/dot-prologue python -m profiling kernels --arch sm_90 --configs changed:configs"""
from rome import launch, launcher


def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.constexprs.get("DOT")]
