"""Model rome's llama-1d launches and the 'halves' experiment kernels side by side (sm_90)."""
import json, sys, importlib, dataclasses
sys.path.insert(0, "/tmp/hexp")
from profiling.static import launches
from profiling.static.archs import ARCHS
from profiling.static.compile import compile_all, compiler_pool, Job
from profiling.static.launches import _LigerConfig

def line(tag, r):
    e = r.get("schedule", {}).get("ends", {}).get("800ns@1.755GHz", {})
    print(f"{tag:34s} {r['pass']:8s} reg {r.get('registers')} spill {r.get('spill_bytes')} "
          f"h100 {r.get('estimate_h100') or 0:.3f} h200 {r.get('estimate_h200') or 0:.3f} "
          f"kb {e.get('inflight_kb_per_sm', 0):.1f} busy {e.get('issue_busy', 0):.2f} ctas {r.get('ctas_per_sm')} {r.get('error') or ''}",
          flush=True)

import os
XT = os.environ.get("XT", "*bf16")
def main():
    out = sys.argv[1]
    specs = sys.argv[2:]   # e.g. 4:128 6:128 8:96
    rows = []
    with compiler_pool(1) as pool:
        cap = pool.submit(launches.workload_launches, "llama-1d", {"dtype": XT[1:].replace("fp32","fp32")}, variants=("rome.apply_qk",), liger=False).result()["launches"]
        base = {L["pass"]: L for L in cap}
        print("rome job options", base["forward"]["job"].options, base["forward"]["job"].num_warps, flush=True)
        res = compile_all(pool, [L["job"] for L in cap])
        for L in cap:
            r = launches.launch_row(L, ARCHS[90], res[L["job"]]); line("rome.apply_qk", r); rows.append(r)
        S, HQ, HK, D = 8192, 32, 8, 128
        for spec in specs:
            K, reg, *rest = spec.split(":")
            K, reg = int(K), int(reg)
            br = int(rest[0]) if rest else 8
            hb = int(rest[1]) if len(rest) > 1 else 20
            mod = f"halves{K}"
            fn = importlib.import_module(mod).halves_kernel
            tiles = -(-S // br)
            kg = -(-HQ // hb)
            groups = kg + -(-HK // hb)
            for tr in (False, True):
                sig = {"c_ptr": "*fp32", "s_ptr": "*fp32", "sct": "i32", "sst": "i32", "n_t": "i32",
                       "a_x": XT, "a_o": XT, "a_sxt": "i32", "a_sot": "i32", "a_sxh": "i32", "a_soh": "i32", "a_H": "i32",
                       "b_x": XT, "b_o": XT, "b_sxt": "i32", "b_sot": "i32", "b_sxh": "i32", "b_soh": "i32", "b_H": "i32",
                       "HB": "i32", "KG": "i32"}
                cons = {"TRANSPOSE": tr, "BLOCK_R": br, "HALF": D // 2, "FIRST": False}
                div = tuple(n for n in sig if n not in ("a_H", "b_H", "HB", "KG", "n_t"))
                opts = {"maxnreg": reg} if reg else {}
                cfg = _LigerConfig(f"halves K={K} reg={reg} br={br} {'bwd' if tr else 'fwd'}", fn, sig, cons, div, 4, 3, {}, opts)
                job = Job.of(cfg, 90)
                meta = dict(base["backward" if tr else "forward"]["meta"])
                meta["elements_per_tile"] = br * D
                kinds = []
                for g in range(groups):
                    H = HQ if g < kg else HK
                    gl = g if g < kg else g - kg
                    n = max(0, min(gl * hb + hb, H) - gl * hb)
                    kinds.append([tiles, [n * br * D]])
                L = {"variant": "halves", "config": cfg.name, "meta": meta, "num_warps": 4, "num_stages": 3, "job": job,
                     "pass": "backward" if tr else "forward", "grid": tiles * groups, "units": tiles * groups,
                     "elements": S * (HQ + HK) * D, "programs": {"kinds": kinds, "grid": tiles * groups, "uniform": {}}}
                rr = compile_all(pool, [job])
                r = launches.launch_row(L, ARCHS[90], rr[job]); line(cfg.name, r); r.pop("tile", None); rows.append(r)
    json.dump(rows, open(out, "w"), indent=1, default=str)

if __name__ == "__main__":
    main()
