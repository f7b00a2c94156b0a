"""Where the next batch's loads sit in one trip of each launch's first tile loop, and what waits on
them at its end, from the cubins a many.py run compiled (as mix.py reads them).
    python loads.py ROWS.json [workload:dtype:pass ...]
Per launch: the trip's instructions C; the index of its first and last global load (LDG) and the
last one's share of the trip, p; the register moves after the trip's last store that read a
register a load of the trip wrote (each waits for its load's data: the trip cannot end before
them); and the model's clocks a trip at the worst end (800 ns, 1.755 GHz): the launch's time there
over its slowest SM's trips, waves x the trips of a program's tile loops (its prologue and seams
spread over them)."""
import json, math, os, re, subprocess, sys

import triton

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);")


def trip(cubin: str, start: int) -> list[tuple[str, str]]:
    sass = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    ops = [(int(m.group(1), 16), m.group(3), m.group(4)) for m in map(LINE.match, sass.splitlines()) if m]
    end = max(a for a, op, args in ops if op == "BRA" and int(args.strip().split()[-1], 16) == start)
    return [(op, args) for a, op, args in ops if start <= a <= end]


def regs(dest: str, op: str) -> set[str]:
    """The registers a load writes (LDG.E.128 R44: R44..R47)."""
    base = int(dest[1:])
    width = {"128": 4, "64": 2}.get(op.rsplit(".", 1)[-1], 1)
    return {f"R{base + i}" for i in range(width)}


def main():
    rows = json.load(open(sys.argv[1]))
    wanted = sys.argv[2:]
    print("| launch | C | loads at | p | moves waiting at the end | model, clocks a trip |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        name = f"{r['workload']}:{r['pass']}"
        if wanted and name not in wanted:
            continue
        loops = r["schedule"]["paths"][0]["tile_loops"]
        body = trip(r["cubin"], int(loops[0][0], 16))
        loads = [i for i, (op, _) in enumerate(body) if op.startswith("LDG")]
        loaded = set().union(*(regs(body[i][1].split(",")[0].strip(), body[i][0]) for i in loads))
        last_store = max(i for i, (op, _) in enumerate(body) if op.startswith("STG"))
        moves = sum(1 for op, args in body[last_store:] if "MOV" in op
                    and any(a.strip() in loaded for a in args.split(",")[1:]))
        c, p = len(body), (loads[-1] + 1) / len(body)
        waves = math.ceil(r["schedule"]["programs_on_busiest_sm"] / r["ctas_per_sm"])
        trips = waves * sum(t for _, t in loops)
        model = r["schedule"]["ends"]["800ns@1.755GHz"]["us"] * 1e-6 * 1.755e9 / trips
        print(f"| {name} | {c} | {loads[0]}-{loads[-1]} | {p:.2f} | {moves} | "
              f"{model:,.0f} |")


if __name__ == "__main__":
    main()
