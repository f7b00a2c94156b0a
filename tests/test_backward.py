"""Backward: dx = dy*cos + (dy*sin) @ Mᵀ by the fused kernel, table and matrix grads, gradcheck."""

import pytest
import torch

import rome
from rome.precision import tolerance, ulp_error
from rome.reference import rotate_index, slice_concat
from helpers import random_tables

from conftest import BACKENDS, DEVICE, DTYPES, MODES, SECTIONS


def analytic_dx(dy, cos, sin, sections, mode):
    """float64 dy*cos + (dy*sin) @ Mᵀ: column j of dy*sin goes back to column index[j]."""
    index, sign = (t.to(dy.device) for t in rotate_index(sections, mode))
    dy64, c64, s64 = dy.double(), cos.double(), sin.double()
    back = torch.zeros(torch.broadcast_shapes(dy.shape, cos.shape), dtype=torch.float64, device=dy.device)
    value = back.index_add(-1, index, dy64 * s64 * sign)
    magnitude = (dy64 * c64).abs() + back.index_add(-1, index, (dy64 * s64).abs())
    return dy64 * c64 + value, magnitude


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sections", SECTIONS.values(), ids=SECTIONS.keys())
@pytest.mark.parametrize("mode", MODES)
def test_dx_against_analytic_formula(backend, dtype, sections, mode):
    d = sum(sections)
    x = torch.randn(2, 3, 6, d, device=DEVICE).to(dtype).requires_grad_()
    cos, sin = random_tables((6, d))  # general tables: "negate sin" would be wrong here
    m = rome.rotation_matrix(sections, mode, dtype=dtype, device=DEVICE)
    dy = torch.randn(2, 3, 6, d, device=DEVICE).to(dtype)
    rome.apply(x, cos, sin, m, backend=backend).backward(dy)
    want, magnitude = analytic_dx(dy, cos, sin, sections, mode)
    assert x.grad.dtype == dtype
    assert ((x.grad.double() - want).abs() <= tolerance(want, magnitude, dtype)).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_qk_backward_one_launch_gqa(backend, dtype):
    sections, mode = (44, 44, 40), "half"
    q = torch.randn(1, 4, 5, 128, device=DEVICE).to(dtype).requires_grad_()
    k = torch.randn(1, 5, 2, 128, device=DEVICE).to(dtype).transpose(1, 2).detach().requires_grad_()
    cos, sin = random_tables((5, 128))
    m = rome.rotation_matrix(sections, mode, dtype=dtype, device=DEVICE)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    q_out, k_out = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    torch.autograd.backward([q_out, k_out], [dq, dk])
    for x, dy in ((q, dq), (k, dk)):
        want, magnitude = analytic_dx(dy, cos, sin, sections, mode)
        assert ((x.grad.double() - want).abs() <= tolerance(want, magnitude, dtype)).all()
    # only q_out used: k gets no grad, q's is unchanged
    q2 = q.detach().clone().requires_grad_()
    k2 = k.detach().clone().requires_grad_()
    rome.apply_qk(q2, k2, cos, sin, m, backend=backend)[0].backward(dq)
    assert torch.equal(q2.grad, q.grad) and (k2.grad is None or not k2.grad.any())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_table_and_matrix_grads_against_float64_autograd(backend, dtype):
    """dcos, dsin (summed over broadcast dims) and dM against autograd through float64 v1/v3."""
    sections, mode = (16, 24, 24), "interleave"
    x = torch.randn(2, 3, 5, 64, device=DEVICE).to(dtype)
    c0, s0 = random_tables((2, 1, 5, 64))  # per-batch tables, broadcast over heads
    m0 = rome.rotation_matrix(sections, mode, device=DEVICE)
    dy = torch.randn(2, 3, 5, 64, device=DEVICE).to(dtype)

    cos, sin, m = (t.clone().requires_grad_() for t in (c0, s0, m0))
    rome.apply(x, cos, sin, m, backend=backend).backward(dy)

    c64, s64, m64 = (t.double().requires_grad_() for t in (c0, s0, m0))
    x64 = x.double()
    (x64 * c64 + (x64 @ m64) * s64).backward(dy.double())
    c_ref, s_ref = c0.double().requires_grad_(), s0.double().requires_grad_()
    slice_concat(x64, c_ref, s_ref, sections, mode).backward(dy.double())
    torch.testing.assert_close(c64.grad, c_ref.grad, rtol=0, atol=0)  # v3 and v1 agree exactly

    for got, want in ((cos.grad, c64.grad), (sin.grad, s64.grad), (m.grad, m64.grad)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_and_gradgradcheck_float64(mode):
    # small: gradgradcheck perturbs every input element, the matrix's included (two sections,
    # GQA k in another layout, tables broadcast over heads)
    sections = (2, 4)
    x = torch.randn(2, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    cos = torch.randn(2, 1, 3, 6, dtype=torch.float64, requires_grad=True)
    sin = torch.randn(2, 1, 3, 6, dtype=torch.float64, requires_grad=True)
    m = rome.rotation_matrix(sections, mode, dtype=torch.float64).requires_grad_()
    k = torch.randn(2, 3, 1, 6, dtype=torch.float64).transpose(1, 2).requires_grad_()

    def one(x, c, s, m):
        return rome.apply(x, c, s, m, backend="torch")

    def both(x, k, c, s, m):
        return rome.apply_qk(x, k, c, s, m, backend="torch")

    for f, args in ((one, (x, cos, sin, m)), (both, (x, k, cos, sin, m))):
        assert torch.autograd.gradcheck(f, args)
        assert torch.autograd.gradgradcheck(f, args)


def test_triton_double_backward_matches_torch():
    """The backward of the backward runs the forward kernel again."""
    sections, mode = (8, 8), "half"
    cos, sin = random_tables((5, 16))
    m = rome.rotation_matrix(sections, mode, device=DEVICE)
    x0, dy0, v = (torch.randn(2, 5, 16, device=DEVICE) for _ in range(3))
    results = []
    for backend in BACKENDS:
        x, dy = x0.clone().requires_grad_(), dy0.clone().requires_grad_()
        (gx,) = torch.autograd.grad(rome.apply(x, cos, sin, m, backend=backend), x, dy, create_graph=True)
        results.append(torch.autograd.grad(gx, dy, v)[0])
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)
    # d(dx)/d(dy) applied to v is the forward rotation of v
    torch.testing.assert_close(results[0], rome.apply(v, cos, sin, m), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_transposed_backends_agree(dtype):
    """The transpose of a signed permutation is one exact dot on dy and a gathered sin: like the
    forward, each backend is within 1 ulp of the exact dy*cos + (dy*sin) @ Mᵀ, and they agree bit
    for bit except at rounding ties."""
    sections, mode = (44, 44, 40), "half"
    dy = torch.randn(2, 3, 21, 128, device=DEVICE).to(dtype)
    cos, sin = random_tables((21, 128))
    m = rome.rotation_matrix(sections, mode, dtype=dtype, device=DEVICE)
    a = torch.ops.rome.apply_transposed(dy, cos, sin, m, "torch")
    b = torch.ops.rome.apply_transposed(dy, cos, sin, m, "triton")
    mt = m.double().mT
    want = dy.double() * cos.double() + (dy.double() * sin.double()) @ mt
    assert ulp_error(b, want, dtype).max() <= 1 and ulp_error(a, want, dtype).max() <= 1
    assert (a != b).float().mean() < 1e-3
