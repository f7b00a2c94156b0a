import os
def rmsfwd128(cc):
    import rome.launcher as L
    L.NORM_MAXNREG = 128
    from rome.launcher import kernel_configs
    return [c for c in kernel_configs(cc) if c.meta.get("norm") == "rms" and c.meta["pass_"] == "fwd"
            and not c.meta.get("tuned_candidate")]
