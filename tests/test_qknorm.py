"""rome.apply_qk_norm (issue 29's op; its signature is a contract): q/k norm then RoPE, against a
float64 oracle written here (the norm by its formula, the rotation by slice-and-concat:
rome.reference.slice_concat in float64), over rms/layer, per head / over heads, Gemma's weight
offset, BNSD and transposed-BSHD inputs, GQA, bf16/fp16/fp32 with gradients, the torch backend
and the Triton path under the interpreter. Tolerances: bf16/fp16 within 1 ulp of the oracle
rounded (the result is rounded once); fp32 2e-6 relative; gradients (float64 inputs on the torch
backend) 1e-10 against the oracle's own autograd.
"""

from __future__ import annotations

import pytest
import torch

import rome
from rome.precision import ulp_error
from rome.reference import slice_concat

from conftest import DEVICE

SECTIONS, MODE = (4, 6, 6), "half"
D = sum(SECTIONS)


def _oracle(x, w, b, cos, sin, *, norm, over, eps, offset):
    """float64: the norm by its formula, then RoPE by slice-and-concat."""
    x = x.double()
    dims = (-1,) if over == "head" else (1, 3)
    if norm == "layer":
        x = x - x.mean(dims, keepdim=True)
    y = x / torch.sqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    h = x.shape[1]
    shape = (D,) if over == "head" else (h, 1, D)
    if w is not None:
        y = y * (w.double().reshape(shape) + offset)
    if b is not None:
        y = y + b.double().reshape(shape)
    return slice_concat(y, cos.double(), sin.double(), SECTIONS, MODE)


def _case(dtype, hq=4, hk=2, s=7, *, bshd=False, gen_seed=0):
    gen = torch.Generator().manual_seed(gen_seed)
    if bshd:  # a projection's [B, S, H, D] output viewed as BNSD
        q = torch.randn(2, s, hq, D, generator=gen).mul(3).to(dtype).transpose(1, 2)
        k = torch.randn(2, s, hk, D, generator=gen).mul(3).to(dtype).transpose(1, 2)
    else:
        q = torch.randn(2, hq, s, D, generator=gen).mul(3).to(dtype)
        k = torch.randn(2, hk, s, D, generator=gen).mul(3).to(dtype)
    pos = torch.stack(torch.meshgrid(torch.arange(1), torch.arange(1), torch.arange(s), indexing="ij"), -1).reshape(-1, 3)
    cos, sin = rome.rope_cos_sin(pos, SECTIONS, mode=MODE)
    return q.to(DEVICE), k.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE)


def _weights(over, hq, hk, *, bias, gen_seed=1):
    gen = torch.Generator().manual_seed(gen_seed)
    n = (lambda h: D) if over == "head" else (lambda h: h * D)
    ws = [torch.rand(n(h), generator=gen).add(0.5).to(DEVICE) for h in (hq, hk)]
    bs = [torch.randn(n(h), generator=gen).mul(0.1).to(DEVICE) for h in (hq, hk)] if bias else [None, None]
    return ws, bs


def _ulps(got, want64, dtype):
    return ulp_error(got, want64, dtype).max().item()


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("over", ["head", "heads"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_against_the_float64_oracle(norm, over, backend, dtype):
    bshd = over == "heads"  # the layout Wan passes
    q, k, cos, sin = _case(dtype, bshd=bshd)
    (wq, wk), (bq, bk) = _weights(over, q.shape[1], k.shape[1], bias=norm == "layer")
    offset = 1.0 if norm == "rms" and over == "head" else 0.0  # Gemma's (1 + w)
    m = rome.rotation_matrix(SECTIONS, MODE, dtype=dtype, device=DEVICE)
    q0, k0 = q.clone(), k.clone()
    got = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, eps=1e-6, norm=norm, over=over, weight_offset=offset,
                             q_bias=bq, k_bias=bk, backend=backend)
    assert torch.equal(q, q0) and torch.equal(k, k0)  # inputs untouched
    for x, w, b, out in ((q, wq, bq, got[0]), (k, wk, bk, got[1])):
        want = _oracle(x, w, b, cos, sin, norm=norm, over=over, eps=1e-6, offset=offset)
        assert out.dtype == dtype and out.shape == x.shape
        if dtype == torch.float32:
            torch.testing.assert_close(out.double(), want, rtol=2e-6, atol=2e-6 * want.abs().max().item())
        elif backend == "torch":
            assert _ulps(out, want, dtype) <= 0.5 + 1e-6, _ulps(out, want, dtype)
        else:  # float32 norm into the kernel, rounded once at the end (interpreter: truncating casts)
            assert _ulps(out, want, dtype) <= 1.0 + 1e-6, _ulps(out, want, dtype)


@pytest.mark.parametrize("norm, over", [("rms", "head"), ("layer", "heads")])
def test_gradients_against_the_oracles_autograd(norm, over):
    q, k, cos, sin = _case(torch.float64)
    q, k = q.requires_grad_(), k.requires_grad_()
    (wq, wk), (bq, bk) = _weights(over, q.shape[1], k.shape[1], bias=norm == "layer")
    wq, wk = wq.double().requires_grad_(), wk.double().requires_grad_()
    params = [q, k, wq, wk]
    if bq is not None:
        bq, bk = bq.double().requires_grad_(), bk.double().requires_grad_()
        params += [bq, bk]
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    out = rome.apply_qk_norm(q, k, cos, sin, rome.rotation_matrix(SECTIONS, MODE, dtype=torch.float64, device=DEVICE), wq, wk,
                             norm=norm, over=over, q_bias=bq, k_bias=bk, backend="torch")
    got = torch.autograd.grad(out, params, (gq, gk))
    ref = (_oracle(q, wq, bq, cos, sin, norm=norm, over=over, eps=1e-6, offset=0.0),
           _oracle(k, wk, bk, cos, sin, norm=norm, over=over, eps=1e-6, offset=0.0))
    want = torch.autograd.grad(ref, params, (gq, gk))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_bad_arguments_are_refused_by_name():
    q, k, cos, sin = _case(torch.float32)
    m = rome.rotation_matrix(SECTIONS, MODE, device=DEVICE)
    w = torch.ones(D, device=DEVICE)
    def call(**kw):
        args = [kw.pop(n, v) for n, v in (("q", q), ("k", k), ("cos", cos), ("sin", sin), ("m", m), ("wq", w),
                                          ("wk", w))]
        return rome.apply_qk_norm(*args, **kw)

    with pytest.raises(ValueError, match="norm must be one of"):
        call(norm="batch")
    with pytest.raises(ValueError, match="over must be one of"):
        call(over="token")
    with pytest.raises(ValueError, match=r"q_weight must have shape \[64\] for over='heads'"):
        call(over="heads")
    with pytest.raises(ValueError, match="eps must be a positive finite float"):
        call(eps=0.0)
    with pytest.raises(ValueError, match="q_bias is for norm='layer'"):
        call(q_bias=w)
    with pytest.raises(ValueError, match=r"q must be \[B, H, S, D\]"):
        call(q=q[0])
    with pytest.raises(TypeError, match="k_weight must be floating point"):
        call(wk=torch.ones(D, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="backend must be one of"):
        call(backend="cuda")
