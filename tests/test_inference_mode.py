"""A first call under ``torch.inference_mode()`` leaves nothing behind that breaks a later call
outside it: kept scratch and memoized matrices are ordinary tensors (an inference tensor can be
neither written outside inference mode nor saved for a backward). Each test empties the memo it
covers first, so it fails without the fix whatever ran before it."""

import pytest
import torch

import rome
from rome import torch_backend

from conftest import DEVICE


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def _reference(x, cos, sin, m):
    """The formula itself, in float64: x*cos + (x @ M)*sin."""
    xd = x.detach().double()
    return (xd * cos.double() + (xd @ m.double()) * sin.double())


@pytest.fixture
def fresh_scratch():
    torch_backend._Work._kept.__dict__.clear()
    yield
    torch_backend._Work._kept.__dict__.clear()


def test_torch_backend_scratch_kept_under_inference_mode(fresh_scratch):
    """float32 tables with float64 x go through the kept float64 scratch (float32 x is
    converted in it): its first allocation under inference_mode must serve later calls."""
    cos, sin = rome.rope_cos_sin(torch.arange(4), (8,), mode="interleave", device="cpu")
    m = rome.rotation_matrix(8, "interleave")
    x = torch.randn(4, 8)
    with torch.inference_mode():
        rome.apply(x, cos, sin, m, backend="torch")
    out = rome.apply(x, cos, sin, m, backend="torch")  # raised "Inplace update to inference tensor"
    torch.testing.assert_close(out.double(), _reference(x, cos, sin, m), rtol=1e-6, atol=1e-6)
    xg = x.clone().requires_grad_()
    (g,) = torch.autograd.grad(rome.apply(xg, cos, sin, m, backend="torch").sum(), xg)
    # d/dx sum(x*c + (x@M)*s) = c + s @ M^T
    torch.testing.assert_close(g.double(), cos.double() + sin.double() @ m.double().T, rtol=1e-6, atol=1e-6)
