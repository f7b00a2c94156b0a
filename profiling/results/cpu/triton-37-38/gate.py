"""Every configuration the launcher can choose, compiled for the archs given under the installed
triton (no GPU), one TSV row each: registers, stack and local bytes (what the gate checks).

    TRITON_CACHE_DIR=<dir> PYTHONPATH=<tree> <python with that triton> gate.py OUT.tsv 90[,80,100]
"""
import sys
import time

from profiling.static import configs


def main():
    out, archs = sys.argv[1], tuple(int(a) if a.isdigit() else a for a in sys.argv[2].split(","))
    t = time.time()
    rows, _ = configs.inspect_kernels(archs, configs_ref=configs.DEFAULT_CONFIGS, schedule=False, sass=False)
    with open(out, "w") as f:
        f.write("arch\tregisters\tstack_bytes\tlocal_bytes\tok\tconfig\n")
        for r in rows:
            f.write(f"{r['arch']}\t{r['registers']}\t{r['stack_bytes']}\t{r['local_bytes']}\t{r['ok']}\t{r['config']}\n")
    bad = [r for r in rows if r.get("spills") or not r.get("ok")]
    print(f"{len(rows)} builds, {len(bad)} spilled or failed, {time.time() - t:.0f} s")
    for r in bad:
        print(f"  {r['arch']} {r['registers']} regs, {r['stack_bytes']} B stack, {r['local_bytes']} B local: {r['config']}")


if __name__ == "__main__":
    main()
