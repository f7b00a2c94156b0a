import sys, json
from profiling.static import configs
from profiling.static.compile import compile_all, compiler_pool, Job

def main():
    archs = [a if not a.isdigit() else int(a) for a in sys.argv[2].split(",")]
    tuned = sys.argv[3] == "tuned"
    out = []
    with compiler_pool(2) as pool:
        for cc in archs:
            lst = pool.submit(configs._list_configs, configs.DEFAULT_CONFIGS, cc, False).result()
            sel = [c for c in lst if c["meta"].get("halves") and (tuned or not c["meta"].get("tuned_candidate"))]
            print(cc, "configs", len(lst), "halves", len(sel), flush=True)
            jobs = [c["job"] for c in sel]
            res = compile_all(pool, jobs)
            for c in sel:
                r = res[c["job"]]
                if "error" in r:
                    print(cc, c["name"], "ERROR", r["error"][-300:], flush=True); continue
                if isinstance(cc, str):
                    amd = r["amd"]
                    print(cc, c["name"], {k: amd.get(k) for k in ("vgpr", "sgpr", "spill_vgpr", "spill_sgpr", "scratch", "private_segment_size") if k in amd} or amd, flush=True)
                else:
                    rs = r["res"]
                    print(cc, c["name"], "reg", rs["reg"], "stack", rs.get("stack"), "local", rs.get("local"), flush=True)
if __name__ == "__main__":
    main()
