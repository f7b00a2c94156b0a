"""The autotuner's candidates (rome.launch.candidates, the gather's tiles other than the chosen one)
in the static table's configurations: what changed when they became half and twice the program.
    PYTHONPATH=.:profiling/results/cpu/tuned-candidates python -m profiling kernels --arch A --configs changed:configs"""
from rome import launch, launcher


def configs(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.meta.get("tuned_candidate")]
