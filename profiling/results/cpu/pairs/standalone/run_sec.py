"""Model rome's default launches and the 'section halves' experiment kernels side by side (sm_90).
    python gen_sec.py K DIR/secK.py      (for each K)
    PYTHONPATH=<tree>:DIR TRITON_CACHE_DIR=<dir> python run_sec.py OUT.json K:REGS[:ROWS[:WARPS]] ...
XT=*fp32 for fp32 x; BASE=0 leaves rome's own launches out."""
import json, sys, importlib, os
from profiling.static import launches
from profiling.static.archs import ARCHS
from profiling.static.compile import compile_all, compiler_pool, Job
from profiling.static.launches import _LigerConfig

def line(tag, r):
    e = r.get("schedule", {}).get("ends", {}).get("800ns@1.755GHz", {})
    print(f"{tag:34s} {r['pass']:8s} reg {r.get('registers')} spill {r.get('spill_bytes')} "
          f"h100 {r.get('estimate_h100') or 0:.3f} h200 {r.get('estimate_h200') or 0:.3f} "
          f"kb {e.get('inflight_kb_per_sm', 0):.1f} busy {e.get('issue_busy', 0):.2f} ctas {r.get('ctas_per_sm')} us {r.get('time_us_h200')} {r.get('error') or ''}",
          flush=True)

XT = os.environ.get("XT", "*bf16")
BASE = os.environ.get("BASE", "1") == "1"
def main():
    out = sys.argv[1]
    specs = sys.argv[2:]   # K:REGS[:ROWS[:WARPS]]
    rows = []
    with compiler_pool(1) as pool:
        cap = pool.submit(launches.workload_launches, "default", {"dtype": XT[1:]}, variants=("rome.apply_qk",), liger=False).result()["launches"]
        base = {L["pass"]: L for L in cap}
        if BASE:
            res = compile_all(pool, [L["job"] for L in cap])
            for L in cap:
                r = launches.launch_row(L, ARCHS[90], res[L["job"]]); line("rome.apply_qk", r); rows.append(r)
        S, HQ, HK, D = 28800, 24, 24, 128
        for spec in specs:
            K, reg, *rest = spec.split(":")
            K, reg = int(K), int(reg)
            br = int(rest[0]) if rest else 16
            nw = int(rest[1]) if len(rest) > 1 else 4
            fn = importlib.import_module(f"sec{K}").sec_kernel
            tiles = -(-S // br)
            for tr in (False, True):
                sig = {"c_ptr": "*fp32", "s_ptr": "*fp32", "sct": "i32", "sst": "i32", "n_t": "i32",
                       "acol_ptr": "*i32", "bcol_ptr": "*i32",
                       "a_x": XT, "a_o": XT, "a_sxt": "i32", "a_sot": "i32", "a_sxh": "i32", "a_soh": "i32", "a_H": "i32",
                       "b_x": XT, "b_o": XT, "b_sxt": "i32", "b_sot": "i32", "b_sxh": "i32", "b_soh": "i32", "b_H": "i32"}
                cons = {"TRANSPOSE": tr, "BLOCK_R": br, "HALF": D // 2, "V": int(os.environ.get("V", "2")), "K": K}
                div = tuple(n for n in sig if n not in ("a_H", "b_H", "n_t"))
                opts = {"maxnreg": reg} if reg else {}
                cfg = _LigerConfig(f"sec K={K} reg={reg} br={br} w={nw} {'bwd' if tr else 'fwd'}", fn, sig, cons, div, nw, 3, {}, opts)
                job = Job.of(cfg, 90)
                meta = dict(base["backward" if tr else "forward"]["meta"])
                meta["elements_per_tile"] = br * D
                meta["block_r"] = br
                kinds = [[tiles, [HQ * br * D, HK * br * D]]]
                L = {"variant": "sec", "config": cfg.name, "meta": meta, "num_warps": nw, "num_stages": 3, "job": job,
                     "pass": "backward" if tr else "forward", "grid": tiles, "units": tiles,
                     "elements": S * (HQ + HK) * D, "programs": {"kinds": kinds, "grid": tiles, "uniform": {}}}
                rr = compile_all(pool, [job])
                r = launches.launch_row(L, ARCHS[90], rr[job]); line(cfg.name, r); r.pop("tile", None); rows.append(r)
    json.dump(rows, open(out, "w"), indent=1, default=str)

if __name__ == "__main__":
    main()
