import os
def norm128(cc):
    import rome.launch as L  # (rome.launcher until the caps moved to rome.launch)
    L.NORM_MAXNREG = L.NORM_RMS_MAXNREG = int(os.environ.get("EXP_CAP", "128"))
    from rome.launcher import kernel_configs
    out = []
    for c in kernel_configs(cc):
        m = c.meta
        if m.get("norm") in ("rms", "layer") and not m.get("tuned_candidate"):
            out.append(c)
    return out
