"""Kernel-side defects of issue 9: fp16 backward rows of NaN (item 2) and bf16 subnormals under
the interpreter (item 5). Each failed on the kernel before the panel/gather rewrite."""

import pytest
import torch

import rome
from rome.precision import ulp_error

from conftest import DEVICE


def test_fp16_backward_large_dy_sin_is_finite():
    """|dy*sin| > 65504 with an exact dx that fits fp16: the old kernel split dy*sin into fp16
    pieces, whose first overflowed to inf and turned the row into NaN."""
    m = rome.half_matrix(2, dtype=torch.float16, device=DEVICE)
    # dx = [a*c + b*s, b*c - a*s] with |a*s| ~ 65577 > 65504 but both results within fp16's range
    dy = torch.tensor([[29800.0, 1000.0]], dtype=torch.float16, device=DEVICE)
    cos = torch.tensor([[0.3, 0.3]], device=DEVICE)
    sin = torch.tensor([[2.2, 2.2]], device=DEVICE)  # |sin| > 1: YaRN-style scaled tables
    for backend in ("torch", "triton"):
        dx = torch.ops.rome.apply_transposed(dy, cos, sin, m, backend)
        want = dy.double() * cos.double() + (dy.double() * sin.double()) @ m.double().mT
        assert torch.isfinite(dx).all(), (backend, dx)
        assert ulp_error(dx, want, torch.float16).max() <= 1, (backend, dx, want)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bf16_subnormals_pass_through_exactly(backend):
    """cos = 1, sin = 0 returns x bit for bit, subnormals included (the interpreter's own
    bf16 <-> fp32 conversion got them wrong; the kernel moves raw bits there)."""
    x = torch.tensor([[1e-40, -5e-39, 1e-39, 2e-38]], dtype=torch.bfloat16, device=DEVICE)
    m = rome.half_matrix(4, dtype=torch.bfloat16, device=DEVICE)
    cos, sin = torch.ones(1, 4, device=DEVICE), torch.zeros(1, 4, device=DEVICE)
    assert torch.equal(rome.apply(x, cos, sin, m, backend=backend), x)
    # and in a rotation: tiny x times an fp32 table, within 1 ulp of the exact value
    cos2 = torch.full((1, 4), 0.75, device=DEVICE)
    sin2 = torch.full((1, 4), 0.5, device=DEVICE)
    out = rome.apply(x, cos2, sin2, m, backend=backend)
    want = x.double() * 0.75 + (x.double() @ m.double()) * 0.5
    assert ulp_error(out, want, torch.bfloat16).max() <= 1
