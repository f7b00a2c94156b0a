"""Two gate TSVs (../triton-37-38/gate.py) compared build by build: per arch and x dtype, the
builds whose registers or stack changed, the register change's range, and the stack frames before
and after.
    python compare_gates.py BEFORE.tsv AFTER.tsv"""
import csv
import sys
from collections import defaultdict


def load(path):
    return {(r["arch"], r["config"]): r for r in csv.DictReader(open(path), delimiter="\t")}


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    assert set(a) == set(b), "the two gates list different configurations"
    groups = defaultdict(list)
    for key in sorted(a):
        ra, rb = a[key], b[key]
        groups[key[0], key[1].split()[0]].append(
            (int(rb["registers"]) - int(ra["registers"]), int(ra["stack_bytes"]), int(rb["stack_bytes"])))
    print("| arch | x | builds | registers changed | fewer / more | change | stack frames before -> after |")
    print("|---|---|---|---|---|---|---|")
    for (arch, x), rows in sorted(groups.items()):
        moved = [d for d, _, _ in rows if d]
        rng = f"{min(moved):+d} .. {max(moved):+d}" if moved else "-"
        print(f"| {arch} | {x} | {len(rows)} | {len(moved)} | {sum(d < 0 for d in moved)} / {sum(d > 0 for d in moved)} "
              f"| {rng} | {sum(s > 0 for _, s, _ in rows)} -> {sum(s > 0 for _, _, s in rows)} |")


if __name__ == "__main__":
    main()
