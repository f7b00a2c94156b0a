"""Rows of the static table for table.py (imported by the compile workers: this folder on
PYTHONPATH): the token tile's (the norm over a token's heads: constexpr HEADS_B > 0) and the
per-head LayerNorm's (norm=layer)."""
from rome import launcher


def token_configs(arch=None):
    return [c for c in launcher.kernel_configs(arch) if c.constexprs.get("HEADS_B", 0) > 0]


def layer_configs(arch=None):
    return [c for c in launcher.kernel_configs(arch) if c.meta.get("norm") == "layer"]
