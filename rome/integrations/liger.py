"""Liger-Kernel's RoPE calls on rome's op: ``liger_rotary_pos_emb`` and
``liger_rotary_pos_emb_vision`` (``liger_kernel.transformers.rope``), Liger not needed.

    from rome.integrations.liger import liger_rotary_pos_emb
    q_rot, k_rot = liger_rotary_pos_emb(q, k, cos, sin)     # q [B, Hq, S, D], k [B, Hk, S, D]

What Liger takes: transformers' tables ``cos``/``sin`` ``[1, S, D']`` or ``[B, S, D']``, or 2-D
``[S, D']`` (its vision path), where ``D'`` is transformers' table width for head_dim D:
``2 * ceil(D / 2)`` (``cat(freqs, freqs)`` over ``arange(0, D, 2)``: 42 for D = 41) or D.
Liger's kernel reads the first ``D // 2`` columns of each table row as the per-pair values and
rotates the pairs ``(j, j + D // 2)``, ``j < D // 2`` (NeoX halves); for an odd D the last
column passes through unchanged. ``position_ids`` is not used (the positions are already in the
tables) and q/k are read as ``[B, H, S, D]`` — transformers' ``unsqueeze_dim=1``; rome also
takes ``unsqueeze_dim=2`` for ``[B, S, H, D]`` q/k (Liger's kernel would misread those).

How: those half-width columns widened to rome's per-column tables (``rome.integrations.
_halfwidth``'s rule) and one ``rome.apply_qk`` with the rotation matrix of the first
``2 * (D // 2)`` columns (a zero block for the odd column). Computed in float32 and rounded
once to q's dtype; Liger computes in the tables' dtype (bf16 tables: bf16 products), so with
bf16/fp16 tables rome is the more accurate (``rounding="exact"``, the default). ``rounding="native"``:
the bits of transformers' eager ``apply_rotary_pos_emb``, the reference Liger's kernel replaces,
for tables in q's dtype, as transformers' rotary modules return them (the tables rounded to q's
dtype, each product and the sum rounded to it; with float32 tables and half q the eager function
promotes to a float32 result, where rome returns q's dtype, as Liger's kernel does);
``liger_rotary_pos_emb_vision`` then gives those of Qwen's ``apply_rotary_pos_emb_vision`` (float32
products and sum, one rounding to q's dtype). Differentiable in q, k and the first ``D // 2``
columns of cos/sin (Liger gives cos/sin no gradient). Returns new tensors (Liger's kernel
writes into contiguous copies of q and k and returns those: new tensors too).

Differences: a 2-D table with ``B > 1`` broadcasts over the batch (Liger's kernel reads past
the table); shapes that do not fit raise ``ValueError`` naming the argument.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_rounding
from ..ops import apply_qk
from ..types import Backend, Rounding
from . import _halfwidth

__all__ = ["liger_rotary_pos_emb", "liger_rotary_pos_emb_vision"]


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _columns(t: Tensor, head_dim: int) -> Tensor:
    """Liger's per-pair values ``t[..., :D // 2]`` as rome's columns ``[..., D]``: pair j on
    columns j and j + D // 2; for an odd D the last column gets 1 (cos) / 0 (sin) via ``pad``."""
    half = t[..., : head_dim // 2]
    return torch.cat([half, half], dim=-1)


def _tables(cos: Tensor, sin: Tensor, head_dim: int):
    c, s = _columns(cos, head_dim), _columns(sin, head_dim)
    if head_dim % 2:
        one = torch.ones(*c.shape[:-1], 1, dtype=c.dtype, device=c.device)
        c, s = torch.cat([c, one], -1), torch.cat([s, torch.zeros_like(one)], -1)
    return c, s


def liger_rotary_pos_emb(
    q: Tensor,
    k: Tensor,
    cos: Tensor,
    sin: Tensor,
    position_ids: Tensor | None = None,
    unsqueeze_dim: int = 1,
    *,
    backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """Liger's ``liger_rotary_pos_emb`` (see the module docstring): ``(q, k)`` rotated, new
    tensors. q ``[B, Hq, S, D]``, k ``[B, Hk, S, D]`` (``[B, S, H, D]`` with ``unsqueeze_dim=2``);
    cos, sin ``[S, D']``, ``[1, S, D']`` or ``[B, S, D']``; ``position_ids`` unused, as Liger.
    ``rounding``: ``"exact"`` or ``"native"`` (see the module docstring)."""
    check_rounding(rounding)
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if isinstance(unsqueeze_dim, bool) or unsqueeze_dim not in (1, 2):
        raise ValueError(
            f"unsqueeze_dim must be 1 (q/k [B, H, S, D]) or 2 (q/k [B, S, H, D]), got {unsqueeze_dim!r}")
    form = "[B, H, S, D]" if unsqueeze_dim == 1 else "[B, S, H, D]"
    for name, t in (("q", q), ("k", k)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be {form} (unsqueeze_dim={unsqueeze_dim}), got shape {_shape(t)}")
    seq_dim = 2 if unsqueeze_dim == 1 else 1
    b, s, d = q.shape[0], q.shape[seq_dim], q.shape[-1]
    if k.shape[0] != b or k.shape[seq_dim] != s or k.shape[-1] != d:
        raise ValueError(f"q and k must share B, S and D ({form}), got q {_shape(q)} and k {_shape(k)}")
    if d < 2:
        raise ValueError(f"head_dim (q.shape[-1]) must be >= 2, got {d}")
    widths = sorted({d, d + d % 2})
    if sin.shape != cos.shape:
        raise ValueError(f"cos and sin must have one shape, got cos {_shape(cos)} and sin {_shape(sin)}")
    ok = (cos.ndim == 2 and cos.shape[0] == s) or (cos.ndim == 3 and cos.shape[0] in (1, b) and cos.shape[1] == s)
    if not ok or cos.shape[-1] not in widths:
        want = " or ".join(f"[{s}, {w}], [1 or {b}, {s}, {w}]" for w in widths)
        raise ValueError(
            f"cos/sin must be [S, D'], [1, S, D'] or [B, S, D'] with D' = {' or '.join(map(str, widths))} "
            f"for q {_shape(q)} ({form}, head_dim {d}): {want}; got {_shape(cos)}")
    c, sn = _tables(cos, sin, d)
    if c.ndim == 2:
        c, sn = c[None], sn[None]
    c, sn = c.unsqueeze(unsqueeze_dim), sn.unsqueeze(unsqueeze_dim)
    dtype = q.dtype if q.is_floating_point() else torch.float32  # another dtype: rome names it
    m = _halfwidth.matrix("half", 2 * (d // 2), d, dtype, q.device)
    return apply_qk(q, k, c, sn, m, backend=backend, rounding=rounding)


def liger_rotary_pos_emb_vision(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """Liger's ``liger_rotary_pos_emb_vision`` (Qwen3-VL's vision RoPE): q, k ``[S, H, D]``,
    cos, sin ``[S, D']``; computed in float32 and returned in q's and k's dtypes and shapes."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 3:
            raise ValueError(f"{name} must be [S, H, D], got shape {_shape(t)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 2:
            raise ValueError(f"{name} must be [S, D'], got shape {_shape(t)}")
    q32, k32 = q.float()[None], k.float()[None]  # [1, S, H, D]
    qo, ko = liger_rotary_pos_emb(q32, k32, cos.float(), sin.float(), unsqueeze_dim=2, backend=backend,
                                  rounding=rounding)
    return qo[0].to(q.dtype), ko[0].to(k.dtype)
