"""The README's table from this folder's *.json files (../depth4/many.py's rows): the model's
shares of copy and H200 µs at the worst end (800 ns, 1.755 GHz).
    python table.py"""
import json
from pathlib import Path

RUNS = [("base36", "3.6", "afd0a74 as it is"),
        ("late8_36", "3.6", "`ROME_LATE=8`: x alone, 8 heads a batch, each partner read before its head's math"),
        ("opt_late8_36", "3.6", "`ROME_LATE=8`, the hit rule relaxed (`hit-rule.patch`)"),
        ("opt_base_36", "3.6", "afd0a74, the hit rule relaxed"),
        ("e5_36", "3.6", "`ROME_LATE=105`: 5 heads, the batch's partners at the iteration's top"),
        ("e6_36", "3.6", "`ROME_LATE=106`: 6 heads, partners at the top"),
        ("e8_36", "3.6", "`ROME_LATE=108`: 8 heads, partners at the top"),
        ("e8r4_36", "3.6", "`ROME_LATE=108`, 4 rows a tile (`ROME_EPT=4`)"),
        ("hb24_36", "3.6", "afd0a74, 24 heads a program (`ROME_HB=24`: q's and k's groups apart)"),
        ("hb8_36", "3.6", "afd0a74, 8 heads a program (`ROME_HB=8`)"),
        ("np8_36", "3.6", "`ROME_LATE=208`: 8 heads, no batch in flight across iterations"),
        ("np10_36", "3.6", "`ROME_LATE=210`: 10 heads, none in flight across iterations"),
        ("np12_36", "3.6", "`ROME_LATE=212`: 12 heads, none in flight across iterations"),
        ("np16_36", "3.6", "`ROME_LATE=216`: 16 heads, none in flight across iterations"),
        ("g8_36", "3.6", "`ROME_LATE=308`: 8 heads, the partner as `tl.gather(x, src, axis=1)`, no load"),
        ("r8_36", "3.6", "`ROME_LATE=408`: a ring of 8 heads, x and partner loaded together, each head's next after its math"),
        ("s4_36", "3.6", "`ROME_LATE=504`: a window of 8 heads, the next window's first 4 at the top, its second 4 each after one of the first 4"),
        ("base39", "3.9", "afd0a74 as it is"),
        ("late8_39", "3.9", "`ROME_LATE=8`"),
        ("g8_39", "3.9", "`ROME_LATE=308`"),
        ("baseb_36", "3.6", "afd0a74 as it is"),
        ("w2a_36", "3.6", "afd0a74, 4 rows on 2 warps (`ROME_WARPS=2`)"),
        ("w2b_36", "3.6", "afd0a74, 4 rows on 2 warps"),
        ("baseb_39", "3.9", "afd0a74 as it is"),
        ("w2a_39", "3.9", "afd0a74, 4 rows on 2 warps"),
        ("w2b_39", "3.9", "afd0a74, 4 rows on 2 warps")]


def main():
    here = Path(__file__).parent
    print("| run | triton | build | launch | pass | H100 / H200 % of copy | H200 µs | KB/SM in flight | registers, spill |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, version, what in RUNS:
        for r in json.load(open(here / f"{name}.json")):
            e = r["schedule"]["ends"]["800ns@1.755GHz"]
            launch = f"{r['workload']} {r['variant'].replace('rome.', '')}"
            print(f"| {name} | {version} | {what} | {launch} | {r['pass']} | {100 * r['estimate_h100']:.1f} / "
                  f"{100 * r['estimate_h200']:.1f} | {r['time_us_h200']:.1f} | {e['inflight_kb_per_sm']:.1f} | "
                  f"{r['registers']}, {r['spill_bytes']} |")


if __name__ == "__main__":
    main()
