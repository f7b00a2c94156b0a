"""fp16 dot builds at the wide tile with one head (a trial: launch.py then gave fp16 the 64 x 16 tile and DEPTH 1)."""
from rome import launch, launcher
def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs()
                if c.constexprs.get("DOT") and c.num_warps == 16 and "fp16" in c.name]
