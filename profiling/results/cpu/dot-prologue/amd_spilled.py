"""The 29 dot configs whose AMD builds spill SGPRs after this change (amd_spilled.json), compiled
at 8f788bc for amd-head-39.json:
    PYTHONPATH=.:profiling/results/cpu/dot-prologue python -m profiling kernels --arch gfx942,gfx90a,gfx950 --configs amd_spilled:configs"""
import json
from rome import launch, launcher
BAD = set(json.load(open('profiling/results/cpu/dot-prologue/amd_spilled.json')))
def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.constexprs.get("DOT") and c.name in BAD]
