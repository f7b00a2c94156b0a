"""vLLM's (and flashinfer's) rotary convention on rome's op.

    from rome.integrations.vllm import RotaryEmbedding, rotary_embedding
    rope = RotaryEmbedding(head_size=128, rotary_dim=128, max_position_embeddings=4096,
                           base=10000.0, is_neox_style=True)
    q, k = rope(positions, q, k)           # q [T, N*D], k [T, N_kv*D] (or k=None -> (q, None))

The semantics of vLLM's ``RotaryEmbedding.forward_native``: ``positions`` ``[T]`` (or any shape
of T tokens, e.g. ``[B, S]``), query/key flattened ``[T, N * head_size]`` (or ``[T, N,
head_size]``; positions' shape, then the heads), one ``cos_sin_cache`` ``[max_positions, rotary_dim]`` holding cos in its
first half and sin in its second (one value per rotated pair), ``is_neox_style`` (NeoX halves;
False: GPT-J pairs), the first ``rotary_dim`` columns of each head rotated and the rest passed
through, ``offsets`` added to the positions, ``key=None`` giving ``(query, None)`` (vLLM's
cross-layer KV sharing). vLLM is not needed.

How: the cache rows at the positions are widened to rome's per-column tables
(``rome.integrations._halfwidth``) and q and k rotated in one ``rome.apply_qk`` (``rome.apply``
without key; ``rome.apply_qk_``/``apply_`` with ``inplace=True``, flashinfer's
``apply_rope_with_cos_sin_cache_inplace``), bitwise those ops on those tables. Computed in
float32 and rounded once to q's dtype; vLLM's native path casts the cache to q's dtype and
computes in it (bf16 products), so rome is the more accurate of the two there.

Differences: the results are new tensors unless ``inplace=True`` (vLLM's CUDA op writes in
place, its native path does not); a float32 cache with bf16/fp16 q is read as float32; bad
shapes and positions outside the cache raise ``ValueError`` naming the argument (positions are
checked on the host, one sync, except under CUDA graph capture and tracing).
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor, nn

from ..frequencies import rope_frequencies
from ..inplace import apply_, apply_qk_
from ..layouts import cos_sin_cache, rope_layout
from ..ops import apply, apply_qk
from ..types import Backend
from . import _halfwidth

__all__ = ["RotaryEmbedding", "rotary_embedding"]


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _int(value, name: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _heads(name: str, t: Tensor, positions: Tensor, head_size: int) -> Tensor:
    """t ``[*positions.shape, ...]`` viewed as ``[T, N, head_size]``."""
    tokens, lead = positions.numel(), positions.ndim
    if (t.ndim <= lead or _shape(t)[:lead] != _shape(positions) or t.numel() % max(tokens * head_size, 1)
            or t.shape[-1] % head_size):
        raise ValueError(
            f"{name} must be [T, N * head_size] (or [T, N, head_size]; T the tokens of positions, "
            f"shape {_shape(positions)}) with head_size = {head_size}, got shape {_shape(t)}"
        )
    try:
        return t.view(tokens, -1, head_size)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {_shape(t)} and strides {list(t.stride())} cannot be viewed as "
            f"[T, N, head_size] = [{tokens}, -1, {head_size}] (make it contiguous)"
        ) from None


def rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Tensor | None = None,
    *,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox_style: bool = True,
    rotary_dim: int | None = None,
    offsets: Tensor | None = None,
    inplace: bool = False,
    backend: Backend = "auto",
) -> tuple[Tensor, Tensor | None]:
    """vLLM's ``RotaryEmbedding.forward(positions, query, key, offsets)`` as a function of its
    cache (see the module docstring). ``rotary_dim`` defaults to (and must equal)
    ``cos_sin_cache.shape[-1]``. Returns ``(query, key)`` rotated, in query's and key's shapes
    (``key`` None stays None); with ``inplace=True`` the inputs themselves, rotated in place
    (not differentiable; ``rome.apply_``'s rules)."""
    for name, t in (("positions", positions), ("query", query), ("cos_sin_cache", cos_sin_cache)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if key is not None and not isinstance(key, Tensor):
        raise TypeError(f"key must be a torch.Tensor or None, got {type(key).__name__}")
    for name, flag in (("is_neox_style", is_neox_style), ("inplace", inplace)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    head_size = _int(head_size, "head_size")
    if key is not None and key.dtype != query.dtype:
        raise TypeError(f"query and key must have one dtype, got {query.dtype} and {key.dtype}")
    if positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"positions must be an int32/int64 tensor, got {positions.dtype}")
    if cos_sin_cache.ndim != 2 or cos_sin_cache.shape[1] == 0 or cos_sin_cache.shape[1] % 2:
        raise ValueError(
            f"cos_sin_cache must be [max_positions, rotary_dim] (cos then sin, rotary_dim even), "
            f"got shape {_shape(cos_sin_cache)}"
        )
    cache_dim = cos_sin_cache.shape[1]
    if rotary_dim is not None and _int(rotary_dim, "rotary_dim") != cache_dim:
        raise ValueError(
            f"rotary_dim={rotary_dim} must equal cos_sin_cache.shape[-1] = {cache_dim} (cache "
            f"{_shape(cos_sin_cache)})"
        )
    if not 0 < cache_dim <= head_size:
        raise ValueError(
            f"rotary_dim = cos_sin_cache.shape[-1] = {cache_dim} must be <= head_size = {head_size}"
        )
    if offsets is not None:
        if not isinstance(offsets, Tensor) or offsets.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"offsets must be None or an int32/int64 tensor, got {offsets!r}")
        if offsets.shape != positions.shape:
            raise ValueError(
                f"offsets must have positions' shape {_shape(positions)}, got {_shape(offsets)}"
            )
        positions = positions + offsets
    tokens = positions.numel()
    q = _heads("query", query, positions, head_size)
    k = None if key is None else _heads("key", key, positions, head_size)
    pos = positions.reshape(tokens, 1).to(query.device)
    _halfwidth.check_positions(
        pos, cos_sin_cache.shape[0],
        f"positions{' + offsets' if offsets is not None else ''} must lie in the rows of "
        f"cos_sin_cache [0, max_positions={cos_sin_cache.shape[0]})")
    mode = "half" if is_neox_style else "interleave"
    cos, sin = cos_sin_cache.chunk(2, dim=-1)
    cos_t, sin_t = _halfwidth.token_tables(cos, sin, pos, head_size, mode)
    cos_t, sin_t = cos_t.unsqueeze(-2), sin_t.unsqueeze(-2)  # [T, 1, D]: over heads
    dtype = query.dtype if query.is_floating_point() else torch.float32  # else: rome names it
    m = _halfwidth.matrix(mode, cache_dim, head_size, dtype, query.device)
    if inplace:
        if k is None:
            apply_(q, cos_t, sin_t, m, backend=backend)
        else:
            apply_qk_(q, k, cos_t, sin_t, m, backend=backend)
        return query, key
    if k is None:
        return apply(q, cos_t, sin_t, m, backend=backend).reshape(query.shape), None
    q, k = apply_qk(q, k, cos_t, sin_t, m, backend=backend)
    return q.reshape(query.shape), k.reshape(key.shape)


class RotaryEmbedding(nn.Module):
    """vLLM's ``RotaryEmbedding(head_size, rotary_dim, max_position_embeddings, base,
    is_neox_style, dtype)``: a ``cos_sin_cache`` buffer ``[max_position_embeddings, rotary_dim]``
    (cos ‖ sin, from rome's float64 angles rounded once to ``dtype``; vLLM's own uses float32
    angles) and ``forward(positions, query, key=None, offsets=None)`` -> ``(query, key)``.

    ``inplace=True`` rotates query and key in place (vLLM's CUDA op and flashinfer do), else
    new tensors are returned (vLLM's native path). Assign another cache (e.g. a scaled RoPE's)
    to ``cos_sin_cache`` to use it."""

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float = 10000.0,
        is_neox_style: bool = True,
        dtype: torch.dtype = torch.float32,
        *,
        inplace: bool = False,
        backend: Backend = "auto",
        device=None,
    ) -> None:
        super().__init__()
        self.head_size = _int(head_size, "head_size")
        self.rotary_dim = _int(rotary_dim, "rotary_dim")
        self.max_position_embeddings = _int(max_position_embeddings, "max_position_embeddings")
        self.base = float(base)
        for name, flag in (("is_neox_style", is_neox_style), ("inplace", inplace)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.is_complex:
            raise TypeError(f"dtype (the cos_sin_cache's) must be a floating torch.dtype, got {dtype!r}")
        self.is_neox_style, self.inplace, self.backend = is_neox_style, inplace, backend
        freqs = rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim)
        cos, sin = cos_sin_cache(rope_layout(freqs, mode="half"), self.max_position_embeddings,
                                 dtype=dtype, device=device)
        half = self.rotary_dim // 2  # half layout: columns [0, rotary_dim/2) hold pair k's value
        self.cos_sin_cache: Tensor
        self.register_buffer("cos_sin_cache", torch.cat([cos[:, :half], sin[:, :half]], -1), persistent=False)

    def forward(
        self, positions: Tensor, query: Tensor, key: Tensor | None = None, offsets: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        return rotary_embedding(
            positions, query, key, head_size=self.head_size, cos_sin_cache=self.cos_sin_cache,
            is_neox_style=self.is_neox_style, rotary_dim=self.rotary_dim, offsets=offsets,
            inplace=self.inplace, backend=self.backend,
        )

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, max_position_embeddings="
                f"{self.max_position_embeddings}, base={self.base}, is_neox_style={self.is_neox_style}")
