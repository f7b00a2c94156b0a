"""Positions read inside the op (``rome.ops.apply_at`` / ``apply_qk_at``, the ops' ``positions``
and ``axis`` args): cos/sin are caches ``[P, D]`` and element (r, j) reads row
``positions[r, axis[j]]``. The reference is the table path, ``rome.apply``/``apply_qk`` on the
per-token tables gathered in torch (``rome.positions.gather_rows``, the same gather as
``rome.layouts.tables_for_positions``): outputs, grads of q/k and of the caches must be bitwise
equal on both backends; plus opcheck, torch.compile, vmap/jvp, rome.RoPE's routing and bad input.
"""

import pytest
import torch

import rome
from rome import ops
from rome.layouts import cos_sin_cache, mrope_layout, rope_layout, section_layout, tables_for_positions
from rome.frequencies import rope_frequencies
from rome.module import RoPE
from rome.positions import gather_rows, normalize_positions, scatter_rows

from conftest import BACKENDS, DEVICE, DTYPES

P = 48  # cache rows

LAYOUTS = {
    "1d-half-32": lambda: rope_layout(rope_frequencies(32), mode="half"),
    "mrope-4/6/6": lambda: mrope_layout(rope_frequencies(32), [4, 6, 6]),
    "video-8/12/12-interleave": lambda: section_layout((8, 12, 12), mode="interleave", theta=256.0),
}


def _caches(layout, requires_grad=False):
    cos, sin = cos_sin_cache(layout, P, device=DEVICE)
    return cos.requires_grad_(requires_grad), sin.requires_grad_(requires_grad)


def _axis(layout):
    return layout.axis.to(DEVICE) if layout.n_axes > 1 else None


def _both(layout, q, k, positions, *, backend, matrix=None, grads=None):
    """(outputs, grads of q, k, cache cos, cache sin) of the positions path and the table path."""
    m = layout.matrix(q.dtype, DEVICE) if matrix is None else matrix
    axis = _axis(layout)
    results = []
    for at in (True, False):
        qq, kk = (t.detach().clone().requires_grad_() for t in (q, k))
        cos, sin = _caches(layout, requires_grad=True)
        if at:
            out = ops.apply_qk_at(qq, kk, cos, sin, m, positions, axis=axis, backend=backend)
        else:
            out = rome.apply_qk(qq, kk, gather_rows(cos, positions, axis), gather_rows(sin, positions, axis), m,
                                backend=backend)
        torch.autograd.backward(out, grads)
        results.append((out, (qq.grad, kk.grad, cos.grad, sin.grad)))
    return results


def _assert_equal(a, b, what):
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.dtype == y.dtype and x.shape == y.shape, (what, i)
        assert torch.equal(x, y), f"{what}[{i}]: max diff {(x.double() - y.double()).abs().max().item()}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("shared", [True, False], ids=["pos[S,A]", "pos[B,1,S,A]"])
def test_bitwise_the_table_path_forward_and_grads(backend, dtype, name, shared):
    layout = LAYOUTS[name]()
    d, a = layout.head_dim, layout.n_axes
    q = torch.randn(2, 3, 5, d, device=DEVICE).to(dtype)
    k = torch.randn(2, 5, 1, d, device=DEVICE).to(dtype).transpose(1, 2)  # GQA, BSND storage
    positions = torch.randint(0, P, (5, a) if shared else (2, 1, 5, a), device=DEVICE)
    positions[..., -1, :] = P - 1  # the last cache row is read
    grads = [torch.randn(q.shape, device=DEVICE).to(dtype), torch.randn(k.shape, device=DEVICE).to(dtype)]
    (out, g), (want, g_want) = _both(layout, q, k, positions, backend=backend, grads=grads)
    _assert_equal(out, want, "outputs")
    _assert_equal(g, g_want, "grads of q, k, cos cache, sin cache")
    assert g[2].shape == (P, d) and g[2].abs().sum() > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_dim_128_three_axes_int32(backend):
    layout = section_layout((44, 44, 40), mode="half")
    q, k = torch.randn(1, 2, 4, 128, device=DEVICE, dtype=torch.bfloat16), torch.randn(1, 1, 4, 128, device=DEVICE,
                                                                                        dtype=torch.bfloat16)
    positions = torch.randint(0, P, (1, 1, 4, 3), device=DEVICE, dtype=torch.int32)
    grads = [torch.randn_like(q), torch.randn_like(k)]
    (out, g), (want, g_want) = _both(layout, q, k, positions, backend=backend, grads=grads)
    _assert_equal(out, want, "outputs")
    _assert_equal(g, g_want, "grads")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_general_matrix(backend, dtype):
    """A matrix that is not a signed permutation: the transpose reads sin at other columns
    (the kernel's non-gather backward) at the same cache rows."""
    layout = LAYOUTS["mrope-4/6/6"]()
    m = torch.randn(32, 32, device=DEVICE).to(dtype)
    q, k = torch.randn(2, 2, 3, 32, device=DEVICE).to(dtype), torch.randn(2, 1, 3, 32, device=DEVICE).to(dtype)
    positions = torch.randint(0, P, (2, 1, 3, 3), device=DEVICE)
    grads = [torch.randn_like(q), torch.randn_like(k)]
    with pytest.warns(UserWarning) if DEVICE == "cuda" and dtype != torch.float32 else _nothing():
        (out, g), (want, g_want) = _both(layout, q, k, positions, backend=backend, matrix=m, grads=grads)
    _assert_equal(out, want, "outputs")
    _assert_equal(g[:2], g_want[:2], "grads of q, k")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("multi", [False, True], ids=["1-axis", "3-axes"])
def test_offsets_and_cu_seqlens_folded_into_positions(backend, multi):
    """Offsets and packed sequences become positions on the host (rome.positions), then the op
    reads the cache at them: bitwise the tables gathered from those positions."""
    layout = LAYOUTS["mrope-4/6/6" if multi else "1d-half-32"]()
    a, cos, sin = layout.n_axes, *_caches(layout)
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    # BNSD decode/chunked prefill: per-sequence offsets
    q, k = torch.randn(3, 2, 4, 32, device=DEVICE), torch.randn(3, 1, 4, 32, device=DEVICE)
    pos = normalize_positions(None, n_axes=a, batch=3, seq=4, offsets=torch.tensor([0, 7, 40]), device=DEVICE)
    got = ops.apply_qk_at(q, k, cos, sin, m, pos[:, None], axis=axis, backend=backend)
    tc, ts = tables_for_positions(layout, (cos, sin), pos, axes_dim=-1)
    _assert_equal(got, rome.apply_qk(q, k, tc[:, None], ts[:, None], m, backend=backend), "BNSD offsets")
    # THD: packed sequences with cu_seqlens and offsets
    cu = torch.tensor([0, 3, 3, 7, 9])
    q, k = torch.randn(9, 2, 32, device=DEVICE), torch.randn(9, 1, 32, device=DEVICE)
    raw = torch.randint(0, 20, (9, a)) if multi else None
    pos = normalize_positions(raw, n_axes=a, batch=1, seq=9, offsets=torch.tensor([1, 2, 3, 25]), cu_seqlens=cu,
                              device=DEVICE)
    got = ops.apply_qk_at(q, k, cos, sin, m, pos[:, None], axis=axis, backend=backend)
    tc, ts = tables_for_positions(layout, (cos, sin), pos, axes_dim=-1)
    _assert_equal(got, rome.apply_qk(q, k, tc[:, None], ts[:, None], m, backend=backend), "THD cu_seqlens")


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_tensor_and_transposed_ops(backend):
    layout = LAYOUTS["video-8/12/12-interleave"]()
    cos, sin = _caches(layout)
    m, axis = layout.matrix(torch.float16, DEVICE), _axis(layout)
    x = torch.randn(2, 6, 3, 32, device=DEVICE, dtype=torch.float16)[:, ::2]  # strided rows
    positions = torch.randint(0, P, (2, 3, 1, 3), device=DEVICE)  # BSND: broadcast over heads
    tc, ts = gather_rows(cos, positions, axis), gather_rows(sin, positions, axis)
    assert torch.equal(ops.apply_at(x, cos, sin, m, positions, axis=axis, backend=backend),
                       rome.apply(x, tc, ts, m, backend=backend))
    assert torch.equal(torch.ops.rome.apply_transposed(x, cos, sin, m, backend, positions, axis),
                       torch.ops.rome.apply_transposed(x, tc, ts, m, backend))


def test_scatter_rows_is_the_adjoint_of_gather_rows():
    layout = LAYOUTS["mrope-4/6/6"]()
    positions, axis = torch.randint(0, 6, (4, 5, 3)), layout.axis
    cache = torch.randn(6, 32, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4, 5, 32, dtype=torch.float64)
    gather_rows(cache, positions, axis).backward(grad)
    assert torch.equal(scatter_rows(grad, positions, axis, 6), cache.grad)
    # by hand: element (t, j) goes to row positions[t, axis[j]]
    want = torch.zeros(6, 32, dtype=torch.float64)
    for t in range(20):
        for j in range(32):
            want[positions.reshape(20, 3)[t, axis[j]], j] += grad.reshape(20, 32)[t, j]
    torch.testing.assert_close(cache.grad, want, rtol=1e-12, atol=1e-12)


# --- the op's registration: opcheck, compile, autograd transforms --------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    layout = LAYOUTS["mrope-4/6/6"]()
    cos, sin = _caches(layout, requires_grad=True)
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    q = torch.randn(2, 3, 4, 32, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 4, 1, 32, device=DEVICE).transpose(1, 2).requires_grad_()
    positions = torch.randint(0, P, (2, 1, 4, 3), device=DEVICE)
    for op in (torch.ops.rome.apply.default, torch.ops.rome.apply_transposed.default):
        torch.library.opcheck(op, (q, cos, sin, m, backend, positions, axis))
    for op in (torch.ops.rome.apply_qk.default, torch.ops.rome.apply_qk_transposed.default):
        torch.library.opcheck(op, (q, k, cos, sin, m, backend, positions, axis))
    one = LAYOUTS["1d-half-32"]()
    c1, s1 = _caches(one)
    torch.library.opcheck(torch.ops.rome.apply_qk.default,
                          (q, k, c1, s1, m, backend, positions[..., :1].int(), None))


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fullgraph_bitwise(compiler, backend):
    """Compiled (fullgraph) against eager: rome's outputs and every grad bitwise. The layer's loss,
    a sum of q_out * k_out, is compared within the reassociation bound of an fp32 sum instead: the
    products are the same bits (q_out and k_out are), but the order of the additions is the
    compiler's and the CPU's (inductor's vectorised sum on an AVX-512 CPU is 1 ulp from eager's;
    with ATEN_CPU_CAPABILITY=avx2 the two agree), not rome's. Any two orders of an n-term fp32 sum
    are within 2 (n-1) u sum|p_i| of each other (u = 2^-24; each within (n-1) u sum|p_i| of the
    exact sum, to first order)."""
    layout = LAYOUTS["mrope-4/6/6"]()
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)

    def layer(q, k, cos, sin, positions):
        q_out, k_out = ops.apply_qk_at(q * 2, k, cos, sin, m, positions, axis=axis, backend=backend)
        return q_out, k_out, (q_out * k_out).sum()

    q, k = torch.randn(2, 2, 4, 32, device=DEVICE), torch.randn(2, 2, 4, 32, device=DEVICE)
    positions = torch.randint(0, P, (2, 1, 4, 3), device=DEVICE)
    results = []
    for f in (torch.compile(layer, fullgraph=True, backend=compiler), layer):
        qq, kk = (t.clone().requires_grad_() for t in (q, k))
        cos, sin = _caches(layout, requires_grad=True)
        q_out, k_out, y = f(qq, kk, cos, sin, positions)
        y.backward()
        results.append(((q_out, k_out, qq.grad, kk.grad, cos.grad, sin.grad), y))
    (got, y_got), (want, y_want) = results
    _assert_equal(got, want, f"{compiler} {backend}: q_out, k_out, grads of q, k, cos, sin")
    products = (want[0] * want[1]).double()
    bound = 2 * (products.numel() - 1) * 2.0 ** -24 * products.abs().sum().item()
    assert abs(y_got.item() - y_want.item()) <= bound, (y_got.item(), y_want.item(), bound)


def test_gradcheck_and_gradgradcheck_float64():
    """float64, so the torch backend (the kernel's grads are bitwise these code paths' above)."""
    backend = "torch"
    layout = section_layout((4, 4), mode="half")
    positions = torch.randint(0, 6, (2, 1, 3, 2))
    positions[0, 0, :, 0] = 5  # repeated rows: the scatter accumulates
    axis = layout.axis
    q = torch.randn(2, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    cos, sin = (t.requires_grad_() for t in cos_sin_cache(layout, 6, dtype=torch.float64))
    m = layout.matrix(torch.float64)

    def f(q, k, cos, sin):
        return ops.apply_qk_at(q, k, cos, sin, m, positions, axis=axis, backend=backend)

    assert torch.autograd.gradcheck(f, (q, k, cos, sin))
    assert torch.autograd.gradgradcheck(f, (q, k, cos, sin))


@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp_and_vmap(backend):
    layout = LAYOUTS["mrope-4/6/6"]()
    cos, sin = _caches(layout)
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    x = torch.randn(2, 2, 3, 32, device=DEVICE)
    positions = torch.randint(0, P, (2, 1, 3, 3), device=DEVICE)
    tc, ts = gather_rows(cos, positions, axis), gather_rows(sin, positions, axis)
    tx, tcos = torch.randn_like(x), torch.randn_like(cos)
    out, tan = torch.func.jvp(lambda x, c: ops.apply_at(x, c, sin, m, positions, axis=axis, backend=backend),
                              (x, cos), (tx, tcos))
    want, want_tan = torch.func.jvp(lambda x, c: rome.apply(x, c, ts, m, backend=backend),
                                    (x, tc), (tx, gather_rows(tcos, positions, axis)))
    assert torch.equal(out, want) and torch.equal(tan, want_tan)
    # vmap over x (positions shared), then over x and positions together
    xs = torch.randn(3, 2, 2, 3, 32, device=DEVICE)
    got = torch.func.vmap(lambda x: ops.apply_at(x, cos, sin, m, positions, axis=axis, backend=backend))(xs)
    assert torch.equal(got, rome.apply(xs, tc, ts, m, backend=backend))
    ps = torch.randint(0, P, (3, 2, 1, 3, 3), device=DEVICE)
    got = torch.func.vmap(lambda x, p: ops.apply_at(x, cos, sin, m, p, axis=axis, backend=backend))(xs, ps)
    want = rome.apply(xs, gather_rows(cos, ps, axis), gather_rows(sin, ps, axis), m, backend=backend)
    assert torch.equal(got, want)


# --- rome.RoPE routes integer positions through the op's positions --------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_rope_module_reads_the_cache_in_the_op(backend, monkeypatch):
    seen = []
    real = ops._rotate

    def spy(xs, cos, sin, matrix, backend_, transpose, positions=None, *rest):
        seen.append(positions is not None)
        return real(xs, cos, sin, matrix, backend_, transpose, positions, *rest)

    monkeypatch.setattr(ops, "_rotate", spy)
    rope = RoPE(mrope_layout(rope_frequencies(32), [4, 6, 6]), backend=backend)
    q, k = torch.randn(2, 2, 5, 32, device=DEVICE, requires_grad=True), torch.randn(2, 1, 5, 32, device=DEVICE)
    pos = torch.randint(0, 30, (3, 2, 5), device=DEVICE)
    out = rope(q, k, pos, offsets=torch.tensor([1, 4]))
    out[0].sum().backward()
    assert seen == [True, True]  # forward and the backward's transposed launch: positions, no tables
    cache = rope._cache(torch.device(DEVICE), torch.float32)
    p = normalize_positions(pos, n_axes=3, batch=2, seq=5, offsets=torch.tensor([1, 4]), device=DEVICE)
    tc, ts = tables_for_positions(rope.layout, (cache.cos, cache.sin), p, axes_dim=-1)
    want = rome.apply_qk(q, k, tc[:, None], ts[:, None], rope.matrix(torch.float32, torch.device(DEVICE)),
                         backend=backend)
    _assert_equal(out, want, "module")
    seen.clear()
    rope(q, k, pos, unrotated=slice(0, 2))  # tables (masked tokens)
    rope(q, k, pos.double() / 2)  # fractional positions: float64 angles
    assert seen == [False, False]


def test_rope_module_out_of_range_is_an_error_not_a_read():
    rope = RoPE(rope_layout(rope_frequencies(32)), max_positions=40, backend="triton")
    q = torch.randn(1, 1, 3, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"positions must be < max_positions=40, got max 40"):
        rope(q, q, torch.tensor([0, 1, 40]))


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_input(backend):
    layout = LAYOUTS["mrope-4/6/6"]()
    cos, sin = _caches(layout)
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    x = torch.randn(2, 2, 3, 32, device=DEVICE)
    pos = torch.randint(0, P, (2, 1, 3, 3), device=DEVICE)

    def at(positions, axis=axis, cos=cos, sin=sin):
        return ops.apply_at(x, cos, sin, m, positions, axis=axis, backend=backend)

    cases = [
        (lambda: at(pos.float()), TypeError, r"positions must be an int32 or int64 tensor, got torch.float32"),
        (lambda: at([0, 1]), TypeError, r"positions must be an int32/int64 torch.Tensor, got list"),
        (lambda: at(pos, axis=axis.float()), TypeError, r"axis must be an int32 or int64 tensor, got torch.float32"),
        (lambda: at(pos[:, :, :2]), ValueError,
         r"positions of shape \[2, 1, 2, 3\] \(\[\.\.\., A\]\) must broadcast to the rows of x \[2, 2, 3, 32\]"),
        (lambda: at(pos, axis=None), ValueError,
         r"positions with A=3 axes \(\[2, 1, 3, 3\]\) need axis, the int \[D=32\] axis each column reads"),
        (lambda: at(pos, axis=axis[:8]), ValueError, r"axis must be \[D\] = \[32\], got \[8\]"),
        (lambda: at(pos, cos=cos[None], sin=sin[None]), ValueError,
         r"with positions, cos/sin must be caches \[P, D\] = \[P, 32\] \(one row per position\), got cos \[1, 48, 32\]"),
        (lambda: at(pos[..., :0]), ValueError, r"positions must be \[\.\.\., A\] with A >= 1 position axes, got \[2, 1, 3, 0\]"),
        (lambda: _on_host(at, pos + P), ValueError, rf"positions must be < the caches' rows P={P}, got max"),
        (lambda: _on_host(at, pos - P), ValueError, r"positions must be >= 0, got min"),
        (lambda: _on_device(at, pos + P), RuntimeError, rf"rome: positions must lie in \[0, the caches' rows P={P}\)"),
        (lambda: at(pos, axis=axis + 1), ValueError, r"axis values must lie in \[0, A\) = \[0, 3\), got min 1 max 3"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


def _on_host(fn, *args, **kwargs):
    with ops.position_checks("host"):  # the host check: ValueError (a sync)
        return fn(*args, **kwargs)


def _on_device(fn, *args, **kwargs):
    with ops.position_checks("device"):  # torch._assert_async: on the CPU a RuntimeError at once
        return fn(*args, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["mrope-4/6/6", "video-8/12/12-interleave"])
def test_positions_outside_the_cache_raise_by_default_and_are_nan_unchecked(backend, dtype, name):
    """Positions are never read on the host. By default their range is asserted on the device
    (on the CPU: a RuntimeError at once). Without a check (``position_checks("kernel")``) the
    elements that would read a row outside the cache are NaN on either backend (the kernel's
    row 0 read in its place and made NaN; the torch backend's clamped gather and mask), the
    others bitwise the in-range result; q and k, forward and backward, each pair class (kept,
    swapped) and dtype (fp16's builds read their tables before the class's branch)."""
    layout = LAYOUTS[name]()
    cos, sin = _caches(layout)
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    q = torch.randn(1, 2, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(1, 1, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    pos = torch.randint(0, P, (1, 1, 4, 3), device=DEVICE)
    pos[0, 0, 1, 2] = P + 5  # token 1's axis 2 (its columns of axis 2) past the end
    pos[0, 0, 3, 0] = -1  # token 3's axis 0 (its columns of axis 0) before the start
    if DEVICE == "cpu":  # (on a GPU the default's failure is a device-side assert: not testable here)
        with pytest.raises(RuntimeError, match=rf"rome: positions must lie in \[0, the caches' rows P={P}\)"):
            ops.apply_qk_at(q, k, cos, sin, m, pos, axis=axis, backend=backend)
    bad = torch.zeros(1, 1, 4, 32, dtype=torch.bool, device=DEVICE)
    bad[0, 0, 1] = axis == 2
    bad[0, 0, 3] = axis == 0
    _assert_nan_outside(q, k, cos, sin, m, pos, axis, bad, backend)


def _assert_nan_outside(q, k, cos, sin, m, pos, axis, bad, backend):
    """With checks off, apply_qk_at's outputs are NaN exactly where ``bad`` ([1, 1, S, D]) says a
    position is outside the cache, elsewhere the table path's bits at the clamped positions; the
    backward reads nothing outside either: the tokens whose every column is in range get the
    in-range grads, bitwise."""
    with ops.position_checks("kernel"):
        qo, ko = ops.apply_qk_at(q, k, cos, sin, m, pos, axis=axis, backend=backend)
    ok = pos.clamp(0, P - 1)
    want = rome.apply_qk(q, k, gather_rows(cos, ok, axis), gather_rows(sin, ok, axis), m, backend=backend)
    for out, w in zip((qo, ko), want):
        assert torch.isnan(out).eq(bad.expand_as(out)).all()
        assert torch.equal(out[~bad.expand_as(out)], w[~bad.expand_as(out)])
    g = torch.randn_like(qo)
    (dq,) = torch.autograd.grad(qo, q, g)
    (dw,) = torch.autograd.grad(want[0], q, g)
    rows = ~bad.any(-1, keepdim=True).expand_as(dq)
    assert torch.equal(dq[rows], dw[rows])
    # (the layouts' pairs share their axis: dx[j] reads cos at j's position and sin at its
    # partner's, the same one, so dx is NaN exactly where the forward is)
    assert torch.isnan(dq).eq(bad.expand_as(dq)).all()



@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["mrope-4/6/6", "video-8/12/12-interleave"])
def test_out_of_range_with_a_pairs_columns_on_two_axes_is_the_torch_backends_nan(dtype, name):
    """An axis by column (a pair's two columns on different axes: the transpose reads sin at src
    at another position than cos) with positions out of range, checks off: the kernel's outputs
    and q's grad are NaN where the torch backend's are and bitwise equal elsewhere, each pair class
    and dtype (the backward's NaN for sin at src is folded into the sign, whichever class's branch
    read it)."""
    layout = LAYOUTS[name]()
    cos, sin = _caches(layout)
    m = layout.matrix(torch.float32, DEVICE)
    axis = torch.arange(32, device=DEVICE) % 3
    q = torch.randn(1, 2, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(1, 1, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    pos = torch.randint(0, P, (1, 1, 4, 3), device=DEVICE)
    pos[0, 0, 1, 2] = P + 5
    pos[0, 0, 3, 0] = -1
    g = torch.randn(1, 2, 4, 32, device=DEVICE).to(dtype)
    got = {}
    with ops.position_checks("kernel"):
        for backend in ("triton", "torch"):
            qo, ko = ops.apply_qk_at(q, k, cos, sin, m, pos, axis=axis, backend=backend)
            (dq,) = torch.autograd.grad(qo, q, g)
            got[backend] = (qo, ko, dq)
    assert torch.isnan(got["torch"][2]).any() and not torch.isnan(got["torch"][2]).all()
    for a, b in zip(got["triton"], got["torch"]):
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        assert torch.equal(a[~torch.isnan(a)], b[~torch.isnan(b)])

def test_kernel_never_reads_outside_the_cache():
    """Without the host check (positions_checked(), as under CUDA graph capture) a position
    outside the cache is not read: the kernel writes NaN for those elements, and only those."""
    layout = LAYOUTS["mrope-4/6/6"]()
    cos, sin = _caches(layout)
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    x = torch.randn(1, 2, 4, 32, device=DEVICE)
    pos = torch.randint(0, P, (1, 1, 4, 3), device=DEVICE)
    pos[0, 0, 1, 2] = P  # token 1's axis 2 (its last 12 columns) past the end
    pos[0, 0, 3, 0] = -1  # token 3's axis 0 (its columns of axis 0) before the start
    with ops.positions_checked():
        out = ops.apply_at(x, cos, sin, m, pos, axis=axis, backend="triton")
    bad = torch.zeros(1, 1, 4, 32, dtype=torch.bool, device=DEVICE)
    bad[0, 0, 1] = axis == 2
    bad[0, 0, 3] = axis == 0
    assert torch.isnan(out).eq(bad.expand_as(out)).all()
    ok = pos.clamp(0, P - 1)
    want = rome.apply(x, gather_rows(cos, ok, axis), gather_rows(sin, ok, axis), m, backend="triton")
    assert torch.equal(out[~bad.expand_as(out)], want[~bad.expand_as(out)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["1d-half-32", "mrope-4/6/6"])
def test_int64_positions_past_int32_are_outside_the_cache(backend, dtype, name):
    """int64 positions outside the cache stay outside when the kernel narrows them to its 32-bit
    offsets: 2**32 + 3 and 3 - 2**32 (whose low 32 bits are row 3) are NaN in their elements with
    checks off (``position_checks("kernel")``), forward and backward, the other elements bitwise
    the table path's; one axis (the head groups' SEAM build and, for bf16, the whole head's
    halves) and several."""
    layout = LAYOUTS[name]()
    cos, sin = _caches(layout)
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    q = torch.randn(1, 2, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(1, 1, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    pos = torch.randint(0, P, (1, 1, 4, layout.n_axes), device=DEVICE)
    pos[0, 0, 1, -1] = 2**32 + 3
    pos[0, 0, 2, 0] = 3 - 2**32
    ax = axis if axis is not None else torch.zeros(32, dtype=torch.long, device=DEVICE)
    bad = torch.zeros(1, 1, 4, 32, dtype=torch.bool, device=DEVICE)
    bad[0, 0, 1] = ax == layout.n_axes - 1
    bad[0, 0, 2] = ax == 0
    _assert_nan_outside(q, k, cos, sin, m, pos, axis, bad, backend)


def test_inputs_untouched():
    layout = LAYOUTS["1d-half-32"]()
    cos, sin = _caches(layout)
    q, k = torch.randn(1, 2, 3, 32, device=DEVICE), torch.randn(1, 1, 3, 32, device=DEVICE)
    pos = torch.randint(0, P, (3, 1), device=DEVICE)
    before = [t.clone() for t in (q, k, cos, sin, pos)]
    for backend in BACKENDS:
        ops.apply_qk_at(q, k, cos, sin, layout.matrix(torch.float32, DEVICE), pos, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, cos, sin, pos)))


# --- item 6: angles computed in the kernel from positions and frequencies -------------------------

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from rome import kernel  # noqa: E402
from rome.positions import angle_frequencies, angle_rows  # noqa: E402


@triton.jit
def _angles_probe(p_ptr, f_ptr, sc_ptr, c_ptr, s_ptr, n, D: tl.constexpr, BLOCK: tl.constexpr, F64: tl.constexpr):
    # the kernel's own scale*cos/sin of p * inv_freq for n positions × D columns, written out
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    m = (rows < n)[:, None]
    p = tl.load(p_ptr + rows, mask=rows < n, other=0).to(tl.float32)[:, None]
    hi = tl.load(f_ptr + cols)[None, :]
    lo = tl.load(f_ptr + D + cols)[None, :]
    sh = tl.load(sc_ptr + cols)[None, :]
    sl = tl.load(sc_ptr + D + cols)[None, :]
    c, s = kernel._cos_sin_angle(p, hi, lo, sh, sl, F64)
    tl.store(c_ptr + rows[:, None] * D + cols[None, :], c, mask=m)
    tl.store(s_ptr + rows[:, None] * D + cols[None, :], s, mask=m)


# max |cos - cos64| of the kernel's angles, as a multiple of the float64-derived fp32 table's own
# (its rounding, half an ulp: 2.98e-8 below 1, 5.96e-8 for a scale > 1). Measured: 1.02x (theta
# 1e4 and 5e5, scales 1, 0.9 and YaRN's 1.2079). Before the quadrant fix it was 1.8x.
ANGLE_TABLE_RATIO = 1.05
ANGLE_ATOL = 3.2e-8  # max |scale*cos - (scale*cos)64| for scales <= 1 (the op tests use 0.9): 1.02 x 2.98e-8 measured


@pytest.mark.parametrize("theta", [1e4, 5e5])
@pytest.mark.parametrize("scale", [1.0, 0.9, 1.2079441541679836], ids=["1", "0.9", "yarn-x8"])
def test_angles_accuracy_against_float64_up_to_2_pow_20(theta, scale):
    """The kernel's scale*cos/sin from positions (double-float angle, reduction by pi/2, one
    rounding) against the float64 truth: as near it as the fp32 table's own rounding; plain fp32
    angles are far off. Positions: the first, last and random ones below 2**20."""
    inv = rope_frequencies(128, theta=theta).inv_freq.repeat(2)  # D=128: frequencies 1 .. 1/theta
    freqs, scales = angle_frequencies(inv, scale)
    g = torch.Generator().manual_seed(0)
    pos = torch.cat([torch.arange(0, 2048), torch.randint(0, 2**20, (2048,), generator=g),
                     torch.arange(2**20 - 2048, 2**20)]).to(DEVICE)
    n, d = len(pos), len(inv)
    c, s = (torch.empty(n, d, device=DEVICE) for _ in range(2))
    fusion = {} if kernel.INTERPRET else {"enable_fp_fusion": False}  # as the rotation kernel is launched
    _angles_probe[(triton.cdiv(n, 512),)](pos, freqs.to(DEVICE), scales.to(DEVICE), c, s, n, d, 512,
                                          kernel.INTERPRET, **fusion)
    angle = pos.double()[:, None] * inv.to(DEVICE)
    c64, s64 = scale * angle.cos(), scale * angle.sin()
    kernel_err = max((c.double() - c64).abs().max().item(), (s.double() - s64).abs().max().item())
    table_err = max((c64.float().double() - c64).abs().max().item(), (s64.float().double() - s64).abs().max().item())
    fp32_angles = (pos.float()[:, None] * inv.float().to(DEVICE))
    fp32_err = (scale * fp32_angles.cos().double() - c64).abs().max().item()
    print(f"\nmax |err| up to 2**20: kernel angles {kernel_err:.3g}, fp32 table {table_err:.3g}, fp32 angles {fp32_err:.3g}")
    assert kernel_err <= ANGLE_TABLE_RATIO * table_err
    assert table_err <= scale * 2**-24 and fp32_err > 1e-3  # the two references are what they claim


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["1d-half-32", "mrope-4/6/6"])
def test_angles_op_against_float64(backend, dtype, name):
    """apply_qk_angles: within the kernel's angle error of the exact x*cos + rot(x)*sin (float64
    tables); the torch backend (float64 angles) is bitwise the cache path."""
    layout = LAYOUTS[name]()
    freqs, scales = (t.to(DEVICE) for t in angle_frequencies(layout.inv_freq, 0.9))
    m, axis = layout.matrix(dtype, DEVICE), _axis(layout)
    q, k = torch.randn(2, 3, 4, 32, device=DEVICE).to(dtype), torch.randn(2, 1, 4, 32, device=DEVICE).to(dtype)
    positions = torch.randint(0, 2**20, (2, 1, 4, layout.n_axes), device=DEVICE)
    got = ops.apply_qk_angles(q, k, freqs, scales, m, positions, axis=axis, backend=backend)
    c64, s64 = angle_rows(freqs, scales, positions, axis, dtype=torch.float64)
    for x, out in zip((q, k), got):
        xd = x.double()
        rot = xd @ m.double()
        exact = xd * c64 + rot * s64
        ulp = torch.finfo(dtype).eps * exact.abs().clamp_min(torch.finfo(dtype).tiny)
        bound = ulp + (xd.abs() + rot.abs()) * ANGLE_ATOL
        assert ((out.double() - exact).abs() <= bound).all()
    if backend == "torch":
        c32, s32 = angle_rows(freqs, scales, positions, axis)
        _assert_equal(got, rome.apply_qk(q, k, c32, s32, m, backend="torch"), "torch backend angles")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name,matrix,columns", [
    ("video-8/12/12-interleave", "layout", "layout"), ("1d-half-32", "layout", "layout"),
    ("mrope-4/6/6", "layout", "layout"), ("1d-half-32", "random", "layout"),
    # each column its own frequency and axis (a pair's two differ), so that sin at src is not the
    # column's own: the move itself is checked
    ("video-8/12/12-interleave", "layout", "shuffled"), ("mrope-4/6/6", "layout", "shuffled")])
def test_angles_backward_per_pair_class(dtype, name, matrix, columns):
    """The angles backward, dx = dy*cos + (dy*sin) @ M^T, against float64 for each way the kernel
    moves sin to src's columns (567fdec): interleave (swapped pairs), half and mRoPE (tl.gather),
    a random signed permutation (no pairs, tl.gather), on the triton backend; within the kernel's
    angle error as the forward's test."""
    layout = LAYOUTS[name]()
    freqs, scales = (t.to(DEVICE) for t in angle_frequencies(layout.inv_freq, 0.9))
    axis = _axis(layout)
    if columns == "shuffled":
        cols = torch.randperm(32, generator=torch.Generator().manual_seed(3)).to(DEVICE)
        freqs, scales = freqs[:, cols].contiguous(), scales[:, cols].contiguous()
        axis = None if axis is None else axis[cols].contiguous()
    if matrix == "random":  # any signed permutation of the columns (their frequencies as they are)
        g = torch.Generator().manual_seed(7)
        perm = torch.randperm(32, generator=g)
        sign = torch.where(torch.rand(32, generator=g) < 0.5, -1.0, 1.0)
        m = torch.zeros(32, 32)
        m[torch.arange(32), perm] = sign
        m = m.to(DEVICE, dtype)
    else:
        m = layout.matrix(dtype, DEVICE)
    q = torch.randn(2, 3, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(2, 1, 4, 32, device=DEVICE).to(dtype).requires_grad_()
    positions = torch.randint(0, 2**20, (2, 1, 4, layout.n_axes), device=DEVICE)
    out = ops.apply_qk_angles(q, k, freqs, scales, m, positions, axis=axis, backend="triton")
    dys = [torch.randn_like(o) for o in out]
    got = torch.autograd.grad(out, (q, k), dys)
    c64, s64 = angle_rows(freqs, scales, positions, axis, dtype=torch.float64)
    m64 = m.double()
    for dy, dx in zip(dys, got):
        d64 = dy.double()
        rot = (d64 * s64) @ m64.T
        exact = d64 * c64 + rot
        ulp = torch.finfo(dtype).eps * exact.abs().clamp_min(torch.finfo(dtype).tiny)
        bound = ulp + (d64.abs() + d64.abs() @ m64.abs().T) * ANGLE_ATOL
        assert ((dx.double() - exact).abs() <= bound).all(), (dx.double() - exact).abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_angles_module_grads_opcheck(backend):
    layout = LAYOUTS["mrope-4/6/6"]()
    rope = RoPE(layout, backend=backend, angles="kernel")
    cached = RoPE(layout, backend=backend)
    q = torch.randn(2, 2, 5, 32, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 1, 5, 32, device=DEVICE, requires_grad=True)
    pos = torch.randint(0, 5000, (3, 2, 5), device=DEVICE)
    out, want = rope(q, k, pos), cached(q, k, pos)
    assert rope.cache_bytes() == 0  # no cache was built
    # |x| + |rot x| <= 8 here: 8 * (kernel angle error + table rounding) + an ulp or two of |out| <= 4
    atol = 8 * (ANGLE_ATOL + 2**-25) + 2 * 4 * 2**-23
    for o, w in zip(out, want):
        torch.testing.assert_close(o, w, rtol=0, atol=atol)
    (gq, gk) = torch.autograd.grad(out, (q, k), (torch.ones_like(q), torch.ones_like(k)))
    (wq, wk) = torch.autograd.grad(want, (q, k), (torch.ones_like(q), torch.ones_like(k)))
    torch.testing.assert_close(gq, wq, rtol=0, atol=2 * atol)  # two heads' grads summed for k
    torch.testing.assert_close(gk, wk, rtol=0, atol=2 * atol)
    freqs, scales = rope._freqs[torch.device(DEVICE)]
    positions = torch.randint(0, 2**20, (2, 1, 5, 3), device=DEVICE)
    for op in (torch.ops.rome.apply_qk.default, torch.ops.rome.apply_qk_transposed.default):
        torch.library.opcheck(op, (q, k, freqs, scales, rope.matrix(torch.float32, torch.device(DEVICE)), backend,
                                   positions, rope._axis(torch.device(DEVICE)), True))


def test_angles_bad_input():
    layout = LAYOUTS["mrope-4/6/6"]()
    freqs, scales = (t.to(DEVICE) for t in angle_frequencies(layout.inv_freq))
    m, axis = layout.matrix(torch.float32, DEVICE), _axis(layout)
    q = torch.randn(1, 1, 3, 32, device=DEVICE)
    pos = torch.randint(0, 9, (1, 1, 3, 3), device=DEVICE)
    pos[0, 0, 0, 0] = 8
    for backend in BACKENDS:
        with pytest.raises(ValueError, match=r"positions must be < 2\*\*24 = 16777216 with angles \(exact in float32\), got max 16777224"):
            _on_host(ops.apply_qk_angles, q, q, freqs, scales, m, pos + 2**24, axis=axis, backend=backend)
        # nothing is read on the host: by default the range is asserted on the device; unchecked,
        # the elements at a position past 2**24 are NaN
        far = pos.clone()
        far[0, 0, 0, 0] += 2**24  # token 0's axis 0 (its first 8 columns)
        if DEVICE == "cpu":
            with pytest.raises(RuntimeError, match=r"rome: positions must lie in \[0, 2\*\*24 \(angles\)\)"):
                ops.apply_qk_angles(q, q, freqs, scales, m, far, axis=axis, backend=backend)
        with ops.position_checks("kernel"):
            out = ops.apply_qk_angles(q, q, freqs, scales, m, far, axis=axis, backend=backend)[0]
        assert torch.isnan(out[0, 0, 0]).eq(axis == 0).all() and not torch.isnan(out[0, 0, 1:]).any()
        with pytest.raises(ValueError, match=r"freqs must be the float32 frequencies \[2, D\] = \[2, 32\]"):
            ops.apply_qk_angles(q, q, freqs[:1], scales, m, pos, axis=axis, backend=backend)
        with pytest.raises(RuntimeError, match=r"no gradient for the frequencies and scales"):
            f = freqs.clone().requires_grad_()
            ops.apply_qk_angles(q, q, f, scales, m, pos, axis=axis, backend=backend)[0].sum().backward()
    with pytest.raises(ValueError, match=r"angles must be 'cache' or 'kernel', got 'fp32'"):
        RoPE(layout, angles="fp32")


@pytest.mark.parametrize("backend", BACKENDS)
def test_angles_module_compiles_fullgraph(backend):
    rope = RoPE(LAYOUTS["mrope-4/6/6"](), backend=backend, angles="kernel")
    q, k = torch.randn(2, 2, 5, 32, device=DEVICE), torch.randn(2, 1, 5, 32, device=DEVICE)
    pos = torch.randint(0, 2**20, (3, 2, 5), device=DEVICE)
    f = torch.compile(lambda q, k, p: rope(q, k, p, offsets=3), fullgraph=True, backend="aot_eager")
    _assert_equal(f(q, k, pos), rope(q, k, pos, offsets=3), "compiled angles")
    with pytest.raises(ValueError, match=r"positions must be < 2\*\*24"):  # checked when the graph runs
        _on_host(f, q, k, pos + 2**24)
    if DEVICE == "cpu":  # by default: asserted on the device inside the graph, no host read
        with pytest.raises(RuntimeError, match=r"rome: positions must lie in"):
            f(q, k, pos + 2**24)


def test_the_forward_reads_a_rows_positions_once_an_axis(monkeypatch):
    """``launch.position_axes``: the forward and the gather's backward on 2-4 position axes take
    ``AXES`` (kernel._by_axis: a row's positions read once an axis, a column's picked in
    registers); one axis, more than ``MAX_ROW_AXES`` and the dot's backward keep the per-element
    read (0; the launcher also for the norm's backward and the angles' transpose). The launcher
    passes it, and the result is the table path's bits
    (test_bitwise_the_table_path_forward_and_grads)."""
    from rome import launch, launcher

    assert [launch.position_axes(2, a, False) for a in (1, 2, 3, 4, 5)] == [0, 2, 3, 4, 0]
    assert launch.position_axes(2, 3, True) == 3 and launch.position_axes(1, 1, False) == 0
    assert launch.position_axes(0, 0, False) == 0
    # the dot on AMD keeps it (its gfx942 builds spilled SGPRs); the gather there and the dot
    # on NVIDIA take it
    assert launch.position_axes(2, 3, False, "dot", "gfx942") == 0
    assert launch.position_axes(2, 3, False, "gather", "gfx942") == 3
    assert launch.position_axes(2, 3, False, "dot", 90) == 3
    assert launch.position_axes(2, 3, True, "dot", 90) == 0  # (the dot's sin at src: by element)
    seen = []
    run = launcher._run

    def spy(fn, grid, args, consts, cfg, transpose, *rest, **kw):
        if "AXES" in consts:
            seen.append((transpose, consts["AXES"]))
        return run(fn, grid, args, consts, cfg, transpose, *rest, **kw)

    monkeypatch.setattr(launcher, "_run", spy)
    for name, want in (("mrope-4/6/6", 3), ("1d-half-32", 0)):
        layout = LAYOUTS[name]()
        q = torch.randn(1, 2, 4, 32, device=DEVICE)
        k = torch.randn(1, 1, 4, 32, device=DEVICE)
        positions = torch.randint(0, P, (1, 1, 4, layout.n_axes), device=DEVICE)
        cos, sin = _caches(layout)
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        seen.clear()
        out = ops.apply_qk_at(qq, kk, cos, sin, layout.matrix(q.dtype, DEVICE), positions, axis=_axis(layout),
                              backend="triton")
        torch.autograd.backward(out, [torch.randn_like(o) for o in out])
        assert seen and set(seen) == {(False, want), (True, want)}, (name, seen)
        (got, grads), (ref, ref_grads) = _both(layout, q, k, positions, backend="triton",
                                               grads=(torch.randn_like(q), torch.randn_like(k)))
        _assert_equal(got, ref, name)
        _assert_equal(grads, ref_grads, name)


def test_the_forward_reads_its_cache_rows_in_the_axis_runs(monkeypatch):
    """``rome.positions.axis_run``: the runs of columns over which the columns' axis stays (4, 2 or
    1), which the ops read once per axis tensor; ``launch.launch_axis_run``: the kernel's
    ``AXIS_RUN`` where AXES reads caches whose row strides are multiples of it (a row's runs as
    vectors). The interpreter ignores the hint that makes them vectors, so a wrong run (wrong
    columns on a GPU) would pass the bitwise tests: the runs are pinned here, and a remembered call
    is keyed on its axis's run, so the same shapes with an axis of other runs launch their own."""
    from rome import launch, launcher
    from rome.positions import axis_run

    assert axis_run([0] * 44 + [1] * 44 + [2] * 40) == 4  # default's 44/44/40
    assert axis_run([0] * 16 + [1] * 56 + [2] * 56) == 4  # hunyuan-video's (runs of 8: one vector 4)
    assert axis_run([0] * 44 + [1] * 42 + [2] * 42) == 2  # wan's
    assert axis_run([j % 3 for j in range(12)]) == 1
    assert axis_run([0] * 4 + [1] * 4 + [0] * 2) == 2  # D = 10: not a multiple of 4
    assert launch.launch_axis_run(4, 3, False, 128, 128) == 4
    assert launch.launch_axis_run(4, 3, False, 128, 130) == 2  # a row stride of 2 mod 4
    assert launch.launch_axis_run(4, 3, False, 129, 128) == 1
    assert launch.launch_axis_run(4, 0, False, 128, 128) == 1  # no AXES (the backward, one axis)
    assert launch.launch_axis_run(4, 3, True, 128, 128) == 1  # angles: no cache rows
    assert launch.launch_axis_run(3, 3, False, 128, 128) == 1  # not a run the kernel knows
    seen = []
    run = launcher._run

    def spy(fn, grid, args, consts, cfg, transpose, *rest, **kw):
        if "AXES" in consts:
            seen.append((transpose, consts["AXES"], consts["AXIS_RUN"]))
        return run(fn, grid, args, consts, cfg, transpose, *rest, **kw)

    layout = LAYOUTS["video-8/12/12-interleave"]()  # sections 8/12/12: runs of 4
    m = layout.matrix(torch.float32, DEVICE)
    q = torch.randn(1, 2, 4, 32, device=DEVICE)
    k = torch.randn(1, 1, 4, 32, device=DEVICE)
    positions = torch.randint(0, P, (1, 1, 4, 3), device=DEVICE)
    cos, sin = _caches(layout)
    wide_c, wide_s = torch.zeros(P, 34, device=DEVICE), torch.zeros(P, 34, device=DEVICE)
    wide_c[:, :32], wide_s[:, :32] = cos, sin
    pairs = (torch.arange(32, device=DEVICE) // 2) % 3  # the pairs' axes: runs of 2
    for axis, c, s, want in ((_axis(layout), cos, sin, 4), (_axis(LAYOUTS["mrope-4/6/6"]()), cos, sin, 2),
                             (pairs, cos, sin, 2), (_axis(layout), wide_c[:, :32], wide_s[:, :32], 2)):
        with monkeypatch.context() as mp:
            mp.setattr(launcher, "_run", spy)
            seen.clear()
            got = ops.apply_qk_at(q, k, c, s, m, positions, axis=axis, backend="triton")
        assert seen == [(False, 3, want)], (want, seen)
        _assert_equal(got, ops.apply_qk_at(q, k, c, s, m, positions, axis=axis, backend="torch"), want)
    # remembered calls (no spy: the lean path runs): the same signature with axes of runs 4 and 1
    # is two entries, each replaying its own run
    monkeypatch.setattr(ops, "_LEAN", {})
    cols = torch.arange(32, device=DEVICE) % 3  # every column its own: runs of 1
    for axis in (_axis(layout), cols, _axis(layout), cols):
        got = ops.apply_qk_at(q, k, cos, sin, m, positions, axis=axis, backend="triton")
        _assert_equal(got, ops.apply_qk_at(q, k, cos, sin, m, positions, axis=axis, backend="torch"), "lean")
    runs = sorted(consts["AXIS_RUN"] for key, e in ops._LEAN.items() if key[0] == "apply_qk_at" and e.triton
                  for _, _, _, _, consts, *_ in e.recipe.launches)
    assert runs == [1, 4], runs
