from rome import launcher, launch
def changed(cc):
    with launch.target_arch(cc):
        return [c for c in launcher._kernel_configs() if c.meta.get("kept_run") in (4, 8)]
