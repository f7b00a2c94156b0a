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


@pytest.mark.parametrize("d", [6, 34, 80, 96, 130, 160, 188, 200, 256])
@pytest.mark.parametrize("kind", ["rotation", "dense"])
def test_every_head_dim_against_float64(d, kind):
    """D that is not a power of two pads to BLOCK_D with more column panels than ceil(D/panel):
    the block mask once used ceil(D/64) panels, dropping the product for columns 64-127 at
    128 < D <= 192 (the fuzz suite found it). Forward and backward, within the stated bound."""
    g = torch.Generator().manual_seed(d)
    if kind == "rotation":
        m = rome.rotation_matrix([d // 2 - d // 2 % 2, d - (d // 2 - d // 2 % 2)], "interleave")
    else:
        m = torch.randn(d, d, generator=g, dtype=torch.float64).float() / d**0.5
    x, dy = (torch.randn(3, d, generator=g) for _ in range(2))
    cos, sin = torch.randn(3, d, generator=g), torch.randn(3, d, generator=g)
    m, x, dy, cos, sin = (t.to(DEVICE) for t in (m, x, dy, cos, sin))
    xd, cd, sd, md = (t.double() for t in (x, cos, sin, m))
    for fwd in (True, False):
        if fwd:
            out = rome.apply(x, cos, sin, m, backend="triton")
            want, mag = xd * cd + (xd @ md) * sd, (xd * cd).abs() + (xd.abs() @ md.abs()) * sd.abs()
        else:
            out = torch.ops.rome.apply_transposed(dy, cos, sin, m, "triton")
            dd = dy.double()
            want, mag = dd * cd + (dd * sd) @ md.mT, (dd * cd).abs() + (dd * sd).abs() @ md.abs().mT
        if kind == "rotation":
            assert ulp_error(out, want, torch.float32).max() <= 1, (fwd, d)
        else:  # IEEE dot of d products: d·u·magnitude
            err = (out.double() - want).abs()
            assert (err <= (d + 4) * 2.0**-24 * mag + 1e-30).all(), (fwd, d, err.max().item())
