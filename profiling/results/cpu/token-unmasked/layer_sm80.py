"""Every per-head LayerNorm configuration of the static table on sm_80 under this python's triton:
registers, stack and local bytes, spill (ptxas's resource usage).

    PYTHONPATH=.:profiling/results/cpu/token-unmasked TRITON_CACHE_DIR=DIR .venv-static36/bin/python \
        profiling/results/cpu/token-unmasked/layer_sm80.py
"""
from profiling.static import configs


def main():
    rows, _ = configs.inspect_kernels((80,), configs_ref="layer_configs:layer_configs", schedule=False, sass=False,
                                      jobs=1)
    for r in rows:
        print(r["arch"], r["config"], r.get("num_warps"), r.get("registers"), r.get("stack_bytes"), r.get("local_bytes"),
              r.get("spills"))


if __name__ == "__main__":
    main()
