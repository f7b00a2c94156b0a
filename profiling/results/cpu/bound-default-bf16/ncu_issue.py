"""What device call Q's ncu profile (profiling/results/h100/scripts/runQ.sh, issuencu.py: default's
and wan's bf16 rome.apply_qk, forward then backward each, in that order) says beside the static
model of the same launches: per gather kernel the SM clock, the issue slots used (ncu's "Issued
Warp Per Scheduler", against the model's issue_busy at 800 ns and the clock end nearest the
measured one) and the warp-instructions executed per DRAM byte (sm__inst_executed.sum over the
DRAM bytes read and written, against the model's count along a program's path).
    PYTHONPATH=. python ncu_issue.py NCU.txt ROWS.json      (ROWS.json: a many.py run, e.g. head36.json)"""
import json
import re
import sys

ORDER = [("default:bf16", "forward"), ("default:bf16", "backward"), ("wan:bf16", "forward"), ("wan:bf16", "backward")]
NUMBER = r"([\d.,]+)"


def kernels(text: str) -> list[dict]:
    """Each profiled kernel's figures from ncu's text report (sections and --metrics)."""
    out = []
    for line in text.splitlines():
        if re.match(r"\s+_rome_gather_kernel \(", line):
            out.append({})
            continue
        if not out:
            continue
        k = out[-1]
        for key, pattern in (("sm_ghz", r"\s+SM Frequency\s+Ghz\s+" + NUMBER),
                             ("issued_per_scheduler", r"\s+Issued Warp Per Scheduler\s+" + NUMBER),
                             ("duration_us", r"\s+Duration\s+us\s+" + NUMBER),
                             ("duration_ms", r"\s+Duration\s+ms\s+" + NUMBER),
                             ("inst", r"\s+sm__inst_executed\.sum\s+\S+\s+" + NUMBER),
                             ("read", r"\s+dram__bytes_read\.sum\s+(\S+)\s+" + NUMBER),
                             ("write", r"\s+dram__bytes_write\.sum\s+(\S+)\s+" + NUMBER)):
            m = re.match(pattern, line)
            if m and key not in k:
                if key in ("read", "write"):  # (ncu scales the unit: byte, Kbyte, Mbyte, Gbyte)
                    scale = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}[m.group(1).lower()]
                    k[key] = float(m.group(2).replace(",", "")) * scale
                else:
                    k[key] = float(m.group(1).replace(",", ""))
    return out


def main():
    text = open(sys.argv[1]).read()
    rows = {(r["workload"], r["pass"]): r for r in json.load(open(sys.argv[2]))}
    print("| launch | SM clock, GHz | issued a scheduler a clock: measured / model | "
          "warp-instructions a DRAM byte: measured / model | duration, us |")
    print("|---|---|---|---|---|")
    for (w, p), k in zip(ORDER, kernels(text)):
        r = rows.get((w, p))
        ghz = k.get("sm_ghz")
        end = "800ns@1.98GHz" if ghz and ghz > (1.755 + 1.98) / 2 else "800ns@1.755GHz"
        busy = r["schedule"]["ends"][end]["issue_busy"] if r else None
        per_byte = k["inst"] / (k["read"] + k["write"]) if {"inst", "read", "write"} <= k.keys() else None
        us = k.get("duration_us") or (k["duration_ms"] * 1e3 if "duration_ms" in k else None)
        fmt = lambda v, f: "?" if v is None else format(v, f)
        print(f"| {w} {p} | {fmt(ghz, '.2f')} | {fmt(k.get('issued_per_scheduler'), '.2f')} / "
              f"{fmt(busy, '.2f')} ({end}) | {fmt(per_byte, '.4f')} / "
              f"{fmt(r and r['warp_instructions_per_dram_byte'], '.4f')} | {fmt(us, ',.1f')} |")


if __name__ == "__main__":
    main()
