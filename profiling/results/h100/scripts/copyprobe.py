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
PYTHONPATH=<tree>:<this folder> python3 copyprobe.py [bf16|fp32] [groups|forms]  (DEV=cpu SMALL=1 TRITON_INTERPRET=1: a check of the outputs on a CPU)"""
import json
import os
import sys

import torch
import triton
import triton.language as tl

from ab import kernel_us  # (this folder's: torch.profiler's kernel time, median of 20 calls)


@triton.jit
def _ld(p, m, HINT: tl.constexpr):  # HINT: streamed data: evict-first loads, streaming (.cs) stores
    if HINT:
        return tl.load(p, mask=m, eviction_policy="evict_first")
    return tl.load(p, mask=m)


@triton.jit
def _st(p, v, m, HINT: tl.constexpr):
    if HINT:
        tl.store(p, v, mask=m, cache_modifier=".cs")
    else:
        tl.store(p, v, mask=m)


@triton.jit
def flat_copy(src, dst, n, BLOCK: tl.constexpr, HINT: tl.constexpr = False):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    _st(dst + offs, _ld(src + offs, m, HINT), m, HINT)


@triton.jit
def persistent_copy(src, dst, n, BLOCK: tl.constexpr, HINT: tl.constexpr = False):
    # a fixed grid (a few programs an SM), each striding over the blocks, the next block's load
    # issued before this one's store: no per-block program start, no partial last wave
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = _ld(src + offs, offs < n, HINT)
    for _ in range(tl.cdiv(n - tl.program_id(0).to(tl.int64) * BLOCK, step)):
        nxt = _ld(src + offs + step, offs + step < n, HINT)
        _st(dst + offs, x, offs < n, HINT)
        x = nxt
        offs += step


@triton.jit
def _apply(x, c, s, TABLES: tl.constexpr):
    if TABLES:
        x = (x.to(tl.float32) * c + s).to(x.dtype)
    return x


@triton.jit
def _heads(src, dst, off, m, c, s, S, H, TABLES: tl.constexpr, D: tl.constexpr, NEXT: tl.constexpr,
           HINT: tl.constexpr):
    sd = (S * D).to(tl.int64)
    if NEXT:  # the next head's load issued before this head's store (rome's batches, one deep)
        x = _ld(src + off, m & (off * 0 < H), HINT)
        for h in range(H):
            nxt = _ld(src + (h + 1) * sd + off, m & (off * 0 + h + 1 < H), HINT)
            _st(dst + h * sd + off, _apply(x, c, s, TABLES), m, HINT)
            x = nxt
    else:
        for h in range(H):
            _st(dst + h * sd + off, _apply(_ld(src + h * sd + off, m, HINT), c, s, TABLES), m, HINT)


@triton.jit
def heads_copy(q, k, qo, ko, cos, sin, S, HQ, HK, TABLES: tl.constexpr, BLOCK_R: tl.constexpr, D: tl.constexpr,
               NEXT: tl.constexpr, HINT: tl.constexpr = False):
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
        c = tl.load(cos + off, mask=m, other=0.0).to(tl.float32)
        s = tl.load(sin + off, mask=m, other=0.0).to(tl.float32)
    _heads(q, qo, off, m, c, s, S, HQ, TABLES, D, NEXT, HINT)  # q's heads, then k's (rome's order)
    _heads(k, ko, off, m, c, s, S, HK, TABLES, D, NEXT, HINT)


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
    cos16, sin16 = cos.to(dtype), sin.to(dtype)  # (forms: the tables in x's dtype, as HF passes them)
    tbytes = 2 * cos.numel() * 4

    def memcpy():
        qo.copy_(q); ko.copy_(k)

    def flats(block=4096, warps=8, hint=False):
        def run():
            for a, b in ((q, qo), (k, ko)):
                flat_copy[(triton.cdiv(a.numel(), block),)](a, b, a.numel(), BLOCK=block, HINT=hint, num_warps=warps)
        return run

    flat = flats()

    def persistent(block, warps, per_sm, hint=False):
        sms = torch.cuda.get_device_properties(0).multi_processor_count if dev == "cuda" else 2
        def run():
            for a, b in ((q, qo), (k, ko)):
                persistent_copy[(sms * per_sm,)](a, b, a.numel(), BLOCK=block, HINT=hint, num_warps=warps)
        return run

    def heads(tables, block_r, warps, nxt, hpg=h, hint=False, half=False):
        c, sn = (cos16, sin16) if half else (cos, sin)
        def run():
            heads_copy[(triton.cdiv(s, block_r), h // hpg)](q, k, qo, ko, c, sn, s, hpg, hpg, TABLES=tables,
                                                             BLOCK_R=block_r, D=d, NEXT=nxt, HINT=hint,
                                                             num_warps=warps)
        return run

    probes = [("memcpy", memcpy, xbytes), ("flat", flat, xbytes)]
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode == "forms":  # the next call's: can a Triton copy come nearer memcpy (block, warps, cache
        # hints), and what the tables in x's dtype leave (bytes as each moves them)
        for block, warps in ((4096, 4), (8192, 8), (16384, 8), (16384, 16), (32768, 16)):
            probes.append((f"flat BLOCK={block} warps={warps}", flats(block, warps), xbytes))
        for block, warps in ((4096, 8), (16384, 16)):
            probes.append((f"flat BLOCK={block} warps={warps} hints", flats(block, warps, True), xbytes))
        for block, warps, per_sm in ((4096, 8, 4), (8192, 8, 4), (4096, 4, 8)):
            probes.append((f"persistent BLOCK={block} warps={warps} programs/SM={per_sm}",
                           persistent(block, warps, per_sm), xbytes))
        tb16 = tbytes * q.element_size() // 4
        for block_r, warps in ((8, 4), (16, 4), (16, 8)):
            probes.append((f"heads+tables BLOCK_R={block_r} warps={warps} next",
                           heads(True, block_r, warps, True), xbytes + tbytes))
            probes.append((f"heads+tables BLOCK_R={block_r} warps={warps} next hints",
                           heads(True, block_r, warps, True, hint=True), xbytes + tbytes))
            if dtype != torch.float32:
                probes.append((f"heads+tables({dt}) BLOCK_R={block_r} warps={warps} next",
                               heads(True, block_r, warps, True, half=True), xbytes + tb16))
                probes.append((f"heads+tables({dt}) BLOCK_R={block_r} warps={warps} next hints",
                               heads(True, block_r, warps, True, hint=True, half=True), xbytes + tb16))
    elif mode == "groups":  # call O's second: fewer heads a program (a
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
            c, sn = (cos16, sin16) if f"tables({dt})" in name else (cos, sin)
            want = (q, k) if "tables" not in name else tuple((x.float() * c.float() + sn.float()).to(dtype) for x in (q, k))
            tol = 2.0 ** -7 if "tables" in name and dtype == torch.bfloat16 else 0.0  # (the interpreter's
            # bf16 cast truncates)
            ok = all(torch.allclose(a.float(), b.float(), rtol=tol, atol=0) for a, b in zip((qo, ko), want))
            print(name, "ok" if ok else "WRONG", file=sys.stderr)
        return
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "dtype": dt, "shape": [1, h, s, d], "rows": []}
    base = base_us = None
    for name, fn, nbytes in probes:
        try:
            us = kernel_us(fn)[0]
        except Exception as e:  # (a form this triton does not compile: its row says so, the rest run)
            out["rows"].append({"probe": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            print(f"{dt} {name}: error {type(e).__name__}: {str(e)[:200]}", file=sys.stderr, flush=True)
            continue
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
