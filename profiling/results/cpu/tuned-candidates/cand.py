"""rome.apply_qk of a workload with the gather tile forced to each autotuning candidate
(rome.launch.candidates of the chosen config), modelled on sm_90. Static estimates.
    PYTHONPATH=<tree>:profiling/results/cpu/tuned-candidates python profiling/results/cpu/tuned-candidates/cand.py OUT.json workload:dtype ...
(TILES=16x8x128,4x2x128: those tiles instead of the candidates; a tile is rows x warps x register cap)"""
import json, os, sys
from profiling.static import launches
from profiling.static.archs import ARCHS
from profiling.static.compile import compile_all, compiler_pool


def _capture(workload, dtype, tile):
    from rome import launch
    with launch.target_arch(90), launch.gather_tile(*tile):
        return launches.workload_launches(workload, {"dtype": dtype}, variants=("rome.apply_qk",), liger=False)


def _candidates(dtype, d, transpose):
    import torch
    from rome import launch
    x = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    with launch.target_arch(90):
        p = launch.plan(launch_matrix(d), x, torch.float32, transpose=transpose, interpret=False)
    return [(c.block_r, c.num_warps, c.maxnreg) for c in p.candidates]


def launch_matrix(d):
    import rome
    return rome.rotation_matrix((d,), "half")


def main():
    out, specs = sys.argv[1], sys.argv[2:]
    rows = []
    with compiler_pool(1) as pool:
        for spec in specs:
            w, dt = spec.split(":")
            for transpose in (False, True):
                tiles = [tuple(int(v) for v in t.split("x")) for t in os.environ["TILES"].split(",")] if os.environ.get("TILES") \
                    else pool.submit(_candidates, dt, 128, transpose).result()
                for tile in tiles:
                    cap = pool.submit(_capture, w, dt, tile).result()["launches"]
                    cap = [L for L in cap if L["pass"] == ("backward" if transpose else "forward")]
                    res = compile_all(pool, [L["job"] for L in cap])
                    for L in cap:
                        r = launches.launch_row(L, ARCHS[90], res[L["job"]])
                        print(f"{w:10s} {dt} {r['pass']:8s} tile {tile} reg {r.get('registers')} spill {r.get('spill_bytes')} "
                              f"h100 {r.get('estimate_h100', 0):.3f} h200 {r.get('estimate_h200', 0):.3f} "
                              f"us {r.get('time_us_h100', 0):.1f}/{r.get('time_us_h200', 0):.1f}", flush=True)
                        rows.append({k: r.get(k) for k in ("pass", "registers", "spill_bytes", "estimate_h100", "estimate_h200",
                                                          "time_us_h100", "time_us_h200", "config")} | {"tile": tile, "workload": spec})
    json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
