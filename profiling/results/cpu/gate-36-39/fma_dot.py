"""The general matrix's FMA dot (row-tile kernel, ``dot=ieee``) for the archs given, under the
installed triton, no GPU: one TSV row a build (ptxas's or LLVM's resource usage).

    cd profiling/results/cpu/gate-36-39 && TRITON_CACHE_DIR=<dir> PYTHONPATH=<tree>:. \\
        <python with that triton> fma_dot.py OUT.tsv 80,86,89,90,100,120,gfx942,gfx90a,gfx950 [MODULE:FUNCTION]

TRIAL=block_r,block_n,warps: every FMA dot at that tile instead of choose()'s (16,32,8: the tile
before ec79eb3). MODULE:FUNCTION: another list of configurations (fp32_gather_168:configs)."""
import os
import sys
import time
from dataclasses import replace

from rome import launch, launcher

_choose = getattr(launch.choose, "__wrapped__", launch.choose)


def _trial(*a, **k):
    cfg = _choose(*a, **k)
    if os.environ.get("TRIAL") and cfg.fp32_dot and not cfg.permutation:
        r, n, w = map(int, os.environ["TRIAL"].split(","))
        cfg = replace(cfg, block_r=r, block_n=min(n, cfg.block_d), num_warps=w)
    return cfg


launch.choose = _trial


def configs(cc):
    return [c for c in launcher.kernel_configs(cc) if "dot=ieee" in c.name]


def main():
    from profiling.static import configs as static

    out, archs = sys.argv[1], tuple(int(a) if a.isdigit() else a for a in sys.argv[2].split(","))
    t = time.time()
    ref = sys.argv[3] if len(sys.argv) > 3 else "fma_dot:configs"
    rows, _ = static.inspect_kernels(archs, configs_ref=ref, schedule=False, sass=False)
    with open(out, "w") as f:
        f.write("arch\tregisters (NVIDIA) / VGPRs (AMD)\tstack B / scratch B\tlocal B / VGPR spills\t"
                "SGPR spills\twaves a SIMD\ttile (rows x panel x warps)\tconfig\n")
        for r in rows:
            amd = r["arch"].startswith("gfx")
            f.write("\t".join(str(v) for v in (
                r["arch"], r["vgprs"] if amd else r["registers"], r["scratch_bytes"] if amd else r["stack_bytes"],
                r["vgpr_spill_count"] if amd else r["local_bytes"], r["sgpr_spill_count"] if amd else "",
                r.get("waves_per_simd", "") if amd else "",
                f"{r['meta'].get('block_r')}x{r['meta'].get('block_n')}x{r['num_warps']}", r["config"])) + "\n")
    print(f"{len(rows)} builds, {time.time() - t:.0f} s")


if __name__ == "__main__":
    main()
