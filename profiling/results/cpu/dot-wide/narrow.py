"""The same sm_90 configurations at f56662f (bf16 dot, BLOCK_D 128, no angles: its 32 x 8 tile).
    PYTHONPATH=<f56662f tree>:profiling/results/cpu/dot-wide python -m profiling kernels --arch sm_90 --configs narrow:configs
(run from the f56662f tree: python -m puts the working directory first on the path)"""
from rome import launch, launcher


def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs()
                if c.constexprs.get("DOT") and c.constexprs.get("BLOCK_D") == 128 and not c.constexprs.get("ANGLES")
                and "bf16" in c.name.split(" ")[0]]
