import math

import pytest
import torch

import rome
from helpers import assert_rope_close

from conftest import DEVICE, optional

rotary_embedding_torch, needs_rotary_embedding_torch = optional("rotary_embedding_torch", "rotary-embedding-torch")


def test_grid_positions_c_order():
    t, h, w = 3, 4, 5
    g = rome.grid_positions([t, h, w])
    assert g.dtype == torch.int64 and g.shape == (t * h * w, 3)
    for i in range(t * h * w):
        assert g[i].tolist() == [i // (h * w), i // w % h, i % w]
    assert torch.equal(rome.grid_positions(7), torch.arange(7)[:, None])
    assert rome.grid_positions([2, 0]).shape == (0, 2)


def angles_by_hand(positions, sections, mode, theta):
    """The tables' definition with math.* on Python floats, element by element."""
    rows = []
    for p in positions:
        row = []
        for i, d in enumerate(sections):
            th = theta[i] if isinstance(theta, (list, tuple)) else theta
            a = [float(p[i]) * th ** (-2.0 * j / d) for j in range(d // 2)]
            row += [v for v in a for _ in range(2)] if mode == "interleave" else a + a
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("mode", ["interleave", "half"])
@pytest.mark.parametrize(
    "sections,theta", [((16, 24, 24), 10000.0), ((4, 6), [256.0, 10000.0]), ((8,), 500000.0)]
)
def test_tables_against_formula(mode, sections, theta):
    pos = torch.tensor([[0, 1, 2][: len(sections)], [5, 0, 7][: len(sections)], [31, 17, 3][: len(sections)]])
    want = angles_by_hand(pos.tolist(), sections, mode, theta)
    cos, sin = rome.rope_cos_sin(pos, sections, mode=mode, theta=theta, dtype=torch.float64)
    torch.testing.assert_close(cos, want.cos(), rtol=0, atol=1e-13)
    torch.testing.assert_close(sin, want.sin(), rtol=0, atol=1e-13)
    c32, s32 = rome.rope_cos_sin(pos, sections, mode=mode, theta=theta)
    assert c32.dtype == torch.float32
    assert torch.equal(c32, cos.float()) and torch.equal(s32, sin.float())  # rounded once


def test_one_dim_positions_and_float_positions():
    cos1, sin1 = rome.rope_cos_sin(torch.arange(6), 8, mode="half")
    cos2, sin2 = rome.rope_cos_sin(torch.arange(6.0)[:, None], [8], mode="half")
    assert torch.equal(cos1, cos2) and torch.equal(sin1, sin2)
    c, _ = rome.rope_cos_sin(torch.tensor([0.5]), [4], mode="half", dtype=torch.float64)
    assert math.isclose(c[0, 1].item(), math.cos(0.5 * 10000 ** (-0.5)), rel_tol=1e-15)


def test_table_dtype_and_device():
    cos, sin = rome.rope_cos_sin(torch.arange(3), 4, mode="half", dtype=torch.bfloat16, device="meta")
    assert cos.dtype == sin.dtype == torch.bfloat16 and cos.device.type == "meta"


def test_table_errors():
    with pytest.raises(ValueError, match=r"needs one section.*\[S, 3\]"):
        rome.rope_cos_sin(torch.arange(4), [4, 4, 4], mode="half")
    with pytest.raises(ValueError, match=r"positions must be \[S\] or \[S, 2\]"):
        rome.rope_cos_sin(torch.zeros(4, 3), [4, 4], mode="half")
    with pytest.raises(TypeError, match="positions must be integer or floating"):
        rome.rope_cos_sin(torch.ones(4, dtype=torch.bool), [4], mode="half")
    with pytest.raises(ValueError, match="one per section"):
        rome.rope_cos_sin(torch.zeros(4, 2), [4, 4], mode="half", theta=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="finite positive"):
        rome.rope_cos_sin(torch.zeros(4), [4], mode="half", theta=-1.0)
    with pytest.raises(ValueError, match="mode must be one of"):
        rome.rope_cos_sin(torch.zeros(4), [4], mode="rotate")
    with pytest.raises(ValueError, match="positive even"):
        rome.rope_cos_sin(torch.zeros(4), [5], mode="half")


# rotary-embedding-torch (a public RoPE library) rotates interleaved pairs with the same
# theta ** (-2j/d) frequencies; it computes its angles in fp32, hence the tolerances.


@needs_rotary_embedding_torch
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_matches_rotary_embedding_torch_1d(backend):
    s, d = 12, 32
    x = torch.randn(2, 3, s, d, device=DEVICE)
    want = rotary_embedding_torch.RotaryEmbedding(dim=d).to(DEVICE).rotate_queries_or_keys(x)
    cos, sin = rome.rope_cos_sin(torch.arange(s), d, mode="interleave", device=DEVICE)
    got = rome.apply(x, cos, sin, rome.rotation_matrix(d, "interleave", device=DEVICE), backend=backend)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_rotary_embedding_torch
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_matches_rotary_embedding_torch_axial_3d(backend):
    t, h, w, d = 2, 3, 4, 16  # three axes of 16: sections 16/16/16
    x = torch.randn(1, 2, t, h, w, 3 * d, device=DEVICE)
    freqs = rotary_embedding_torch.RotaryEmbedding(dim=d).to(DEVICE).get_axial_freqs(t, h, w)
    want = rotary_embedding_torch.apply_rotary_emb(freqs, x)
    cos, sin = rome.rope_cos_sin(rome.grid_positions([t, h, w]), [d, d, d], mode="interleave", device=DEVICE)
    m = rome.rotation_matrix([d, d, d], "interleave", device=DEVICE)
    got = rome.apply(x.flatten(2, 4), cos, sin, m, backend=backend)
    torch.testing.assert_close(got, want.flatten(2, 4), rtol=1e-5, atol=1e-5)


@needs_rotary_embedding_torch
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_partial_rotary_matches_rotary_embedding_torch(backend):
    """Partial rotary: rotate the first 32 of 64 dims; a zero block and cos=1, sin=0 pass the rest."""
    s, rot, d = 9, 32, 64
    x = torch.randn(2, 2, s, d, device=DEVICE)
    want = rotary_embedding_torch.RotaryEmbedding(dim=rot).to(DEVICE).rotate_queries_or_keys(x)
    c, sn = rome.rope_cos_sin(torch.arange(s), rot, mode="interleave", device=DEVICE)
    cos = torch.cat([c, torch.ones(s, d - rot, device=DEVICE)], -1)
    sin = torch.cat([sn, torch.zeros(s, d - rot, device=DEVICE)], -1)
    m = torch.block_diag(rome.interleave_matrix(rot), torch.zeros(d - rot, d - rot)).to(DEVICE)
    got = rome.apply(x, cos, sin, m, backend=backend)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[..., rot:], x[..., rot:])


def test_tables_rotate_like_complex_multiplication():
    """Interleaved tables rotate each pair (x0, x1) as the complex number x0 + i x1 by the angle."""
    sections = (8, 12)
    pos = rome.grid_positions([3, 5])
    x = torch.randn(4, 15, 20, dtype=torch.float64)
    cos, sin = rome.rope_cos_sin(pos, sections, mode="interleave", dtype=torch.float64)
    angles = rome.rope_angles(pos, sections, mode="interleave")[:, ::2]
    z = torch.view_as_complex(x.reshape(4, 15, 10, 2).contiguous()) * torch.polar(torch.ones_like(angles), angles)
    got = rome.apply(x, cos, sin, rome.rotation_matrix(sections, "interleave", dtype=torch.float64))
    torch.testing.assert_close(got, torch.view_as_real(z).reshape(4, 15, 20), rtol=1e-12, atol=1e-12)
    assert_rope_close(got, x, cos, sin, sections, "interleave")
