"""Before -> after NEXT by the model: rome.apply_qk, sm_90, choose()'s tile, fp32 tables, loaded
estimate against copy at the worst end (800 ns, 1.755 GHz), H100 / H200, forward / backward.
fp32 and fp16 were modelled with NEXT while it applied to them; the rule (rome.launch.seam_next)
now leaves them out (their builds spilled under triton 3.9). Before: ../model-12fe90f/ (and ../h200-a8e7b9b/schedules36-partner.json, its 3.6 rows of default,
llama-1d and wan bf16); after: this folder's after-*.json.gz. PYTHONPATH=<tree> python compare.py"""
import gzip
import json
from pathlib import Path

from profiling.static import model

here = Path(__file__).resolve().parent
cpu = here.parent


def rows(*files):
    out = {}
    for f in files:
        data = gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
        for r in json.loads(data):
            out[(r["workload"], r["pass"])] = r
    return out


before = {"3.6": rows(cpu / "h200-a8e7b9b/schedules36-partner.json", cpu / "model-12fe90f/cur36.json.gz"),
          "3.9": rows(cpu / "model-12fe90f/cur39.json.gz")}
after = {"3.6": rows(here / "after-a36.json.gz", here / "after-b36.json.gz"), "3.9": rows(here / "after-a39.json.gz")}
WORST = "800ns@1.755GHz"


def est(r, gpu):
    return 100 * model.loaded(r["schedule"]["ends"][WORST]["gbps"], model.GPUS[gpu].copy_gbps)


print("| workload | triton | H100 fwd / bwd | H200 fwd / bwd | registers | KB/SM in flight | launched |")
print("|---|---|---|---|---|---|---|")
for w in ("default:bf16", "default:fp32", "default:fp16", "wan:bf16", "wan:fp32", "hunyuan-video:bf16",
          "hunyuan-video:fp32"):
    for tv in ("3.6", "3.9"):
        b = [before[tv].get((w, p)) for p in ("forward", "backward")]
        a = [after[tv].get((w, p)) for p in ("forward", "backward")]
        if None in a or None in b:
            continue
        cell = {g: " / ".join(f"{est(x, g):.1f}" for x in b) + " → " + " / ".join(f"**{est(x, g):.1f}**" for x in a)
                for g in ("H100", "H200")}
        regs = " / ".join(str(x["registers"]) for x in b) + " → " + " / ".join(str(x["registers"]) for x in a)
        kb = " / ".join(f"{x['schedule']['ends'][WORST]['inflight_kb_per_sm']:.1f}" for x in b) + " → " + \
            " / ".join(f"{x['schedule']['ends'][WORST]['inflight_kb_per_sm']:.1f}" for x in a)
        taken = "yes" if w.endswith("bf16") else "no (the rule: bf16 only)"
        print(f"| {w} | {tv} | {cell['H100']} | {cell['H200']} | {regs} | {kb} | {taken} |")
