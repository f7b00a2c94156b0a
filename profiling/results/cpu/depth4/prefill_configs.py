from profiling.static import configs as C

def prefill_configs(cc=None):
    return [c for c in C.configs(cc) if "prefill" in c.name]
