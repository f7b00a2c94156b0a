"""What device call Q's ncu profile (profiling/results/h100/scripts/runQ.sh, pairsncu.py partner bf16
default,wan: rome.apply_qk, forward then backward each, in that order) says beside the static
model of the same launches: per gather kernel the SM clock, the issue slots used (ncu's "Issued
Warp Per Scheduler", against the model's issue_busy at 800 ns and the clock end nearest the
measured one) and the warp-instructions executed per DRAM byte (sm__inst_executed.sum over the
DRAM bytes read and written, against the model's count along a program's path).
    python ncu_issue.py NCU.txt ROWS.json      (ROWS.json: a many.py run, e.g. head36.json)"""
import json
import sys

from ncu_clocks import kernels

ORDER = [("default:bf16", "forward"), ("default:bf16", "backward"), ("wan:bf16", "forward"), ("wan:bf16", "backward")]


def main():
    text = open(sys.argv[1]).read()
    rows = {(r["workload"], r["pass"]): r for r in json.load(open(sys.argv[2]))}
    print("| launch | SM clock, GHz | issued a scheduler a clock: measured / model | "
          "warp-instructions a DRAM byte: measured / model | duration, us |")
    print("|---|---|---|---|---|")
    for (w, p), k in zip(ORDER, [k for k in kernels(text) if "gather" in k["name"]]):
        r = rows.get((w, p))
        ghz = k.get("sm_ghz")
        end = "800ns@1.98GHz" if ghz and ghz > (1.755 + 1.98) / 2 else "800ns@1.755GHz"
        busy = r["schedule"]["ends"][end]["issue_busy"] if r else None
        per_byte = k["inst"] / (k["read"] + k["write"]) if {"inst", "read", "write"} <= k.keys() else None
        us = k.get("duration_us")
        fmt = lambda v, f: "?" if v is None else format(v, f)
        print(f"| {w} {p} | {fmt(ghz, '.2f')} | {fmt(k.get('issued_per_scheduler'), '.2f')} / "
              f"{fmt(busy, '.2f')} ({end}) | {fmt(per_byte, '.4f')} / "
              f"{fmt(r and r['warp_instructions_per_dram_byte'], '.4f')} | {fmt(us, ',.1f')} |")


if __name__ == "__main__":
    main()
