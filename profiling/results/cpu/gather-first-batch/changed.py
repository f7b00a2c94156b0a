"""The builds this change touches: the head groups' gather with ``FIRST`` (rome.launch.first_batch_first:
sm_90, not fp16; not the SEAM build, the token tile or the dot), every x dtype, D, pass and matrix
of the static table; those at one head a batch compile the same code as before.
    PYTHONPATH=.:profiling/results/cpu/gather-first-batch python -m profiling kernels --arch sm_90 --configs changed:configs"""
from rome import launch, launcher


def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.constexprs.get("FIRST")]
