"""rome.apply_qk of several workloads (and dtypes), compiled for sm_90 and modelled: one line each.
    PYTHONPATH=<tree> TRITON_CACHE_DIR=DIR python many.py OUT.json [workload:dtype[:variant] ...]
PAIRS=1 or PAIRS=0: the capture inside rome.launch.pairs_halves(True / False) (trees that have it;
unset: the tree's default). XTABLES=1: the workload's tables in x's dtype (../tables-in-x-dtype/).
TILE=RxW: every gather launch at BLOCK_R=R and W warps, through launch.choose_gather (the tile the
capture records) and launch.candidates (../tile-16x4/). REGS=N: every gather launch and its tuner
candidates at ptxas's register cap N (../bound-default-bf16/: 168, three programs an SM on sm_90).
"""
import contextlib, json, os, sys
from profiling.static import launches

if os.environ.get("XTABLES"):  # (module level: the spawned capture worker imports this file too)
    import profiling.workloads as _workloads
    _tables = _workloads.tables
    _workloads.tables = lambda w, *a, **k: _tables(w, *a, **{"dtype": w.dtype, **k})
_fields = {}  # (TILE, REGS: what every gather launch's config is replaced with)
if os.environ.get("TILE"):
    _fields |= dict(zip(("block_r", "num_warps"), map(int, os.environ["TILE"].split("x"))))
if os.environ.get("REGS"):
    _fields["maxnreg"] = int(os.environ["REGS"])
if _fields:
    from dataclasses import replace as _replace
    from rome import launch as _launch
    _choose, _candidates = _launch.choose_gather, _launch.candidates
    _launch.choose_gather = lambda *a, **k: _replace(_choose(*a, **k), **_fields)
    # (a forced tile is the one candidate; a register cap applies to each of the tuner's)
    _launch.candidates = lambda cfg, **k: (_replace(cfg, **_fields),) if "block_r" in _fields else \
        tuple(_replace(c, **_fields) for c in _candidates(cfg, **k))
from profiling.static.archs import ARCHS
from profiling.static.compile import compile_all, compiler_pool

def _capture(workload, dtype, variant):
    pairs = os.environ.get("PAIRS")
    if pairs is None:
        block = contextlib.nullcontext()
    else:
        from rome import launch
        block = launch.pairs_halves(pairs == "1")
    with block:
        return launches.workload_launches(workload, {"dtype": dtype}, variants=(variant,), liger=False)

def main():
    out = sys.argv[1]
    specs = sys.argv[2:] or ["default:bf16", "llama-1d:bf16", "wan:bf16", "hunyuan-video:bf16",
                             "default:fp32", "llama-1d:fp32", "wan:fp32", "hunyuan-video:fp32"]
    rows = []
    with compiler_pool(1) as pool:
        for spec in specs:
            w, dt, *v = spec.split(":")
            variant = v[0] if v else "rome.apply_qk"
            cap = pool.submit(_capture, w, dt, variant).result()["launches"]
            res = compile_all(pool, [L["job"] for L in cap])
            for L in cap:
                r = launches.launch_row(L, ARCHS[90], res[L["job"]])
                r["workload"] = f"{w}:{dt}"
                e = r.get("schedule", {}).get("ends", {})
                print(f"{w:14s} {dt} {r['pass']:8s} reg {r.get('registers')} spill {r.get('spill_bytes')} "
                      f"h100 {r.get('estimate_h100', 0):.3f} h200 {r.get('estimate_h200', 0):.3f} "
                      f"kb {e.get('800ns@1.755GHz', {}).get('inflight_kb_per_sm', 0):.1f} "
                      f"busy {e.get('800ns@1.755GHz', {}).get('issue_busy', 0):.2f} {r.get('error') or ''}", flush=True)
                r.pop("tile", None)
                rows.append(r)
    json.dump(rows, open(out, "w"), indent=1, default=str)

if __name__ == "__main__":
    main()
