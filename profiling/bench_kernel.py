"""``python -m profiling.bench_kernel --out DIR [--workloads default,llama-1d,wan,decode] [--sweep]``:
rome's gather kernel timed on a GPU against a plain device copy of the same bytes.

Per workload (bf16 q and k, BNSD, fp32 tables; the shapes of ``profiling.workloads``, rebuilt here
from rome's public API only: ``rome.rotation_matrix``, ``rome.rope_cos_sin``,
``rome.grid_positions``, ``rome.apply_qk``):

- ``copy``: ``q_out.copy_(q); k_out.copy_(k)``: every byte of q and k read once and written once,
  what the kernel must move at least (the tables, read about once, are left out of both);
- ``fwd``: ``rome.apply_qk(q, k, cos, sin, M, backend="triton")``;
- ``bwd``: its backward, ``torch.autograd.grad`` of the outputs (dq, dk from dq_out, dk_out).

Each is timed with ``triton.testing.do_bench`` (CUDA events around repeated launches, the L2
flushed between them; the median), after a first call that compiles and autotunes. GB/s counts
2 x (bytes of q + bytes of k) per call; "% of copy" is copy's time over the op's.

``--sweep`` also times the forward and backward of the first workload at other launch knobs:
tile rows / warps / register cap (``rome.launch.gather_tile``) and the prefetch depth
(``ROME_GATHER_DEPTH``, a compile-time constant: one child process per depth). Writes
``bench_kernel.json`` and ``bench_kernel.md`` under ``--out`` and prints the table. About a minute
on an H200 without ``--sweep`` (most of it compiling), a few minutes with it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

WORKLOADS = {  # name: (batch, q heads, kv heads, seq, sections, mode, theta, grid, decode)
    "default": (1, 24, 24, 28800, (44, 44, 40), "half", 10000.0, (20, 36, 40), False),
    "llama-1d": (1, 32, 8, 8192, (128,), "half", 500000.0, None, False),
    "wan": (1, 40, 40, 21 * 30 * 52, (44, 42, 42), "interleave", 10000.0, (21, 30, 52), False),
    "hunyuan-video": (1, 24, 24, 33 * 34 * 60, (16, 56, 56), "interleave", 256.0, (33, 34, 60), False),
    "decode": (64, 32, 8, 1, (128,), "half", 500000.0, None, True),
}
DEFAULT_WORKLOADS = "default,llama-1d,wan,decode"
# (block_r, num_warps, maxnreg): None keeps choose()'s
SWEEP_TILES = ((None, None, None), (4, None, None), (16, None, 255), (None, 8, None), (None, None, 168))
SWEEP_DEPTHS = (2, 3)  # (the chosen depth, 4 for bf16 x on sm_90, is the first tile row)
DEVICE = "cuda"


def _sync():
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def inputs(name: str, dtype=None):
    import torch

    import rome

    dtype = dtype or torch.bfloat16
    b, hq, hk, s, sections, mode, theta, grid, decode = WORKLOADS[name]
    dev = DEVICE
    m = rome.rotation_matrix(sections, mode, device=dev)
    if decode:  # one token per sequence at its own position: tables [B, 1, 1, D]
        pos = 1000 + 37 * torch.arange(b, device=dev)
        cos, sin = rome.rope_cos_sin(pos, sections, mode=mode, theta=theta, device=dev)
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]
    else:
        pos = rome.grid_positions(grid, device=dev) if grid else torch.arange(s, device=dev)
        cos, sin = rome.rope_cos_sin(pos, sections, mode=mode, theta=theta, device=dev)
    d = sum(sections)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(b, hq, s, d, device=dev, generator=g).to(dtype)
    k = torch.randn(b, hk, s, d, device=dev, generator=g).to(dtype)
    return q, k, cos, sin, m


def _bench(fn, rep_ms: int) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")


def time_workload(name: str, rep_ms: int, *, copy: bool = True) -> dict:
    import torch

    import rome
    from rome import tuning

    q, k, cos, sin, m = inputs(name)
    nbytes = 2 * (q.numel() * q.element_size() + k.numel() * k.element_size())
    row = {"workload": name, "q": list(q.shape), "k": list(k.shape), "bytes_moved": nbytes}
    if copy:
        qo, ko = torch.empty_like(q), torch.empty_like(k)

        def run_copy():
            qo.copy_(q)
            ko.copy_(k)

        row["copy_ms"] = _bench(run_copy, rep_ms)

    def fwd():
        return rome.apply_qk(q, k, cos, sin, m, backend="triton")

    t0 = time.perf_counter()
    fwd()
    _sync()
    row["first_fwd_s"] = time.perf_counter() - t0  # compile + autotune
    row["fwd_ms"] = _bench(fwd, rep_ms)
    qg, kg = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    outs = rome.apply_qk(qg, kg, cos, sin, m, backend="triton")
    grads = [torch.randn_like(o) for o in outs]

    def bwd():
        return torch.autograd.grad(outs, (qg, kg), grads, retain_graph=True)

    t0 = time.perf_counter()
    bwd()
    _sync()
    row["first_bwd_s"] = time.perf_counter() - t0
    row["bwd_ms"] = _bench(bwd, rep_ms)
    # a check that the timed op is right: the triton forward against the torch backend, bitwise
    ref = rome.apply_qk(q, k, cos, sin, m, backend="torch")
    row["fwd_equals_torch_backend"] = all(torch.equal(a, b) for a, b in zip(fwd(), ref))
    for key in ("copy", "fwd", "bwd"):
        if f"{key}_ms" in row:
            row[f"{key}_gbps"] = nbytes / (row[f"{key}_ms"] * 1e-3) / 1e9
    if copy:
        row["fwd_pct_of_copy"] = 100 * row["copy_ms"] / row["fwd_ms"]
        row["bwd_pct_of_copy"] = 100 * row["copy_ms"] / row["bwd_ms"]
    row["tuned"] = dict(tuning.chosen())
    return row


def sweep_tiles(name: str, rep_ms: int) -> list[dict]:
    from rome import launch, tuning

    out = []
    for block_r, warps, maxnreg in SWEEP_TILES:
        tuning.reset()
        label = f"BLOCK_R={block_r or 'chosen'} warps={warps or 'chosen'} maxnreg={maxnreg or 'chosen'}"
        try:
            with launch.gather_tile(block_r, warps, maxnreg):
                row = time_workload(name, rep_ms, copy=False)
        except Exception as e:  # a knob that does not launch is a row saying so
            row = {"workload": name, "error": f"{type(e).__name__}: {e}"}
        row["knobs"] = label
        out.append(row)
    return out


def sweep_depths(name: str, rep_ms: int, out_dir: Path) -> list[dict]:
    rows = []
    for depth in SWEEP_DEPTHS:
        child_out = out_dir / f"depth{depth}"
        env = dict(os.environ, ROME_GATHER_DEPTH=str(depth))
        cmd = [sys.executable, "-m", "profiling.bench_kernel", "--out", str(child_out), "--workloads", name,
               "--rep-ms", str(rep_ms), "--no-copy"]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        path = child_out / "bench_kernel.json"
        if proc.returncode == 0 and path.exists():
            row = json.loads(path.read_text())["rows"][0]
        else:
            row = {"workload": name, "error": (proc.stderr or proc.stdout)[-2000:]}
        row["knobs"] = f"ROME_GATHER_DEPTH={depth}"
        rows.append(row)
    return rows


def _fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [f"# rome gather kernel vs copy ({env['device']}, torch {env['torch']}, triton {env['triton']})", "",
             "Measured with triton.testing.do_bench (median, ms); GB/s = 2 x (bytes of q + k) / time; "
             "% of copy = copy time / op time.", "",
             "| workload | q | k | copy ms | copy GB/s | fwd ms | fwd GB/s | fwd % copy | bwd ms | bwd GB/s | bwd % copy |"
             " fwd == torch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    copy_ms = {}
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['workload']} | error: {r['error'][:200]} |")
            continue
        copy_ms[r["workload"]] = r.get("copy_ms")
        lines.append(f"| {r['workload']} | {r['q']} | {r['k']} | {_fmt(r.get('copy_ms'), '.4f')} | "
                     f"{_fmt(r.get('copy_gbps'), '.0f')} | {r['fwd_ms']:.4f} | {r['fwd_gbps']:.0f} | "
                     f"{_fmt(r.get('fwd_pct_of_copy'), '.1f')} | {r['bwd_ms']:.4f} | {r['bwd_gbps']:.0f} | "
                     f"{_fmt(r.get('bwd_pct_of_copy'), '.1f')} | {r['fwd_equals_torch_backend']} |")
    if result.get("sweep"):
        lines += ["", "## Sweep (first workload; % of its copy time above)", "",
                  "| knobs | fwd ms | fwd % copy | bwd ms | bwd % copy | tuned |", "|---|---|---|---|---|---|"]
        for r in result["sweep"]:
            if "error" in r:
                lines.append(f"| {r['knobs']} | error: {r['error'][-300:]!r} | | | | |")
                continue
            c = copy_ms.get(r["workload"])
            pf = 100 * c / r["fwd_ms"] if c else None
            pb = 100 * c / r["bwd_ms"] if c else None
            lines.append(f"| {r['knobs']} | {r['fwd_ms']:.4f} | {_fmt(pf, '.1f')} | {r['bwd_ms']:.4f} | "
                         f"{_fmt(pb, '.1f')} | {r.get('tuned')} |")
    return "\n".join(lines) + "\n"


def environment() -> dict:
    import torch
    import triton

    commit = os.environ.get("ROME_COMMIT")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parent).stdout.strip() or None
        except OSError:
            commit = None
    return {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "torch": torch.__version__, "triton": triton.__version__,
            "commit": commit, "gather_depth": os.environ.get("ROME_GATHER_DEPTH", "default"),
            "autotune": os.environ.get("ROME_AUTOTUNE", "default"),
            "time": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m profiling.bench_kernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workloads", default=DEFAULT_WORKLOADS, help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--rep-ms", type=int, default=100, help="do_bench's rep (ms of timed runs per op)")
    ap.add_argument("--sweep", action="store_true", help="time launch knobs on the first workload")
    ap.add_argument("--no-copy", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_kernel: no CUDA device", file=sys.stderr)
        return 2
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in names if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workloads {unknown}; known: {list(WORKLOADS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = []
    for name in names:
        try:
            rows.append(time_workload(name, args.rep_ms, copy=not args.no_copy))
        except Exception as e:  # one workload failing is a row, not a crash of the table
            rows.append({"workload": name, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
    result = {"environment": environment(), "rows": rows}
    if args.sweep:
        result["sweep"] = sweep_tiles(names[0], args.rep_ms) + sweep_depths(names[0], args.rep_ms, args.out)
    result["seconds"] = time.perf_counter() - started
    (args.out / "bench_kernel.json").write_text(json.dumps(result, indent=1, default=str))
    md = markdown(result)
    (args.out / "bench_kernel.md").write_text(md)
    print(md)
    print(f"({result['seconds']:.0f} s; {args.out / 'bench_kernel.json'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
