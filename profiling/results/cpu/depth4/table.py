import json, sys
from profiling.static import configs
KEYS = ("arch", "config", "num_warps", "registers", "stack_bytes", "local_bytes", "spills", "vgprs", "sgprs",
        "vgpr_spill_count", "sgpr_spill_count", "scratch_bytes", "ok", "error")
def main():
    archs = tuple(int(a) if a.isdigit() else a for a in sys.argv[2].split(","))
    rows, _ = configs.inspect_kernels(archs, configs_ref=sys.argv[3] if len(sys.argv) > 3 else "d4_configs:d4_configs", schedule=False, sass=False)
    keep = [{k: r.get(k) for k in KEYS if k in r} for r in rows]
    json.dump(keep, open(sys.argv[1], "w"), indent=1)
    for r in keep:
        print(r.get("arch"), r.get("config"), r.get("registers") or r.get("vgprs"), r.get("stack_bytes"), r.get("local_bytes"),
              r.get("spills"), r.get("vgpr_spill_count"), r.get("scratch_bytes"), r.get("error") or "", flush=True)
if __name__ == "__main__":
    main()
