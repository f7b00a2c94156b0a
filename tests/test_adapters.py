"""Other libraries' RoPE conventions on rome's op (issue 19 item 4): the flash-attn adapter
(``rome.integrations.flash_attn.apply_rotary_emb``), the vLLM adapter
(``rome.integrations.vllm``) and the ``mode=`` shortcut of ``rome.apply``/``apply_qk``.

Each adapter is checked three ways on the same inputs:
- bitwise ``rome.apply``/``apply_qk`` with per-column tables and a matrix built here;
- bitwise the other library's formula written here (flash-attn's ``apply_rotary_emb_torch`` and
  kernel row rule; vLLM's ``RotaryEmbedding.forward_native``) evaluated in float64 and rounded
  once: the torch backend computes exactly that (float64 products of float32/bf16/fp16 values
  are exact and the sum is rounded once, as in the formula); where the adapter runs with
  ``backend="auto"``, a GPU runs the kernel instead, which is held to rome's stated tolerance of
  the float64 formula (``conftest.assert_formula``);
- within a stated bound of that formula at the library's own precision (flash-attn's kernel:
  float32; vLLM's native path: x's dtype).
Neither flash-attn nor vLLM is installed: the formulas are written from their sources
(flash_attn/layers/rotary.py, flash_attn/ops/triton/rotary.py;
vllm/model_executor/layers/rotary_embedding/{base,common}.py).
Mostly the torch backend; a few tiny cases on the Triton kernel (interpreter without a GPU).
"""

from __future__ import annotations

import pytest
import torch
from einops import repeat

import rome
from conftest import DEVICE, assert_formula
from rome.integrations.flash_attn import apply_rotary_emb
from rome.integrations.vllm import RotaryEmbedding, rotary_embedding
from rome.precision import ulp_error

F64 = torch.float64


# --- the other libraries' formulas, written from their sources ------------------------------


def fa_rotate_half(x, interleaved):
    """flash-attn's rotate_half."""
    if not interleaved:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def fa_rows(x, offsets, cu_seqlens):
    """The cos/sin row each token reads in flash-attn's kernel: ``s + seqlen_offsets[b]`` for
    token s of sequence b (of the batch, or of cu_seqlens). ``[B, S]`` or ``[T]``."""
    if cu_seqlens is None:
        b, s = x.shape[:2]
        off = offsets if isinstance(offsets, torch.Tensor) else torch.full((b,), offsets)
        return torch.arange(s)[None, :] + off.long().cpu()[:, None]
    rows, cu = [], cu_seqlens.tolist()
    for i, (start, end) in enumerate(zip(cu, cu[1:])):
        off = int(offsets[i]) if isinstance(offsets, torch.Tensor) else offsets
        rows += [t - start + off for t in range(start, end)]
    return torch.tensor(rows, dtype=torch.long)


def fa_reference(x, cos, sin, interleaved=False, offsets=0, cu_seqlens=None, compute=F64):
    """flash-attn's apply_rotary_emb_torch at its kernel's rows, computed in ``compute`` and
    rounded once to x's dtype; columns past rotary_dim copied."""
    rows = fa_rows(x, offsets, cu_seqlens).to(x.device)
    ro = cos.shape[-1] * 2
    pattern = "... d -> ... 1 (d 2)" if interleaved else "... d -> ... 1 (2 d)"
    c, s = (repeat(t[rows].to(compute), pattern) for t in (cos, sin))
    xr = x[..., :ro].to(compute)
    out = xr * c + fa_rotate_half(xr, interleaved) * s
    return torch.cat([out.to(x.dtype), x[..., ro:]], dim=-1)


def vllm_reference(positions, query, key, cache, head_size, neox, compute=None, rounded=True):
    """vLLM's RotaryEmbedding.forward_native (and apply_rotary_emb_torch), with the arithmetic
    in ``compute`` (None: x's dtype, as vLLM) rounded once to x's dtype (``rounded=False``: left
    in ``compute``)."""
    positions = positions.flatten()
    t = positions.shape[0]
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)
    rotary_dim = cache.shape[-1]

    def one(x):
        shape, x = x.shape, x.view(t, -1, head_size)
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        dt = compute or x.dtype
        c, s, r = cos.unsqueeze(-2).to(dt), sin.unsqueeze(-2).to(dt), rot.to(dt)
        x1, x2 = r.chunk(2, dim=-1) if neox else (r[..., ::2], r[..., 1::2])
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        o = torch.cat((o1, o2), dim=-1) if neox else torch.stack((o1, o2), dim=-1).flatten(-2)
        out = torch.cat((o.to(x.dtype), rest), dim=-1) if rounded else torch.cat((o, rest.to(dt)), dim=-1)
        return out.reshape(shape)

    return one(query), None if key is None else one(key)


def vllm_exact(positions, x, cache, head_size, neox):
    """vLLM's formula for one of query/key in float64, not rounded (``assert_formula``'s)."""
    return vllm_reference(positions, x, None, cache, head_size, neox, F64, rounded=False)[0]


# --- rome's side, built independently: per-column tables and the matrix ----------------------


def widen(t, interleaved, head_dim):
    """half-width rows ``[..., rotary_dim/2]`` -> rome's columns ``[..., head_dim]``."""
    w = t.repeat_interleave(2, dim=-1) if interleaved else torch.cat([t, t], dim=-1)
    return w, head_dim - w.shape[-1]


def full_tables(cos_rows, sin_rows, interleaved, head_dim):
    c, rest = widen(cos_rows, interleaved, head_dim)
    s, _ = widen(sin_rows, interleaved, head_dim)
    pad = torch.ones(*c.shape[:-1], rest, dtype=c.dtype, device=c.device)
    return torch.cat([c, pad], -1), torch.cat([s, 0 * pad], -1)


def partial_matrix(rotary_dim, head_dim, interleaved, dtype=torch.float32):
    rot = rome.rotation_matrix(rotary_dim, "interleave" if interleaved else "half", dtype=dtype, device=DEVICE)
    return torch.block_diag(rot, torch.zeros(head_dim - rotary_dim, head_dim - rotary_dim, dtype=dtype, device=DEVICE))


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def tables(rows, rotary_dim, dtype=torch.float32):
    """Half-width cos/sin ``[rows, rotary_dim/2]`` of a RoPE (any values would do)."""
    angle = torch.arange(rows, dtype=F64)[:, None] * 10000.0 ** (-torch.arange(rotary_dim // 2, dtype=F64) / (rotary_dim // 2))
    return angle.cos().to(DEVICE, dtype), angle.sin().to(DEVICE, dtype)


def assert_bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


# tolerances of the libraries' own precision against rome (rounded once from float64):
# flash-attn's kernel computes in float32 and rounds once: float32 x within 2 fp32 rounding
# errors of |x*cos| + |rot(x)*sin| (< 8 here) -> atol 1e-6; bf16/fp16 x: at most one ulp of x's
# dtype (the float32 error moves the result across a rounding boundary at most once).
FA_TOL = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.bfloat16: dict(rtol=2**-7, atol=1e-5),
          torch.float16: dict(rtol=2**-10, atol=1e-6)}


# --- flash-attn ---------------------------------------------------------------------------


CASES = [  # interleaved, rotary_dim (head_dim 16), seqlen_offsets
    (False, 16, 0), (True, 16, 0), (False, 8, 3), (True, 8, 3), (False, 16, "tensor"), (True, 12, "tensor"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved,rotary_dim,offsets", CASES)
def test_flash_attn_formula_and_rome_apply(interleaved, rotary_dim, offsets, dtype):
    b, s, h, d = 2, 5, 3, 16
    x = rand(b, s, h, d, dtype=dtype)
    cos, sin = tables(12, rotary_dim, dtype)
    if offsets == "tensor":
        offsets = torch.tensor([4, 1], dtype=torch.int32, device=DEVICE)
    x0, cos0, sin0 = x.clone(), cos.clone(), sin.clone()
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets, backend="torch")
    # the formula in float64, rounded once: bitwise
    assert_bitwise(out, fa_reference(x, cos, sin, interleaved, offsets))
    # at flash-attn's own precision (float32 arithmetic): within FA_TOL
    torch.testing.assert_close(out, fa_reference(x, cos, sin, interleaved, offsets, compute=torch.float32), **FA_TOL[dtype])
    # rome.apply on per-column tables and the matrix built here: bitwise
    rows = fa_rows(x, offsets, None).to(DEVICE)
    c, sn = full_tables(cos[rows], sin[rows], interleaved, d)
    m = partial_matrix(rotary_dim, d, interleaved, dtype)
    assert_bitwise(out, rome.apply(x, c[:, :, None], sn[:, :, None], m, backend="torch"))
    # inputs untouched, output its own memory
    assert_bitwise(x, x0)
    assert_bitwise(cos, cos0)
    assert_bitwise(sin, sin0)
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


@pytest.mark.parametrize("interleaved,rotary_dim", [(False, 16), (True, 8)])
def test_flash_attn_varlen(interleaved, rotary_dim):
    cu = torch.tensor([0, 3, 3, 7, 12], dtype=torch.int32, device=DEVICE)  # an empty sequence too
    x = rand(12, 2, 16, dtype=torch.bfloat16)
    cos, sin = tables(10, rotary_dim)
    for offsets in (0, 2, torch.tensor([0, 5, 1, 3], device=DEVICE)):
        out = apply_rotary_emb(x, cos, sin, interleaved, False, offsets, cu, 5, backend="torch")
        assert_bitwise(out, fa_reference(x, cos, sin, interleaved, offsets, cu))
        torch.testing.assert_close(out, fa_reference(x, cos, sin, interleaved, offsets, cu, torch.float32),
                                   **FA_TOL[torch.bfloat16])
    # max_seqlen may be left out (flash-attn requires it; rome does not need it)
    assert_bitwise(apply_rotary_emb(x, cos, sin, interleaved, cu_seqlens=cu, backend="torch"),
                   fa_reference(x, cos, sin, interleaved, 0, cu))


@pytest.mark.parametrize("interleaved,rotary_dim", [(False, 8), (True, 16)])
def test_flash_attn_inplace(interleaved, rotary_dim):
    x = rand(2, 4, 3, 16)
    cos, sin = tables(9, rotary_dim)
    off = torch.tensor([2, 5], device=DEVICE)
    expected = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=off, backend="torch")
    ptr = x.data_ptr()
    out = apply_rotary_emb(x, cos, sin, interleaved, True, off, backend="torch")
    assert out is x and x.data_ptr() == ptr  # the input itself, written in place
    assert_bitwise(x, expected)
    # a view of a bigger buffer (q of packed qkv): only that view is written
    qkv = rand(2, 4, 3, 3, 16)
    rest = qkv[:, :, 1:].clone()
    q = qkv[:, :, 0]
    want = apply_rotary_emb(q, cos, sin, interleaved, seqlen_offsets=off, backend="torch")
    apply_rotary_emb(q, cos, sin, interleaved, True, off, backend="torch")
    assert_bitwise(qkv[:, :, 0], want)
    assert_bitwise(qkv[:, :, 1:], rest)


@pytest.mark.parametrize("interleaved,rotary_dim", [(False, 8), (True, 16)])
def test_flash_attn_gradients(interleaved, rotary_dim):
    """Functional: the grads of x, cos and sin are the float64 formula's (autograd of the
    formula, float64 inputs on the torch backend). In place (x a non-leaf, as flash-attn):
    x's grad bitwise the functional one."""
    x = rand(2, 4, 3, 16, dtype=F64).requires_grad_()
    cos, sin = (t.requires_grad_() for t in tables(9, rotary_dim, F64))
    w = rand(2, 4, 3, 16, dtype=F64)
    off = torch.tensor([3, 0], device=DEVICE)
    out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=off, backend="torch")
    got = torch.autograd.grad((out * w).sum(), (x, cos, sin))
    ref = fa_reference(x, cos, sin, interleaved, off)
    want = torch.autograd.grad((ref * w).sum(), (x, cos, sin))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12)  # sums in another order

    for backend in ("torch", "triton"):
        x32 = rand(1, 3, 2, 16).requires_grad_()
        c32, s32 = tables(9, rotary_dim)
        w32 = rand(1, 3, 2, 16)
        functional = apply_rotary_emb(x32, c32, s32, interleaved, seqlen_offsets=2, backend=backend)
        (g_functional,) = torch.autograd.grad((functional * w32).sum(), x32)
        y = x32 * 1  # a non-leaf: autograd allows writing it in place
        out = apply_rotary_emb(y, c32, s32, interleaved, True, 2, backend=backend)
        assert out is y
        assert_bitwise(out.detach(), functional.detach())
        (g_inplace,) = torch.autograd.grad((out * w32).sum(), x32)
        assert_bitwise(g_inplace, g_functional)


def test_flash_attn_triton_kernel():
    """A few tiny cases on the Triton kernel: bitwise rome.apply on the kernel, and within
    FA_TOL of the float64 formula (varlen in place: within 1 ulp of it)."""
    cos, sin = tables(8, 12)
    for interleaved, dtype in ((False, torch.float32), (True, torch.bfloat16)):
        x = rand(1, 3, 2, 16, dtype=dtype)
        off = torch.tensor([4], device=DEVICE)
        out = apply_rotary_emb(x, cos, sin, interleaved, seqlen_offsets=off, backend="triton")
        rows = fa_rows(x, off, None).to(DEVICE)
        c, s = full_tables(cos[rows], sin[rows], interleaved, 16)
        assert_bitwise(out, rome.apply(x, c[:, :, None], s[:, :, None], partial_matrix(12, 16, interleaved, dtype),
                                       backend="triton"))
        torch.testing.assert_close(out, fa_reference(x, cos, sin, interleaved, off), **FA_TOL[dtype])
    x = rand(5, 2, 16)
    cu = torch.tensor([0, 2, 5], device=DEVICE)
    expected = apply_rotary_emb(x.double(), cos.double(), sin.double(), cu_seqlens=cu, max_seqlen=3, backend="torch")
    out = apply_rotary_emb(x, cos, sin, inplace=True, cu_seqlens=cu, backend="triton")
    assert ulp_error(out, expected, torch.float32).max() <= 1  # the kernel's fp32 sum: faithful


@pytest.mark.parametrize("kwargs,args,match", [
    ({}, dict(x=(2, 3, 16)), r"x must be \[batch, seqlen, nheads, headdim\].*got shape \[2, 3, 16\]"),
    ({"cu_seqlens": torch.tensor([0, 2])}, dict(), r"x must be \[total_seqlen, nheads, headdim\] with cu_seqlens, got shape \[1, 2, 2, 16\]"),
    ({}, dict(cos=(8, 10)), r"rotary_dim = 2 \* cos.shape\[1\] = 20 must be <= headdim = 16"),
    ({}, dict(sin=(8, 3)), r"cos and sin must both be \[seqlen_ro, rotary_dim / 2\].*cos \[8, 4\] and sin \[8, 3\]"),
    ({}, dict(cos=(8,), sin=(8,)), r"cos and sin must both be"),
    ({"seqlen_offsets": 7}, dict(), r"rows of cos/sin \[0, seqlen_ro=8\).*got max 8"),
    ({"seqlen_offsets": -1}, dict(), r"rows of cos/sin.*>= 0, got min -1"),
    ({"seqlen_offsets": torch.tensor([0, 1])}, dict(), r"seqlen_offsets must be an int or a tensor \[batch\] = \[1\], got shape \[2\]"),
    ({"cu_seqlens": torch.tensor([0, 1, 3]), "max_seqlen": 1}, dict(x=(3, 2, 16)), r"max_seqlen=1 is shorter than the longest sequence in cu_seqlens \(2 tokens\)"),
    ({"cu_seqlens": torch.tensor([0, 1, 2])}, dict(x=(3, 2, 16)), r"cu_seqlens must end at the number of packed tokens T = 3"),
    ({"max_seqlen": 4}, dict(), r"max_seqlen=4 is given without cu_seqlens"),
])
def test_flash_attn_errors(kwargs, args, match):
    x = rand(*args.get("x", (1, 2, 2, 16)))
    cos, sin = rand(*args.get("cos", (8, 4))), rand(*args.get("sin", args.get("cos", (8, 4))))
    with pytest.raises(ValueError, match=match):
        apply_rotary_emb(x, cos, sin, backend="torch", **kwargs)


def test_flash_attn_type_errors():
    x, (cos, sin) = rand(1, 2, 2, 16), tables(8, 16)
    for kwargs, match in (({"seqlen_offsets": 1.5}, "seqlen_offsets must be an int"),
                          ({"seqlen_offsets": torch.tensor([1.0])}, "seqlen_offsets must be an int or an int32/int64 tensor, got torch.float32"),
                          ({"interleaved": "yes"}, "interleaved must be a bool"),
                          ({"inplace": 1}, "inplace must be a bool")):
        with pytest.raises(TypeError, match=match):
            apply_rotary_emb(x, cos, sin, **kwargs)
    with pytest.raises(TypeError, match="cos must be a torch.Tensor, got list"):
        apply_rotary_emb(x, [1.0], sin)


# --- vLLM ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("neox,rotary_dim", [(True, 16), (False, 16), (True, 8), (False, 12)])
def test_vllm_formula_and_rome_apply_qk(neox, rotary_dim, dtype):
    t, nq, nkv, hs = 6, 4, 2, 16
    rope = RotaryEmbedding(hs, rotary_dim, 32, 10000.0, neox, dtype)
    positions = torch.tensor([0, 3, 31, 7, 7, 12], device=DEVICE)
    q, k = rand(t, nq * hs, dtype=dtype), rand(t, nkv * hs, dtype=dtype)
    q0, k0 = q.clone(), k.clone()
    got_q, got_k = rope(positions, q, k)  # backend "auto": the kernel on a GPU
    cache = rope.cos_sin_cache
    assert_formula(got_q, vllm_exact(positions, q, cache, hs, neox), q, cache)
    assert_formula(got_k, vllm_exact(positions, k, cache, hs, neox), k, cache)
    assert_bitwise(q, q0)
    assert_bitwise(k, k0)  # not modified
    # rome.apply_qk (the same backend) on per-column tables and the matrix built here: bitwise
    half = rotary_dim // 2
    c, s = full_tables(rope.cos_sin_cache[positions, :half], rope.cos_sin_cache[positions, half:], not neox, hs)
    m = partial_matrix(rotary_dim, hs, not neox, dtype)
    want_q, want_k = rome.apply_qk(q.view(t, nq, hs), k.view(t, nkv, hs), c[:, None], s[:, None], m)
    assert_bitwise(got_q, want_q.reshape(t, -1))
    assert_bitwise(got_k, want_k.reshape(t, -1))
    # vLLM's native arithmetic (each product and sum rounded to x's dtype, unit roundoff u):
    # |rome - native| <= 2u (|x|*|cos| + |x @ M|*|sin| + |out|), per element
    u = {torch.float32: 2**-24, torch.bfloat16: 2**-8, torch.float16: 2**-11}[dtype]
    nat_q, nat_k = vllm_reference(positions, q, k, rope.cos_sin_cache, hs, neox)
    c64, s64, m64 = c.double()[:, None], s.double()[:, None], m.double()
    for got, nat, x in ((got_q, nat_q, q), (got_k, nat_k, k)):
        x3 = x.double().view(t, -1, hs)
        mag = (x3.abs() * c64.abs() + (x3 @ m64).abs() * s64.abs()).reshape(x.shape)
        assert ((got.double() - nat.double()).abs() <= 2 * u * (mag + got.double().abs())).all()


def test_vllm_cache_matches_vllm_formula():
    """The module's cos_sin_cache is vLLM's (cos ‖ sin of positions x inv_freq), from float64
    angles: within float32 rounding of the float64 values vLLM's formula means, closer than
    vLLM's own float32-angle cache (whose angles round at ~|angle| * 2**-24)."""
    rd, p = 8, 64
    rope = RotaryEmbedding(16, rd, p, 500.0, True)
    inv = 1.0 / (500.0 ** (torch.arange(0, rd, 2, dtype=F64) / rd))  # vLLM's _compute_inv_freq, float64
    freqs = torch.einsum("i,j -> ij", torch.arange(p, dtype=F64), inv)
    exact = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    assert rope.cos_sin_cache.shape == (p, rd) and rope.cos_sin_cache.dtype == torch.float32
    assert (rope.cos_sin_cache.double().cpu() - exact).abs().max() <= 2**-24
    inv32 = 1.0 / (500.0 ** (torch.arange(0, rd, 2, dtype=torch.float) / rd))  # vLLM's own, float32
    f32 = torch.einsum("i,j -> ij", torch.arange(p, dtype=torch.float), inv32)
    vllm_cache = torch.cat((f32.cos(), f32.sin()), dim=-1)
    torch.testing.assert_close(rope.cos_sin_cache.cpu(), vllm_cache, rtol=0, atol=64 * 2**-24)


def test_vllm_key_none_offsets_shapes_inplace():
    hs, rd = 16, 8
    rope = RotaryEmbedding(hs, rd, 20, 10000.0, False)
    cache = rope.cos_sin_cache
    pos = torch.tensor([[0, 1, 2], [5, 6, 7]], device=DEVICE)  # [B, S] positions (older vLLM)
    q = rand(2, 3, 2 * hs)  # [B, S, N*D]
    k = rand(2, 3, 1, hs)   # [B, S, N, D]
    got_q, none = rope(pos, q)  # key None -> (q, None) (cross-layer KV sharing); backend "auto"
    assert none is None and got_q.shape == q.shape
    assert_formula(got_q, vllm_exact(pos, q, cache, hs, False), q, cache)
    off = torch.tensor([[3, 3, 3], [1, 1, 1]], device=DEVICE)
    got_q, got_k = rope(pos, q, k, off)
    assert_formula(got_q, vllm_exact(pos + off, q, cache, hs, False), q, cache)
    assert_formula(got_k, vllm_exact(pos + off, k, cache, hs, False), k, cache)
    ref_q, ref_k = vllm_reference(pos + off, q, k, cache, hs, False, F64)
    # in place (vLLM's CUDA op, flashinfer's apply_rope_with_cos_sin_cache_inplace): the inputs
    qi, ki = q.clone(), k.clone()
    out_q, out_k = rotary_embedding(pos, qi, ki, head_size=hs, cos_sin_cache=cache, is_neox_style=False,
                                    offsets=off, inplace=True, backend="torch")
    assert out_q is qi and out_k is ki
    assert_bitwise(qi, ref_q)
    assert_bitwise(ki, ref_k)
    qi = q.clone()
    assert rotary_embedding(pos, qi, None, head_size=hs, cos_sin_cache=cache, is_neox_style=False,
                            inplace=True)[1] is None
    assert_formula(qi, vllm_exact(pos, q, cache, hs, False), q, cache)
    # q and k as views of one packed qkv buffer [T, (Nq + 2 Nkv) * D] (vLLM's qkv.split)
    qkv = rand(4, 4 * hs)
    qv, kv, _ = qkv.split([2 * hs, hs, hs], dim=-1)
    p4 = torch.arange(4, device=DEVICE)
    got_q, got_k = rope(p4, qv, kv)
    assert_formula(got_q, vllm_exact(p4, qv, cache, hs, False), qv, cache)
    assert_formula(got_k, vllm_exact(p4, kv, cache, hs, False), kv, cache)


def test_vllm_gradients_and_triton():
    hs = 16
    cache = torch.cat(tables(10, 12, F64), -1).requires_grad_()
    pos = torch.tensor([1, 9, 4], device=DEVICE)
    q, k = rand(3, 2 * hs, dtype=F64).requires_grad_(), rand(3, hs, dtype=F64).requires_grad_()
    wq, wk = rand(3, 2 * hs, dtype=F64), rand(3, hs, dtype=F64)
    got = rotary_embedding(pos, q, k, head_size=hs, cos_sin_cache=cache, backend="torch")
    ref = vllm_reference(pos, q, k, cache, hs, True, F64)
    g = torch.autograd.grad((got[0] * wq).sum() + (got[1] * wk).sum(), (q, k, cache))
    r = torch.autograd.grad((ref[0] * wq).sum() + (ref[1] * wk).sum(), (q, k, cache))
    for a, b in zip(g, r):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the Triton kernel, bitwise the torch backend's rome.apply_qk tables (tiny)
    c32 = cache.detach().float()
    q32, k32 = rand(3, 2 * hs), rand(3, hs)
    for neox in (True, False):
        got_t = rotary_embedding(pos, q32, k32, head_size=hs, cos_sin_cache=c32, is_neox_style=neox, backend="triton")
        c, s = full_tables(c32[pos, :6], c32[pos, 6:], not neox, hs)
        want = rome.apply_qk(q32.view(3, 2, hs), k32.view(3, 1, hs), c[:, None], s[:, None],
                             partial_matrix(12, hs, not neox), backend="triton")
        assert_bitwise(got_t[0], want[0].reshape(3, -1))
        assert_bitwise(got_t[1], want[1].reshape(3, -1))
        torch.testing.assert_close(got_t[0], vllm_reference(pos, q32, None, c32, hs, neox, F64)[0],
                                   **FA_TOL[torch.float32])


@pytest.mark.parametrize("call,match", [
    (lambda p, q, k, c: rotary_embedding(p, q, k, head_size=16, cos_sin_cache=c[:, :7]),
     r"cos_sin_cache must be \[max_positions, rotary_dim\].*got shape \[10, 7\]"),
    (lambda p, q, k, c: rotary_embedding(p, q, k, head_size=16, cos_sin_cache=c, rotary_dim=8),
     r"rotary_dim=8 must equal cos_sin_cache.shape\[-1\] = 12"),
    (lambda p, q, k, c: rotary_embedding(p, q, k, head_size=8, cos_sin_cache=c),
     r"rotary_dim = cos_sin_cache.shape\[-1\] = 12 must be <= head_size = 8"),
    (lambda p, q, k, c: rotary_embedding(p[:2], q, k, head_size=16, cos_sin_cache=c),
     r"query must be \[T, N \* head_size\].*shape \[2\]\) with head_size = 16, got shape \[3, 32\]"),
    (lambda p, q, k, c: rotary_embedding(p, q, k[:, :10], head_size=16, cos_sin_cache=c),
     r"key must be \[T, N \* head_size\].*got shape \[3, 10\]"),
    (lambda p, q, k, c: rotary_embedding(p + 8, q, k, head_size=16, cos_sin_cache=c),
     r"positions must lie in the rows of cos_sin_cache \[0, max_positions=10\).*got max 12"),
    (lambda p, q, k, c: rotary_embedding(p, q, k, head_size=16, cos_sin_cache=c, offsets=p[:2]),
     r"offsets must have positions' shape \[3\], got \[2\]"),
    (lambda p, q, k, c: rotary_embedding(p, q, k, head_size=16, cos_sin_cache=c, offsets=p - 5),
     r"positions \+ offsets must lie in the rows.*>= 0, got min -5"),
])
def test_vllm_errors(call, match):
    p = torch.tensor([0, 2, 4], device=DEVICE)
    q, k, c = rand(3, 32), rand(3, 16), torch.cat(tables(10, 12), -1)
    with pytest.raises(ValueError, match=match):
        call(p, q, k, c)
    with pytest.raises(TypeError, match="positions must be an int32/int64 tensor, got torch.float32"):
        rotary_embedding(p.float(), q, k, head_size=16, cos_sin_cache=c)
    with pytest.raises(TypeError, match="is_neox_style must be a bool"):
        rotary_embedding(p, q, k, head_size=16, cos_sin_cache=c, is_neox_style=None)


# --- mode= ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_mode_shortcut_is_the_matrix(backend):
    q, k = rand(1, 2, 3, 16), rand(1, 1, 3, 16)
    cos, sin = rome.rope_cos_sin(torch.arange(3), (16,), mode="half", device=DEVICE)
    for mode in rome.MODES:
        m = rome.rotation_matrix(16, mode, device=DEVICE)
        assert_bitwise(rome.apply(q, cos, sin, mode=mode, backend=backend), rome.apply(q, cos, sin, m, backend=backend))
        for a, b in zip(rome.apply_qk(q, k, cos, sin, mode=mode, backend=backend),
                        rome.apply_qk(q, k, cos, sin, m, backend=backend)):
            assert_bitwise(a, b)


def test_mode_shortcut_gradients_and_inference_mode():
    """The cached matrix is built outside inference mode: a first call under inference_mode
    does not break a later training call (an inference tensor cannot be saved for backward)."""
    rome.matrices._KEPT.clear()
    rome.torch_backend._Work._kept.__dict__.clear()  # the kept CPU scratch too: not by test order
    cos, sin = rome.rope_cos_sin(torch.arange(4), (8,), mode="interleave", device=DEVICE)
    x = rand(4, 8)
    with torch.inference_mode():
        rome.apply(x, cos, sin, mode="interleave", backend="torch")
    xg = x.clone().requires_grad_()
    xm = x.clone().requires_grad_()
    g1 = torch.autograd.grad(rome.apply(xg, cos, sin, mode="interleave", backend="torch").sum(), xg)
    m = rome.rotation_matrix(8, "interleave", device=DEVICE)
    g2 = torch.autograd.grad(rome.apply(xm, cos, sin, m, backend="torch").sum(), xm)
    assert_bitwise(g1[0], g2[0])


def test_mode_shortcut_errors():
    x = rand(2, 8)
    cos, sin = rome.rope_cos_sin(torch.arange(2), (8,), mode="half", device=DEVICE)
    m = rome.rotation_matrix(8, "half", device=DEVICE)
    with pytest.raises(ValueError, match=r"pass matrix \(a \[D, D\] tensor\) or mode \('half' or 'interleave'\), got neither"):
        rome.apply(x, cos, sin)
    with pytest.raises(ValueError, match="pass matrix or mode, not both"):
        rome.apply_qk(x, x, cos, sin, m, mode="half")
    with pytest.raises(ValueError, match=r"mode must be one of \('interleave', 'half'\), got 'neox'"):
        rome.apply(x, cos, sin, mode="neox")
    with pytest.raises(ValueError, match=r"x's head_dim \(its last dim\) for mode='half' must be a positive even integer, got 7"):
        rome.apply(rand(2, 7), cos[:, :7], sin[:, :7], mode="half")
    with pytest.raises(TypeError, match="q must be a torch.Tensor, got list"):
        rome.apply_qk([1.0], x, cos, sin, mode="half")


def test_compile_fullgraph():
    """The adapters and mode= trace into one graph under Dynamo (matrices built as constants,
    the position check skipped while tracing) and give the eager bits (backend "eager": the
    trace is what is checked; inductor's CPU codegen would take ~25 s here)."""
    torch._dynamo.reset()
    cos, sin = tables(8, 8)
    x = rand(1, 3, 2, 16)
    fa = torch.compile(lambda x, c, s: apply_rotary_emb(x, c, s, True, seqlen_offsets=2, backend="torch"), fullgraph=True, backend="eager")
    assert_bitwise(fa(x, cos, sin), apply_rotary_emb(x, cos, sin, True, seqlen_offsets=2, backend="torch"))
    rope = RotaryEmbedding(16, 8, 32, 10000.0, True).to(DEVICE)
    pos, q, k = torch.tensor([0, 5, 9], device=DEVICE), rand(3, 32), rand(3, 16)
    for got, want in zip(torch.compile(rope, fullgraph=True, backend="eager")(pos, q, k), rope(pos, q, k)):
        assert_bitwise(got, want)
    c, s = rome.rope_cos_sin(torch.arange(3), (16,), mode="half", device=DEVICE)
    shortcut = torch.compile(lambda x, c, s: rome.apply(x, c, s, mode="interleave", backend="torch"), fullgraph=True, backend="eager")
    assert_bitwise(shortcut(x, c[:, None], s[:, None]), rome.apply(x, c[:, None], s[:, None], mode="interleave", backend="torch"))


def test_vllm_rotary_embedding_checks_its_arguments():
    """``RotaryEmbedding`` refuses a non-float cache dtype and a non-bool ``inplace`` when built
    (not at the first forward, naming "cos"); mixed query/key dtypes are named as such."""
    with pytest.raises(TypeError, match=r"^dtype \(the cos_sin_cache's\) must be a floating torch.dtype, got torch.int32$"):
        RotaryEmbedding(8, 8, 16, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"^dtype \(the cos_sin_cache's\) must be a floating torch.dtype, got 'float32'$"):
        RotaryEmbedding(8, 8, 16, dtype="float32")
    with pytest.raises(TypeError, match=r"^inplace must be a bool, got 1$"):
        RotaryEmbedding(8, 8, 16, inplace=1)
    rope = RotaryEmbedding(8, 8, 16, backend="torch")
    with pytest.raises(TypeError, match=r"^query and key must have one dtype, got torch.float32 and torch.float16$"):
        rope(torch.arange(4, device=DEVICE), rand(4, 16), rand(4, 8).half())
