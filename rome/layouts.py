"""Column layouts: every RoPE variant as per-column frequencies, position axes and a matrix M.

Column j of a head of size D turns by ``pos[axis[j]] * inv_freq[j]`` (``pos`` a token's position
on each of ``n_axes`` axes), and ``out = x*cos + (x @ M)*sin`` with ``cos[j] = s*cos(angle_j)``,
``sin[j] = s*sin(angle_j)``, ``s`` the ``attention_scaling``. M is block-diagonal with one
``half``/``interleave`` block per rotary block (``rome.matrices``) and zeros for pass-through
columns (``inv_freq[j] == 0``), whose tables are exactly ``cos = 1``, ``sin = 0``: they come out
as x, unscaled. Columns that M pairs share their frequency and axis.

Builders: ``section_layout`` (multi-axis video RoPE, one block per axis, as ``rome.tables``),
``rope_layout`` (1D RoPE with any ``Frequencies``, partial rotary included), ``mrope_layout``
(Qwen2/2.5-VL mRoPE, Qwen3-VL interleaved mRoPE) and ``axial_layout`` (Qwen2-VL's vision tower).
Tables: ``cos_sin_cache`` (``[P, D]``, one row per position value) and ``tables_for_positions``
(per-token tables gathered from it), with ``angles_for_positions`` as the float64 oracle.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from einops import repeat

from .frequencies import Frequencies, _describe, _number, _positive_int, base_inv_freq
from .matrices import check_mode, check_sections, rotation_matrix
from .positions import axes_last, check_finite_positions
from .tables import _thetas, check_table_dtype
from .types import Mode

BLOCK_MODES = ("half", "interleave", "none")
_LAYOUT = {"interleave": "j -> (j r)", "half": "j -> (r j)"}


def _partners(blocks) -> torch.Tensor:
    """int64 ``[D]``: the column each column is rotated with (itself in a ``none`` block)."""
    parts, offset = [], 0
    for mode, d in blocks:
        j = torch.arange(d)
        if mode == "interleave":
            j = j ^ 1
        elif mode == "half":
            j = (j + d // 2) % d
        parts.append(offset + j)
        offset += d
    return torch.cat(parts)


@dataclass(frozen=True, eq=False)
class RopeLayout:
    """Per-column frequencies and axes of a RoPE, and the blocks of its matrix.

    ``inv_freq``: float64 ``[D]`` (0: pass-through). ``axis``: int64 ``[D]`` in ``[0, n_axes)``.
    ``blocks``: ``(mode, size)`` pairs, mode in ``BLOCK_MODES``, sizes summing to D.
    ``attention_scaling``: multiplied into cos and sin of the rotated columns.
    """

    inv_freq: torch.Tensor
    axis: torch.Tensor
    n_axes: int
    blocks: tuple[tuple[str, int], ...]
    attention_scaling: float = 1.0

    def __post_init__(self):
        inv, axis = self.inv_freq, self.axis
        if not isinstance(inv, torch.Tensor) or inv.dtype != torch.float64 or inv.ndim != 1:
            raise TypeError(f"inv_freq must be a 1-D float64 tensor, got {_describe(inv)}")
        if (
            not isinstance(axis, torch.Tensor)
            or axis.dtype != torch.int64
            or axis.shape != inv.shape
        ):
            raise TypeError(
                f"axis must be an int64 tensor of inv_freq's shape {list(inv.shape)}, got "
                f"{_describe(axis)}"
            )
        inv, axis = inv.detach().to("cpu", copy=True), axis.detach().to("cpu", copy=True)
        if not bool(torch.isfinite(inv).all()) or bool((inv < 0).any()):
            raise ValueError(f"inv_freq must be finite and >= 0, got {inv.tolist()}")
        n_axes = _positive_int(self.n_axes, "n_axes")
        if axis.numel() and (int(axis.min()) < 0 or int(axis.max()) >= n_axes):
            raise ValueError(
                f"axis values must be in [0, {n_axes}), got {sorted(set(axis.tolist()))}"
            )
        try:
            blocks = tuple((m, operator.index(d)) for m, d in self.blocks)
        except (TypeError, ValueError):
            raise ValueError(f"blocks must be (mode, size) pairs, got {self.blocks!r}") from None
        for i, (m, d) in enumerate(blocks):
            if m not in BLOCK_MODES or d <= 0 or (m != "none" and d % 2):
                raise ValueError(
                    f"blocks[{i}] must be (mode in {BLOCK_MODES}, positive size, even unless "
                    f"'none'), got {(m, d)}"
                )
        if sum(d for _, d in blocks) != inv.numel():
            raise ValueError(f"block sizes {[d for _, d in blocks]} must sum to D = {inv.numel()}")
        partner = _partners(blocks)
        rotated = inv != 0
        bad = (inv[partner] != inv) | (rotated & (axis[partner] != axis))
        if bad.any():
            j = int(bad.nonzero()[0])
            k = int(partner[j])
            raise ValueError(
                f"columns {j} and {k} rotate together but have inv_freq {inv[j].item()} vs "
                f"{inv[k].item()} and axis {int(axis[j])} vs {int(axis[k])}"
            )
        if bool((rotated & (partner == torch.arange(inv.numel()))).any()):
            raise ValueError("columns of a 'none' block must have inv_freq 0")
        scaling = _number(self.attention_scaling, "attention_scaling", positive=True)
        object.__setattr__(self, "inv_freq", inv)
        object.__setattr__(self, "axis", axis)
        object.__setattr__(self, "n_axes", n_axes)
        object.__setattr__(self, "blocks", blocks)
        object.__setattr__(self, "attention_scaling", scaling)

    @property
    def head_dim(self) -> int:
        return self.inv_freq.numel()

    @property
    def passthrough(self) -> torch.Tensor:
        """bool ``[D]``: the columns that come out unchanged (frequency 0)."""
        return self.inv_freq == 0

    def matrix(self, dtype=torch.float32, device=None) -> torch.Tensor:
        """D×D signed permutation M (``x @ M`` rotates), zero on the pass-through columns."""
        parts = [
            torch.zeros(d, d, dtype=dtype, device=device) if m == "none"
            else rotation_matrix(d, m, dtype=dtype, device=device)
            for m, d in self.blocks
        ]
        out = torch.block_diag(*parts)
        still = self.passthrough.to(out.device)
        return out.masked_fill_(still[:, None] | still[None, :], 0)

    def __repr__(self) -> str:
        return (
            f"RopeLayout(head_dim={self.head_dim}, n_axes={self.n_axes}, "
            f"blocks={list(self.blocks)}, attention_scaling={self.attention_scaling})"
        )


def _columns(inv: torch.Tensor, mode: str) -> torch.Tensor:
    """Pair values ``[d/2]`` over d columns: ``[f, f]`` (half) or ``[f0, f0, f1, ...]``."""
    return repeat(inv, _LAYOUT[mode], r=2)


def _check_frequencies(freqs) -> Frequencies:
    if not isinstance(freqs, Frequencies):
        raise TypeError(f"freqs must be rome.frequencies.Frequencies, got {type(freqs).__name__}")
    return freqs


def _pad(columns: torch.Tensor, axis: torch.Tensor, blocks: list, head_dim: int):
    """Append ``head_dim - len(columns)`` pass-through columns (frequency 0, axis 0)."""
    rest = head_dim - columns.numel()
    if rest:
        columns = torch.cat([columns, torch.zeros(rest, dtype=torch.float64)])
        axis = torch.cat([axis, torch.zeros(rest, dtype=torch.int64)])
        blocks = [*blocks, ("none", rest)]
    return columns, axis, tuple(blocks)


def section_layout(sections, *, mode: Mode, theta=10000.0) -> RopeLayout:
    """Multi-axis RoPE, one ``mode`` block per section: section i reads axis i and turns pair k by
    ``theta_i ** (-2k / d_i)``. Column for column the angles of ``rome.tables.rope_angles``."""
    sections = check_sections(sections)
    check_mode(mode)
    thetas = _thetas(theta, len(sections))
    inv = torch.cat([_columns(base_inv_freq(d, t), mode) for d, t in zip(sections, thetas)])
    axis = torch.cat([torch.full((d,), i, dtype=torch.int64) for i, d in enumerate(sections)])
    return RopeLayout(inv, axis, len(sections), tuple((mode, d) for d in sections))


def rope_layout(freqs: Frequencies, *, mode: Mode = "half") -> RopeLayout:
    """1D RoPE (``half``: Llama/NeoX ``rotate_half``; ``interleave``: GPT-J): the first
    ``freqs.rotary_dim`` columns rotate, the rest of ``freqs.head_dim`` pass through."""
    freqs = _check_frequencies(freqs)
    check_mode(mode)
    columns = _columns(freqs.inv_freq, mode)
    axis = torch.zeros(columns.numel(), dtype=torch.int64)
    columns, axis, blocks = _pad(columns, axis, [(mode, freqs.rotary_dim)], freqs.head_dim)
    return RopeLayout(columns, axis, 1, blocks, freqs.attention_scaling)


def mrope_axes(mrope_section: Sequence[int], *, interleaved: bool = False) -> torch.Tensor:
    """int64 ``[sum(mrope_section)]``: the axis each frequency index reads.

    Contiguous (Qwen2/2.5-VL): index chunks of sizes ``mrope_section`` go to axes 0, 1, 2, ...
    Interleaved (Qwen3-VL, transformers' ``recomposition_frequencies``): index i reads axis
    ``a = i % A`` when ``a > 0`` and ``i < A * mrope_section[a]``, else axis 0 (t).
    """
    if (
        isinstance(mrope_section, (str, torch.Tensor))
        or not isinstance(mrope_section, Sequence)
        or not mrope_section
    ):
        raise ValueError(
            f"mrope_section must be a non-empty sequence of ints, got {mrope_section!r}"
        )
    for i, s in enumerate(mrope_section):
        if isinstance(s, bool) or not isinstance(s, numbers.Integral) or s < 0:
            raise ValueError(f"mrope_section[{i}] must be a non-negative int, got {s!r}")
    sections = [operator.index(s) for s in mrope_section]
    n, a = sum(sections), len(sections)
    if not interleaved:
        return torch.cat([torch.full((s,), i, dtype=torch.int64) for i, s in enumerate(sections)])
    i = torch.arange(n)
    lengths = torch.tensor(sections)[i % a] * a
    axis = torch.where((i % a > 0) & (i < lengths), i % a, 0)
    # transformers applies this rule whatever the sections (e.g. [2, 3, 3] over 8 frequencies
    # gives the axes 3, 3, 2 frequencies): so does rome, rather than refuse a config it accepts
    return axis


def mrope_layout(
    freqs: Frequencies, mrope_section: Sequence[int], *, interleaved: bool = False
) -> RopeLayout:
    """Multimodal RoPE (Qwen2-VL): one frequency set over the rotary columns, one global half
    rotation (columns k and k + rotary_dim/2 share frequency k), frequency k reading the axis
    ``mrope_axes(mrope_section, interleaved=...)[k]``; ``sum(mrope_section) == rotary_dim / 2``.
    Columns past ``freqs.rotary_dim`` pass through (Qwen3.5's partial rotary)."""
    freqs = _check_frequencies(freqs)
    n = freqs.inv_freq.numel()
    axis = mrope_axes(mrope_section, interleaved=interleaved)
    if axis.numel() != n:
        raise ValueError(
            f"mrope_section={list(mrope_section)} must sum to rotary_dim/2 = {n} (sum is "
            f"{axis.numel()})"
        )
    axis = _columns(axis, "half")
    columns, axis, blocks = _pad(
        _columns(freqs.inv_freq, "half"), axis, [("half", freqs.rotary_dim)], freqs.head_dim
    )
    return RopeLayout(columns, axis, len(mrope_section), blocks, freqs.attention_scaling)


def axial_layout(freqs: Frequencies, *, n_axes: int = 2) -> RopeLayout:
    """Axial RoPE inside one half rotation (Qwen2-VL's ``VisionRotaryEmbedding``): every axis
    turns by the same ``freqs`` (of ``D / n_axes`` columns), the half vector is
    ``[f(pos_0), f(pos_1), ...]`` and the head ``cat(half, half)``; D = 2 * n_axes * len(inv_freq).
    For Qwen2-VL's vision tower: ``rope_frequencies(head_dim // 2, theta=10000.0)``."""
    freqs = _check_frequencies(freqs)
    n_axes = _positive_int(n_axes, "n_axes")
    if freqs.rotary_dim != freqs.head_dim:
        raise ValueError(
            f"axial_layout needs frequencies without pass-through columns, got rotary_dim="
            f"{freqs.rotary_dim} of head_dim={freqs.head_dim}"
        )
    n = freqs.inv_freq.numel()
    half = freqs.inv_freq.repeat(n_axes)
    axis = torch.arange(n_axes).repeat_interleave(n)
    blocks = (("half", 2 * n * n_axes),)
    return RopeLayout(
        _columns(half, "half"), _columns(axis, "half"), n_axes, blocks, freqs.attention_scaling
    )


def _check_layout(layout) -> RopeLayout:
    if not isinstance(layout, RopeLayout):
        raise TypeError(f"layout must be a RopeLayout, got {type(layout).__name__}")
    return layout


def _cos_sin(angles: torch.Tensor, layout: RopeLayout, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables from float64 angles ``[..., D]``: scaled on the rotated columns, 1/0 on the others,
    rounded once to ``dtype``."""
    check_table_dtype(dtype)
    rotated = ~layout.passthrough.to(angles.device)
    s = layout.attention_scaling
    cos = torch.where(rotated, angles.cos() * s, 1.0)
    sin = torch.where(rotated, angles.sin() * s, 0.0)
    return cos.to(dtype), sin.to(dtype)


def cos_sin_cache(
    layout: RopeLayout, max_positions: int, *, dtype=torch.float32, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)``, each ``[max_positions, D]``: row p holds every column at position value p,
    ``cache[p, j] = s * cos(p * inv_freq[j])`` (float64 angles, rounded once to ``dtype``)."""
    _check_layout(layout)
    max_positions = _positive_int(max_positions, "max_positions")
    p = torch.arange(max_positions, dtype=torch.float64, device=device)
    angles = p[:, None] * layout.inv_freq.to(p.device)
    return _cos_sin(angles, layout, dtype)


def _positions(layout: RopeLayout, positions, axes_dim) -> torch.Tensor:
    """positions moved to ``[S, A]`` or ``[B, S, A]``.

    Without ``axes_dim``: ``[S]``/``[B, S]`` for one axis, ``[S, A]``/``[B, S, A]`` for several.
    ``axes_dim=d``: dimension d indexes the axes (``axes_dim=0`` for transformers' ``[3, B, S]``).
    """
    if not isinstance(positions, torch.Tensor):
        raise TypeError(f"positions must be a tensor, got {type(positions).__name__}")
    a, shape = layout.n_axes, list(positions.shape)
    if axes_dim is None:
        if a == 1:
            if positions.ndim not in (1, 2):
                raise ValueError(
                    f"positions for a 1-axis layout must be [S] or [B, S], got {shape}"
                )
            return positions[..., None]
        if positions.ndim not in (2, 3) or shape[-1] != a:
            raise ValueError(
                f"positions for a {a}-axis layout must be [S, {a}] or [B, S, {a}] (or pass "
                f"axes_dim), got {shape}"
            )
        return positions
    positions = axes_last(positions, a, axes_dim)
    if positions.ndim not in (2, 3):
        raise ValueError(
            f"positions must be [S, A] or [B, S, A] once axes_dim is moved last, got {shape}"
        )
    return positions


def tables_for_positions(
    layout: RopeLayout, cache, positions: torch.Tensor, *, axes_dim: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(cos, sin)``, each ``[S, D]`` or ``[B, S, D]``, by indexing the cache:
    ``cos[..., s, j] = cache_cos[positions[..., s, axis[j]], j]``.

    ``positions``: integer, ``[S]``/``[B, S]`` (one axis), ``[S, A]``/``[B, S, A]``, or any layout
    with the axes at ``axes_dim`` (transformers' mRoPE ``[3, B, S]``: ``axes_dim=0``).
    """
    _check_layout(layout)
    if (
        not isinstance(cache, (tuple, list))
        or len(cache) != 2
        or not all(isinstance(t, torch.Tensor) for t in cache)
    ):
        raise TypeError(
            f"cache must be a (cos, sin) pair of tensors from cos_sin_cache, got "
            f"{type(cache).__name__}"
        )
    cos, sin = cache
    if (
        cos.ndim != 2
        or cos.shape != sin.shape
        or cos.shape[1] != layout.head_dim
        or cos.device != sin.device
    ):
        raise ValueError(
            f"cache must be (cos, sin) of shape [P, {layout.head_dim}] on one device, got "
            f"{list(cos.shape)} and {list(sin.shape)}"
        )
    pos = _positions(layout, positions, axes_dim)
    if pos.dtype == torch.bool or pos.is_floating_point() or pos.is_complex():
        raise TypeError(f"positions must be an integer tensor, got {pos.dtype}")
    p = cos.shape[0]
    if pos.numel():
        lo, hi = int(pos.min()), int(pos.max())
        if lo < 0:
            raise ValueError(f"positions must be >= 0, got min {lo}")
        if hi >= p:
            raise ValueError(f"positions must be < {p} (the cache's rows), got max {hi}")
    index = pos.to(cos.device, torch.int64)[..., layout.axis.to(cos.device)]
    columns = torch.arange(layout.head_dim, device=cos.device)
    return cos[index, columns], sin[index, columns]


def angles_for_positions(
    layout: RopeLayout, positions: torch.Tensor, *, axes_dim: int | None = None
) -> torch.Tensor:
    """float64 oracle ``[..., S, D]``: ``positions[..., s, axis[j]] * inv_freq[j]`` (float
    positions allowed; shapes as in ``tables_for_positions``)."""
    _check_layout(layout)
    pos = _positions(layout, positions, axes_dim)
    if pos.dtype == torch.bool or pos.is_complex():
        raise TypeError(f"positions must be integer or floating, got {pos.dtype}")
    if pos.device.type == "cpu":  # (a per-call path: on a device the check would sync every call;
        # rome.RoPE checks its positions once per tensor, the table builders theirs)
        check_finite_positions(pos)
    pos = pos.to(torch.float64)
    return pos[..., layout.axis.to(pos.device)] * layout.inv_freq.to(pos.device)


def cos_sin_for_positions(
    layout: RopeLayout, positions: torch.Tensor, *, axes_dim: int | None = None, dtype=torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token tables straight from ``angles_for_positions`` (no cache; float positions
    allowed), scaled and rounded as ``cos_sin_cache``: for integer positions, bitwise the tables
    ``tables_for_positions`` gathers."""
    return _cos_sin(angles_for_positions(layout, positions, axes_dim=axes_dim), layout, dtype)
