import os
def rmsfwd128(cc):
    import rome.launch as L  # (rome.launcher until the caps moved to rome.launch)
    L.NORM_MAXNREG = L.NORM_RMS_MAXNREG = 128
    from rome.launcher import kernel_configs
    return [c for c in kernel_configs(cc) if c.meta.get("norm") == "rms" and c.meta["pass_"] == "fwd"
            and not c.meta.get("tuned_candidate")]
