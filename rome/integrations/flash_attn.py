"""flash-attn's rotary convention on rome's op: drop-in ``apply_rotary_emb`` (and its alias
``apply_rotary_emb_func``), ``apply_rotary_emb_qkv_`` and ``apply_rotary_emb_kv_``.

    from rome.integrations.flash_attn import apply_rotary_emb
    out = apply_rotary_emb(x, cos, sin, interleaved=False, seqlen_offsets=cache_len)
    apply_rotary_emb_qkv_(qkv, cos, sin, num_heads_q=None)   # q and k of qkv, in place

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
kernel does (``rounding="exact"``, the default). ``rounding="native"`` (every function): the bits
of flash-attn's plain-torch ``apply_rotary_emb_torch`` on x's dtype (``x*cos + rotate_half(x)*sin``
with cos/sin in x's dtype, each product and the sum rounded to it; the pass-through columns as
they are), in place and in the backward too (``grad*cos`` and ``grad*sin`` rounded, summed).

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

In place (``inplace=True``, ``apply_rotary_emb_qkv_``, ``apply_rotary_emb_kv_``) with grad mode
on and a tensor that requires grad, as flash-attn's autograd Functions: a leaf (or a view of
one) stays a leaf and its ``.grad`` is the gradient through the returned tensor, which shares
its memory (autograd's alias of an input returned unmarked); any other tensor is returned
itself, marked dirty (its history rebased). Unlike flash-attn, the incoming gradient is never
written, and the write bumps the tensor's version counter, so an op that saved it earlier
raises at backward rather than reading rotated values.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from ..checks import check_rounding
from ..inplace import apply_, apply_qk_
from ..ops import apply
from ..positions import check_cu_seqlens, normalize_positions
from ..types import Backend, Rounding
from . import _halfwidth

__all__ = ["apply_rotary_emb", "apply_rotary_emb_func", "apply_rotary_emb_kv_", "apply_rotary_emb_qkv_"]


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
    rounding: Rounding = "exact",
) -> Tensor:
    """flash-attn's ``apply_rotary_emb`` (see the module docstring), computed by rome.

    Returns a new tensor, or with ``inplace=True`` x rotated in place: x itself, or, where x is
    a leaf that requires grad (or a view of one), a tensor sharing x's memory that carries the
    rotation's backward, x staying a leaf whose ``.grad`` is the gradient through the result
    (flash-attn's autograd Function returns its input unmarked; autograd hands back such an
    alias). In place, differentiable in x only, as flash-attn. ``backend``, ``rounding`` as
    ``rome.apply`` (see the module docstring).
    """
    check_rounding(rounding)
    for name, flag in (("interleaved", interleaved), ("inplace", inplace)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    varlen = cu_seqlens is not None
    if isinstance(x, Tensor) and x.ndim != (3 if varlen else 4):
        form = "[total_seqlen, nheads, headdim] with cu_seqlens" if varlen else \
            "[batch, seqlen, nheads, headdim] (or [total_seqlen, nheads, headdim] with cu_seqlens)"
        raise ValueError(f"x must be {form}, got shape {_shape(x)}")
    cos_t, sin_t, m, mt = _tables("x", x, cos, sin, interleaved, seqlen_offsets, cu_seqlens, max_seqlen)
    kw = {"backend": backend, "rounding": rounding}
    if not inplace:
        return apply(x, cos_t, sin_t, m, **kw)
    cos_t, sin_t = cos_t.detach(), sin_t.detach()  # in place: no gradient to cos/sin (flash-attn)
    return _in_place(x, lambda t: apply_(t, cos_t, sin_t, m, **kw),
                     lambda g: apply(g, cos_t, sin_t, mt, **kw))


# For backward compatibility (flash-attn's own alias)
apply_rotary_emb_func = apply_rotary_emb


def _tables(name: str, x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, seqlen_offsets,
            cu_seqlens, max_seqlen, names=("cos", "sin")):
    """``(cos_t, sin_t, M, Mᵀ)`` for x ``[B, S, H, D]`` (``[T, H, D]`` with cu_seqlens): the rows
    each token reads (token index + seqlen_offsets), widened to rome's per-column tables
    ``[..., 1, D]`` (broadcast over heads), and the partial rotary's matrix and its transpose."""
    for n, t in ((name, x), (names[0], cos), (names[1], sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{n} must be a torch.Tensor, got {type(t).__name__}")
    if cos.ndim != 2 or sin.shape != cos.shape or cos.shape[1] == 0:
        raise ValueError(
            f"{names[0]} and {names[1]} must both be [seqlen_ro, rotary_dim / 2] with rotary_dim "
            f"> 0, got {names[0]} {_shape(cos)} and {names[1]} {_shape(sin)}"
        )
    head_dim, rotary_dim = x.shape[-1], 2 * cos.shape[1]
    if rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim = 2 * {names[0]}.shape[1] = {rotary_dim} must be <= headdim = {head_dim} "
            f"({name} {_shape(x)}, {names[0]} {_shape(cos)})"
        )
    positions = _positions(x, seqlen_offsets, cu_seqlens, max_seqlen)
    _halfwidth.check_positions(
        positions, cos.shape[0],
        f"the rows read (token index + seqlen_offsets) must lie in the rows of "
        f"{'/'.join(names)} [0, seqlen_ro={cos.shape[0]})")
    mode = "interleave" if interleaved else "half"
    cos_t, sin_t = _halfwidth.token_tables(cos, sin, positions, head_dim, mode)
    cos_t, sin_t = cos_t.unsqueeze(-2), sin_t.unsqueeze(-2)  # broadcast over heads
    dtype = x.dtype if x.is_floating_point() else torch.float32  # another dtype: rome names it
    m = _halfwidth.matrix(mode, rotary_dim, head_dim, dtype, x.device)
    mt = _halfwidth.matrix(mode, rotary_dim, head_dim, dtype, x.device, transposed=True)
    return cos_t, sin_t, m, mt


def _in_place(x: Tensor, rotate, grad_of) -> Tensor:
    """``rotate(x)`` in place; differentiable in x (``grad_of`` its backward) where grad mode is
    on and x requires grad, as flash-attn's autograd Functions."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _RotateInPlace.apply(x, rotate, grad_of)
    with torch.no_grad():
        rotate(x)
    return x


def apply_rotary_emb_qkv_(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    cos_k: Tensor | None = None,
    sin_k: Tensor | None = None,
    interleaved: bool = False,
    seqlen_offsets: int | Tensor = 0,
    num_heads_q: int | None = None,
    *,
    backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> Tensor:
    """flash-attn's ``apply_rotary_emb_qkv_``: q and k of a packed ``qkv`` rotated *in place*
    (v untouched), ``qkv`` returned (differentiable in qkv as flash-attn: a leaf that requires
    grad stays a leaf and receives the gradient through the result).

    qkv: ``[batch, seqlen, 3, nheads, headdim]``, or ``[batch, seqlen, num_heads_q + 2 *
    num_heads_k, headdim]`` with ``num_heads_q`` (GQA/MQA). cos, sin: ``[seqlen_ro,
    rotary_dim / 2]`` for q, and for k unless ``cos_k``/``sin_k`` are given (each defaults to
    its q counterpart, as in flash-attn). seqlen_offsets: an int or an int tensor ``[batch]``.
    ``rounding`` as ``apply_rotary_emb``.
    """
    check_rounding(rounding)
    if not isinstance(qkv, Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {interleaved!r}")
    if qkv.ndim == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"qkv must be [batch, seqlen, 3, nheads, headdim], got shape {_shape(qkv)}")
        if num_heads_q is not None and num_heads_q != qkv.shape[3]:
            raise ValueError(f"num_heads_q={num_heads_q!r} does not match qkv {_shape(qkv)} "
                             f"([batch, seqlen, 3, nheads, headdim], nheads={qkv.shape[3]})")

        def split(t):
            return t[:, :, 0], t[:, :, 1]
    elif qkv.ndim == 4:
        if num_heads_q is None:
            raise ValueError(
                f"num_heads_q is needed for qkv [batch, seqlen, num_heads_q + 2 * num_heads_k, "
                f"headdim], got shape {_shape(qkv)} and num_heads_q=None")
        if isinstance(num_heads_q, bool) or not isinstance(num_heads_q, int) or num_heads_q < 1:
            raise TypeError(f"num_heads_q must be a positive int, got {num_heads_q!r}")
        nq = num_heads_q
        nk = (qkv.shape[2] - nq) // 2
        if nk < 1 or qkv.shape[2] != nq + 2 * nk:
            raise ValueError(
                f"qkv [batch, seqlen, num_heads_q + 2 * num_heads_k, headdim] has {qkv.shape[2]} "
                f"heads, not num_heads_q={nq} plus twice a positive num_heads_k (shape {_shape(qkv)})")

        def split(t):
            return t[:, :, :nq], t[:, :, nq:nq + nk]
    else:
        raise ValueError(
            f"qkv must be [batch, seqlen, 3, nheads, headdim] or [batch, seqlen, num_heads_q + 2 * "
            f"num_heads_k, headdim], got shape {_shape(qkv)}")
    q, k = split(qkv)
    tq = [t.detach() if isinstance(t, Tensor) else t
          for t in _tables("qkv", q, cos, sin, interleaved, seqlen_offsets, None, None)]
    if cos_k is None and sin_k is None:
        tk = tq
    else:
        ck, sk = (cos if cos_k is None else cos_k), (sin if sin_k is None else sin_k)
        names = ("cos_k" if cos_k is not None else "cos", "sin_k" if sin_k is not None else "sin")
        tk = [t.detach() for t in _tables("qkv", k, ck, sk, interleaved, seqlen_offsets, None, None, names)]

    def rotate(t, transpose=False):
        a, b = split(t)
        i = 3 if transpose else 2
        kw = {"backend": backend, "rounding": rounding}
        if tk is tq:
            apply_qk_(a, b, tq[0], tq[1], tq[i], **kw)
        else:
            apply_(a, tq[0], tq[1], tq[i], **kw)
            apply_(b, tk[0], tk[1], tk[i], **kw)

    def grad_of(g):
        g = g.clone()
        with torch.no_grad():
            rotate(g, transpose=True)
        return g

    return _in_place(qkv, rotate, grad_of)


def apply_rotary_emb_kv_(
    kv: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    seqlen_offsets: int | Tensor = 0,
    *,
    backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> Tensor:
    """flash-attn's ``apply_rotary_emb_kv_``: k = ``kv[:, :, 0]`` of ``kv`` ``[batch, seqlen, 2,
    nheads, headdim]`` rotated *in place* (v untouched), ``kv`` returned (differentiable in kv
    as flash-attn, a leaf included). cos, sin: ``[seqlen_ro, rotary_dim / 2]``. ``rounding`` as
    ``apply_rotary_emb``."""
    check_rounding(rounding)
    if not isinstance(kv, Tensor):
        raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {interleaved!r}")
    if kv.ndim != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be [batch, seqlen, 2, nheads, headdim], got shape {_shape(kv)}")
    cos_t, sin_t, m, mt = (t.detach() for t in
                           _tables("kv", kv[:, :, 0], cos, sin, interleaved, seqlen_offsets, None, None))

    def grad_of(g):
        g = g.clone()
        with torch.no_grad():
            apply_(g[:, :, 0], cos_t, sin_t, mt, backend=backend, rounding=rounding)
        return g

    return _in_place(kv, lambda t: apply_(t[:, :, 0], cos_t, sin_t, m, backend=backend, rounding=rounding),
                     grad_of)


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
    """x rotated in place by ``rotate`` (a ``rome.apply_``/``apply_qk_`` call); the gradient is
    ``grad_of(g)``, the rotation with Mᵀ (flash-attn's ``conjugate``): for these tables, whose two
    columns of a pair hold one value, that is ``rome.apply``'s own dx (``(g*sin) @ Mᵀ ==
    (g @ Mᵀ)*sin``).

    As flash-attn's autograd Functions: the result shares x's memory and carries the rotation's
    backward; a leaf that requires grad (or a view of one) stays a leaf (its ``.grad`` is the
    gradient through the result), since autograd forbids marking such a tensor dirty — x may
    itself be a view (of a tensor without grad) made a leaf by ``requires_grad_()``, as
    flash-attn's ``unpad_input`` output in its varlen test; any other x is marked dirty (x itself
    is returned, its history rebased)."""

    @staticmethod
    def forward(ctx, x, rotate, grad_of):
        rotate(x)
        base = x if x._base is None else x._base
        # a leaf that requires grad: x itself (a view of a tensor without grad included, e.g.
        # flash-attn's unpad_input output after requires_grad_()) or the base x views
        if not ((x.is_leaf and x.requires_grad) or (base.is_leaf and base.requires_grad)):
            ctx.mark_dirty(x)
        ctx.grad_of = grad_of
        return x

    @staticmethod
    def backward(ctx, grad):
        return ctx.grad_of(grad), None, None
