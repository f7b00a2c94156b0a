"""The static table's configurations whose code NEXT (rome.launch.seam_next) changes: the head
groups' gather over q's and k's heads, not the SEAM build, the dot, a norm, the halves or the
token tile. Run while the rule was every dtype and position kind on sm_90 (378 builds; the rule
now takes the bf16 ones at tables or one position a row without angles: 94).
    PYTHONPATH=<tree>:<this folder> python -m profiling kernels --arch sm_90 --configs nextcfg:configs"""
from rome import launch, launcher


def takes_next(c):
    k = c.constexprs
    return (getattr(c.fn, "__name__", "") == "_rome_gather_kernel" and not k.get("SEAM") and not k.get("DOT")
            and not k.get("NORM") and not k.get("HALVES") and not k.get("HEADS_B") and k.get("NEXT"))


def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if takes_next(c)]
