"""../depth4/many.py with fp32 x's head-groups dot at another tile (a trial: rome unchanged).
    PYTHONPATH=<tree> TRITON_CACHE_DIR=DIR python tiles.py OUT.json 'default:fp32:rome.apply_qk (dot)' ...
F32DEPTH=n: fp32 x takes the wide tile (launch.DOT_WIDE_ROWS x DOT_WIDE_WARPS, 64 x 16 at 128
registers) with n heads a batch. F32D=n: n heads a batch at the tile choose() gives (16 x 8).
F32TILE=RxWxN: R rows on W warps at a cap of N registers, heads a batch as F32D (default one)."""
import os, sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "depth4"))
from rome import launch  # noqa: E402

if os.environ.get("F32DEPTH"):  # (module level: the spawned capture worker imports this file too)
    launch.DOT_WIDE_DEPTH[torch.float32] = int(os.environ["F32DEPTH"])
if os.environ.get("F32D"):
    _depth = launch.dot_depth
    launch.dot_depth = lambda cfg, arch: int(os.environ["F32D"]) \
        if cfg.x_dtype == torch.float32 and not cfg.angles else _depth(cfg, arch)
if os.environ.get("F32TILE"):
    from dataclasses import replace
    _choose = launch.choose
    _r, _w, _n = map(int, os.environ["F32TILE"].split("x"))

    def _tile(*a, **k):
        cfg = _choose(*a, **k)
        if cfg.product == "dot" and cfg.x_dtype == torch.float32 and not cfg.angles and cfg.heads:
            cfg = replace(cfg, block_r=_r, num_warps=_w, maxnreg=_n)
        return cfg
    launch.choose = _tile
import many  # noqa: E402

if __name__ == "__main__":
    many.main()
