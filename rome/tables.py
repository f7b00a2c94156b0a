"""Positions and cos/sin tables laid out to match ``rotation_matrix(sections, mode)``.

Section i (size d_i) rotates by the angles ``positions[:, i] * theta_i ** (-2j / d_i)``, j < d_i/2:
the per-axis convention of HunyuanVideo, Wan, CogVideoX and rotary-embedding-torch. The angle
vector ``a`` of a section is laid out as ``[a0, a0, a1, a1, ...]`` for interleave (each pair
shares its angle) and ``[a, a]`` for half (column j and j + d/2 share theirs).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import torch
from einops import repeat

from .frequencies import base_inv_freq
from .matrices import check_mode, check_sections
from .positions import check_finite_positions
from .types import Mode

_LAYOUT = {"interleave": "s j -> s (j r)", "half": "s j -> s (r j)"}


def grid_positions(sizes: int | Sequence[int], *, device=None) -> torch.Tensor:
    """int64 ``[prod(sizes), len(sizes)]`` coordinates of a grid in C order (first axis slowest).

    ``grid_positions([t, h, w])[i] == (i // (h*w), i // w % h, i % w)``: the token order of a
    video latent flattened as ``(t h w)``.
    """
    if isinstance(sizes, int) and not isinstance(sizes, bool):
        sizes = (sizes,)
    if not isinstance(sizes, Sequence) or not sizes:
        raise ValueError(f"sizes must be a non-empty sequence of non-negative ints, got {sizes!r}")
    dims = []
    for i, n in enumerate(sizes):
        if isinstance(n, bool) or not hasattr(n, "__index__") or operator.index(n) < 0:
            raise ValueError(f"sizes[{i}] must be a non-negative int, got {n!r}")
        dims.append(torch.arange(operator.index(n), device=device))
    return torch.stack(torch.meshgrid(*dims, indexing="ij"), dim=-1).reshape(-1, len(dims))


def _thetas(theta, n: int) -> list[float]:
    if isinstance(theta, (str, bytes)):
        raise ValueError(f"theta must be a number or one per section, got {theta!r}")
    if isinstance(theta, torch.Tensor):  # (a tensor's values: 0-d one base, 1-d one per section)
        theta = theta.tolist() if theta.ndim == 1 else theta.item() if theta.ndim == 0 else theta
    values = list(theta) if isinstance(theta, Sequence) else [theta] * n
    if len(values) != n:
        raise ValueError(f"theta must be one float or one per section ({n}), got {len(values)}")
    for i, t in enumerate(values):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValueError(f"theta[{i}] must be a finite positive number, got {t!r}")
    return [float(t) for t in values]


FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # (also the ops' x dtypes)


def check_table_dtype(dtype) -> torch.dtype:
    """``dtype`` itself if tables can be in it (a floating dtype), else TypeError naming it."""
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be one of {[str(d) for d in FLOAT_DTYPES]} for cos/sin tables, got {dtype!r}")
    return dtype


def rope_angles(positions, sections, *, mode: Mode, theta=10000.0, device=None) -> torch.Tensor:
    """float64 ``[S, D]`` rotation angles, D = sum(sections), laid out for ``mode``."""
    sections = check_sections(sections)
    check_mode(mode)
    thetas = _thetas(theta, len(sections))
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be integer or floating, got {positions.dtype}")
    if positions.ndim == 1:
        if len(sections) != 1:
            raise ValueError(
                f"positions of shape {list(positions.shape)} ([S]) needs one section, got "
                f"sections={list(sections)}: pass positions of shape [S, {len(sections)}]"
            )
        positions = positions[:, None]
    if positions.ndim != 2 or positions.shape[1] != len(sections):
        raise ValueError(
            f"positions must be [S] or [S, {len(sections)}] for sections={list(sections)}, "
            f"got {list(positions.shape)}"
        )
    check_finite_positions(positions)
    pos = positions.to(torch.float64)
    parts = []
    for i, (d, t) in enumerate(zip(sections, thetas)):
        inv_freq = base_inv_freq(d, t, device=pos.device)
        parts.append(repeat(pos[:, i, None] * inv_freq, _LAYOUT[mode], r=2))
    return torch.cat(parts, dim=-1)


def rope_cos_sin(
    positions, sections, *, mode: Mode, theta=10000.0, dtype=torch.float32, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``[S, D]``, for ``rotation_matrix(sections, mode)``.

    ``positions`` is ``[S]`` (one section) or ``[S, len(sections)]``, integer or float, e.g.
    ``grid_positions([t, h, w])`` for 3D video RoPE. ``theta`` is one base or one per section.
    Angles are computed in float64 and rounded once to ``dtype``.
    """
    check_table_dtype(dtype)
    angles = rope_angles(positions, sections, mode=mode, theta=theta, device=device)
    return angles.cos().to(dtype), angles.sin().to(dtype)
