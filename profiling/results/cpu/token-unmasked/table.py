"""The static table's token-tile rows (the norm over a token's heads: constexpr HEADS_B > 0) under
this python's triton, registers and spill per arch:

    PYTHONPATH=.:profiling/results/cpu/token-unmasked TRITON_CACHE_DIR=DIR .venv-static36/bin/python profiling/results/cpu/token-unmasked/table.py OUT.json
"""
import json
import sys

from profiling.static import configs


def main():
    rows, _ = configs.inspect_kernels((90, 80, 100, "gfx942"), configs_ref="token_configs:token_configs",
                                      schedule=False, sass=False)
    keys = ("arch", "config", "num_warps", "registers", "stack_bytes", "local_bytes", "spills", "vgprs", "sgprs",
            "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "scratch_instructions", "ok", "error")
    keep = [{k: r.get(k) for k in keys if k in r} for r in rows]
    json.dump(keep, open(sys.argv[1], "w"), indent=1)
    for r in keep:
        print(r)


if __name__ == "__main__":
    main()
