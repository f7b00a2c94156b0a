def tokfwd(cc):
    import torch
    from rome import launch, launcher
    out = []
    with launch.target_arch(cc):
        for x in (torch.bfloat16, torch.float16, torch.float32):
            for d, heads in ((128, 24), (128, 32), (128, 40), (64, 40), (64, 64), (64, 80)):
                out += launcher._gather_configs(x, d, False, torch.float32, 0, False, norm="rms_heads", heads=(heads, heads))[:1]
    seen, uniq = set(), []
    for c in out:
        if c.name not in seen:
            seen.add(c.name); uniq.append(c)
    return uniq
