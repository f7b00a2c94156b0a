def configs(cc=None):
    """Every configuration whose dot splits fp32 operands into bf16 pieces (SPLIT > 1)."""
    from profiling.static.configs import configs as every
    return [c for c in every(cc) if c.constexprs.get("SPLIT", 1) > 1]
