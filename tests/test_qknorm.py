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


@pytest.fixture(autouse=True)
def _token_tile_interpreted(monkeypatch):
    """The norm over heads by the token tile in every test here, under the interpreter too (where
    the launcher otherwise takes the head groups: rome.launch.TOKEN_TILE_INTERPRETED), as one
    block of heads (the interpreter's time is per block: 5 heads as one padded block of 8, its
    masked heads tested so); the tests of the blocks themselves set the launcher's own count."""
    from rome import launch
    monkeypatch.setattr(launch, "TOKEN_TILE_INTERPRETED", True)
    monkeypatch.setattr(launch, "TOKEN_MAX_BLOCKS", 1)


TOKEN_MAX_BLOCKS = __import__("rome.launch").launch.TOKEN_MAX_BLOCKS  # the launcher's own (before any fixture)

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
    pos = torch.randint(0, 50, (s, 3), generator=gen)  # every axis turns: every section is rotated
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


# --- the fused path: the norm as the gather kernel's prologue (triton backend, over="head") ---

def _half_case(dtype, *, mode="half", s=5, hq=3, hk=2, d=32, requires_grad=False):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, s, hq, d, generator=gen).mul(2).to(dtype).transpose(1, 2).to(DEVICE)  # BSHD viewed
    k = torch.randn(2, s, hk, d, generator=gen).mul(2).to(dtype).transpose(1, 2).to(DEVICE)
    ang = torch.randn(s, d, generator=gen, dtype=torch.float64)
    cos, sin = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    m = rome.rotation_matrix([d], mode, dtype=dtype, device=DEVICE)
    if requires_grad:
        q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    return q, k, cos, sin, m


def _oracle_rot(x, w, b, cos, sin, m, *, norm, eps, offset):
    """float64: the norm per head by its formula, then x*cos + (x @ M)*sin (M's signed permutation)."""
    x = x.double()
    if norm == "layer":
        x = x - x.mean(-1, keepdim=True)
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (w.double() + offset)
    if b is not None:
        y = y + b.double()
    return y * cos.double() + (y @ m.double()) * sin.double()


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_fused_is_one_launch_with_the_norm_prologue(mode, norm, monkeypatch):
    """The triton path over heads of D is one launch of the gather kernel with NORM set (no norm
    kernels before it), for q and k together."""
    from rome import launcher
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append((fn, consts)), run(fn, grid, args, consts, *a, **kw)))
    q, k, cos, sin, m = _half_case(torch.bfloat16, mode=mode)
    gen = torch.Generator().manual_seed(4)
    wq, wk = (torch.rand(32, generator=gen).add(0.5).to(DEVICE) for _ in range(2))
    bq, bk = (torch.randn(32, generator=gen).to(DEVICE) for _ in range(2)) if norm == "layer" else (None, None)
    got = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, norm=norm, backend="triton", q_bias=bq, k_bias=bk)
    assert [(fn, c["NORM"], c["TRANSPOSE"]) for fn, c in launches] == \
        [(launcher.kernel._rome_gather_kernel, {"rms": 1, "layer": 2}[norm], False)]
    want = [_oracle_rot(x, w, b, cos, sin, m.double(), norm=norm, eps=1e-6, offset=0.0)
            for x, w, b in ((q, wq, bq), (k, wk, bk))]
    for out, w64 in zip(got, want):
        assert _ulps(out, w64, torch.bfloat16) <= 1.0 + 1e-6


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_forward_and_gradients_against_float64(mode, norm, dtype):
    """Forward within 1 ulp (2e-6 relative in fp32) of norm-then-rotate in float64; dq, dk, the
    weights' and biases' gradients of the fused op against the float64 oracle's autograd (the
    backward: the transposed kernel in fp32, then the norm's backward in fp32: 1e-5 relative)."""
    q, k, cos, sin, m = _half_case(dtype, mode=mode, requires_grad=True)
    d = q.shape[-1]
    gen = torch.Generator().manual_seed(5)
    wq, wk = (torch.rand(d, generator=gen).add(0.5).to(DEVICE).requires_grad_() for _ in range(2))
    layer = norm == "layer"
    bq, bk = ((torch.randn(d, generator=gen).mul(0.1).to(DEVICE).requires_grad_() for _ in range(2))
              if layer else (None, None))
    out = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, norm=norm, weight_offset=0.25, q_bias=bq, k_bias=bk,
                             backend="triton")
    params = [q, k, wq, wk] + ([bq, bk] if layer else [])
    want = [_oracle_rot(x, w, b, cos, sin, m.double(), norm=norm, eps=1e-6, offset=0.25)
            for x, w, b in ((q, wq, bq), (k, wk, bk))]
    for got, w64 in zip(out, want):
        if dtype == torch.float32:
            torch.testing.assert_close(got.double(), w64.detach(), rtol=2e-6, atol=2e-6 * w64.abs().max().item())
        else:
            assert _ulps(got, w64.detach(), dtype) <= 1.0 + 1e-6
    gen = torch.Generator().manual_seed(7)
    gq, gk = (torch.randn(x.shape, generator=gen).to(dtype).to(DEVICE) for x in (q, k))
    got = torch.autograd.grad(out, params, (gq, gk))
    ref = torch.autograd.grad(want, params, (gq.double(), gk.double()))
    for name, a, b in zip(("dq", "dk", "dwq", "dwk", "dbq", "dbk"), got, ref):
        # (the oracle's dq/dk come back in q's dtype: autograd rounds a leaf's gradient to it)
        assert a.dtype == b.dtype == (dtype if name in ("dq", "dk") else torch.float32), name
        if name in ("dq", "dk") and dtype != torch.float32:  # both rounded once to the half dtype
            assert _ulps(a, b.double(), dtype) <= 1.0, name
        else:
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("norm", ["rms", "layer", "rms_heads"])
@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("dy_layout", ["like_q", "contiguous"])
def test_fused_backward_is_one_launch_with_the_norm_epilogue(norm, mode, dy_layout, monkeypatch):
    """The fused op's backward is one launch of the transposed gather kernel with NORM set (the
    norm's backward as its epilogue: dx from dy and the forward's q/k, the weights' and biases'
    sums from per-program partials), no fp32 torch norm ops; dq, dk, dw, db against the float64
    oracle's autograd: dq/dk within 1 bf16 ulp, the sums 1e-5 relative. dy in q's layout (a
    transposed BSHD view) or contiguous BNSD (the kernel reads x at dy's offsets: x copied to it)."""
    from rome import launcher
    heads = norm == "rms_heads"
    q, k, cos, sin, m = _half_case(torch.bfloat16, mode=mode, hq=5, hk=2, requires_grad=True)
    d = q.shape[-1]
    gen = torch.Generator().manual_seed(11)
    n = [(5 if heads else 1) * d, (2 if heads else 1) * d]
    wq, wk = (torch.rand(c, generator=gen).add(0.5).to(DEVICE).requires_grad_() for c in n)
    layer = norm == "layer"
    bq, bk = ((torch.randn(d, generator=gen).mul(0.1).to(DEVICE).requires_grad_() for _ in range(2))
              if layer else (None, None))
    kw = dict(norm="layer" if layer else "rms", over="heads" if heads else "head", q_bias=bq, k_bias=bk)
    out = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, weight_offset=0.25, backend="triton", **kw)
    gq, gk = (torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(DEVICE) for x in (q, k))
    if dy_layout == "like_q":
        gq, gk = (g.transpose(1, 2).contiguous().transpose(1, 2) for g in (gq, gk))
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append((fn, consts)), run(fn, grid, args, consts, *a, **kw)))
    params = [q, k, wq, wk] + ([bq, bk] if layer else [])
    got = torch.autograd.grad(out, params, (gq, gk))
    assert [(fn, c["NORM"], c["TRANSPOSE"]) for fn, c in launches] == \
        [(launcher.kernel._rome_gather_kernel, {"rms": 1, "layer": 2, "rms_heads": 3}[norm], True)]
    if heads:
        want = [_oracle_heads(x, w, cos, sin, m, 1e-6, offset=0.25) for x, w in ((q, wq), (k, wk))]
    else:
        want = [_oracle_rot(x, w, b, cos, sin, m.double(), norm=kw["norm"], eps=1e-6, offset=0.25)
                for x, w, b in ((q, wq, bq), (k, wk, bk))]
    ref = torch.autograd.grad(want, params, (gq.double(), gk.double()))
    for name, a, b in zip(("dq", "dk", "dwq", "dwk", "dbq", "dbk"), got, ref):
        assert a.shape == b.shape and a.stride()[-1] == 1, name
        if name in ("dq", "dk"):
            assert _ulps(a, b.double(), torch.bfloat16) <= 1.0, name
        else:
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("norm", ["rms", "layer", "rms_heads"])
def test_q_and_k_in_separate_launches(norm, monkeypatch):
    """MQA with B > 1 and positions per batch (one k head: k's batch and token dims merge into
    one row dim, q's do not): q and k take separate launches, forward and backward. The launch of
    one tensor still compiles the kernel's code for the second (no heads): its weight, bias and
    forward-input arguments are the first tensor's, typed as that code expects (an int32
    stand-in failed to compile over heads on the GPU: a loop-carried fp32 weight re-assigned
    int32). Values and gradients against the float64 oracle."""
    from rome import launcher
    heads = norm == "rms_heads"
    q = torch.randn(2, 3, 5, 32, generator=torch.Generator().manual_seed(21)).to(torch.bfloat16).to(DEVICE)
    k = torch.randn(2, 1, 5, 32, generator=torch.Generator().manual_seed(22)).to(torch.bfloat16).to(DEVICE)
    q, k = q.requires_grad_(), k.requires_grad_()
    _, _, cc, sc, m = _half_case(torch.bfloat16)  # caches [5, 32]
    gen = torch.Generator().manual_seed(23)
    pos = torch.randint(0, 5, (2, 1, 5, 1), generator=gen).to(DEVICE)
    cos, sin = cc[pos[..., 0]], sc[pos[..., 0]]  # [2, 1, 5, 32]: the oracle's tables
    wq, wk = (torch.rand(c * 32 if heads else 32, generator=gen).add(0.5).to(DEVICE).requires_grad_() for c in (3, 1))
    layer = norm == "layer"
    bq, bk = ((torch.randn(32, generator=gen).mul(0.1).to(DEVICE).requires_grad_() for _ in range(2))
              if layer else (None, None))
    kw = dict(norm="layer" if layer else "rms", over="heads" if heads else "head", q_bias=bq, k_bias=bk)
    launches = []
    run = launcher._run
    names = launcher.kernel._rome_gather_kernel.arg_names
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append((consts, dict(zip(names, args)))), run(fn, grid, args, consts, *a, **kw)))
    out = rome.apply_qk_norm_at(q, k, cc, sc, m, pos, wq, wk, backend="triton", **kw)
    gq, gk = (torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(DEVICE) for x in (q, k))
    params = [q, k, wq, wk] + ([bq, bk] if layer else [])
    got = torch.autograd.grad(out, params, (gq, gk))
    want_norm = {"rms": 1, "layer": 2, "rms_heads": 3}[norm]
    assert [(c["NORM"], c["TRANSPOSE"]) for c, _ in launches] == [(want_norm, t) for t in (False, False, True, True)]
    for consts, a in launches:
        assert a["b_H"] == 0, "q and k were expected in separate launches"
        for n in ("nw", "nb"):
            assert a["b_" + n].dtype == a["a_" + n].dtype == torch.float32, n
        if consts["TRANSPOSE"]:
            assert a["b_xn"].dtype == a["a_xn"].dtype == torch.bfloat16
    if heads:
        want = [_oracle_heads(x, w, cos, sin, m, 1e-6) for x, w in ((q, wq), (k, wk))]
    else:
        want = [_oracle_rot(x, w, b, cos, sin, m.double(), norm=kw["norm"], eps=1e-6, offset=0.0)
                for x, w, b in ((q, wq, bq), (k, wk, bk))]
    for o, w64 in zip(out, want):
        assert _ulps(o, w64.detach(), torch.bfloat16) <= 1.0 + 1e-6
    ref = torch.autograd.grad(want, params, (gq.double(), gk.double()))
    for name, a, b in zip(("dq", "dk", "dwq", "dwk", "dbq", "dbk"), got, ref):
        if name in ("dq", "dk"):
            assert _ulps(a, b.double(), torch.bfloat16) <= 1.0, name
        else:
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("norm", ["rms", "layer", "rms_heads"])
@pytest.mark.parametrize("at", [False, True], ids=["tables", "positions"])
def test_fused_double_backward_matches_the_torch_backend(norm, at):
    """The fused op's backward (``rome::apply_qk_norm_backward``) has its own backward: second
    derivatives through q, k and the weights, per head and over heads, tables or caches at
    multi-axis positions, against the torch backend's autograd (fp32; 1e-5 of the largest value).
    Before, the triton path raised (no autograd formula for the backward op)."""
    heads = norm == "rms_heads"
    gen = torch.Generator().manual_seed(31)
    q0 = torch.randn(2, 3, 5, 32, generator=gen).to(DEVICE)
    k0 = torch.randn(2, 2, 5, 32, generator=gen).to(DEVICE)
    m = rome.rotation_matrix([16, 16], "half", device=DEVICE)
    ang = torch.randn(5, 32, generator=gen, dtype=torch.float64)
    cos, sin = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    pos = torch.randint(0, 5, (2, 1, 5, 2), generator=gen).to(DEVICE)
    axis = (torch.arange(32) // 16).to(DEVICE)
    w0, v0 = (torch.rand(c * 32 if heads else 32, generator=gen).add(0.5).to(DEVICE) for c in (3, 2))
    kw = dict(norm="layer" if norm == "layer" else "rms", over="heads" if heads else "head")
    res = {}
    for be in ("triton", "torch"):
        q, k, w, v = (t.clone().requires_grad_() for t in (q0, k0, w0, v0))
        if at:
            o = rome.apply_qk_norm_at(q, k, cos, sin, m, pos, w, v, axis=axis, backend=be, **kw)
        else:
            o = rome.apply_qk_norm(q, k, cos, sin, m, w, v, backend=be, **kw)
        g = torch.autograd.grad(o[0].pow(2).sum() + (o[1] * o[1].detach()).sum(), (q, k, w), create_graph=True)
        res[be] = torch.autograd.grad(g[0].pow(2).sum() + g[1].sum() + g[2].pow(2).sum(), (q, k, w, v),
                                      allow_unused=True)
    for name, a, b in zip(("q", "k", "w", "v"), res["triton"], res["torch"]):
        assert a is not None and b is not None, name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * max(b.abs().max().item(), 1.0), msg=name)


@pytest.mark.parametrize("over", ["head", "heads"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_backward_reads_caches_at_multi_axis_positions(over, dtype, monkeypatch):
    """apply_qk_norm_at with an M-RoPE cache read at 3-axis positions: the backward is the one
    epilogue launch (the transpose reads sin at (pos[t, axis[src]], src)); dq, dk within 1 ulp of
    the float64 torch backend's (fp32: 1e-5 relative), the fp32 weights' gradients 1e-5."""
    from rome import launcher
    from rome.frequencies import rope_frequencies
    from rome.layouts import cos_sin_cache, mrope_layout
    layout = mrope_layout(rope_frequencies(32), [4, 6, 6])
    cos, sin = (t.to(DEVICE) for t in cos_sin_cache(layout, 20))
    axis, m = layout.axis.to(DEVICE), layout.matrix(torch.float32, DEVICE)
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(2, 5, 3, 32, generator=gen).to(dtype).transpose(1, 2).to(DEVICE)
    k = torch.randn(2, 5, 2, 32, generator=gen).to(dtype).transpose(1, 2).to(DEVICE)
    pos = torch.randint(0, 20, (2, 1, 5, 3), generator=gen).to(DEVICE)
    n = (32, 32) if over == "head" else (96, 64)
    wq, wk = (torch.rand(c, generator=gen).add(0.5).to(DEVICE) for c in n)
    dys = [torch.randn(2, h, 5, 32, generator=gen).to(dtype).to(DEVICE) for h in (3, 2)]
    grads = {}
    for be in ("triton", "torch"):
        wide = torch.float64 if be == "torch" else None
        leaves = [t.detach().to(wide or t.dtype).clone().requires_grad_() for t in (q, k, wq, wk)]
        c, s, mm = (t.to(wide or t.dtype) for t in (cos, sin, m if be == "torch" else m.to(dtype)))
        out = rome.apply_qk_norm_at(leaves[0], leaves[1], c, s, mm, pos, leaves[2], leaves[3], axis=axis,
                                    over=over, backend=be)
        launches = []
        if be == "triton":
            run = launcher._run
            monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
                launches.append(consts), run(fn, grid, args, consts, *a, **kw)))
        grads[be] = torch.autograd.grad(out, leaves, [dy.to(out[0].dtype) for dy in dys])
        if be == "triton":
            monkeypatch.undo()
            assert [(c["NORM"], c["TRANSPOSE"], c["POSITIONS"]) for c in launches] == \
                [(1 if over == "head" else 3, True, 2)]
    for i, (a, b) in enumerate(zip(grads["triton"], grads["torch"])):
        if i < 2 and dtype != torch.float32:
            assert _ulps(a, b, dtype) <= 1.0 + 1e-6
        else:
            torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_norm_backward_epilogue_refuses_what_it_cannot_do():
    """launcher.rotate(norm_grad=...) refuses by name: the forward direction, an unknown norm, the
    prologue or rounding='native' with it, and forward inputs whose layout is not dy's."""
    from rome import launcher
    q, k, cos, sin, m = _half_case(torch.float32)
    w = torch.ones(q.shape[-1], device=DEVICE)
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    outs = [torch.empty_like(gq), torch.empty_like(gk)]

    def call(**kw):
        args = dict(transpose=True, norm_grad=("rms", 1e-6, [(w, None), (w, None)], [q, k]))
        args.update(kw)
        return launcher.rotate([gq, gk], outs, cos, sin, m, **args)

    with pytest.raises(ValueError, match="norm's backward epilogue is the gather kernel's transpose"):
        call(transpose=False)
    with pytest.raises(ValueError, match="norm's backward epilogue"):
        call(norm_grad=("batch", 1e-6, [(w, None), (w, None)], [q, k]))
    with pytest.raises(ValueError, match="norm's backward epilogue"):
        call(native=True)
    with pytest.raises(ValueError, match=r"norm_grad's inputs must match the gradients' shape, strides and dtype"):
        call(norm_grad=("rms", 1e-6, [(w, None), (w, None)], [q.contiguous(), k]))
    with pytest.raises(ValueError, match=r"norm_grad's inputs must match"):
        call(norm_grad=("rms", 1e-6, [(w, None), (w, None)], [q.double(), k]))


def test_fused_backward_op_opcheck():
    """rome::apply_qk_norm_backward (the fused backward as a torch.library op, so a compiled
    model's backward traces it): opcheck's schema and fake-impl checks, per head and over heads."""
    q, k, cos, sin, m = _half_case(torch.float32)
    d = q.shape[-1]
    for norm, (nq, nk) in (("rms", (d, d)), ("layer", (d, d)), ("rms_heads", (3 * d, 2 * d))):
        wq, wk = torch.rand(nq).add(0.5).to(DEVICE), torch.rand(nk).add(0.5).to(DEVICE)
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        torch.library.opcheck(torch.ops.rome.apply_qk_norm_backward.default,
                              (gq, gk, q, k, cos, sin, m, wq, wk, 1e-6, norm, "triton"),
                              test_utils=("test_schema", "test_faketensor"))


def test_fused_op_opcheck_and_compile():
    """rome::apply_qk_norm as a torch.library op: opcheck (schema, fake impl, autograd
    registration), and torch.compile(fullgraph=True) of the call without a graph break."""
    q, k, cos, sin, m = _half_case(torch.float32)
    d = q.shape[-1]
    w = torch.rand(d).add(0.5).to(DEVICE)
    torch.library.opcheck(torch.ops.rome.apply_qk_norm.default, (q, k, cos, sin, m, w, w, None, None, 1e-6, "rms", "triton"),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    eager = rome.apply_qk_norm(q, k, cos, sin, m, w, w, backend="triton")
    f = torch.compile(lambda *a: rome.apply_qk_norm(*a, backend="triton"), fullgraph=True, backend="eager")
    for a, b in zip(f(q, k, cos, sin, m, w, w), eager):
        assert torch.equal(a, b)


def test_fused_op_runs_unfused_where_the_gather_kernel_does_not_take_the_rotation(monkeypatch):
    """Under product("dot") (the seed's formulation) the op normalises in fp32 torch ops and makes
    one rotation launch without the prologue: the same result within the same bounds."""
    from rome import launch, launcher
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append(consts), run(fn, grid, args, consts, *a, **kw)))
    q, k, cos, sin, m = _half_case(torch.bfloat16)
    w = torch.rand(32, generator=torch.Generator().manual_seed(9)).add(0.5).to(DEVICE)
    with launch.product("dot"):
        got = rome.apply_qk_norm(q, k, cos, sin, m, w, w, backend="triton")
    assert len(launches) == 1 and launches[0].get("NORM", 0) == 0 and launches[0].get("DOT", True)
    for out, x in zip(got, (q, k)):
        want = _oracle_rot(x, w, None, cos, sin, m.double(), norm="rms", eps=1e-6, offset=0.0)
        assert _ulps(out, want, torch.bfloat16) <= 1.0 + 1e-6


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_positions_form_is_the_table_form_at_gathered_rows(backend, norm, monkeypatch):
    """apply_qk_norm_at(caches, positions) equals apply_qk_norm on the rows the positions pick,
    bitwise (the same kernel reads the same values); on the triton backend one launch with the
    norm prologue and POSITIONS set; gradients flow to q, k and the weights."""
    from rome import launcher
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append(consts), run(fn, grid, args, consts, *a, **kw)))
    q, k, _, _, m = _half_case(torch.bfloat16, requires_grad=True)
    gen = torch.Generator().manual_seed(11)
    ang = torch.randn(40, 32, generator=gen, dtype=torch.float64)
    cos_c, sin_c = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    pos = torch.randint(0, 40, (2, 1, q.shape[2], 1), generator=gen).to(DEVICE)
    w = [torch.rand(32, generator=gen).add(0.5).to(DEVICE).requires_grad_() for _ in range(2)]
    b = [torch.randn(32, generator=gen).to(DEVICE) for _ in range(2)] if norm == "layer" else [None, None]
    got = rome.apply_qk_norm_at(q, k, cos_c, sin_c, m, pos, w[0], w[1], norm=norm, q_bias=b[0], k_bias=b[1],
                                backend=backend)
    if backend == "triton":
        assert [(c["NORM"], c["POSITIONS"]) for c in launches] == [({"rms": 1, "layer": 2}[norm], 1)]
    rows = pos[..., 0]  # [B, 1, S]
    want = rome.apply_qk_norm(q, k, cos_c[rows], sin_c[rows], m, w[0], w[1], norm=norm, q_bias=b[0], k_bias=b[1],
                              backend=backend)
    for a, e in zip(got, want):
        assert torch.equal(a, e)
    gq, gk = torch.ones_like(q), torch.ones_like(k)
    g1 = torch.autograd.grad(got, [q, k, *w], (gq, gk))
    g2 = torch.autograd.grad(want, [q, k, *w], (gq, gk))
    for a, e in zip(g1, g2):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_rope_module_norm_option(kind, monkeypatch):
    """rome.RoPE(q, k, positions, norm=QKNorm.from_modules(q_norm, k_norm)): on the triton backend
    one launch with the norm prologue per call (the first and the repeated call), within 1 ulp of
    the float64 module applied to the float64-normalised q, k; the modules' own forward is not called."""
    from rome import launcher
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append(consts), run(fn, grid, args, consts, *a, **kw)))
    d = 32
    mods = [torch.nn.RMSNorm(d, eps=1e-5) if kind == "rms" else torch.nn.LayerNorm(d, eps=1e-5) for _ in range(2)]
    gen = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for mod in mods:
            mod.weight.copy_(torch.rand(d, generator=gen).add(0.5))
            if kind == "layer":
                mod.bias.copy_(torch.randn(d, generator=gen))
    for mod in mods:
        monkeypatch.setattr(mod, "forward", lambda *a: pytest.fail("the norm module ran"))
    spec = rome.QKNorm.from_modules(*mods)
    assert (spec.norm, spec.eps) == (kind, 1e-5)
    q = torch.randn(2, 5, 3, d, generator=gen).to(torch.bfloat16).transpose(1, 2)
    k = torch.randn(2, 5, 2, d, generator=gen).to(torch.bfloat16).transpose(1, 2)
    pos = torch.arange(5)[None].expand(2, 5) + 3
    rope = rome.RoPE.sections([d], mode="half", backend="triton")
    rope64 = rome.RoPE.sections([d], mode="half", backend="torch")
    want = rope64(*(_oracle_norm(x, m, kind) for x, m in ((q, mods[0]), (k, mods[1]))), pos)
    for call in range(2):
        launches.clear()
        got = rope(q, k, pos, norm=spec)
        assert [c["NORM"] for c in launches] == [{"rms": 1, "layer": 2}[kind]], call
        for a, e in zip(got, want):
            assert a.dtype == torch.bfloat16 and _ulps(a, e, torch.bfloat16) <= 1.0 + 1e-6


def _oracle_norm(x, mod, kind):
    x = x.double()
    if kind == "layer":
        x = x - x.mean(-1, keepdim=True)
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + mod.eps) * mod.weight.detach().double()
    return y + mod.bias.detach().double() if kind == "layer" else y


def test_qknorm_spec_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match="q_norm must be a norm module"):
        rome.QKNorm.from_modules("rms", torch.nn.RMSNorm(8))
    with pytest.raises(ValueError, match="same kind of norm"):
        rome.QKNorm.from_modules(torch.nn.RMSNorm(8, eps=1e-6), torch.nn.LayerNorm(8, eps=1e-6))
    with pytest.raises(ValueError, match="no eps"):
        rome.QKNorm.from_modules(torch.nn.Identity(), torch.nn.Identity())
    with pytest.raises(TypeError, match="norm must be a rome.QKNorm"):
        rome.RoPE.sections([8])(torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8), norm="rms")


def _oracle_heads(x, w, cos, sin, m, eps, offset=0.0):
    """float64 RMSNorm over a token's H·D values (w [H·D] head-major), then the rotation."""
    x = x.double()
    y = x / torch.sqrt(x.pow(2).mean((1, 3), keepdim=True) + eps) * (w.double().view(x.shape[1], 1, -1) + offset)
    return y * cos.double() + (y @ m.double()) * sin.double()


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("at", [False, True])
def test_fused_over_heads(mode, dtype, at, monkeypatch):
    """RMSNorm over all heads of a token (Wan's rms_norm_across_heads) fused: one launch (NORM 3),
    each program holding all q and k heads of its tokens (first sweep: the sum of squares, second:
    the rotation); q, k from a [B, S, H, D] projection with different head counts; forward within
    1 ulp (2e-6 relative in fp32) and gradients of q, k and the [H·D] weights against float64."""
    from rome import launcher
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append(consts), run(fn, grid, args, consts, *a, **kw)))
    q, k, cos, sin, m = _half_case(dtype, mode=mode, hq=5, hk=2, requires_grad=True)
    gen = torch.Generator().manual_seed(17)
    wq = torch.rand(5 * 32, generator=gen).add(0.5).to(DEVICE).requires_grad_()
    wk = torch.rand(2 * 32, generator=gen).add(0.5).to(DEVICE).requires_grad_()
    if at:
        pos = torch.arange(q.shape[2]).view(1, 1, -1, 1).to(DEVICE)
        out = rome.apply_qk_norm_at(q, k, cos, sin, m, pos, wq, wk, over="heads", eps=1e-5, backend="triton")
    else:
        out = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, over="heads", eps=1e-5, backend="triton")
    assert [c["NORM"] for c in launches] == [3]
    want = [_oracle_heads(x, w, cos, sin, m, 1e-5) for x, w in ((q, wq), (k, wk))]
    for got, w64 in zip(out, want):
        if dtype == torch.float32:
            torch.testing.assert_close(got.double(), w64.detach(), rtol=2e-6, atol=2e-6 * w64.abs().max().item())
        else:
            assert _ulps(got, w64.detach(), dtype) <= 1.0 + 1e-6
    gq, gk = (torch.randn(x.shape, generator=gen).to(dtype).to(DEVICE) for x in (q, k))
    got = torch.autograd.grad(out, [q, k, wq, wk], (gq, gk))
    ref = torch.autograd.grad(want, [q, k, wq, wk], (gq.double(), gk.double()))
    for name, a, b in zip(("dq", "dk", "dwq", "dwk"), got, ref):
        if name in ("dq", "dk") and dtype != torch.float32:
            assert _ulps(a, b.double(), dtype) <= 1.0, name
        else:
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5 * b.abs().max().item())


def test_token_tile_choice(monkeypatch):
    """rome.launch.token_tile: blocks of one power-of-two head count, the fewest padded heads with
    at most TOKEN_MAX_BLOCKS blocks (Wan 2.1's 40: 5 x 8, none padded), warps (a power of two) for
    ~8 values a thread and no more threads than a block has values, a register cap that fits the
    register file; None past TOKEN_MAX_ELEMENTS."""
    from rome import launch
    monkeypatch.setattr(launch, "TOKEN_MAX_BLOCKS", TOKEN_MAX_BLOCKS)
    tile = lambda heads, d, backward=True, swapped=True, wide=False: launch.token_tile(  # noqa: E731
        heads, d, backward=backward, swapped=swapped, wide=wide)
    assert tile(40, 128) == (8, 5, 16, 128)  # Wan 2.1 14B
    assert tile(32, 128) == (32, 1, 16, 128)  # OLMo 2 7B
    # the backward rounds its warps up: at most 8 values a thread where 16 warps hold them (Wan 2.1
    # 1.3B's 12 heads: 6 on 8 warps, not 12 on 4; 24 heads: 6 on 16, not 12 on 8, which spilled)
    assert tile(12, 128) == (4, 3, 8, 128) and tile(24, 128)[2] == 16
    # fp32 x with a loaded partner: at most 8 values a thread, else the head groups' sweeps
    assert tile(40, 128, swapped=False, wide=True) is None and tile(40, 128, wide=True) == (8, 5, 16, 128)
    assert tile(32, 128, swapped=False, wide=True) == (32, 1, 16, 128)
    assert tile(5, 16)[:2] == (1, 5)
    assert tile(36, 128)[:2] == (8, 5)  # (4 x 9 is more blocks than the code holds)
    assert tile(80, 128) is None  # 5 x 16 x 128 values: the head groups' sweeps
    # the forward: at most 8 warps where a thread then holds at most 20 values (interleave's swapped
    # pairs) or 12 (a partner loaded): two programs an SM
    assert tile(40, 128, False) == (8, 5, 8, 128) and tile(32, 128, False) == (32, 1, 8, 128)
    assert tile(40, 128, False, False) == (8, 5, 16, 128) and tile(32, 128, False, False)[2] == 16
    assert tile(24, 128, False, False) == (8, 3, 8, 128)  # 12 values a thread
    assert tile(12, 128, False) == (4, 3, 4, 128)  # (already fewer)
    assert tile(48, 128, False) == (16, 3, 16, 128)  # 6144 values: 24 a thread at 8 warps, so 16
    # the backward of a full tile (nothing masked) on sm_90: at most 8 warps where a thread then
    # holds at most 20 values of swapped 2-byte pairs (Wan 2.1 14B: two programs an SM); 16 where
    # masked (36 heads pad 4), wide, a loaded partner, on sm_80/sm_100, or under a compiler the
    # choice was not read off (triton 3.7 and 3.8 spilled 56-64 B at 8 warps: launch.TUNED_COMPILER)
    full = lambda heads, d=128, **kw: launch.token_tile(heads, d, backward=True, full=True, **{  # noqa: E731
        "swapped": True, **kw})
    eight = 8 if launch.TUNED_COMPILER else 16
    assert full(40) == (8, 5, eight, 128) and full(40, arch=90) == full(40)
    assert full(32) == (32, 1, eight, 128) and full(24)[2] == eight and full(12) == tile(12, 128)
    assert full(36) == tile(36, 128) and full(36)[2] == 16 and full(48)[2] == 16  # (48: 24 a thread)
    assert full(40, wide=True)[2] == full(40, swapped=False)[2] == full(40, arch=80)[2] == full(40, arch=100)[2] == 16
    # the compilers these were not read off (launch.TUNED_COMPILER false: triton 3.7 and 3.8): the
    # backward on 16 warps everywhere, the forward's 8 only on sm_80 and sm_90 (sm_100's spilled 16 B
    # under 3.7)
    assert full(40, tuned=True)[2] == 8 and full(40, tuned=False) == (8, 5, 16, 128) == full(40, arch=90, tuned=False)
    fwd = lambda **kw: launch.token_tile(40, 128, backward=False, swapped=True, **kw)[2]  # noqa: E731
    assert fwd(tuned=True) == fwd(arch=100, tuned=True) == fwd(arch=90, tuned=False) == fwd(tuned=False) == 8
    assert fwd(arch=100, tuned=False) == 16 and fwd(arch=80, tuned=False) == 8
    assert full(40, lanes=64, arch="gfx942") == launch.token_tile(40, 128, 64, backward=True, swapped=True)
    for heads in range(1, 65):
        for backward, swapped in ((False, True), (False, False), (True, True), (True, False)):
            hb, blocks, warps, cap = tile(heads, 64, backward, swapped)
            assert hb & (hb - 1) == 0 and blocks <= launch.TOKEN_MAX_BLOCKS and (blocks - 1) * hb < heads <= blocks * hb
            assert warps * 32 <= hb * 64 and cap * warps * 32 <= 65536
            most = launch.TOKEN_FWD_PER_THREAD if swapped else launch.TOKEN_FWD_PER_THREAD_LOADED
            assert backward or warps <= 8 or hb * blocks * 64 > 8 * 32 * most
            per_thread = hb * blocks * 64 / (warps * 32)
            assert not backward or per_thread <= launch.TOKEN_PER_THREAD or warps == 16 or warps * 32 == hb * 64


def _pair_matrix(mode, d):
    """A rotation whose gather index is of the pair class ``mode`` names: interleave (pairs
    swapped), half (pairs kept), or "none" (half rotation of 6-column sections: pairs split)."""
    if mode == "none":
        return rome.rotation_matrix([6] * (d // 6) + [d % 6] * bool(d % 6), "half", dtype=torch.float32,
                                    device=DEVICE)
    return rome.rotation_matrix([d], mode, dtype=torch.float32, device=DEVICE)


def _over_heads_against_oracle(q, k, cos, sin, m, *, seed):
    """apply_qk_norm over heads (triton, random weights [H·D]) against the float64 oracle: the
    forward within 1 bf16 ulp, dq and dk too, the weights' gradients 1e-5."""
    gen = torch.Generator().manual_seed(seed)
    hq, hk, d = q.shape[1], k.shape[1], q.shape[-1]
    wq = torch.rand(hq * d, generator=gen).add(0.5).to(DEVICE).requires_grad_()
    wk = torch.rand(hk * d, generator=gen).add(0.5).to(DEVICE).requires_grad_()
    out = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, over="heads", eps=1e-5, backend="triton")
    want = [_oracle_heads(x, w, cos, sin, m, 1e-5) for x, w in ((q, wq), (k, wk))]
    for got, w64 in zip(out, want):
        assert _ulps(got, w64.detach(), torch.bfloat16) <= 1.0 + 1e-6
    gq, gk = (torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(DEVICE) for x in (q, k))
    got = torch.autograd.grad(out, [q, k, wq, wk], (gq, gk))
    ref = torch.autograd.grad(want, [q, k, wq, wk], (gq.double(), gk.double()))
    for name, a, b in zip(("dq", "dk", "dwq", "dwk"), got, ref):
        if name in ("dq", "dk"):
            assert _ulps(a, b.double(), torch.bfloat16) <= 1.0, name
        else:
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5 * b.abs().max().item())


@pytest.mark.parametrize("path, mode, heads", [
    ("token", "interleave", (5, 2)), ("token", "half", (5, 2)), ("token", "none", (5, 2)),
    ("token", "interleave", (12, 3)), ("head_groups", "interleave", (5, 2)), ("head_groups", "half", (12, 3))])
def test_over_heads_token_tile_and_head_groups(path, mode, heads, monkeypatch):
    """The norm over a token's heads by both of the gather kernel's ways, each against the
    float64 oracle with gradients (dq, dk within 1 bf16 ulp, dw 1e-5): the token tile (a token's
    heads in registers as blocks: 5 heads as 5 x 1, 12 as 3 x 4; each pair class's code), and
    the head groups' two sweeps the launcher takes where a token exceeds the tile (forced here)."""
    from rome import launch, launcher
    monkeypatch.setattr(launch, "TOKEN_MAX_BLOCKS", TOKEN_MAX_BLOCKS)
    if path == "head_groups":
        monkeypatch.setattr(launch, "TOKEN_MAX_ELEMENTS", 0)
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append(consts), run(fn, grid, args, consts, *a, **kw)))
    hq, hk = heads
    q, k, cos, sin, _ = _half_case(torch.bfloat16, mode="half", hq=hq, hk=hk, s=3, d=16, requires_grad=True)
    m = _pair_matrix(mode, 16)
    _over_heads_against_oracle(q, k, cos, sin, m, seed=29)
    blocks = {c["HEADS_B"] for c in launches if c.get("NORM") == 3}
    assert len(launches) == 2 and all(c.get("NORM") == 3 for c in launches)
    assert blocks == ({0} if path == "head_groups" else {launch.token_tile(max(heads), 16, backward=False)[0]})
    if path == "token":
        assert {c["PAIRS"] for c in launches} == {{"interleave": 2, "half": 1, "none": 0}[mode]}


@pytest.mark.parametrize("mode, hq, hk, d", [("interleave", 4, 4, 16), ("interleave", 4, 3, 16), ("half", 4, 4, 12)])
def test_token_tile_loop_tail_and_full_blocks(mode, hq, hk, d, monkeypatch):
    """The token tile's walk: programs of 4 and 5 tokens (TOKEN_PROGRAMS_PER_SM 1: 16 programs a
    tensor over 70 tokens), so two pairs through the loop and, for the first six, the tail after
    it; its loads clamped into range, none masked where the heads fill the blocks and D is a power
    of two (FULL), masked heads (k's 3 of 4) or columns (D = 12) else. Forward and gradients
    against the float64 oracle (dq, dk within 1 bf16 ulp, dw 1e-5)."""
    from rome import launch, launcher
    monkeypatch.setattr(launch, "TOKEN_PROGRAMS_PER_SM", 1)
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append((grid(consts) if callable(grid) else grid, consts)), run(fn, grid, args, consts, *a, **kw)))
    q, k, cos, sin, _ = _half_case(torch.bfloat16, mode="half", hq=hq, hk=hk, s=35, d=d, requires_grad=True)
    m = _pair_matrix(mode, d)
    _over_heads_against_oracle(q, k, cos, sin, m, seed=37)
    assert [c.get("NORM") for _, c in launches] == [3, 3]
    assert [g[0] for g, _ in launches] == [16, 16]  # (70 tokens: programs of 5 and of 4)
    assert {c["FULL"] for _, c in launches} == {hq == hk and d == 16}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("over", ["head", "heads"])
def test_tables_in_q_dtype(backend, over):
    """bf16 tables with bf16 q (what models cast their tables to) are taken on every path (the
    normalised q is float32/float64 there): the result is that of the same tables in fp32."""
    q, k, cos, sin, m = _half_case(torch.bfloat16)
    cos, sin = cos.bfloat16(), sin.bfloat16()
    n = 32 if over == "head" else None
    wq = torch.rand(n or 3 * 32).add(0.5).to(DEVICE)
    wk = torch.rand(n or 2 * 32).add(0.5).to(DEVICE)
    got = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, over=over, backend=backend)
    want = rome.apply_qk_norm(q, k, cos.float(), sin.float(), m, wq, wk, over=over, backend=backend)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_over_heads_with_per_head_tables_is_exact(monkeypatch):
    """Tables that differ between heads (LTX's [B, H, S, D]) with a norm over heads: the kernel's
    programs would not hold a token's heads, so the op normalises unfused (no NORM launch) and
    the result is still the float64 oracle's within 1 ulp."""
    from rome import launcher
    launches = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *a, **kw: (
        launches.append(consts), run(fn, grid, args, consts, *a, **kw)))
    q, k, _, _, m = _half_case(torch.bfloat16, hq=2, hk=2)
    gen = torch.Generator().manual_seed(23)
    ang = torch.randn(1, 2, q.shape[2], 32, generator=gen, dtype=torch.float64)
    cos, sin = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    w = torch.rand(64, generator=gen).add(0.5).to(DEVICE)
    got = rome.apply_qk_norm(q, k, cos, sin, m, w, w, over="heads", eps=1e-5, backend="triton")
    assert [c.get("NORM", 0) for c in launches] == [0]
    for out, x in zip(got, (q, k)):
        assert _ulps(out, _oracle_heads(x, w, cos, sin, m, 1e-5), torch.bfloat16) <= 1.0 + 1e-6


def test_rope_module_norm_compiles_fullgraph():
    """rome.RoPE(..., norm=spec) under torch.compile(fullgraph=True): no graph break, the eager
    result bitwise (the op is rome::apply_qk_norm in the graph)."""
    d = 32
    gen = torch.Generator().manual_seed(31)
    spec = rome.QKNorm(torch.rand(3 * d, generator=gen).add(0.5).to(DEVICE),
                       torch.rand(2 * d, generator=gen).add(0.5).to(DEVICE), over="heads", eps=1e-5)
    q = torch.randn(1, 3, 6, d, generator=gen).to(DEVICE)
    k = torch.randn(1, 2, 6, d, generator=gen).to(DEVICE)
    rope = rome.RoPE.sections([d], mode="interleave", backend="triton")
    pos = torch.arange(6, device=DEVICE)[None]
    eager = rope(q, k, pos, norm=spec)  # (builds the cache the compiled call reads)
    f = torch.compile(lambda q, k, p: rope(q, k, p, norm=spec), fullgraph=True, backend="eager")
    for a, b in zip(f(q, k, pos), eager):
        assert torch.equal(a, b)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_the_norm_launches_take_their_register_cap(norm, monkeypatch):
    """The per-head norm's launches: the RMSNorm prologue at the gather's 128-register cap (two
    heads a batch compile without spill there: 4 programs an SM where 168 held 3), its backward's
    epilogue and the LayerNorm's at the norm's 168 (``rome.launch.norm_registers``)."""
    from rome import launch, launcher

    seen = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, cfg, transpose, *a, **kw: (
        seen.append((transpose, cfg.maxnreg)), run(fn, grid, args, consts, cfg, transpose, *a, **kw)))
    q, k, cos, sin, _ = _half_case(torch.bfloat16, d=32, requires_grad=True)
    m = _pair_matrix("half", 32)
    wq, wk = (torch.ones(32, device=DEVICE, requires_grad=True) for _ in range(2))
    bias = dict(q_bias=torch.zeros(32, device=DEVICE), k_bias=torch.zeros(32, device=DEVICE)) if norm == "layer" else {}
    out = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, norm=norm, backend="triton", **bias)
    torch.autograd.backward(out, [torch.ones_like(o) for o in out])
    caps = {("bwd" if transpose else "fwd"): cap for transpose, cap in seen}
    assert caps == {"fwd": 128 if norm == "rms" else 168, "bwd": 168}, caps
    assert launch.norm_registers("rms_heads", backward=False) == launch.NORM_MAXNREG == 168
    # by arch: sm_80 and sm_90 (and the interpreter, as sm_90); on sm_100 two heads spilled at 128
    assert [launch.norm_registers("rms", backward=False, arch=a) for a in (80, 90, 100, "gfx942")] == [128, 128, 168, 168]
    # the fp16 LayerNorm's backward at D <= 64 on sm_80 under triton before 3.9 (8 B spilled at 168
    # under 3.6): 176
    fp16 = [launch.norm_registers("layer", backward=True, arch=a, x_dtype=torch.float16, head_dim=d)
            for a, d in ((80, 64), (80, 128), (90, 64), (100, 64))]
    assert fp16 == [176 if launch._TRITON_BEFORE_3_9 else 168, 168, 168, 168]
    assert launch.norm_registers("layer", backward=True, arch=80, x_dtype=torch.bfloat16, head_dim=64) == 168
    assert launch.norm_registers("layer", backward=False, arch=80, x_dtype=torch.float16, head_dim=64) == 168
