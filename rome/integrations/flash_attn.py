"""flash-attn's rotary convention on rome's op: a drop-in ``apply_rotary_emb``.

    from rome.integrations.flash_attn import apply_rotary_emb
    out = apply_rotary_emb(x, cos, sin, interleaved=False, seqlen_offsets=cache_len)

The signature and semantics of ``flash_attn.layers.rotary.apply_rotary_emb`` (flash-attn 2.x):
x ``[batch, seqlen, nheads, headdim]``, or ``[total_seqlen, nheads, headdim]`` with
``cu_seqlens``; ``cos``/``sin`` the half-width tables ``[seqlen_ro, rotary_dim / 2]``; the
first ``rotary_dim`` columns of each head rotate (NeoX halves, or GPT-J pairs with
``interleaved=True``), the rest pass through unchanged; token s of sequence b reads row
``s + seqlen_offsets[b]`` (an int, or an int tensor ``[batch]``). flash-attn is not needed.

How: the rows are gathered at those positions and widened to rome's per-column tables
(``rome.integrations._halfwidth``), then one ``rome.apply`` (``rome.apply_`` in place), so the
result is bitwise ``rome.apply`` with those tables and ``rotation_matrix(rotary_dim, mode)``
padded with a zero block. Computed in float32 and rounded once to x's dtype, as flash-attn's
kernel does.

Differences from flash-attn, all where flash-attn would assert or read out of bounds:

- bad shapes, dtypes and arguments raise ``ValueError``/``TypeError`` naming the argument;
- a position outside the table (``seqlen_offsets`` too large, or negative) is a ``ValueError``
  (one host sync; skipped under CUDA graph capture and tracing); flash-attn's kernel leaves
  such rows unrotated;
- ``cu_seqlens`` must end at ``total_seqlen`` (flash-attn leaves trailing rows unwritten) and
  ``max_seqlen`` may be left out (it is checked against the longest sequence when given);
- cos/sin may be float32 with a lower-precision x (read as float32), as well as x's dtype;
- with ``inplace=False`` the gradient also reaches cos and sin (flash-attn gives none); with
  ``inplace=True`` only x gets one, as in flash-attn.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from ..inplace import apply_
from ..ops import apply
from ..positions import check_cu_seqlens, normalize_positions
from ..types import Backend
from . import _halfwidth

__all__ = ["apply_rotary_emb"]


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def apply_rotary_emb(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: int | Tensor = 0,
    cu_seqlens: Tensor | None = None,
    max_seqlen: int | None = None,
    *,
    backend: Backend = "auto",
) -> Tensor:
    """flash-attn's ``apply_rotary_emb`` (see the module docstring), computed by rome.

    Returns a new tensor, or x itself rotated in place with ``inplace=True`` (then
    differentiable in x only, as flash-attn). ``backend`` as ``rome.apply``.
    """
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, flag in (("interleaved", interleaved), ("inplace", inplace)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    varlen = cu_seqlens is not None
    if x.ndim != (3 if varlen else 4):
        form = "[total_seqlen, nheads, headdim] with cu_seqlens" if varlen else \
            "[batch, seqlen, nheads, headdim] (or [total_seqlen, nheads, headdim] with cu_seqlens)"
        raise ValueError(f"x must be {form}, got shape {_shape(x)}")
    if cos.ndim != 2 or sin.shape != cos.shape or cos.shape[1] == 0:
        raise ValueError(
            f"cos and sin must both be [seqlen_ro, rotary_dim / 2] with rotary_dim > 0, got cos "
            f"{_shape(cos)} and sin {_shape(sin)}"
        )
    head_dim, rotary_dim = x.shape[-1], 2 * cos.shape[1]
    if rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim = 2 * cos.shape[1] = {rotary_dim} must be <= headdim = {head_dim} (x "
            f"{_shape(x)}, cos {_shape(cos)})"
        )
    positions = _positions(x, seqlen_offsets, cu_seqlens, max_seqlen)
    _halfwidth.check_positions(
        positions, cos.shape[0],
        f"the rows read (token index + seqlen_offsets) must lie in the rows of cos/sin [0, "
        f"seqlen_ro={cos.shape[0]})")
    mode = "interleave" if interleaved else "half"
    cos_t, sin_t = _halfwidth.token_tables(cos, sin, positions, head_dim, mode)
    cos_t, sin_t = cos_t.unsqueeze(-2), sin_t.unsqueeze(-2)  # broadcast over heads
    dtype = x.dtype if x.is_floating_point() else torch.float32  # another dtype: rome names it
    m = _halfwidth.matrix(mode, rotary_dim, head_dim, dtype, x.device)
    if not inplace:
        return apply(x, cos_t, sin_t, m, backend=backend)
    if torch.is_grad_enabled() and x.requires_grad:
        mt = _halfwidth.matrix(mode, rotary_dim, head_dim, dtype, x.device, transposed=True)
        return _RotateInPlace.apply(x, cos_t.detach(), sin_t.detach(), m, mt, backend)
    with torch.no_grad():
        return apply_(x, cos_t, sin_t, m, backend=backend)


def _positions(x: Tensor, seqlen_offsets, cu_seqlens, max_seqlen) -> Tensor:
    """int64 positions ``[B', S, 1]`` (``[T, 1]`` with cu_seqlens): token index + offset."""
    n = x.shape[0]
    if cu_seqlens is not None:
        cu = check_cu_seqlens(cu_seqlens, n)
        n = cu.numel() - 1
        if max_seqlen is not None:
            if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
                raise TypeError(f"max_seqlen must be an int or None, got {max_seqlen!r}")
            longest = int(cu.diff().max())
            if max_seqlen < longest:
                raise ValueError(
                    f"max_seqlen={max_seqlen} is shorter than the longest sequence in cu_seqlens "
                    f"({longest} tokens)"
                )
    elif max_seqlen is not None:
        raise ValueError(f"max_seqlen={max_seqlen!r} is given without cu_seqlens")
    what = "len(cu_seqlens) - 1" if cu_seqlens is not None else "batch"
    if isinstance(seqlen_offsets, Tensor):
        if seqlen_offsets.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"seqlen_offsets must be an int or an int32/int64 tensor, got {seqlen_offsets.dtype}")
        if seqlen_offsets.shape != (n,):
            raise ValueError(
                f"seqlen_offsets must be an int or a tensor [{what}] = [{n}], got shape "
                f"{_shape(seqlen_offsets)}"
            )
    else:
        try:
            if isinstance(seqlen_offsets, bool):
                raise TypeError
            seqlen_offsets = operator.index(seqlen_offsets)
        except TypeError:
            raise TypeError(
                f"seqlen_offsets must be an int or an int tensor [{what}], got {seqlen_offsets!r}"
            ) from None
    if cu_seqlens is not None:
        return normalize_positions(None, n_axes=1, batch=1, seq=x.shape[0], offsets=seqlen_offsets,
                                   cu_seqlens=cu_seqlens, device=x.device)
    return normalize_positions(None, n_axes=1, batch=x.shape[0], seq=x.shape[1],
                               offsets=seqlen_offsets, device=x.device)


class _RotateInPlace(torch.autograd.Function):
    """x rotated in place by ``rome.apply_``; dx = the rotation with Mᵀ (flash-attn's
    ``conjugate``): for these tables, whose two columns of a pair hold one value, that is
    ``rome.apply``'s own dx (``(g*sin) @ Mᵀ == (g @ Mᵀ)*sin``)."""

    @staticmethod
    def forward(ctx, x, cos, sin, m, mt, backend):
        apply_(x, cos, sin, m, backend=backend)
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin, mt)
        ctx.backend = backend
        return x

    @staticmethod
    def backward(ctx, grad):
        cos, sin, mt = ctx.saved_tensors
        return apply(grad, cos, sin, mt, backend=ctx.backend), None, None, None, None, None
