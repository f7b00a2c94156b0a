"""The static table's per-head LayerNorm rows (norm=layer), for layer_sm80.py (compile workers import it: this
folder on PYTHONPATH)."""
from rome import launcher


def layer_configs(arch=None):
    return [c for c in launcher.kernel_configs(arch) if c.meta.get("norm") == "layer"]
