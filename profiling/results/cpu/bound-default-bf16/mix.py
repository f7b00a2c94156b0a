"""Opcode counts of one trip of each launch's first tile loop, read from the cubins a many.py run
compiled (../depth4/many.py writes each row's cubin path and its tile loops' start addresses).
    python mix.py ROWS.json [workload:dtype:pass ...]     (e.g. default:bf16:forward wan:bf16:forward)
One column per launch; the loop is [its start, the backward branch to it]."""
import collections, json, os, re, subprocess, sys

import triton

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")


def loop_mix(cubin: str, start: int) -> collections.Counter:
    sass = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    ops = [(int(m.group(1), 16), m.group(3), m.group(4)) for m in map(LINE.match, sass.splitlines()) if m]
    end = max(a for a, op, args in ops if op == "BRA" and int(args.strip().split()[-1], 16) == start)
    return collections.Counter(op for a, op, _ in ops if start <= a <= end)


def main():
    rows = json.load(open(sys.argv[1]))
    wanted = sys.argv[2:]
    cols = {}
    for r in rows:
        name = f"{r['workload']}:{r['pass']}"
        if wanted and name not in wanted:
            continue
        start, trips = r["schedule"]["paths"][0]["tile_loops"][0]
        cols[f"{name} (x{trips})"] = loop_mix(r["cubin"], int(start, 16))
    ops = sorted(set().union(*cols.values()), key=lambda o: -sum(c[o] for c in cols.values()))
    print("| opcode | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    print("| **all** | " + " | ".join(str(sum(c.values())) for c in cols.values()) + " |")
    for o in ops:
        print(f"| {o} | " + " | ".join(str(c[o]) for c in cols.values()) + " |")


if __name__ == "__main__":
    main()
