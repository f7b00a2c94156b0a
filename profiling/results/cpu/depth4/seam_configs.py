from profiling.static import configs as C

def seam_configs(cc=None):
    return [c for c in C.configs(cc) if c.constexprs.get("DEPTH") == 4 and c.constexprs.get("SEAM")
            and not c.constexprs.get("DOT")]
