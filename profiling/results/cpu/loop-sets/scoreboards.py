"""Which scoreboards the first tile loop's global loads write, and what the loop's first
instruction waits on, from the cubins a many.py run compiled (cuobjdump's control bits, read as
the model reads them: profiling.static.schedule.sass_controls).
    PYTHONPATH=<tree> python scoreboards.py ROWS.json ...
Per launch: the loop's instructions; the loads (LDG) in order, grouped by the scoreboard each
writes, as 'SB<n>: first-last (count)'; the scoreboards (0-5) the loop's first instruction waits
on, and the first instruction of the loop that waits on a scoreboard the loop's loads write
(its index: a wait there on loads issued before the back edge). Scoreboards 0 and 1 here are the loads' and stores' operand reads (their address registers);
a load's data is waited on through the one it writes."""
import json, os, subprocess, sys

import triton

from profiling.static.nvidia import parse_sass
from profiling.static.schedule import sass_controls

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def loop(text: str, start: int):
    ins = parse_sass(text)
    end = max(i.addr for i in ins if i.base == "BRA" and i.operands.split()[-1].startswith("0x")
              and int(i.operands.split()[-1], 16) == start)
    return [i for i in ins if start <= i.addr <= end]


def main():
    print("| run | launch | loop instructions | loads by the scoreboard they write (first-last, count) | "
          "the loop's first instruction waits on | first wait on a load's scoreboard |")
    print("|---|---|---|---|---|---|")
    for path in sys.argv[1:]:
        for r in json.load(open(path)):
            text = subprocess.run([CUOBJDUMP, "-sass", r["cubin"]], capture_output=True, text=True, check=True).stdout
            ctl = sass_controls(text)
            body = loop(text, int(r["schedule"]["paths"][0]["tile_loops"][0][0], 16))
            groups = {}
            for n, i in enumerate(body):
                if i.base == "LDG":
                    groups.setdefault(ctl[i.addr]["write"], []).append(n)
            sbs = "; ".join(f"SB{k}: {v[0]}-{v[-1]} ({len(v)})" for k, v in sorted(groups.items()))
            wait = ctl[body[0].addr]["wait"]
            waits = ", ".join(f"SB{k}" for k in range(6) if wait >> k & 1) or "none"
            loaded = sum(1 << k for k in groups)
            first = next((f"{n} ({', '.join(f'SB{k}' for k in range(6) if (ctl[i.addr]['wait'] & loaded) >> k & 1)})"
                          for n, i in enumerate(body) if ctl[i.addr]["wait"] & loaded), "none")
            name = os.path.basename(path).removesuffix(".json")
            print(f"| {name} | {r['pass']} | {len(body)} | {sbs} | {waits} | {first} |")


if __name__ == "__main__":
    main()
