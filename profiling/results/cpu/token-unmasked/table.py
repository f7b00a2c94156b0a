"""Static-table rows under this python's triton, registers and spill per arch (ptxas's / the AMD
backend's resource usage): the token tile's on sm_90, sm_80, sm_100 and gfx942 (``token``, as
JSON to OUT), or the per-head LayerNorm's on sm_80 (``layer``, printed):

    PYTHONPATH=.:profiling/results/cpu/token-unmasked TRITON_CACHE_DIR=DIR .venv-static36/bin/python \
        profiling/results/cpu/token-unmasked/table.py token OUT.json
    ... table.py layer
"""
import json
import sys

from profiling.static import configs

KEYS = ("arch", "config", "num_warps", "registers", "stack_bytes", "local_bytes", "spills", "vgprs", "sgprs",
        "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "scratch_instructions", "ok", "error")


def main():
    kind = sys.argv[1]
    archs = (90, 80, 100, "gfx942") if kind == "token" else (80,)
    rows, _ = configs.inspect_kernels(archs, configs_ref=f"token_configs:{kind}_configs", schedule=False,
                                      sass=False, jobs=None if kind == "token" else 1)
    if kind == "token":
        keep = [{k: r.get(k) for k in KEYS if k in r} for r in rows]
        json.dump(keep, open(sys.argv[2], "w"), indent=1)
        for r in keep:
            print(r)
    else:
        for r in rows:
            print(r["arch"], r["config"], r.get("num_warps"), r.get("registers"), r.get("stack_bytes"),
                  r.get("local_bytes"), r.get("spills"))


if __name__ == "__main__":
    main()
