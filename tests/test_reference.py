import pytest
import torch

import rome
from rome.reference import exact, merged_matrix, per_section_matrices, slice_concat
from helpers import assert_rope_close, random_tables, tables

from conftest import DEVICE, MODES, SECTIONS


@pytest.mark.parametrize("sections", SECTIONS.values(), ids=SECTIONS.keys())
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_v1_v2_v3_agree_bitwise(sections, mode, dtype):
    """Each output of x @ M is one ±x term, so the three references round identically."""
    d = sum(sections)
    x = torch.randn(2, 3, 7, d, dtype=dtype, device=DEVICE)
    cos, sin = random_tables((7, d), dtype=dtype)
    m = rome.rotation_matrix(sections, mode, dtype=dtype, device=DEVICE)
    v1 = slice_concat(x, cos, sin, sections, mode)
    assert torch.equal(v1, per_section_matrices(x, cos, sin, sections, mode))
    assert torch.equal(v1, merged_matrix(x, cos, sin, m))


@pytest.mark.parametrize("sections", SECTIONS.values(), ids=SECTIONS.keys())
@pytest.mark.parametrize("mode", MODES)
def test_references_against_oracle(sections, mode):
    d = sum(sections)
    x = torch.randn(2, 5, d, dtype=torch.float64, device=DEVICE)
    cos, sin = tables(sections, mode, 5, dtype=torch.float64)
    torch.testing.assert_close(slice_concat(x, cos, sin, sections, mode), exact(x, cos, sin, sections, mode), rtol=0, atol=1e-14)


def test_reference_promotes_like_eager_torch():
    x = torch.randn(3, 8, dtype=torch.bfloat16, device=DEVICE)
    cos, sin = tables((8,), "half", 3)
    out = slice_concat(x, cos, sin, (8,), "half")  # fp32 tables: fp32 arithmetic, bf16 result
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, slice_concat(x.float(), cos, sin, (8,), "half").bfloat16())
    assert_rope_close(out, x, cos, sin, (8,), "half")
