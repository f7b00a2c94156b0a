from profiling.static import configs as C

def d4_configs(cc=None):
    return [c for c in C.configs(cc) if c.constexprs.get("DEPTH") == 4 and not c.constexprs.get("HEADS_B") and not c.constexprs.get("DOT")]
