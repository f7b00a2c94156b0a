def normfwd(cc):
    # every norm forward the launcher lists (per head: rms, layer; over heads: the token tile) as
    # launched, and the token tile's forward at 24-80 heads, three dtypes, both pair classes
    import torch
    from rome import launch, launcher
    out = [c for c in launcher.kernel_configs(cc)
           if c.meta.get("norm") in ("rms", "layer", "rms_heads") and c.meta["pass_"] == "fwd"
           and not c.meta.get("tuned_candidate")]
    with launch.target_arch(cc):
        for x in (torch.bfloat16, torch.float16, torch.float32):
            for d, heads in ((128, 24), (128, 32), (128, 40), (64, 40), (64, 64), (64, 80)):
                for mode in ("interleave", "half"):
                    out += launcher._gather_configs(x, d, False, torch.float32, 0, False, norm="rms_heads",
                                                    heads=(heads, heads), mode=mode)[:1]
    seen, uniq = set(), []
    for c in out:
        if c.name not in seen:
            seen.add(c.name); uniq.append(c)
    return uniq
