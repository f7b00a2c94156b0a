"""Issue 9 (hardening): overlapping layouts, function transforms, threads, non-dense inputs.

Every check compares against the float64 formula ``x*cos + (x @ M)*sin`` written here
(``rope64``), or its transpose ``x*cos + (x*sin) @ Mᵀ``; with fp32 inputs, fp32 math and a
single rounding, a result is within ``TOL`` (a few fp32 ulps of |x||M| sums of size ~10) of it.
"""

import threading

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rome
import rome.ops as ops

from conftest import BACKENDS, DEVICE

# torch.func.jvp imports torch's own jvp decompositions, which call torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # (Deprecation- or, torch 2.15, FutureWarning)

TOL = dict(rtol=1e-5, atol=1e-5)  # fp32 math on O(1) values with D <= 16 terms: ~1e-6 abs


def rope64(x, cos, sin, m, *, transpose=False):
    x, cos, sin, m = (t.double() for t in (x, cos, sin, m))
    if transpose:
        return x * cos + torch.einsum("...j,ij->...i", x * sin, m)
    return x * cos + torch.einsum("...i,ij->...j", x, m) * sin


def tables(shape, dtype=torch.float32):
    return torch.randn(shape, dtype=dtype, device=DEVICE), torch.randn(shape, dtype=dtype, device=DEVICE)


# --- item 1: outputs always get a unit last stride; every input layout is read right -----------


def overlapping():
    """strides (1, 0, 1): torch.empty_like of it has last stride 5, not 1 (issue 9, item 1)."""
    return torch.randn(8, 1, device=DEVICE).T.unsqueeze(1).expand(1, 5, 8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlapping_x_forward(backend):
    x = overlapping()
    assert x.stride() == (1, 0, 1)
    m = rome.rotation_matrix(8, "half", device=DEVICE)
    cos, sin = tables((5, 8))
    out = rome.apply(x, cos, sin, m, backend=backend)
    assert out.stride(-1) == 1
    torch.testing.assert_close(out.double(), rope64(x, cos, sin, m), **TOL)
    q_out, k_out = rome.apply_qk(x, x, cos, sin, m, backend=backend)
    assert torch.equal(q_out, out) and torch.equal(k_out, out)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["apply", "apply_transposed", "apply_qk", "apply_qk_transposed"])
def test_overlapping_x_fake_strides_match_real(backend, op):
    x = overlapping()
    m = rome.rotation_matrix(8, "half", device=DEVICE)
    cos, sin = tables((5, 8))
    xs = (x, x) if "qk" in op else (x,)
    f = getattr(torch.ops.rome, op)
    real = f(*xs, cos, sin, m, backend)
    with FakeTensorMode() as mode:
        fake = f(*(mode.from_tensor(t) for t in (*xs, cos, sin, m)), backend)
    for r, g in zip(*((t,) if isinstance(t, torch.Tensor) else t for t in (real, fake))):
        assert r.stride() == g.stride() and r.stride(-1) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlapping_grad_backward(backend):
    """The backward's incoming grad may be any view: dx = dy*cos + (dy*sin) @ Mᵀ still."""
    m = rome.rotation_matrix(8, "half", device=DEVICE)
    cos, sin = tables((5, 8))
    x = torch.randn(1, 5, 8, device=DEVICE, requires_grad=True)
    dy = overlapping()
    rome.apply(x, cos, sin, m, backend=backend).backward(dy)
    torch.testing.assert_close(x.grad.double(), rope64(dy, cos, sin, m, transpose=True), **TOL)
    q = x.detach().clone().requires_grad_()
    k = x.detach().clone().requires_grad_()
    torch.autograd.backward(rome.apply_qk(q, k, cos, sin, m, backend=backend), [dy, dy])
    assert torch.equal(q.grad, x.grad) and torch.equal(k.grad, x.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_stride_zero_and_odd_strided_tables_and_matrix(backend):
    """cos/sin with a stride-0 last dim (one value per row), a transposed / expanded matrix."""
    x = torch.randn(2, 5, 8, device=DEVICE)
    cos = torch.randn(5, 1, device=DEVICE).expand(5, 8)
    sin = torch.randn(1, 8, device=DEVICE).expand(5, 8)
    sin_t = torch.randn(8, 5, device=DEVICE).T  # last stride 5
    mats = {
        "transposed": torch.randn(8, 8, device=DEVICE).T,
        "expanded rows": torch.randn(1, 8, device=DEVICE).expand(8, 8),
        "expanded cols": torch.randn(8, 1, device=DEVICE).expand(8, 8),
        "strided": torch.randn(16, 16, device=DEVICE)[::2, 1::2],
    }
    for name, m in mats.items():
        for c, s in ((cos, sin), (cos, sin_t)):
            out = rome.apply(x, c, s, m, backend=backend)
            torch.testing.assert_close(out.double(), rope64(x, c, s, m), **TOL, msg=name)
            dx = torch.ops.rome.apply_transposed(x, c, s, m, backend)
            torch.testing.assert_close(dx.double(), rope64(x, c, s, m, transpose=True), **TOL, msg=name)


# --- item 4: forward-mode AD and torch.func transforms ------------------------------------------


def problem(backend, d=6, shape=(2, 3)):
    """x [*shape, d], per-row tables [shape[-1], d], a dense random matrix; all fp32."""
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(*shape, d, generator=g).to(DEVICE)
    cos, sin = (torch.randn(shape[-1], d, generator=g).to(DEVICE) for _ in range(2))
    m = torch.randn(d, d, generator=g).to(DEVICE)

    def f(x, cos, sin, m):
        return rome.apply(x, cos, sin, m, backend=backend)

    return f, (x, cos, sin, m)


def tangent64(args, tangents, transpose=False):
    """d/dε of the float64 formula at args + ε·tangents, by its (bilinear) expansion."""
    x, cos, sin, m = (t.double() for t in args)
    tx, tc, ts, tm = (t.double() for t in tangents)
    if transpose:
        return (rope64(tx, cos, sin, m, transpose=True) + x * tc
                + torch.einsum("...j,ij->...i", x * ts, m) + torch.einsum("...j,ij->...i", x * sin, tm))
    return (rope64(tx, cos, sin, m) + x * tc
            + torch.einsum("...i,ij->...j", x, m) * ts + torch.einsum("...i,ij->...j", x, tm) * sin)


def fd_tangent(args, tangents, eps=1e-6):
    """Central finite difference of the float64 formula (a check of tangent64 itself)."""
    plus = rope64(*(a.double() + eps * t.double() for a, t in zip(args, tangents)))
    minus = rope64(*(a.double() - eps * t.double() for a, t in zip(args, tangents)))
    return (plus - minus) / (2 * eps)


@pytest.mark.parametrize("backend", BACKENDS)
def test_jvp_and_forward_ad(backend):
    f, args = problem(backend)
    tangents = tuple(torch.randn_like(a) for a in args)
    want = tangent64(args, tangents)
    torch.testing.assert_close(want, fd_tangent(args, tangents), rtol=1e-7, atol=1e-7)

    out, tan = torch.func.jvp(f, args, tangents)
    assert torch.equal(out, f(*args))
    torch.testing.assert_close(tan.double(), want, **TOL)

    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        duals = [fwAD.make_dual(a, t) for a, t in zip(args, tangents)]
        tan2 = fwAD.unpack_dual(f(*duals)).tangent
    torch.testing.assert_close(tan2.double(), want, **TOL)

    # one tangent at a time: x alone is the op itself, bitwise
    only_x = (tangents[0], *(torch.zeros_like(a) for a in args[1:]))
    assert torch.equal(torch.func.jvp(f, args, only_x)[1], f(tangents[0], *args[1:]))
    for i in range(1, 4):
        one = tuple(t if j == i else torch.zeros_like(t) for j, t in enumerate(tangents))
        torch.testing.assert_close(torch.func.jvp(f, args, one)[1].double(), tangent64(args, one), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_qk_jvp(backend):
    _, (x, cos, sin, m) = problem(backend)
    k = torch.randn(3, 2, 6, device=DEVICE).transpose(0, 1)  # [2, 3, 6] in another layout
    args = (x, k, cos, sin, m)
    tangents = tuple(torch.randn_like(a) for a in args)
    outs, tans = torch.func.jvp(lambda *a: rome.apply_qk(*a, backend=backend), args, tangents)
    for i in range(2):
        want = tangent64((args[i], cos, sin, m), (tangents[i], *tangents[2:]))
        torch.testing.assert_close(tans[i].double(), want, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_vjp_jacrev_jacfwd(backend):
    f, args = problem(backend, d=4, shape=(3,))
    dy = torch.randn(3, 4, device=DEVICE)

    # reference: float64 autograd through the formula
    a64 = [a.double().requires_grad_() for a in args]
    want = torch.autograd.grad(rope64(*a64), a64, dy.double())

    out, vjp_fn = torch.func.vjp(f, *args)
    for got, w in zip(vjp_fn(dy), want):
        torch.testing.assert_close(got.double(), w, **TOL)
    grads = torch.func.grad(lambda *a: (f(*a) * dy).sum(), argnums=(0, 1, 2, 3))(*args)
    for got, w in zip(grads, want):
        torch.testing.assert_close(got.double(), w, **TOL)

    jac64 = torch.autograd.functional.jacobian(rope64, tuple(a.double() for a in args))
    for jac in (torch.func.jacrev, torch.func.jacfwd):
        got = jac(f, argnums=(0, 1, 2, 3))(*args)
        for g, w in zip(got, jac64):
            torch.testing.assert_close(g.double(), w, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hessian_and_vmap(backend):
    """Second order (rome is bilinear in (x, tables)) and vmap over x, tables or matrices."""
    f, args = problem(backend, d=4, shape=(2,))
    x, cos, sin, m = args

    def loss(x, cos):
        return (f(x, cos, sin, m) ** 2).sum()

    def loss64(x, cos):
        return (rope64(x, cos, sin, m) ** 2).sum()

    want = torch.autograd.functional.hessian(loss64, (x.double(), cos.double()))
    got = torch.func.hessian(loss, argnums=(0, 1))(x, cos)
    for gi, wi in zip(got, want):
        for g, w in zip(gi, wi):
            torch.testing.assert_close(g.double(), w, **TOL)

    xb, cb, mb = torch.randn(3, *x.shape), torch.randn(3, *cos.shape), torch.randn(3, *m.shape)
    cases = {
        "x": ((xb, cos, sin, m), (0, None, None, None)),
        "tables": ((x, cb, cb + 1, m), (None, 0, 0, None)),
        "x and cos, batch dim 1": ((xb.movedim(0, 1), cb.movedim(0, 1), sin, m), (1, 1, None, None)),
        "matrix": ((x, cos, sin, mb), (None, None, None, 0)),
    }
    for name, (a, dims) in cases.items():
        got = torch.func.vmap(f, in_dims=dims)(*a)
        want = torch.stack([rope64(*(t.select(d, i) if d is not None else t for t, d in zip(a, dims)))
                            for i in range(3)])
        torch.testing.assert_close(got.double(), want, **TOL, msg=name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_apply_qk_different_ranks(backend):
    q = torch.randn(3, 2, 4, 5, 6, device=DEVICE)  # batch 3 of [2, 4, 5, 6]
    k = torch.randn(3, 5, 6, device=DEVICE)  # batch 3 of [5, 6]
    cos, sin = tables((3, 5, 6))
    m = torch.randn(6, 6, device=DEVICE)
    qo, ko = torch.func.vmap(lambda q, k, c, s: rome.apply_qk(q, k, c, s, m, backend=backend))(q, k, cos, sin)
    torch.testing.assert_close(qo.double(), rope64(q, cos[:, None, None], sin[:, None, None], m), **TOL)
    torch.testing.assert_close(ko.double(), rope64(k, cos, sin, m), **TOL)


def test_gradcheck_forward_mode_and_batched_float64():
    """torch's own checks of the forward-mode rule and of the batched (vmap) grads, in float64."""
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(3, 2, 6, dtype=torch.float64).transpose(0, 1).requires_grad_()
    cos, sin = (torch.randn(3, 6, dtype=torch.float64, requires_grad=True) for _ in range(2))
    m = rome.rotation_matrix([2, 4], "interleave", dtype=torch.float64).requires_grad_()

    def one(x, c, s, m):
        return rome.apply(x, c, s, m, backend="torch")

    def both(x, k, c, s, m):
        return rome.apply_qk(x, k, c, s, m, backend="torch")

    checks = dict(check_forward_ad=True, check_batched_grad=True, check_batched_forward_grad=True)
    for f, args in ((one, (x, cos, sin, m)), (both, (x, k, cos, sin, m))):
        assert torch.autograd.gradcheck(f, args, **checks)
        assert torch.autograd.gradgradcheck(f, args, check_fwd_over_rev=True, check_rev_over_rev=True)


def test_raw_op_forward_ad_is_an_error_not_a_zero():
    """torch.ops.rome.* have no forward-mode rule (a torch.library limit): a clear error."""
    import torch.autograd.forward_ad as fwAD

    _, (x, cos, sin, m) = problem("torch")
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, torch.randn_like(x))
        with pytest.raises(RuntimeError, match=r"forward-mode AD .*rome\.apply"):
            torch.ops.rome.apply(dual, cos, sin, m, "torch")


# --- item 6: threads under the interpreter -----------------------------------------------------


def test_threads_under_interpreter():
    """Threads launching the kernel at once get the single-thread results, no error."""
    m = rome.rotation_matrix([4, 4], "half", device=DEVICE)
    cos, sin = tables((5, 8))
    n_threads, calls = 3, 20
    xs = [torch.randn(2, 5, 8, device=DEVICE) for _ in range(n_threads)]
    want = [rome.apply(x, cos, sin, m, backend="triton") for x in xs]
    errors, results = [], {}
    start = threading.Barrier(n_threads)

    def work(i):
        start.wait()
        for j in range(calls):
            try:
                results[i, j] = rome.apply(xs[i], cos, sin, m, backend="triton")
            except Exception as e:  # noqa: BLE001 - collected and reported below
                errors.append(f"{type(e).__name__}: {str(e)[:200]}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)}/{n_threads * calls} calls failed, e.g. {errors[0]}"
    assert all(torch.equal(results[i, j], want[i]) for i in range(n_threads) for j in range(calls))


@pytest.mark.parametrize("interpret", [True, False])
def test_interpreter_lock_only_when_interpreting(monkeypatch, interpret):
    """Launches are serialised under TRITON_INTERPRET only; the compiled GPU path takes no lock."""
    kernel = ops._kernel()
    seen = []
    monkeypatch.setattr(kernel, "INTERPRET", interpret)
    monkeypatch.setattr(kernel, "rotate", lambda *a, **k: seen.append(ops._INTERPRET_LOCK.locked()))
    x = torch.randn(2, 8, device=DEVICE)
    rome.apply(x, torch.ones(8), torch.zeros(8), rome.half_matrix(8), backend="triton")
    assert seen == [interpret]


# --- item 7: sparse, nested, complex and integer tensors are refused by name --------------------


def sparse_layouts(t):
    return {
        "sparse_coo": t.to_sparse(),
        "sparse_csr": t.to_sparse_csr(),
        "sparse_csc": t.to_sparse_csc(),
        "sparse_bsr": t.to_sparse_bsr((2, 2)),
    }


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta:UserWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["x", "cos", "sin", "matrix"])
def test_sparse_arguments(backend, name):
    args = dict(x=torch.randn(4, 8), cos=torch.randn(4, 8), sin=torch.randn(4, 8), matrix=rome.half_matrix(8))
    for layout, t in sparse_layouts(args[name]).items():
        bad = args | {name: t}
        with pytest.raises(TypeError, match=rf"^{name} must be a dense \(strided\) tensor, got layout torch\.{layout}"):
            rome.apply(**bad, backend=backend)
        qk = dict(q=bad.pop("x"), k=args["x"], **bad)
        qname = "q" if name == "x" else name
        with pytest.raises(TypeError, match=rf"^{qname} must be a dense \(strided\) tensor"):
            rome.apply_qk(**qk, backend=backend)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype:UserWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=str)
def test_nested_arguments(backend, layout):
    nt = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(4, 8)], layout=layout)
    cos, sin, m = torch.randn(8), torch.randn(8), rome.half_matrix(8)
    with pytest.raises(TypeError, match=r"^x must be a dense tensor, got a nested tensor"):
        rome.apply(nt, cos, sin, m, backend=backend)
    with pytest.raises(TypeError, match=r"^k must be a dense tensor, got a nested tensor"):
        rome.apply_qk(torch.randn(2, 8), nt, cos, sin, m, backend=backend)
    with pytest.raises(TypeError, match=r"^cos must be a dense tensor, got a nested tensor"):
        rome.apply(torch.randn(2, 8), nt, sin, m, backend=backend)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int32, torch.int64, torch.bool, torch.uint8], ids=str)
@pytest.mark.parametrize("name", ["q", "k", "cos", "sin", "matrix"])
def test_complex_and_integer_arguments(dtype, name):
    args = dict(q=torch.randn(4, 8), k=torch.randn(4, 8), cos=torch.randn(4, 8), sin=torch.randn(4, 8),
                matrix=rome.half_matrix(8))
    args[name] = args[name].to(dtype)
    match = rf"^{name} must be a float16/bfloat16/float32/float64 tensor, got {dtype}"
    with pytest.raises(TypeError, match=match):
        rome.apply_qk(**args)
    if name != "k":
        single = dict(args)
        single["x"] = single.pop("q")
        del single["k"]
        with pytest.raises(TypeError, match=match.replace("^q", "^x")):
            rome.apply(**single)


def test_meta_tensors_still_work():
    x = torch.randn(2, 5, 8, device="meta")
    out = rome.apply(x, torch.randn(5, 8, device="meta"), torch.randn(5, 8, device="meta"),
                     rome.half_matrix(8, device="meta"), backend="torch")
    assert out.device.type == "meta" and out.shape == x.shape
