"""torch.library registration: opcheck, fake impls with the real strides, torch.compile."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rome
from helpers import random_tables

from conftest import BACKENDS, DEVICE


def inputs(requires_grad=True):
    m = rome.rotation_matrix([8, 8], "half", device=DEVICE)
    q = torch.randn(2, 3, 5, 16, device=DEVICE, requires_grad=requires_grad)
    k = torch.randn(2, 5, 1, 16, device=DEVICE).transpose(1, 2).requires_grad_(requires_grad)
    cos, sin = random_tables((5, 16))
    return q, k, cos, sin, m


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    q, k, cos, sin, m = inputs()
    for op in (torch.ops.rome.apply.default, torch.ops.rome.apply_transposed.default):
        torch.library.opcheck(op, (q, cos, sin, m, backend))
        torch.library.opcheck(op, (k, cos.requires_grad_(), sin, m, backend))
    for op in (torch.ops.rome.apply_qk.default, torch.ops.rome.apply_qk_transposed.default):
        torch.library.opcheck(op, (q, k, cos, sin, m, backend))


@pytest.mark.parametrize("make_x", [
    lambda: torch.randn(2, 5, 3, 16).transpose(1, 2),        # dense, permuted: kept
    lambda: torch.randn(2, 3, 10, 16)[:, :, ::2],            # strided slice: contiguous out
    lambda: torch.randn(2, 3, 16, 5).transpose(-1, -2),      # last stride 5: contiguous out
    lambda: torch.randn(1, 3, 5, 16).expand(2, -1, -1, -1),  # expanded: contiguous out
])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fake_impl_has_real_strides(make_x, backend):
    x = make_x().to(DEVICE)
    cos, sin = random_tables((5, 16))
    m = rome.half_matrix(16, device=DEVICE)
    real = torch.ops.rome.apply(x, cos, sin, m, backend)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = torch.ops.rome.apply(*(mode.from_tensor(t) for t in (x, cos, sin, m)), backend)
    assert fake.shape == real.shape and fake.stride() == real.stride() and fake.dtype == real.dtype


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fullgraph_forward_and_backward(compiler, backend):
    """User code around rome.apply / apply_qk traces with no graph break, grads included."""
    def layer(q, k, cos, sin, m):
        q_out, k_out = rome.apply_qk(q * 2, k, cos, sin, m, backend=backend)
        return (q_out.sum(-1) * rome.apply(k_out, cos, sin, m, backend=backend).mean(-1)).sum()

    compiled = torch.compile(layer, fullgraph=True, backend=compiler)
    q, k, cos, sin, m = inputs()
    got = compiled(q, k, cos, sin, m)
    got.backward()
    grads = q.grad, k.grad
    q2, k2 = (t.detach().clone().requires_grad_() for t in (q, k))
    want = layer(q2, k2, cos, sin, m)
    want.backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(grads[0], q2.grad)
    torch.testing.assert_close(grads[1], k2.grad)


def test_compile_errors_surface_at_trace_time():
    compiled = torch.compile(lambda x, c, s, m: rome.apply(x, c, s, m), fullgraph=True, backend="aot_eager")
    x, cos, sin, m = torch.randn(2, 5, 16), torch.randn(5, 16), torch.randn(5, 16), torch.randn(16, 8)
    with pytest.raises(Exception, match=r"matrix must be \[D, D\] = \[16, 16\]"):
        compiled(x, cos, sin, m)
