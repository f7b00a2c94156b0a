"""The spill gate of the NEXT builds (gate36.json: triton 3.6; gate39.json: 3.9; sm_90, 378 builds
each): which spilled, and the rule's 94 (bf16 x, tables or one position a row, no angles).
python gate.py"""
import json
from pathlib import Path

here = Path(__file__).resolve().parent
for g in ("36", "39"):
    rows = json.loads((here / f"gate{g}.json").read_text())
    spilled = [r for r in rows if r["spills"] or not r["ok"] or r["local_instructions"]]
    taken = [r for r in rows if r["config"].startswith("bf16") and "positions=axes" not in r["config"]
             and "angles" not in r["config"]]
    kinds = sorted({" ".join(r["config"].split()[:1]) for r in spilled})
    print(f"triton {g[0]}.{g[1]}: {len(rows)} builds, {len(spilled)} spilled ({', '.join(kinds)} x); "
          f"the rule's {len(taken)}: {sum(r in spilled for r in taken)} spilled, "
          f"at most {max(r['registers'] for r in taken)} registers")
    for r in spilled:
        print(f"    {r['config']}: {r['stack_bytes']} B of stack")
