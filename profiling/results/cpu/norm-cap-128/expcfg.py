import os
def norm128(cc):
    import rome.launcher as L
    L.NORM_MAXNREG = int(os.environ.get("EXP_CAP", "128"))
    from rome.launcher import kernel_configs
    out = []
    for c in kernel_configs(cc):
        m = c.meta
        if m.get("norm") in ("rms", "layer") and not m.get("tuned_candidate"):
            out.append(c)
    return out
