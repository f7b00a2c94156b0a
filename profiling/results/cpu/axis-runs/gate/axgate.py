"""Every build that reads positions on several axes by row (AXES > 0: LATE_TABLES, _row_positions,
_run_rows), gather and dot, tuned candidates too; registers and spill. --forward: the forward's
only (axis-runs' gate, before the backward took AXES: ../../axis-runs-backward/).
    PYTHONPATH=<tree> TRITON_CACHE_DIR=<dir> python axgate.py 90,80,100,gfx942 [count] [--forward]"""
import sys
from profiling.static import configs
from profiling.static.compile import compile_all, compiler_pool


def main():
    archs = [a if not a.isdigit() else int(a) for a in sys.argv[1].split(",")]
    count_only = "count" in sys.argv[2:]
    forward = "--forward" in sys.argv[2:]
    with compiler_pool(1) as pool:
        for cc in archs:
            lst = pool.submit(configs._list_configs, configs.DEFAULT_CONFIGS, cc, True).result()
            sel = [c for c in lst if c["meta"].get("positions", 0) == 2 and (c["meta"].get("pass_") == "fwd" or not forward)
                   and dict(c["job"].constexprs).get("AXES", 0) > 0]
            print(cc, "configs", len(lst), "AXES builds", len(sel),
                  "tuned", sum(1 for c in sel if c["meta"].get("tuned_candidate")),
                  "dot", sum(1 for c in sel if c["meta"].get("product") == "dot"), flush=True)
            if count_only:
                continue
            res = compile_all(pool, [c["job"] for c in sel])
            bad = 0
            for c in sel:
                r = res[c["job"]]
                run = dict(c["job"].constexprs).get("AXIS_RUN")
                if "error" in r:
                    print(cc, c["name"], "ERROR", r["error"][-300:], flush=True)
                    bad += 1
                    continue
                if isinstance(cc, str):
                    amd = r["amd"]
                    keys = ("vgpr_count", "vgpr_spill_count", "sgpr_spill_count", "private_segment_fixed_size",
                            "llvm_scratch_size")
                    missing = [k for k in keys if k not in amd]
                    assert not missing, (missing, sorted(amd))
                    sp = any(amd[k] for k in keys[1:])
                    print(cc, c["name"], "run", run, {k: amd[k] for k in keys}, "SPILL" if sp else "", flush=True)
                else:
                    rs = r["res"]
                    sp = rs.get("stack") or rs.get("local")
                    print(cc, c["name"], "run", run, "reg", rs["reg"], "stack", rs.get("stack"), "local",
                          rs.get("local"), "SPILL" if sp else "", flush=True)
                bad += bool(sp)
            print(cc, "done", len(sel), "bad", bad, flush=True)


if __name__ == "__main__":
    main()
