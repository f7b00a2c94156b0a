"""A/B on a GPU of the per-head RMSNorm prologue's register cap (rome.launch.NORM_RMS_MAXNREG:
128 since f08b5be, 168 before): rome.apply_qk_norm's forward kernel time on the per-head *-qknorm
workloads at each cap, in alternating rounds (128, 168, 128, 168, ...) beside a copy of the same
q/k bytes, and whether the two caps' outputs are the same bits. q, k bf16 [B,S,H,D] projections
viewed as [B,H,S,D]; fp32 tables; kernel us by torch.profiler (median of 20, ab.kernel_us).
Prints one JSON object; one line per row on stderr.

    PYTHONPATH=.:profiling/results/h100/scripts python3 normcap.py [qwen3-qknorm,flux-qknorm] [rounds]
"""
import json
import statistics
import sys

import torch

import rome
from ab import kernel_us
from rome import launch

W = {  # B, S, Hq, Hk, D, sections, mode, grid (as qk.py)
    "flux-qknorm": (1, 4608, 24, 24, 128, (16, 56, 56), "interleave", (1, 64, 72)),
    "qwen3-qknorm": (1, 8192, 32, 8, 128, (128,), "half", None),
}


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(W)
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "rows": []}
    for name in names:
        b, s, hq, hk, d, sec, mode, grid = W[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, s, hq, d, device="cuda", generator=g).bfloat16().transpose(1, 2)
        k = torch.randn(b, s, hk, d, device="cuda", generator=g).bfloat16().transpose(1, 2)
        m = rome.rotation_matrix(sec, mode, device="cuda", dtype=torch.bfloat16)
        pos = rome.grid_positions(grid, device="cuda") if grid else torch.arange(s, device="cuda")[:, None]
        cos, sin = rome.rope_cos_sin(pos, sec, mode=mode, device="cuda")
        qw = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).bfloat16()
        kw = (1 + 0.1 * torch.randn(d, device="cuda", generator=g)).bfloat16()
        qo, ko = torch.empty_like(q), torch.empty_like(k)
        fused = lambda: rome.apply_qk_norm(q, k, cos, sin, m, qw, kw, backend="triton")  # noqa: E731
        row = {"workload": name, "q": [b, hq, s, d], "k_heads": hk, "copy_us": [], "cap_us": {128: [], 168: []}}
        outs = {}
        for _ in range(rounds):
            row["copy_us"].append(kernel_us(lambda: (qo.copy_(q), ko.copy_(k)))[0])
            for cap in (128, 168):
                launch.NORM_RMS_MAXNREG = cap
                outs[cap] = fused()
                row["cap_us"][cap].append(kernel_us(fused)[0])
        launch.NORM_RMS_MAXNREG = 128
        row["same_bits"] = all(torch.equal(a, b) for a, b in zip(outs[128], outs[168]))
        copy = statistics.median(row["copy_us"])
        for cap in (128, 168):
            us = statistics.median(row["cap_us"][cap])
            row[f"cap{cap}_median_us"], row[f"cap{cap}_pct_copy"] = us, 100 * copy / us
        out["rows"].append(row)
        print(f"[{name}] copy {copy:.1f} us; cap 128 {row['cap128_median_us']:.1f} us "
              f"({row['cap128_pct_copy']:.1f}%), cap 168 {row['cap168_median_us']:.1f} us "
              f"({row['cap168_pct_copy']:.1f}%); same bits {row['same_bits']}", file=sys.stderr, flush=True)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
