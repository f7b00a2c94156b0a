"""Copy probes: how near a copy's rate a plain Triton kernel with rome's walk gets, on a GPU.

The measured rome launches whose SM side the model holds far ahead (wan, default fp32) sit at
~0.95 of a device copy's DRAM rate (profiling/results/cpu/pairs-why/, section 4). These kernels
move the same bytes with nothing else in the way, to tell the walk's cost from rome's:

- ``memcpy``: torch's ``copy_`` of q and of k (cudaMemcpy device to device, the reference);
- ``flat``: one Triton program per 4096 contiguous elements of q then k (16-byte vectors);
- ``heads``: rome's walk: a program takes BLOCK_R rows of every head of q, then of k (x
  ``[1, H, S, D]`` contiguous), a head an iteration; ``+tables``: the program first reads its
  rows' fp32 cos and sin ``[S, D]`` (default's tables) and each head is stored as x*cos + sin
  (the loads kept live), so its bytes are default's ``rome.apply_qk``'s; ``next``: each head's
  load issued before the previous head's store (two heads in flight a program, as rome's batches).

Kernel time by torch.profiler (median of 20 calls), bytes as each moves them, against memcpy's
rate in the same run. Prints one JSON object; each row's line to stderr.
PYTHONPATH=<tree>:<this folder> python3 copyprobe.py [bf16|fp32] [groups]  (DEV=cpu SMALL=1 TRITON_INTERPRET=1: a check of the outputs on a CPU)"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from ab import kernel_us  # (this folder's: torch.profiler's kernel time, median of 20 calls)


@triton.jit
def flat_copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


@triton.jit
def _apply(x, c, s, TABLES: tl.constexpr):
    if TABLES:
        x = (x.to(tl.float32) * c + s).to(x.dtype)
    return x


@triton.jit
def _heads(src, dst, off, m, c, s, S, H, TABLES: tl.constexpr, D: tl.constexpr, NEXT: tl.constexpr):
    sd = (S * D).to(tl.int64)
    if NEXT:  # the next head's load issued before this head's store (rome's batches, one deep)
        x = tl.load(src + off, mask=m & (off * 0 < H))
        for h in range(H):
            nxt = tl.load(src + (h + 1) * sd + off, mask=m & (off * 0 + h + 1 < H))
            tl.store(dst + h * sd + off, _apply(x, c, s, TABLES), mask=m)
            x = nxt
    else:
        for h in range(H):
            tl.store(dst + h * sd + off, _apply(tl.load(src + h * sd + off, mask=m), c, s, TABLES), mask=m)


@triton.jit
def heads_copy(q, k, qo, ko, cos, sin, S, HQ, HK, TABLES: tl.constexpr, BLOCK_R: tl.constexpr, D: tl.constexpr,
               NEXT: tl.constexpr):
    # (HQ, HK: the heads a program walks; grid axis 1: its group, HQ of q's heads and HK of k's)
    g = tl.program_id(1).to(tl.int64) * S * D
    q += g * HQ
    qo += g * HQ
    k += g * HK
    ko += g * HK
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    off = rows[:, None].to(tl.int64) * D + tl.arange(0, D)[None, :]
    m = rows[:, None] < S
    c = 0.0
    s = 0.0
    if TABLES:
        c = tl.load(cos + off, mask=m, other=0.0)
        s = tl.load(sin + off, mask=m, other=0.0)
    _heads(q, qo, off, m, c, s, S, HQ, TABLES, D, NEXT)  # q's heads, then k's (rome's order)
    _heads(k, ko, off, m, c, s, S, HK, TABLES, D, NEXT)


def main():
    dt = sys.argv[1] if len(sys.argv) > 1 else "bf16"
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dt]
    dev, small = os.environ.get("DEV", "cuda"), bool(os.environ.get("SMALL"))
    h, s, d = (3, 20, 128) if small else (24, 28800, 128)  # default's q and k
    q = torch.randn(1, h, s, d, device=dev).to(dtype)
    k = torch.randn(1, h, s, d, device=dev).to(dtype)
    cos, sin = torch.rand(s, d, device=dev), torch.rand(s, d, device=dev)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    xbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    tbytes = 2 * cos.numel() * 4

    def memcpy():
        qo.copy_(q); ko.copy_(k)

    def flat():
        for a, b in ((q, qo), (k, ko)):
            flat_copy[(triton.cdiv(a.numel(), 4096),)](a, b, a.numel(), BLOCK=4096, num_warps=8)

    def heads(tables, block_r, warps, nxt, hpg=h):
        def run():
            heads_copy[(triton.cdiv(s, block_r), h // hpg)](q, k, qo, ko, cos, sin, s, hpg, hpg, TABLES=tables,
                                                             BLOCK_R=block_r, D=d, NEXT=nxt, num_warps=warps)
        return run

    probes = [("memcpy", memcpy, xbytes), ("flat", flat, xbytes)]
    if len(sys.argv) > 2 and sys.argv[2] == "groups":  # call O's second: fewer heads a program (a
        # group of q's heads and as many of k's, the tables read once a group), the one-ahead loads
        for hpg in (h, 8, 4, 2, 1):
            if h % hpg:
                continue
            for block_r, warps in ((8, 4), (16, 4), (16, 8), (32, 8)):
                probes.append((f"heads+tables BLOCK_R={block_r} warps={warps} next heads/program={hpg}",
                               heads(True, block_r, warps, True, hpg), xbytes + tbytes))
    else:
        for tables in (False, True):
            for block_r, warps in ((8, 4), (16, 4), (16, 8)):
                for nxt in (False, True):
                    name = f"heads{'+tables' if tables else ''} BLOCK_R={block_r} warps={warps}{' next' if nxt else ''}"
                    probes.append((name, heads(tables, block_r, warps, nxt), xbytes + (tbytes if tables else 0)))
    if dev != "cuda":  # a check of what each writes, no timing
        for name, fn, _ in probes:
            qo.zero_(); ko.zero_()
            fn()
            want = (q, k) if "tables" not in name else tuple((x.float() * cos + sin).to(dtype) for x in (q, k))
            tol = 2.0 ** -7 if "tables" in name and dtype == torch.bfloat16 else 0.0  # (the interpreter's
            # bf16 cast truncates)
            ok = all(torch.allclose(a.float(), b.float(), rtol=tol, atol=0) for a, b in zip((qo, ko), want))
            print(name, "ok" if ok else "WRONG", file=sys.stderr)
        return
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "dtype": dt, "shape": [1, h, s, d], "rows": []}
    base = base_us = None
    for name, fn, nbytes in probes:
        us = kernel_us(fn)[0]
        rate = nbytes / us / 1e3  # GB/s
        base = base or rate
        base_us = base_us or us
        out["rows"].append({"probe": name, "kernel_us": us, "bytes": nbytes, "gbps": rate, "x_memcpy_rate": rate / base,
                            "pct_qk_copy": 100 * base_us / us})
        print(f"{dt} {name}: {us:.1f} us, {rate:.0f} GB/s, {rate / base:.3f} of memcpy's rate, "
              f"{100 * base_us / us:.1f}% of the q/k copy's time", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
