import json, sys
from profiling.static import configs
if __name__ == "__main__":
    archs = [int(a) if a.isdigit() else a for a in sys.argv[1].split(",")]
    rows, _ = configs.inspect_kernels(tuple(archs), configs_ref="" + __import__("os").environ.get("EXP_REF", "expcfg:norm128") + "", schedule=False, sass=False)
    bad = 0
    for r in rows:
        m = r["meta"]
        spill = (r.get("stack_bytes") or 0) + (r.get("local_bytes") or 0) + (r.get("vgpr_spill_count") or 0) \
            + (r.get("scratch_bytes") or 0) + (r.get("sgpr_spill_count") or 0)
        print(r["arch"], r["config"][:110], "regs", r.get("registers") or r.get("vgpr_count"), "spill", spill, "ok", r["ok"], "ctas", r.get("ctas_per_sm"))
        bad += bool(spill) or not r["ok"]
    print("n", len(rows), "bad", bad)
    json.dump(rows, open(sys.argv[2], "w"), default=str)
