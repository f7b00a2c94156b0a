"""Plain-torch RoPE references, shared by the tests and the benchmarks (seed 004's v1, v2, v3).

They compute the way a model does in eager torch: arithmetic in torch's promoted dtype of x and
the tables (bf16 tables with bf16 x stay in bf16, fp32 tables promote to fp32), the result cast
back to x's dtype. ``cos``/``sin`` are full-width ``[..., D]`` tables that broadcast against x.
"""

from __future__ import annotations

import torch
from einops import rearrange

from .matrices import check_mode, check_sections, rotation_matrix
from .types import Mode


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """NeoX/Llama rotation: cat(x1, x2) -> cat(-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """GPT-J rotation: pairs (x0, x1) -> (-x1, x0)."""
    x1, x2 = rearrange(x, "... (d j) -> j ... d", j=2)
    return rearrange(torch.stack((-x2, x1)), "j ... d -> ... (d j)")


ROTATE = {"interleave": rotate_every_two, "half": rotate_half}


def _compute_dtype(x: torch.Tensor, cos: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, cos.dtype)


def slice_concat(x, cos, sin, sections, mode: Mode) -> torch.Tensor:
    """v1: split x and the tables per section, rotate each slice, concatenate."""
    sections, rotate = check_sections(sections), ROTATE[check_mode(mode)]
    parts = [
        xs * cs + rotate(xs) * ss
        for xs, cs, ss in zip(
            x.split(sections, -1), cos.split(sections, -1), sin.split(sections, -1)
        )
    ]
    return torch.cat(parts, dim=-1).to(x.dtype)


def per_section_matrices(x, cos, sin, sections, mode: Mode) -> torch.Tensor:
    """v2: one rotation matrix per section, applied slice by slice, then concatenated."""
    sections = check_sections(sections)
    dt = _compute_dtype(x, cos)
    parts = []
    for xs, cs, ss, d in zip(
        x.split(sections, -1), cos.split(sections, -1), sin.split(sections, -1), sections
    ):
        m = rotation_matrix(d, mode, dtype=dt, device=x.device)
        xs = xs.to(dt)
        parts.append(xs * cs + (xs @ m) * ss)
    return torch.cat(parts, dim=-1).to(x.dtype)


def merged_matrix(x, cos, sin, matrix) -> torch.Tensor:
    """v3: ``x*cos + (x @ M)*sin`` with the one block-diagonal matrix, in eager torch."""
    dt = _compute_dtype(x, cos)
    xc = x.to(dt)
    return (xc * cos + (xc @ matrix.to(dt)) * sin).to(x.dtype)


def rotate_index(sections, mode: Mode) -> tuple[torch.Tensor, torch.Tensor]:
    """``(index, sign)`` with ``rotate(x)[..., j] == sign[j] * x[..., index[j]]``, by arithmetic
    on column numbers alone (independent of the matrices and of the einops rotations)."""
    sections, mode = check_sections(sections), check_mode(mode)
    index, sign, offset = [], [], 0
    for d in sections:
        for j in range(d):
            if mode == "interleave":
                partner, negative = j ^ 1, j % 2 == 0
            else:
                partner, negative = (j + d // 2) % d, j < d // 2
            index.append(offset + partner)
            sign.append(-1.0 if negative else 1.0)
        offset += d
    return torch.tensor(index), torch.tensor(sign, dtype=torch.float64)


def exact(x, cos, sin, sections, mode: Mode, *, magnitude: bool = False):
    """float64 oracle ``x*cos + rotate(x)*sin`` from x and the tables as given.

    With ``magnitude=True``: ``(value, |x*cos| + |rotate(x)*sin|)``, the second the size of the
    two terms whose cancellation fp32 arithmetic cannot resolve (``rome.precision.tolerance``).
    """
    index, sign = rotate_index(sections, mode)
    x64, c64, s64 = x.double(), cos.double(), sin.double()
    first, second = x64 * c64, x64[..., index.to(x.device)] * sign.to(x.device) * s64
    if magnitude:
        return first + second, first.abs() + second.abs()
    return first + second
