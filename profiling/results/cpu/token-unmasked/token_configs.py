"""The token-tile rows of the static table (the norm over a token's heads: constexpr HEADS_B > 0),
for table.py (imported by the compile workers: this folder on PYTHONPATH)."""
from rome import launcher


def token_configs(arch=None):
    return [c for c in launcher.kernel_configs(arch) if c.constexprs.get("HEADS_B", 0) > 0]
