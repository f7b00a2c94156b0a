"""Issue 31 items 1 and 3: the adapters take their library's call exactly (names, positional
order, defaults, shapes, in-place and autograd semantics) — flash-attn (in place on a leaf that
requires grad, ``apply_rotary_emb_qkv_``, ``apply_rotary_emb_kv_``), flashinfer (new module),
Liger (new module: 2-D tables, odd head dims), vLLM (``get_rope`` and its scaling classes,
mRoPE) — and each of the issue's reproducers (items 1, 3 and 4 of its "Why") is a test here.

None of those libraries is installed: the references are written here in plain torch from the
libraries' documented behaviour (their docstrings and formulas), evaluated in float64, and the
adapters are compared with them at the stated tolerances. The torch backend computes in float64
from the tables' values and rounds once, so against a float64 formula rounded once to x's dtype
it is compared bitwise where the tables are given (flash-attn, vLLM caches, Liger); where rome
builds the tables (flashinfer's on-the-fly forms, the vLLM caches themselves) the bound is the
float32 rounding of the tables (stated per test). Calls left on ``backend="auto"`` run the kernel
on a GPU, which is held to rome's stated tolerance of the float64 formula there
(``conftest.assert_formula``; bit for bit on a CPU, where "auto" is the torch backend).
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from conftest import DEVICE, assert_formula
from rome.integrations import flash_attn as fa
from rome.integrations import flashinfer as fi
from rome.integrations import liger, vllm

F64 = torch.float64


def rand(*shape, dtype=torch.float32, requires_grad=False):
    t = torch.randn(*shape, device=DEVICE).to(dtype)
    return t.requires_grad_() if requires_grad else t


def bitwise(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


# --- references (plain torch, float64), from the libraries' documented formulas -------------


def rotate_pairs(r, c, s, interleaved):
    """``r`` ``[..., rd]`` rotated with per-pair ``c``, ``s`` ``[..., rd/2]`` (broadcast):
    NeoX halves (k, k + rd/2) or GPT-J pairs (2k, 2k + 1)."""
    half = r.shape[-1] // 2
    x1, x2 = (r[..., 0::2], r[..., 1::2]) if interleaved else (r[..., :half], r[..., half:])
    o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
    return torch.stack((o1, o2), -1).flatten(-2) if interleaved else torch.cat((o1, o2), -1)


def partial(x, c, s, interleaved):
    """The first ``2 * c.shape[-1]`` columns rotated, the rest passed through (float64)."""
    rd = 2 * c.shape[-1]
    x = x.to(F64)
    return torch.cat([rotate_pairs(x[..., :rd], c.to(F64), s.to(F64), interleaved), x[..., rd:]], -1)


def fa_rows(batch, seqlen, offsets):
    off = offsets if isinstance(offsets, torch.Tensor) else torch.full((batch,), offsets)
    return torch.arange(seqlen)[None, :] + off.long().cpu()[:, None]  # [B, S]


def fa_ref(x, cos, sin, interleaved=False, offsets=0):
    """flash-attn's ``apply_rotary_emb`` for x ``[B, S, H, D]``: token s of sequence b reads row
    ``s + seqlen_offsets[b]`` of cos/sin ``[S_ro, rd/2]``. float64."""
    rows = fa_rows(x.shape[0], x.shape[1], offsets).to(cos.device)
    return partial(x, cos[rows][:, :, None], sin[rows][:, :, None], interleaved)


# --- flash-attn: in place on a leaf that requires grad ----------------------------------------


def test_issue31_item1_reproducer():
    """The issue's reproducer: flash-attn rotates a leaf that requires grad in place (its test
    then reads x.grad); rome raised "a leaf Variable that requires grad has been used in an
    in-place operation"."""
    x = torch.randn(2, 5, 3, 16, requires_grad=True)
    cos, sin = torch.rand(10, 8), torch.rand(10, 8)
    x_ref = x.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb(x, cos, sin, inplace=True)
    assert x.is_leaf and out.data_ptr() == x.data_ptr()  # x's memory, x still a leaf
    want = fa_ref(x_ref, cos, sin)
    bitwise(out.detach(), want.detach().float())
    bitwise(x.detach(), want.detach().float())  # x itself rotated
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g.double())
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=2**-22)  # fp32: < 1 ulp at |grad| < 8


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offsets", ["zero", "int", "tensor"])
@pytest.mark.parametrize("interleaved,rotary_fraction", [(False, 1.0), (True, 1.0), (False, 0.5), (True, 0.5)])
def test_flash_attn_inplace_leaf_grad(interleaved, rotary_fraction, offsets, dtype):
    """flash-attn's ``test_rotary_emb_func`` with ``inplace=True``, against float64: the output
    (bitwise the float64 formula rounded once) and x.grad (the rotation by -angle of the
    incoming gradient, within one rounding of x's dtype)."""
    b, s, h, d = 2, 6, 3, 16
    rd = int(d * rotary_fraction)
    cos, sin = (torch.rand(2 * s, rd // 2, device=DEVICE).to(dtype) for _ in range(2))
    off = {"zero": 0, "int": 3, "tensor": torch.tensor([0, 5], dtype=torch.int32, device=DEVICE)}[offsets]
    x = rand(b, s, h, d, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb(x, cos, sin, interleaved, True, off, backend="torch")
    want = fa_ref(x_ref, cos, sin, interleaved, off)
    bitwise(out.detach(), want.detach().to(dtype))
    g = torch.randn_like(out)
    g_copy = g.clone()
    out.backward(g)
    want.backward(g.to(F64))
    assert torch.equal(g, g_copy)  # the incoming gradient is not written (flash-attn may write it)
    u = {torch.float32: 2**-24, torch.bfloat16: 2**-8}[dtype]
    ref = x_ref.grad
    assert ((x.grad.double() - ref).abs() <= u * ref.abs() + 1e-30).all()


def test_flash_attn_inplace_varlen_leaf():
    """``test_rotary_emb_varlen_func`` with inplace: packed x ``[T, H, D]`` leaf, cu_seqlens."""
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    cos, sin = torch.rand(12, 4, device=DEVICE), torch.rand(12, 4, device=DEVICE)
    x = rand(7, 2, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb(x, cos, sin, inplace=True, seqlen_offsets=torch.tensor([2, 0], device=DEVICE),
                              cu_seqlens=cu, max_seqlen=4, backend="torch")
    rows = torch.tensor([2, 3, 4, 0, 1, 2, 3], device=DEVICE)
    want = partial(x_ref, cos[rows][:, None], sin[rows][:, None], False)
    bitwise(out.detach(), want.detach().float())
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g.double())
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=2**-23, atol=0)  # both one rounding of float64


def test_flash_attn_inplace_non_leaf_and_no_grad():
    """A non-leaf x is x itself afterwards, its history rebased (the gradient reaches the
    leaf above it); without grad the result is x."""
    cos, sin = torch.rand(8, 4, device=DEVICE), torch.rand(8, 4, device=DEVICE)
    a = rand(1, 4, 2, 8, requires_grad=True)
    x = a * 2
    out = fa.apply_rotary_emb(x, cos, sin, inplace=True, backend="torch")
    assert out is x
    g = torch.randn_like(out)
    out.backward(g)
    a_ref = a.detach().clone().requires_grad_()
    fa_ref(a_ref * 2, cos, sin).backward(g.double())
    torch.testing.assert_close(a.grad, a_ref.grad, rtol=2**-23, atol=0)
    y = rand(1, 4, 2, 8)
    assert fa.apply_rotary_emb(y, cos, sin, inplace=True) is y
    assert fa.apply_rotary_emb_func is fa.apply_rotary_emb


def _qkv_case(gqa, dtype=torch.float32):
    b, s, h, d = 2, 5, 4, 16
    if gqa:
        return rand(b, s, h + 2 * 2, d, dtype=dtype, requires_grad=True), h, 2
    return rand(b, s, 3, h, d, dtype=dtype, requires_grad=True), None, h


def _bits_then_grads(out, written, want, leaf, ref_leaf):
    """An in-place rotation: ``out`` and the tensor it wrote bitwise ``want`` (float64, rounded
    once), then the gradient through ``out`` reaches ``leaf`` as ``want``'s reaches ``ref_leaf``."""
    bitwise(out.detach(), want.detach().float())
    bitwise(written.detach(), want.detach().float())
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g.double())
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=2**-23, atol=0)


@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("separate_k", [False, True])
@pytest.mark.parametrize("interleaved,rotary_dim", [(False, 16), (True, 8)])
def test_flash_attn_qkv_inplace(gqa, separate_k, interleaved, rotary_dim):
    """flash-attn's ``apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None,
    interleaved=False, seqlen_offsets=0, num_heads_q=None)``: q and k rotated in place (k with
    cos_k/sin_k when given), v untouched; the leaf qkv gets the gradient through the result."""
    qkv, nq, nk = _qkv_case(gqa)
    cos, sin = torch.rand(10, rotary_dim // 2, device=DEVICE), torch.rand(10, rotary_dim // 2, device=DEVICE)
    cos_k = torch.rand(10, rotary_dim // 2, device=DEVICE) if separate_k else None
    off = torch.tensor([1, 4], device=DEVICE)
    ref_in = qkv.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, None, interleaved, off, nq, backend="torch")
    assert qkv.is_leaf and out.data_ptr() == qkv.data_ptr() and out.shape == qkv.shape
    if gqa:
        q, k, v = ref_in.split([nq, nk, nk], dim=2)
    else:
        q, k, v = ref_in.unbind(2)
    rq = fa_ref(q, cos, sin, interleaved, off)
    rk = fa_ref(k, cos if cos_k is None else cos_k, sin, interleaved, off)
    want = torch.cat([rq, rk, v.double()], 2) if gqa else torch.stack([rq, rk, v.double()], 2)
    _bits_then_grads(out, qkv, want, qkv, ref_in)


def test_flash_attn_kv_inplace_and_compile():
    """``apply_rotary_emb_kv_(kv, cos, sin, interleaved=False, seqlen_offsets=0)``: k =
    kv[:, :, 0] rotated in place, v untouched, gradient to the leaf; and qkv_ under
    torch.compile (flash-attn's ``compiled`` case; backend "eager": the trace is checked)."""
    kv = rand(2, 5, 2, 3, 16, requires_grad=True)
    cos, sin = torch.rand(9, 8, device=DEVICE), torch.rand(9, 8, device=DEVICE)
    ref_in = kv.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb_kv_(kv, cos, sin, seqlen_offsets=4)  # backend "auto"
    want = torch.stack([fa_ref(ref_in[:, :, 0], cos, sin, False, 4), ref_in[:, :, 1].double()], 2)
    assert_formula(out, want, kv, cos, sin)
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g.double())
    torch.testing.assert_close(kv.grad, ref_in.grad, rtol=2**-23, atol=0)
    torch._dynamo.reset()
    qkv, _, _ = _qkv_case(False)
    expected = fa.apply_rotary_emb_qkv_(qkv.detach().clone(), cos, sin, seqlen_offsets=2)
    got = torch.compile(fa.apply_rotary_emb_qkv_, backend="eager")(qkv, cos, sin, seqlen_offsets=2)
    bitwise(got.detach(), expected)
    got.sum().backward()
    assert qkv.grad is not None and qkv.grad.shape == qkv.shape


def test_flash_attn_signatures_and_errors():
    assert list(inspect.signature(fa.apply_rotary_emb_qkv_).parameters)[:8] == [
        "qkv", "cos", "sin", "cos_k", "sin_k", "interleaved", "seqlen_offsets", "num_heads_q"]
    assert list(inspect.signature(fa.apply_rotary_emb_kv_).parameters)[:5] == [
        "kv", "cos", "sin", "interleaved", "seqlen_offsets"]
    cos, sin = torch.rand(8, 4), torch.rand(8, 4)
    with pytest.raises(ValueError, match=r"num_heads_q is needed for qkv \[batch, seqlen, num_heads_q"):
        fa.apply_rotary_emb_qkv_(rand(1, 2, 6, 8), cos, sin)
    with pytest.raises(ValueError, match=r"has 7 heads, not num_heads_q=4 plus twice"):
        fa.apply_rotary_emb_qkv_(rand(1, 2, 7, 8), cos, sin, num_heads_q=4)
    with pytest.raises(ValueError, match=r"qkv must be \[batch, seqlen, 3, nheads, headdim\]"):
        fa.apply_rotary_emb_qkv_(rand(1, 2, 2, 2, 8), cos, sin)
    with pytest.raises(ValueError, match=r"kv must be \[batch, seqlen, 2, nheads, headdim\], got shape \[1, 2, 3, 2, 8\]"):
        fa.apply_rotary_emb_kv_(rand(1, 2, 3, 2, 8), cos, sin)
    with pytest.raises(ValueError, match=r"cos_k and sin must both be \[seqlen_ro, rotary_dim / 2\]"):
        fa.apply_rotary_emb_qkv_(rand(1, 2, 3, 2, 8), cos, sin, cos_k=torch.rand(8, 3))
    with pytest.raises(TypeError, match="qkv must be a torch.Tensor, got list"):
        fa.apply_rotary_emb_qkv_([1.0], cos, sin)
    with pytest.raises(TypeError, match="interleaved must be a bool, got 1"):
        fa.apply_rotary_emb_kv_(rand(1, 2, 2, 2, 8), cos, sin, 1)


# --- flashinfer -----------------------------------------------------------------------------


def vllm_cache_ref(positions, x, cache, head_size, neox):
    """vLLM/flashinfer's cos_sin_cache convention for x ``[T, N * head_size]``. float64."""
    c, s = cache[positions].to(F64).chunk(2, dim=-1)
    t = positions.numel()
    return partial(x.view(t, -1, head_size), c[:, None], s[:, None], not neox).reshape(x.shape)


def test_issue31_item3_reproducer():
    """flashinfer's call: ``apply_rope_with_cos_sin_cache(positions, query, key, head_size,
    cos_sin_cache, is_neox)`` positionally, ``is_neox=`` by name (rome took is_neox_style and
    keywords only: TypeError)."""
    positions = torch.tensor([0, 3, 7, 2], device=DEVICE)
    cache = torch.cat([torch.rand(16, 8), torch.rand(16, 8)], -1).to(DEVICE)
    query, key = rand(4, 4 * 32), rand(4, 2 * 32)
    for neox in (True, False):
        q1, k1 = fi.apply_rope_with_cos_sin_cache(positions, query, key, 32, cache, neox)
        q2, k2 = fi.apply_rope_with_cos_sin_cache(positions, query, key, 32, cache, is_neox=neox)
        bitwise(q1, q2)
        bitwise(k1, k2)
        assert_formula(q1, vllm_cache_ref(positions, query, cache, 32, neox), query, cache)  # backend "auto"
        assert_formula(k1, vllm_cache_ref(positions, key, cache, 32, neox), key, cache)
        qi, ki = query.clone(), key.clone()
        assert fi.apply_rope_with_cos_sin_cache_inplace(positions, qi, ki, 32, cache, is_neox=neox) is None
        bitwise(qi, q1)
        bitwise(ki, k1)
    q3, k3 = fi.apply_rope_with_cos_sin_cache(positions, query.view(4, 4, 32), key.view(4, 2, 32), 32, cache, False)
    bitwise(q3, q2.view(4, 4, 32))  # [nnz, H, D] as flashinfer views it (last loop: is_neox=False)
    with pytest.raises(ValueError, match=r"query must be \[nnz, num_heads \* head_size\].*nnz = positions.shape\[0\] = 4, got shape \[3, 128\]"):
        fi.apply_rope_with_cos_sin_cache(positions, query[:3], key, 32, cache)
    with pytest.raises(ValueError, match=r"cos_sin_cache should be float32 \(as flashinfer\), got torch.float16"):
        fi.apply_rope_with_cos_sin_cache(positions, query, key, 32, cache.half())


def fi_ref(x, pos, rotary_dim, interleave, rope_scale, rope_theta, llama=None):
    """flashinfer's on-the-fly RoPE (its docstrings; kernel: freq_i = rope_theta ** (-2i/rd) /
    rope_scale, Llama 3.1 smoothing between freq / rope_scale and freq clamped to [0, 1]) for
    ragged x ``[nnz, H, D]`` at positions ``[nnz]``. float64."""
    rd = rotary_dim or x.shape[-1]
    f = rope_theta ** (-2 * torch.arange(rd // 2, dtype=F64) / rd)
    if llama is None:
        f = f / rope_scale
    else:
        low, high, old = llama
        smooth = ((old * f / (2 * math.pi) - low) / (high - low)).clamp(0, 1)
        f = (1 - smooth) * f / rope_scale + smooth * f
    angle = pos.to("cpu", F64)[:, None] * f
    return partial(x, angle.cos().to(x.device)[:, None], angle.sin().to(x.device)[:, None], interleave)


# flashinfer's tables are float32 (rome: rounded once from float64): float32 q/k are within
# |x| * 2**-23 per product of the float64 formula; bf16 results within 1 bf16 ulp (2**-8 relative)
def _close(got, want, dtype):
    u = {torch.float32: 2**-21, torch.bfloat16: 2**-8}[dtype]
    assert ((got.double() - want).abs() <= u * (want.abs() + 1)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("interleave,rotary_dim", [(False, None), (True, None), (False, 8), (True, 12)])
def test_flashinfer_ragged_and_pos_ids(interleave, rotary_dim, dtype):
    """``apply_rope(q, k, indptr, offsets, rotary_dim, interleave, rope_scale, rope_theta)``
    positionally, its ``_inplace`` and ``_pos_ids`` forms, and the llama31 ones, on ragged
    ``[nnz, H, D]`` q/k (GQA)."""
    q, k = rand(7, 4, 16, dtype=dtype), rand(7, 2, 16, dtype=dtype)
    indptr = torch.tensor([0, 3, 3, 7], dtype=torch.int32, device=DEVICE)
    offsets = torch.tensor([5, 9, 1], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor([5, 6, 7, 1, 2, 3, 4], device=DEVICE)
    got = fi.apply_rope(q, k, indptr, offsets, rotary_dim, interleave, 2.0, 500.0)  # as the forms below: "auto"
    for g, x in zip(got, (q, k)):
        _close(g, fi_ref(x, pos, rotary_dim, interleave, 2.0, 500.0), dtype)
    qi, ki = q.clone(), k.clone()
    assert fi.apply_rope_inplace(qi, ki, indptr, offsets, rotary_dim, interleave, 2.0, 500.0) is None
    bitwise(qi, got[0])
    bitwise(ki, got[1])
    by_ids = fi.apply_rope_pos_ids(q, k, pos, rotary_dim, interleave, 2.0, 500.0)
    bitwise(by_ids[0], got[0])
    bitwise(by_ids[1], got[1])
    qi, ki = q.clone(), k.clone()
    fi.apply_rope_pos_ids_inplace(qi, ki, pos.int(), rotary_dim, interleave, 2.0, 500.0)
    bitwise(qi, got[0])
    llama = (1.0, 4.0, 4)  # old_context_len 4: the three bands appear at these positions
    lq, lk = fi.apply_llama31_rope(q, k, indptr, offsets, rotary_dim, interleave, old_context_len=4)
    _close(lq, fi_ref(q, pos, rotary_dim, interleave, 8, 5e5, llama), dtype)
    _close(lk, fi_ref(k, pos, rotary_dim, interleave, 8, 5e5, llama), dtype)
    for fn, arg in ((fi.apply_llama31_rope_inplace, (indptr, offsets)), (fi.apply_llama31_rope_pos_ids_inplace, (pos,))):
        qi, ki = q.clone(), k.clone()
        assert fn(qi, ki, *arg, rotary_dim, interleave, old_context_len=4) is None
        bitwise(qi, lq)
        bitwise(ki, lk)
    bitwise(fi.apply_llama31_rope_pos_ids(q, k, pos, rotary_dim, interleave, old_context_len=4)[0], lq)


def test_flashinfer_negative_positions_rotate_back_in_both_forms():
    """flashinfer computes the angles from the positions: a negative offset or pos_id rotates by
    a negative angle, the same in apply_rope and apply_rope_pos_ids (no cache row is read)."""
    q, k = rand(4, 2, 16), rand(4, 2, 16)
    indptr = torch.tensor([0, 4], dtype=torch.int32, device=DEVICE)
    pos = torch.tensor([-3, -2, -1, 0], device=DEVICE)
    got = fi.apply_rope(q, k, indptr, torch.tensor([-3], dtype=torch.int32, device=DEVICE))
    _close(got[0], fi_ref(q, pos, None, False, 1.0, 1e4), torch.float32)
    by_ids = fi.apply_rope_pos_ids(q, k, pos)
    bitwise(by_ids[0], got[0])
    bitwise(by_ids[1], got[1])


def test_flashinfer_signatures_and_errors():
    """Argument names, order and defaults as flashinfer documents them."""
    want = {
        "apply_rope": ["q", "k", "indptr", "offsets", "rotary_dim", "interleave", "rope_scale", "rope_theta"],
        "apply_rope_pos_ids": ["q", "k", "pos_ids", "rotary_dim", "interleave", "rope_scale", "rope_theta"],
        "apply_llama31_rope": ["q", "k", "indptr", "offsets", "rotary_dim", "interleave", "rope_scale",
                               "rope_theta", "low_freq_factor", "high_freq_factor", "old_context_len"],
        "apply_rope_with_cos_sin_cache": ["positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"],
    }
    for name, params in want.items():
        for fn in (getattr(fi, name), getattr(fi, name.replace("apply_rope", "apply_rope_inplace")
                                               if name == "apply_rope" else name + "_inplace")):
            sig = inspect.signature(fn).parameters
            assert [p for p in sig if p not in ("backend", "rounding")] == params, fn.__name__  # (rome's keyword-only extras)
    sig = inspect.signature(fi.apply_llama31_rope).parameters
    assert [sig[p].default for p in ("rotary_dim", "interleave", "rope_scale", "rope_theta", "low_freq_factor",
                                     "high_freq_factor", "old_context_len")] == [None, False, 8, 5e5, 1, 4, 8192]
    sig = inspect.signature(fi.apply_rope).parameters
    assert [sig[p].default for p in ("rotary_dim", "interleave", "rope_scale", "rope_theta")] == [None, False, 1, 1e4]
    assert inspect.signature(fi.apply_rope_with_cos_sin_cache).parameters["is_neox"].default is True
    q, k = rand(4, 2, 8), rand(4, 1, 8)
    indptr, off = torch.tensor([0, 4]), torch.tensor([0])
    with pytest.raises(ValueError, match=r"indptr must end at the number of tokens nnz = 4, got indptr\[-1\] = 3"):
        fi.apply_rope(q, k, torch.tensor([0, 3]), off)
    with pytest.raises(ValueError, match=r"offsets must be \[batch_size\] = \[len\(indptr\) - 1\] = \[1\], got shape \[2\]"):
        fi.apply_rope(q, k, indptr, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"q must be a ragged tensor \[nnz, num_heads, head_dim\], got shape \[4, 16\]"):
        fi.apply_rope(q.view(4, 16), k, indptr, off)
    with pytest.raises(ValueError, match=r"pos_ids must be \[nnz\] = \[4\], got shape \[3\]"):
        fi.apply_rope_pos_ids(q, k, torch.arange(3))
    with pytest.raises(ValueError, match=r"rope_scale must be a positive number, got 0"):
        fi.apply_rope_pos_ids(q, k, torch.arange(4), rope_scale=0)
    with pytest.raises(ValueError, match=r"rotary_dim must be a positive even int <= head_dim = 8, got 10"):
        fi.apply_rope_pos_ids(q, k, torch.arange(4), rotary_dim=10)
    with pytest.raises(TypeError, match=r"q and k must have one dtype, got torch.float32 and torch.float16"):
        fi.apply_rope_pos_ids(q, k.half(), torch.arange(4))
    with pytest.raises(TypeError, match=r"key must be a torch.Tensor, got NoneType"):
        fi.apply_rope_with_cos_sin_cache(torch.arange(4), q.view(4, 16), None, 8, torch.rand(4, 8))


# --- Liger --------------------------------------------------------------------------------


def hf_tables(positions, head_dim, theta=10000.0):
    """transformers' Llama tables as it builds them: ``inv_freq = 1 / theta ** (arange(0, D,
    2) / D)`` (ceil(D / 2) frequencies), ``cat(freqs, freqs)``: 2 * ceil(D / 2) wide."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=F64) / head_dim)
    f = positions.to(F64)[..., None] * inv
    emb = torch.cat([f, f], -1)
    return emb.cos(), emb.sin()


def liger_ref(x, cos, sin, seq_dim=2):
    """Liger's kernel: the first D // 2 table columns are the per-pair values of pairs (j, j +
    D // 2); an odd D's last column passes through. x ``[B, H, S, D]``, tables ``[S, D']`` or
    ``[B', S, D']``. float64."""
    d = x.shape[-1]
    c, s = cos[..., : d // 2].to(F64), sin[..., : d // 2].to(F64)
    if c.ndim == 2:
        c, s = c[None], s[None]
    c, s = c.unsqueeze(1 if seq_dim == 2 else 2), s.unsqueeze(1 if seq_dim == 2 else 2)
    return partial(x, c, s, False)


def test_issue31_item4_reproducer_2d_tables():
    """Liger's vision case: ``[S, D]`` cos/sin with q ``[1, 4, 16, 64]`` (rome refused them
    after Liger's own unsqueeze: "cos/sin of shape [16, 1, 64] must broadcast to q")."""
    q, k = rand(1, 4, 16, 64), rand(1, 4, 16, 64)
    cos, sin = (t.float().to(DEVICE) for t in hf_tables(torch.arange(16), 64))
    got_q, got_k = liger.liger_rotary_pos_emb(q, k, cos, sin, backend="torch")
    bitwise(got_q, liger_ref(q, cos, sin).float())
    bitwise(got_k, liger_ref(k, cos, sin).float())
    # the same as transformers' apply_rotary_pos_emb on [1, S, D] tables (even D: the halves equal)
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    hq, hk = apply_rotary_pos_emb(q.double(), k.double(), cos[None].double(), sin[None].double())
    bitwise(got_q, hq.float())
    bitwise(got_k, hk.float())
    # liger_rotary_pos_emb_vision: q/k [S, H, D] in their dtype, computed in float32
    qv, kv = rand(16, 4, 64, dtype=torch.bfloat16), rand(16, 2, 64, dtype=torch.bfloat16)
    vq, vk = liger.liger_rotary_pos_emb_vision(qv, kv, cos, sin, backend="torch")
    assert vq.dtype == torch.bfloat16 and vq.shape == qv.shape and vk.shape == kv.shape
    bitwise(vq, liger_ref(qv.float().transpose(0, 1)[None], cos, sin)[0].transpose(0, 1).float().bfloat16())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_issue31_item4_reproducer_odd_head_dim(dtype):
    """head_dim 41 with transformers' 42-wide tables (Liger's ``(9, 7, 41, 41, 41)`` case):
    pairs (j, j + 20) read table column j, column 40 passes through; gradients to q and k."""
    b, s, d = 2, 7, 41
    cos, sin = (t.to(DEVICE, torch.float32)[None].expand(b, s, 42) for t in hf_tables(torch.arange(s), d))
    q = rand(b, 3, s, d, dtype=dtype, requires_grad=True)
    k = rand(b, 2, s, d, dtype=dtype, requires_grad=True)
    qr, kr = (t.detach().clone().requires_grad_() for t in (q, k))
    got_q, got_k = liger.liger_rotary_pos_emb(q, k, cos, sin, torch.arange(s)[None], 1, backend="torch")
    want_q, want_k = liger_ref(qr, cos, sin), liger_ref(kr, cos, sin)
    bitwise(got_q.detach(), want_q.detach().to(dtype))
    bitwise(got_k.detach(), want_k.detach().to(dtype))
    assert torch.equal(got_q[..., 40], q[..., 40])
    gq, gk = torch.randn_like(got_q), torch.randn_like(got_k)
    torch.autograd.backward((got_q, got_k), (gq, gk))
    torch.autograd.backward((want_q, want_k), (gq.double(), gk.double()))
    u = {torch.float32: 2**-24, torch.bfloat16: 2**-8}[dtype]
    for a, r in ((q.grad, qr.grad), (k.grad, kr.grad)):
        assert ((a.double() - r).abs() <= u * r.abs()).all()


def test_liger_bshd_and_errors():
    """``unsqueeze_dim=2``: q/k ``[B, S, H, D]`` (transformers' convention; Liger's kernel reads
    BHSD only); shapes that do not fit are named."""
    q, k = rand(2, 5, 4, 16), rand(2, 5, 2, 16)
    cos, sin = (t.float().to(DEVICE) for t in hf_tables(torch.arange(5), 16))
    cos_b, sin_b = cos[None].expand(2, 5, 16), sin[None].expand(2, 5, 16)
    got = liger.liger_rotary_pos_emb(q, k, cos_b, sin_b, unsqueeze_dim=2, backend="torch")
    bitwise(got[0], liger_ref(q, cos_b, sin_b, seq_dim=1).float())
    with pytest.raises(ValueError, match=r"unsqueeze_dim must be 1 \(q/k \[B, H, S, D\]\) or 2"):
        liger.liger_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=3)
    with pytest.raises(ValueError, match=r"cos/sin must be \[S, D'\], \[1, S, D'\] or \[B, S, D'\] with D' = 16"):
        liger.liger_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos[:, :12], sin[:, :12])
    with pytest.raises(ValueError, match=r"q must be \[B, H, S, D\] \(unsqueeze_dim=1\), got shape \[5, 4, 16\]"):
        liger.liger_rotary_pos_emb(q[0], k, cos, sin)
    with pytest.raises(TypeError, match="cos must be a torch.Tensor, got list"):
        liger.liger_rotary_pos_emb(q, k, [1.0], sin)


# --- vLLM: get_rope and the scaling classes ---------------------------------------------------


def vllm_native(positions, x, cache, head_size, rotary_dim, neox):
    """vLLM's ``forward_native`` (``query.view(num_tokens, -1, head_size)``, cos ‖ sin rows of
    the cache at the flattened positions, the first rotary_dim columns rotated), float64."""
    t = positions.numel()
    c, s = cache[positions.flatten()].to(F64).chunk(2, dim=-1)
    v = x.reshape(t, -1, head_size)
    return partial(v, c[:, None], s[:, None], not neox).reshape(x.shape)


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("shape", ["batch", "flat", "padded"])
@pytest.mark.parametrize("use_key", [True, False])
def test_vllm_get_rope_pos_encoding(neox, shape, use_key):
    """vLLM's ``test_rotary_embedding`` call: ``get_rope(head_size, max_position, is_neox_style,
    rope_parameters)``, ``.to(dtype=...)``, positions ``[B, S]``, query ``[B, S, N, D]``, ``[B,
    S, N * D]`` or sliced ``[B, S, N, D + 64][..., :D]``, key or None; forward_native and forward
    against vLLM's formula (bitwise, the cache given)."""
    head_size, rotary_dim, max_position = 64, 32, 256
    rope = vllm.get_rope(head_size, max_position, neox, {"rope_type": "default", "rope_theta": 10000,
                                                         "partial_rotary_factor": rotary_dim / head_size})
    rope = rope.to(dtype=torch.bfloat16, device=DEVICE)
    assert all(b.dtype == torch.bfloat16 for b in rope.buffers()) and rope.rotary_dim == rotary_dim
    b, s, n = 3, 5, 7
    positions = torch.randint(0, max_position, (b, s), device=DEVICE)
    full = {"batch": (b, s, n, head_size), "flat": (b, s, n * head_size), "padded": (b, s, n, head_size + 64)}[shape]
    query = rand(*full, dtype=torch.bfloat16)[..., :head_size] if shape == "padded" else rand(*full, dtype=torch.bfloat16)
    key = (rand(*full, dtype=torch.bfloat16)[..., :head_size] if shape == "padded" else rand(*full, dtype=torch.bfloat16)) if use_key else None
    ref_q = vllm_native(positions, query, rope.cos_sin_cache, head_size, rotary_dim, neox)
    out_q, out_k = rope.forward_native(positions, query, key)  # backend "auto"
    assert_formula(out_q, ref_q, query, rope.cos_sin_cache)
    if use_key:
        assert_formula(out_k, vllm_native(positions, key, rope.cos_sin_cache, head_size, rotary_dim, neox), key,
                       rope.cos_sin_cache)
    else:
        assert out_k is None
    f_q, f_k = rope(positions, query, key)
    bitwise(f_q, out_q)


def test_vllm_get_rope_module_cache():
    """One module per distinct arguments (vLLM's ``_ROPE_DICT``); buffers in ``dtype``."""
    seen = {}
    for params in ({"rope_type": "default"}, {"rope_type": "linear", "factor": (1,)}, {"rope_type": "dynamic", "factor": 1}):
        for theta in (10000, 1000000):
            for dtype in (torch.bfloat16, torch.float32):
                p = dict(params, rope_theta=theta, partial_rotary_factor=0.5)
                rope = vllm.get_rope(64, 123, True, p, dtype)
                assert id(rope) not in seen.values()
                assert all(b.dtype == dtype for b in rope.buffers())
                seen[(str(params), theta, dtype)] = id(rope)
                assert vllm.get_rope(64, 123, True, dict(p), dtype) is rope


def _inv(rd, base):
    return 1.0 / base ** (torch.arange(0, rd, 2, dtype=F64) / rd)


def _cache(t, inv, scale=1.0):
    f = t.to(F64)[:, None] * inv
    return torch.cat([f.cos() * scale, f.sin() * scale], -1)


def _yarn_ref(rd, base, factor, original, beta_fast=32, beta_slow=1, attn_factor=1.0):
    """vLLM's YaRN (common.py: yarn_find_correction_range, yarn_linear_ramp_mask,
    yarn_get_mscale), float64."""
    def dim(rot):
        return rd * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))
    low, high = max(math.floor(dim(beta_fast)), 0), min(math.ceil(dim(beta_slow)), rd - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rd // 2, dtype=F64) - low) / (high - low)).clamp(0, 1)
    mask = 1 - ramp
    pos = base ** (torch.arange(0, rd, 2, dtype=F64) / rd)
    inv = (1 / (factor * pos)) * (1 - mask) + (1 / pos) * mask
    return inv, (0.1 * math.log(factor) + 1.0) * attn_factor


# the caches are float32 rounded once from float64 angles: within 2**-24 * |value| (scale <= 1.2)
CACHE_TOL = dict(rtol=0, atol=2**-23)


def test_vllm_scaling_caches():
    """Each scaling class's ``cos_sin_cache`` against vLLM's formula for it, in float64."""
    hs, rd, base = 32, 32, 10000.0
    rope = vllm.get_rope(hs, 64, True, {"rope_type": "linear", "factor": 2.0})
    assert type(rope).__name__ == "LinearScalingRotaryEmbedding"
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(128) / 2.0, _inv(rd, base)), **CACHE_TOL)
    multi = vllm.get_rope(hs, 64, True, {"rope_type": "linear", "factor": [1.0, 4.0]})
    assert multi.scaling_factor_to_offset == {1.0: 0, 4.0: 64}
    torch.testing.assert_close(multi.cos_sin_cache[64:].double(), _cache(torch.arange(256) / 4.0, _inv(rd, base)), **CACHE_TOL)
    rope = vllm.get_rope(hs, 64, True, {"rope_type": "dynamic", "factor": 2.0})
    stretched = base * (2.0 * 128 / 64 - 1.0) ** (rd / (rd - 2))
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(128), _inv(rd, stretched)), **CACHE_TOL)
    rope = vllm.get_rope(hs, 64, True, {"rope_type": "dynamic", "alpha": 3.0})
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(64), _inv(rd, base * 3.0 ** (rd / (rd - 2)))), **CACHE_TOL)
    rope = vllm.get_rope(hs, 256, True, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                         "attn_factor": 0.9, "beta_fast": 16})
    inv, mscale = _yarn_ref(rd, base, 4.0, 64, beta_fast=16, attn_factor=0.9)
    assert rope.cos_sin_cache.shape == (256, rd) and math.isclose(rope.mscale, mscale)
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(256), inv, mscale), **CACHE_TOL)
    rope = vllm.get_rope(hs, 64, True, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    f = _inv(rd, base)
    wavelen = 2 * math.pi / f
    smooth = (32 / wavelen - 1.0) / 3.0
    want = torch.where(wavelen < 32 / 4.0, f, torch.where(wavelen > 32 / 1.0, f / 8, (1 - smooth) * f / 8 + smooth * f))
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(64), want), **CACHE_TOL)


def test_vllm_get_rope_yarn_takes_vllms_keys_and_dynamic_its_unrounded_length():
    """vLLM's get_rope passes yarn only extrapolation_factor, attn_factor, beta_fast, beta_slow,
    apply_yarn_scaling and truncate (apply_yarn_scaling=False: mscale = attn_factor alone);
    mscale / mscale_all_dim / attention_factor are deepseek_yarn's and change nothing here. The
    dynamic NTK base stretches for max_position * factor unrounded (the cache rounds its rows up)."""
    hs, rd, base = 16, 16, 10000.0
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    inv, mscale = _yarn_ref(rd, base, 4.0, 16, attn_factor=0.8)
    rope = vllm.get_rope(hs, 64, True, {**yarn, "attn_factor": 0.8, "apply_yarn_scaling": False})
    assert math.isclose(rope.mscale, 0.8)
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(64), inv, 0.8), **CACHE_TOL)
    rope = vllm.get_rope(hs, 64, True, {**yarn, "attn_factor": 0.8, "mscale": 1.0, "mscale_all_dim": 1.0,
                                        "attention_factor": 2.0})
    assert math.isclose(rope.mscale, mscale)
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(64), inv, mscale), **CACHE_TOL)
    f, m = 2.3, 32
    rope = vllm.get_rope(hs, m, True, {"rope_type": "dynamic", "factor": f})
    stretched = base * (f * (m * f) / m - (f - 1)) ** (rd / (rd - 2))
    assert rope.cos_sin_cache.shape == (math.ceil(m * f), rd)
    torch.testing.assert_close(rope.cos_sin_cache.double(), _cache(torch.arange(math.ceil(m * f)), _inv(rd, stretched)),
                               **CACHE_TOL)


def test_vllm_cache_of_another_dtype_is_cast_to_querys_as_vllm_does():
    """vLLM casts cos_sin_cache to the query's dtype; rome reads a float32 cache as is and casts
    any other (a float64 cache with float32 q, bf16 with fp16 q) as vLLM does. A non-floating
    cache is named."""
    rope = vllm.get_rope(16, 32, True, {"rope_type": "default"})
    cache = rope.cos_sin_cache
    pos = torch.tensor([0, 5, 31], device=DEVICE)
    q, k = rand(3, 2 * 16), rand(3, 16)

    def run(q, k, cache):
        return vllm.rotary_embedding(pos, q, k, head_size=16, cos_sin_cache=cache)

    for g, w in zip(run(q, k, cache.double()), run(q, k, cache.float())):
        bitwise(g, w)
    qh, kh = q.half(), k.half()
    for g, w in zip(run(qh, kh, cache.bfloat16()), run(qh, kh, cache.bfloat16().half())):
        bitwise(g, w)
    with pytest.raises(TypeError, match="cos_sin_cache must be a floating tensor, got torch.int64"):
        run(q, k, cache.long())


def test_vllm_phi3_longrope():
    """``Phi3LongRoPEScaledRotaryEmbedding``: short cache (original rows, short factors) above
    the long one (max rows, long factors), both times sqrt(1 + ln(max/orig) / ln(orig));
    positions read the long one (offset by orig) when max_model_len > orig."""
    hs, rd, orig, mx = 16, 16, 32, 128
    short, long = [1.0 + 0.1 * i for i in range(8)], [2.0 + 0.5 * i for i in range(8)]
    rope = vllm.get_rope(hs, mx, True, {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                                        "original_max_position_embeddings": orig})
    m = math.sqrt(1 + math.log(mx / orig) / math.log(orig))
    want = torch.cat([_cache(torch.arange(orig), _inv(rd, 10000.0) / torch.tensor(short, dtype=F64), m),
                      _cache(torch.arange(mx), _inv(rd, 10000.0) / torch.tensor(long, dtype=F64), m)])
    torch.testing.assert_close(rope.long_short_cos_sin_cache.double(), want, **CACHE_TOL)
    assert rope.use_long_rope
    pos, q, k = torch.tensor([0, 5, 100], device=DEVICE), rand(3, 2 * hs), rand(3, hs)
    got_q, got_k = rope(pos, q, k)  # backend "auto"
    assert_formula(got_q, vllm_native(pos + orig, q, rope.cos_sin_cache, hs, rd, True), q, rope.cos_sin_cache)
    short_only = vllm.Phi3LongRoPEScaledRotaryEmbedding(hs, rd, mx, orig, 10000.0, True, torch.float32, short, long,
                                                        max_model_len=orig)
    assert_formula(short_only(pos[:2], q[:2], k[:2])[0], vllm_native(pos[:2], q[:2], short_only.cos_sin_cache, hs, rd, True),
                   q, short_only.cos_sin_cache)
    with pytest.raises(ValueError, match="only supports is_neox_style=True"):
        vllm.get_rope(hs, mx, False, {"rope_type": "longrope", "short_factor": short, "long_factor": long,
                                      "original_max_position_embeddings": orig})


def mrope_ref(positions, x, cache, head_size, section, interleaved, neox=True):
    """vLLM's ``MRotaryEmbedding.forward_native`` with positions ``[3, T]``: rows per axis, then
    contiguous sections (``cat(m[i] for i, m in enumerate(split(section)))``) or Qwen3-VL's
    interleaving (``apply_interleaved_rope``), written out here. float64."""
    rows = cache[positions].to(F64)  # [3, T, rd]
    cos, sin = rows.chunk(2, dim=-1)

    def select(t):
        if not interleaved:
            return torch.cat([m[i] for i, m in enumerate(t.split(section, dim=-1))], -1)
        ch = torch.arange(t.shape[-1])
        h = (ch % 3 == 1) & (ch < section[1] * 3)
        w = (ch % 3 == 2) & (ch < section[2] * 3)
        return torch.where(w, t[2], torch.where(h, t[1], t[0]))

    c, s = select(cos), select(sin)
    t = positions.shape[-1]
    return partial(x.view(t, -1, head_size), c[:, None], s[:, None], not neox).reshape(x.shape)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("yarn", [False, True])
def test_vllm_mrope(interleaved, yarn):
    """``get_rope`` with ``mrope_section`` (Qwen2/2.5-VL; ``mrope_interleaved``: Qwen3-VL; with
    YaRN): a cache of 4 * max_position rows; positions ``[3, T]`` select each pair's axis;
    positions ``[T]`` are plain RoPE."""
    hs, section = 32, [4, 6, 6]
    params = {"rope_type": "default", "mrope_section": section, "mrope_interleaved": interleaved, "rope_theta": 1e6}
    if yarn:
        params.update(rope_type="yarn", factor=2.0, original_max_position_embeddings=64)
    rope = vllm.get_rope(hs, 64, True, params, torch.float32).to(DEVICE)
    assert type(rope).__name__ == "MRotaryEmbedding" and rope.cos_sin_cache.shape == (256, hs)
    inv, scale = (_yarn_ref(hs, 1e6, 2.0, 64) if yarn else (_inv(hs, 1e6), 1.0))
    torch.testing.assert_close(rope.cos_sin_cache.double().cpu(), _cache(torch.arange(256), inv, scale), **CACHE_TOL)
    t = 6
    positions = torch.randint(0, 256, (3, t), device=DEVICE)
    q, k = rand(t, 4 * hs), rand(t, 2 * hs)
    got_q, got_k = rope(positions, q, k)  # backend "auto"
    cache = rope.cos_sin_cache
    assert_formula(got_q, mrope_ref(positions, q, cache, hs, section, interleaved), q, cache)
    assert_formula(got_k, mrope_ref(positions, k, cache, hs, section, interleaved), k, cache)
    text_q, _ = rope(positions[0], q, k)
    assert_formula(text_q, vllm_native(positions[0], q, cache, hs, hs, True), q, cache)
    qi, ki = q.clone(), k.clone()
    inplace = vllm.MRotaryEmbedding(hs, hs, 64, 1e6, True, torch.float32, section, interleaved, inplace=True)
    assert inplace(positions, qi, ki)[0] is qi
    if not yarn:
        bitwise(qi, got_q)


@pytest.mark.parametrize("params,match", [
    ({"rope_type": "ntk", "factor": 2.0}, r"rope_type='ntk' \(NTKScalingRotaryEmbedding\) is not supported"),
    ({"rope_type": "xdrope", "alpha": 1.0, "xdrope_section": [1]}, r"rope_type='xdrope'.*not supported"),
    ({"rope_type": "mllama4"}, r"rope_type='mllama4' \(Llama4VisionRotaryEmbedding\) is not supported"),
    ({"rope_type": "deepseek_yarn", "factor": 2.0}, r"rope_type='deepseek_yarn'.*not supported"),
    ({"rope_type": "proportional"}, r"Gemma 4's proportional RoPE\) is not supported"),
    ({"rope_type": "nope"}, r"Unknown RoPE scaling type 'nope'; supported: default, linear, dynamic, yarn, llama3, longrope"),
    ({"rope_type": "dynamic"}, r"Dynamic rope scaling must contain either 'alpha' or 'factor' field"),
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "extrapolation_factor": 0.5},
     r"YaRN with extrapolation_factor=0.5 is not supported by rome"),
    ({"rope_type": "llama3", "factor": 8.0}, r"rope_type='llama3' needs rope_parameters\['low_freq_factor'\]"),
    ({"partial_rotary_factor": 1.5}, r"partial_rotary_factor=1.5 must be between 0.0 and 1.0"),
    ({"mrope_section": [4, 4, 4]}, r"mrope_section=\[4, 4, 4\] must sum to rotary_dim // 2 = 16 \(sum is 12\)"),
])
def test_vllm_get_rope_refusals(params, match):
    with pytest.raises(ValueError, match=match):
        vllm.get_rope(32, 64, True, params)


def test_vllm_get_rope_dual_chunk_and_types():
    with pytest.raises(ValueError, match=r"dual_chunk_attention_config \(vLLM's DualChunkRotaryEmbedding\) is not supported"):
        vllm.get_rope(32, 64, True, None, None, {"chunk_size": 8})
    with pytest.raises(TypeError, match="rope_parameters must be a dict or None, got list"):
        vllm.get_rope(32, 64, True, [("rope_type", "default")])
    rope = vllm.get_rope(32, 64)
    with pytest.raises(ValueError, match=r"positions must be \[T\] or \[3, T\]|positions must lie"):
        vllm.get_rope(32, 64, True, {"mrope_section": [4, 6, 6]})(torch.zeros(2, 3, dtype=torch.long), rand(3, 32), rand(3, 32))
    assert type(rope).__name__ == "RotaryEmbedding" and rope.cos_sin_cache.dtype == torch.get_default_dtype()


def test_triton_tiny():
    """A few tiny cases on the Triton kernel (the interpreter without a GPU): bitwise the torch
    backend's results up to the kernel's float32 arithmetic (one rounding of float32 products)."""
    cos, sin = torch.rand(8, 4, device=DEVICE), torch.rand(8, 4, device=DEVICE)
    x = rand(1, 3, 2, 8, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb(x, cos, sin, inplace=True, seqlen_offsets=2, backend="triton")
    assert x.is_leaf and out.data_ptr() == x.data_ptr()
    want = fa_ref(x_ref, cos, sin, False, 2)
    torch.testing.assert_close(out.detach().double(), want.detach(), rtol=0, atol=2**-21)
    out.backward(torch.ones_like(out))
    want.backward(torch.ones_like(want))
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=2**-21)
    q, k = rand(1, 2, 3, 41), rand(1, 1, 3, 41)
    c, s = (t.float().to(DEVICE) for t in hf_tables(torch.arange(3), 41))
    got = liger.liger_rotary_pos_emb(q, k, c, s, backend="triton")
    torch.testing.assert_close(got[0].double(), liger_ref(q, c, s), rtol=0, atol=2**-21)
    qf, kf = rand(3, 2, 16), rand(3, 1, 16)
    got = fi.apply_rope_pos_ids(qf, kf, torch.tensor([0, 4, 9], device=DEVICE), backend="triton")
    _close(got[0], fi_ref(qf, torch.tensor([0, 4, 9]), None, False, 1.0, 1e4), torch.float32)


def test_flash_attn_inplace_leaf_saved_elsewhere_raises():
    """The in-place write bumps x's version counter (flash-attn's Triton store does not): an
    earlier op that saved x for its backward raises at backward instead of reading the rotated
    values (a silently wrong gradient under flash-attn)."""
    cos, sin = torch.rand(8, 4, device=DEVICE), torch.rand(8, 4, device=DEVICE)
    x = rand(1, 3, 2, 8, requires_grad=True)
    y = x * x  # saves x
    fa.apply_rotary_emb(x, cos, sin, inplace=True, backend="torch")
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_inplace_view_of_leaf_and_flashinfer_autograd():
    """flash-attn in place on a view of a leaf that requires grad (autograd refuses to mark it
    dirty): the leaf gets the gradient through the result. flashinfer's functional forms are
    differentiable in q and k; its ``_inplace`` forms are not (RuntimeError with grad on)."""
    cos, sin = torch.rand(8, 4, device=DEVICE), torch.rand(8, 4, device=DEVICE)
    leaf = rand(1, 4, 3, 8, requires_grad=True)
    ref = leaf.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb(leaf[:, :, :2], cos, sin, inplace=True, backend="torch")
    want = fa_ref(ref[:, :, :2], cos, sin)
    bitwise(out.detach(), want.detach().float())
    g = torch.randn_like(out)
    out.backward(g)
    want.backward(g.double())
    torch.testing.assert_close(leaf.grad, ref.grad, rtol=2**-23, atol=0)
    q, k = rand(3, 2, 8, requires_grad=True), rand(3, 1, 8, requires_grad=True)
    pos = torch.tensor([0, 2, 5], device=DEVICE)
    got = fi.apply_rope_pos_ids(q, k, pos, backend="torch")
    gq, gk = torch.autograd.grad(got[0].sum() + got[1].sum(), (q, k))
    qr, kr = (t.detach().clone().requires_grad_() for t in (q, k))
    rq, rk = torch.autograd.grad(fi_ref(qr, pos, None, False, 1.0, 1e4).sum() + fi_ref(kr, pos, None, False, 1.0, 1e4).sum(), (qr, kr))
    torch.testing.assert_close(gq, rq, rtol=2**-21, atol=2**-21)
    torch.testing.assert_close(gk, rk, rtol=2**-21, atol=2**-21)
    with pytest.raises(RuntimeError):
        fi.apply_rope_pos_ids_inplace(q, k, pos)


def test_flashinfer_inplace_on_packed_views():
    """flashinfer's examples: q and k are ``reshape``d slices of one ``qkv_packed`` ``[nnz, (Hq +
    2 Hk) * D]`` buffer (strided views): rotated in place there, v untouched, equal to the
    functional form."""
    nnz, hq, hk, d = 6, 4, 2, 16
    qkv = rand(nnz, (hq + 2 * hk) * d)
    q = qkv[:, : hq * d].reshape(nnz, hq, d)
    k = qkv[:, hq * d: (hq + hk) * d].reshape(nnz, hk, d)
    v = qkv[:, (hq + hk) * d:].clone()
    indptr = torch.tensor([0, 2, 6], dtype=torch.int32, device=DEVICE)
    offsets = torch.tensor([10, 3], dtype=torch.int32, device=DEVICE)
    want_q, want_k = fi.apply_rope(q, k, indptr, offsets, 8, True)
    fi.apply_rope_inplace(q, k, indptr, offsets, 8, True)
    bitwise(qkv[:, : hq * d].reshape(nnz, hq, d), want_q)
    bitwise(qkv[:, hq * d: (hq + hk) * d].reshape(nnz, hk, d), want_k)
    bitwise(qkv[:, (hq + hk) * d:], v)


def test_vllm_mrope_forward_cuda_and_compile():
    """vLLM's ``test_mrope`` calls: ``get_rope(head_size=, max_position=, is_neox_style=,
    rope_parameters=, dtype=)`` with a Qwen2-VL-style config (GLM-4.1V's partial rotary too),
    ``forward_native`` vs ``forward_cuda`` (in place, returns query/key), and the in-place
    forward wrapped functionally under ``torch.compile(fullgraph=True)`` (backend "eager")."""
    for params, head_dim in (({"rope_type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 1e6}, 16),
                             ({"rope_type": "default", "mrope_section": [2, 3, 3], "partial_rotary_factor": 0.5}, 32),
                             ({"rope_type": "default", "mrope_section": [2, 3, 3], "mrope_interleaved": True}, 16)):
        rope = vllm.get_rope(head_size=head_dim, max_position=64, is_neox_style=True, rope_parameters=params,
                             dtype=torch.bfloat16).to(device=DEVICE)
        positions = torch.randint(0, 16, (3, 5), device=DEVICE)
        query, key = rand(5, 4 * head_dim, dtype=torch.bfloat16), rand(5, 2 * head_dim, dtype=torch.bfloat16)
        nq, nk = rope.forward_native(positions, query.clone(), key.clone())
        qc, kc = query.clone(), key.clone()
        out_q, out_k = rope.forward_cuda(positions, qc, kc)
        assert out_q is qc and out_k is kc
        bitwise(qc, nq)
        bitwise(kc, nk)
        section = params["mrope_section"]
        assert_formula(nq, mrope_ref(positions, query, rope.cos_sin_cache, head_dim, section,
                                     params.get("mrope_interleaved", False)), query, rope.cos_sin_cache)

        def functional(pos, q, k):
            q, k = q.clone(), k.clone()
            rope.forward_cuda(pos, q, k)
            return q, k

        torch._dynamo.reset()
        cq, ck = torch.compile(functional, fullgraph=True, backend="eager")(positions, query, key)
        bitwise(cq, nq)
        bitwise(ck, nk)


def test_flash_attn_inplace_leaf_that_is_a_view():
    """flash-attn's varlen test rotates, in place, ``unpad_input``'s output after
    ``requires_grad_()``: a leaf that requires grad and is itself a view (of a gathered tensor
    without grad). As flash-attn, x is rotated, stays a leaf, and the gradient through the result
    lands in ``x.grad`` (rome marked it dirty: autograd's "leaf Variable ... in-place" error)."""
    cu = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)
    cos, sin = torch.rand(12, 4, device=DEVICE), torch.rand(12, 4, device=DEVICE)
    x = rand(7, 2, 2, 4).view(7, 2, 8).requires_grad_()  # a view, made a leaf
    assert x._base is not None and x.is_leaf and not x._base.requires_grad
    x_ref = x.detach().clone().requires_grad_()
    out = fa.apply_rotary_emb(x, cos, sin, inplace=True, cu_seqlens=cu, max_seqlen=4, backend="torch")
    assert x.is_leaf and out.data_ptr() == x.data_ptr()
    rows = torch.tensor([0, 1, 2, 0, 1, 2, 3], device=DEVICE)
    want = partial(x_ref, cos[rows][:, None], sin[rows][:, None], False)
    _bits_then_grads(out, x, want, x, x_ref)
    kv = rand(3, 32).view(1, 3, 2, 2, 8).requires_grad_()  # packed kv, also a view made a leaf
    assert kv._base is not None and kv.is_leaf
    fa.apply_rotary_emb_kv_(kv, cos, sin).sum().backward()
    assert kv.is_leaf and kv.grad is not None
