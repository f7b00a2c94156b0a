"""vLLM's rotary convention on rome's op: ``RotaryEmbedding``, ``get_rope`` and its scaling
classes, and ``rotary_embedding`` (the forward as a function of a cache; flashinfer's
cos/sin-cache functions, ``rome.integrations.flashinfer``, call it).

    from rome.integrations.vllm import RotaryEmbedding, get_rope, rotary_embedding
    rope = get_rope(128, 4096, True, {"rope_type": "llama3", "factor": 8.0, ...})
    rope = RotaryEmbedding(head_size=128, rotary_dim=128, max_position_embeddings=4096,
                           base=10000.0, is_neox_style=True)
    q, k = rope(positions, q, k)           # q [T, N*D], k [T, N_kv*D] (or k=None -> (q, None))
    torch.ops.rome.vllm_rotary_embedding(positions, q, k, 128, rope.cos_sin_cache, True)  # vLLM's op, in place

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
float32 and rounded once to q's dtype (``rounding="exact"``, the default); vLLM's native path
casts the cache to q's dtype and computes in it (bf16 products), so rome is the more accurate of
the two there. ``rounding="native"`` gives vLLM's ``forward_native`` bits instead: the cache rows
rounded to q's dtype, each product and sum rounded to it (``x1*cos - x2*sin``, ``x2*cos +
x1*sin``), the pass-through columns as they are.

Differences: the results are new tensors unless ``inplace=True`` (vLLM's CUDA op writes in
place, its native path does not); a float32 cache with bf16/fp16 q is read as float32; bad
shapes and positions outside the cache raise ``ValueError`` naming the argument (positions are
checked on the host, one sync, except under CUDA graph capture and tracing).
"""

from __future__ import annotations

import math
import numbers
import operator

import torch
from torch import Tensor, nn

from ..checks import check_rounding
from ..frequencies import Frequencies, rope_frequencies
from ..inplace import apply_, apply_qk_
from ..layouts import cos_sin_cache, mrope_axes, rope_layout
from ..ops import apply, apply_qk
from ..types import Backend, Rounding
from . import _halfwidth

__all__ = [
    "DynamicNTKAlphaRotaryEmbedding",
    "DynamicNTKScalingRotaryEmbedding",
    "Llama3RotaryEmbedding",
    "LinearScalingRotaryEmbedding",
    "MRotaryEmbedding",
    "Phi3LongRoPEScaledRotaryEmbedding",
    "RotaryEmbedding",
    "YaRNScalingRotaryEmbedding",
    "get_rope",
    "rotary_embedding",
    "vllm_rotary_embedding",
]


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _int(value, name: str) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {value!r}") from None


def _heads(name: str, t: Tensor, positions: Tensor, head_size: int) -> tuple[Tensor, list[int]]:
    """t as ``[*lead, N, head_size]`` (a view) and ``lead``: positions' shape where t starts with
    it (``[*positions.shape, N * head_size]`` or ``[*positions.shape, N, head_size]``, any
    strides: vLLM's sliced ``[..., :head_size]`` q included), else ``[T]`` (t viewed as ``[T, N,
    head_size]``, vLLM's ``view(num_tokens, -1, head_size)``)."""
    lead, shape = _shape(positions), _shape(t)
    n = len(lead)
    if shape[:n] == lead and head_size > 0:
        if t.ndim == n + 2 and shape[-1] == head_size and shape[-2] > 0:
            return t, lead
        if t.ndim == n + 1 and shape[-1] > 0 and shape[-1] % head_size == 0:
            return t.unflatten(-1, (-1, head_size)), lead
    tokens = positions.numel()
    prefixes = [math.prod(shape[:i]) for i in range(1, t.ndim)]  # T tokens: leading dims of t
    if (tokens not in prefixes or t.numel() == 0 or t.numel() % max(tokens * head_size, 1)
            or t.shape[-1] % max(head_size, 1)):
        raise ValueError(
            f"{name} must be [T, N * head_size] (or [T, N, head_size]; T the tokens of positions, "
            f"shape {_shape(positions)}) with head_size = {head_size}, got shape {_shape(t)}"
        )
    try:
        return t.view(tokens, -1, head_size), [tokens]
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
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor | None]:
    """vLLM's ``RotaryEmbedding.forward(positions, query, key, offsets)`` as a function of its
    cache (see the module docstring). ``rotary_dim`` defaults to (and must equal)
    ``cos_sin_cache.shape[-1]``. Returns ``(query, key)`` rotated, in query's and key's shapes
    (``key`` None stays None); with ``inplace=True`` the inputs themselves, rotated in place
    (not differentiable; ``rome.apply_``'s rules). ``rounding``: ``"exact"`` or ``"native"``
    (``forward_native``'s bits; see the module docstring)."""
    check_rounding(rounding)
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
    if not cos_sin_cache.is_floating_point():
        raise TypeError(f"cos_sin_cache must be a floating tensor, got {cos_sin_cache.dtype}")
    if query.is_floating_point() and cos_sin_cache.dtype not in (torch.float32, query.dtype):
        cos_sin_cache = cos_sin_cache.to(query.dtype)  # as vLLM casts it (float32 is read as is)
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
    q, q_lead = _heads("query", query, positions, head_size)
    k, k_lead = (None, None) if key is None else _heads("key", key, positions, head_size)
    pos = positions.reshape(tokens, 1).to(query.device)
    _halfwidth.check_positions(
        pos, cos_sin_cache.shape[0],
        f"positions{' + offsets' if offsets is not None else ''} must lie in the rows of "
        f"cos_sin_cache [0, max_positions={cos_sin_cache.shape[0]})")
    mode = "half" if is_neox_style else "interleave"
    cos, sin = cos_sin_cache.chunk(2, dim=-1)
    cos_t, sin_t = _halfwidth.token_tables(cos, sin, pos, head_size, mode)  # [T, D]

    def tables(lead):  # [*lead, 1, D]: over heads
        return cos_t.view(*lead, 1, head_size), sin_t.view(*lead, 1, head_size)

    dtype = query.dtype if query.is_floating_point() else torch.float32  # else: rome names it
    m = _halfwidth.matrix(mode, cache_dim, head_size, dtype, query.device)
    kw = {"backend": backend, "rounding": rounding}
    if inplace:
        if k is None:
            apply_(q, *tables(q_lead), m, **kw)
        elif q_lead == k_lead:
            apply_qk_(q, k, *tables(q_lead), m, **kw)
        else:
            apply_(q, *tables(q_lead), m, **kw)
            apply_(k, *tables(k_lead), m, **kw)
        return query, key
    if k is None:
        return apply(q, *tables(q_lead), m, **kw).reshape(query.shape), None
    if q_lead == k_lead:
        q, k = apply_qk(q, k, *tables(q_lead), m, **kw)
    else:
        q, k = apply(q, *tables(q_lead), m, **kw), apply(k, *tables(k_lead), m, **kw)
    return q.reshape(query.shape), k.reshape(key.shape)


# vLLM's ``torch.ops._C.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)``
# as a registered op of rome's namespace, for code that calls the op itself: in place on query
# and key (key may be None), returning nothing, as vLLM's; ``rounding`` (a trailing argument vLLM's
# schema has not, default "exact") as ``rotary_embedding``'s, "native" giving vLLM's bits.
@torch.library.custom_op("rome::vllm_rotary_embedding", mutates_args=("query", "key"))
def vllm_rotary_embedding(positions: Tensor, query: Tensor, key: Tensor | None, head_size: int,
                          cos_sin_cache: Tensor, is_neox: bool, rounding: str = "exact") -> None:
    """``torch.ops.rome.vllm_rotary_embedding``: vLLM's ``_C.rotary_embedding`` schema, query and
    key rotated in place by ``rotary_embedding(..., inplace=True)``."""
    rotary_embedding(positions, query, key, head_size=head_size, cos_sin_cache=cos_sin_cache,
                     is_neox_style=is_neox, inplace=True, rounding=rounding)


@vllm_rotary_embedding.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox, rounding="exact"):
    check_rounding(rounding)


def _half_cache(freqs: Frequencies, rows: int, dtype: torch.dtype, device) -> Tensor:
    """vLLM's ``cos_sin_cache`` ``[rows, rotary_dim]`` (cos ‖ sin, one value per pair, times
    ``freqs.attention_scaling``) from rome's float64 angles, rounded once to ``dtype``."""
    cos, sin = cos_sin_cache(rope_layout(freqs, mode="half"), rows, dtype=dtype, device=device)
    half = freqs.rotary_dim // 2  # half layout: columns [0, rotary_dim/2) hold pair k's value
    return torch.cat([cos[:, :half], sin[:, :half]], -1)


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


class RotaryEmbedding(nn.Module):
    """vLLM's ``RotaryEmbedding(head_size, rotary_dim, max_position_embeddings, base,
    is_neox_style, dtype)``: a ``cos_sin_cache`` buffer ``[max_position_embeddings, rotary_dim]``
    (cos ‖ sin, from rome's float64 angles rounded once to ``dtype``; vLLM's own uses float32
    angles) and ``forward(positions, query, key=None, offsets=None)`` -> ``(query, key)``.

    ``forward_native`` returns new tensors (vLLM's native path); ``forward`` too, unless the
    module was built with ``inplace=True``; ``forward_cuda`` rotates query and key in place and
    returns them (vLLM's CUDA op).
    Assign another cache (e.g. a scaled RoPE's) to ``cos_sin_cache`` to use it; ``.to(dtype)``
    casts it, as in vLLM. The scaled subclasses (``get_rope``) differ only in their cache.
    ``rounding="native"``: every forward gives ``forward_native``'s bits on this cache (vLLM's
    cache is float32 angles; assign it to ``cos_sin_cache`` for vLLM's own tables)."""

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float = 10000.0,
        is_neox_style: bool = True,
        dtype: torch.dtype | None = None,
        *,
        inplace: bool = False,
        backend: Backend = "auto",
        device=None,
        rounding: Rounding = "exact",
    ) -> None:
        super().__init__()
        self.rounding = check_rounding(rounding)
        self.head_size = _int(head_size, "head_size")
        self.rotary_dim = _int(rotary_dim, "rotary_dim")
        self.max_position_embeddings = _int(max_position_embeddings, "max_position_embeddings")
        if self.max_position_embeddings < 1:
            raise ValueError(f"max_position_embeddings must be >= 1, got {self.max_position_embeddings}")
        if not 0 < self.rotary_dim <= self.head_size or self.rotary_dim % 2:
            raise ValueError(
                f"rotary_dim must be a positive even int <= head_size = {self.head_size}, got {self.rotary_dim}")
        self.base = _positive(base, "base")
        for name, flag in (("is_neox_style", is_neox_style), ("inplace", inplace)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.is_complex:
            raise TypeError(f"dtype (the cos_sin_cache's) must be a floating torch.dtype, got {dtype!r}")
        self.is_neox_style, self.inplace, self.backend, self.dtype = is_neox_style, inplace, backend, dtype
        self.cos_sin_cache: Tensor
        self.register_buffer("cos_sin_cache", self._compute_cos_sin_cache(device), persistent=False)

    # what the subclasses change: the frequencies and the cache's rows
    def _frequencies(self) -> Frequencies:
        return rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim)

    def _cache_rows(self) -> int:
        return self.max_position_embeddings

    def _compute_cos_sin_cache(self, device=None) -> Tensor:
        return _half_cache(self._frequencies(), self._cache_rows(), self.dtype, device)

    def forward_native(
        self, positions: Tensor, query: Tensor, key: Tensor | None = None, offsets: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """vLLM's ``forward_native``: ``(query, key)`` rotated, new tensors."""
        return self._rotate(positions, query, key, offsets, inplace=False)

    def forward(
        self, positions: Tensor, query: Tensor, key: Tensor | None = None, offsets: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        return self._rotate(positions, query, key, offsets, inplace=self.inplace)

    def forward_cuda(
        self, positions: Tensor, query: Tensor, key: Tensor | None = None, offsets: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """vLLM's ``forward_cuda``: query and key rotated in place, returned (on any device;
        not differentiable, ``rome.apply_``'s rules)."""
        return self._rotate(positions, query, key, offsets, inplace=True)

    def _rotate(self, positions, query, key, offsets, inplace):
        return rotary_embedding(
            positions, query, key, head_size=self.head_size, cos_sin_cache=self.cos_sin_cache,
            is_neox_style=self.is_neox_style, rotary_dim=self.rotary_dim, offsets=offsets,
            inplace=inplace, backend=self.backend, rounding=getattr(self, "rounding", "exact"),
        )

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, max_position_embeddings="
                f"{self.max_position_embeddings}, base={self.base}, is_neox_style={self.is_neox_style}")


class LinearScalingRotaryEmbedding(RotaryEmbedding):
    """vLLM's ``LinearScalingRotaryEmbedding(head_size, rotary_dim, max_position_embeddings,
    base, is_neox_style, scaling_factors, dtype)``: for each factor f (a float or a list), a cache
    of ``max_position_embeddings * f`` rows at ``inv_freq / f``, the caches stacked;
    ``scaling_factor_to_offset[f]`` is the first row of f's (add it to the positions)."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                 scaling_factors, dtype=None, **kwargs) -> None:
        factors = [scaling_factors] if isinstance(scaling_factors, numbers.Real) else scaling_factors
        if isinstance(factors, (str, bytes)) or not isinstance(factors, (list, tuple)) or not factors:
            raise ValueError(f"scaling_factors must be a positive number or a non-empty list of them, got {scaling_factors!r}")
        self.scaling_factors = [_positive(f, "scaling_factors[i]") for f in factors]
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, **kwargs)

    def _compute_cos_sin_cache(self, device=None) -> Tensor:
        caches, self._scaling_factor_to_offset, offset = [], {}, 0
        for f in self.scaling_factors:
            freqs = rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim,
                                     scaling={"rope_type": "linear", "factor": f})
            rows = math.ceil(self.max_position_embeddings * f)
            caches.append(_half_cache(freqs, rows, self.dtype, device))
            self._scaling_factor_to_offset.setdefault(float(f), offset)
            offset += rows
        return torch.cat(caches, 0)

    @property
    def scaling_factor_to_offset(self) -> dict[float, int]:
        return self._scaling_factor_to_offset


class DynamicNTKScalingRotaryEmbedding(RotaryEmbedding):
    """vLLM's ``DynamicNTKScalingRotaryEmbedding(..., scaling_factor, dtype)``: one cache of
    ``max_position_embeddings * scaling_factor`` rows with the base stretched for that length,
    ``base * (f * L / max_pos - (f - 1)) ** (d / (d - 2))`` (transformers' ``dynamic`` at L)."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                 scaling_factor, dtype=None, **kwargs) -> None:
        self.scaling_factor = _positive(scaling_factor, "scaling_factor")
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, **kwargs)

    def _cache_rows(self) -> int:
        return math.ceil(self.max_position_embeddings * self.scaling_factor)

    def _frequencies(self) -> Frequencies:
        # vLLM stretches the base for the unrounded length max_position_embeddings * scaling_factor
        # (the cache's rows round it up): the stretch f * L / max_pos - (f - 1) as vLLM writes it,
        # given as a fixed NTK alpha (the same d / (d - 2) exponent)
        f, m = self.scaling_factor, self.max_position_embeddings
        stretch = f * (m * f) / m - (f - 1)
        return rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim,
                                scaling={"rope_type": "ntk_alpha", "alpha": stretch})


class DynamicNTKAlphaRotaryEmbedding(RotaryEmbedding):
    """vLLM's ``DynamicNTKAlphaRotaryEmbedding(..., scaling_alpha, dtype)``: the base stretched
    to ``base * alpha ** (d / (d - 2))`` (HunYuan)."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                 scaling_alpha, dtype=None, **kwargs) -> None:
        self.scaling_alpha = _positive(scaling_alpha, "scaling_alpha")
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, **kwargs)

    def _frequencies(self) -> Frequencies:
        return rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim,
                                scaling={"rope_type": "dynamic", "alpha": self.scaling_alpha})


def _yarn_params(scaling_factor, original, extrapolation_factor, attn_factor, beta_fast, beta_slow,
                 truncate, mscale=None, mscale_all_dim=None, attention_factor=None,
                 apply_yarn_scaling=True) -> dict:
    """vLLM's YaRN arguments as a transformers ``yarn`` dict for ``rome.rope_frequencies``
    (``apply_yarn_scaling=False``: vLLM's mscale is ``attn_factor`` alone)."""
    if not isinstance(apply_yarn_scaling, bool):
        raise ValueError(f"apply_yarn_scaling must be a bool, got {apply_yarn_scaling!r}")
    if not apply_yarn_scaling:
        if attention_factor is not None:
            raise ValueError("apply_yarn_scaling=False takes attn_factor as the mscale; attention_factor is "
                             f"for the default, got attention_factor={attention_factor!r}")
        attention_factor = _positive(attn_factor, "attn_factor")
    if extrapolation_factor != 1:
        raise ValueError(
            f"YaRN with extrapolation_factor={extrapolation_factor!r} is not supported by rome "
            f"(transformers' yarn, which rome computes, has extrapolation_factor 1)")
    params = {"rope_type": "yarn", "factor": _positive(scaling_factor, "scaling_factor"),
              "original_max_position_embeddings": original, "beta_fast": beta_fast,
              "beta_slow": beta_slow, "truncate": truncate, "mscale": mscale,
              "mscale_all_dim": mscale_all_dim, "attention_factor": attention_factor}
    if attention_factor is None and attn_factor != 1:  # vLLM: mscale = yarn_get_mscale(f) * attn_factor
        f = params["factor"]
        params["attention_factor"] = (1.0 if f <= 1 else 0.1 * math.log(f) + 1.0) * _positive(attn_factor, "attn_factor")
    return {k: v for k, v in params.items() if v is not None}


class YaRNScalingRotaryEmbedding(RotaryEmbedding):
    """vLLM's ``YaRNScalingRotaryEmbedding(head_size, rotary_dim, max_position_embeddings, base,
    is_neox_style, scaling_factor, dtype, *, extrapolation_factor=1, attn_factor=1, beta_fast=32,
    beta_slow=1, truncate=True, apply_yarn_scaling=True)``, ``max_position_embeddings`` the original context: a cache of
    ``ceil(max_position_embeddings * scaling_factor)`` rows, frequencies blended between
    ``inv_freq`` and ``inv_freq / scaling_factor`` over YaRN's ramp, cos and sin times
    ``mscale = (0.1 * ln(scaling_factor) + 1) * attn_factor`` (transformers' ``yarn``; ``attn_factor``
    alone with ``apply_yarn_scaling=False``, as vLLM).
    ``extrapolation_factor`` other than 1 is refused (``ValueError``)."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                 scaling_factor, dtype=None, *, extrapolation_factor=1, attn_factor=1, beta_fast=32,
                 beta_slow=1, truncate=True, apply_yarn_scaling=True, mscale=None, mscale_all_dim=None,
                 attention_factor=None, max_position=None, **kwargs) -> None:
        self._yarn = _yarn_params(scaling_factor, _int(max_position_embeddings, "max_position_embeddings"),
                                  extrapolation_factor, attn_factor, beta_fast, beta_slow, truncate,
                                  mscale, mscale_all_dim, attention_factor, apply_yarn_scaling)
        self.scaling_factor = self._yarn["factor"]
        self.max_position = max_position
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, **kwargs)
        self.mscale = self._frequencies().attention_scaling

    def _cache_rows(self) -> int:
        return max(math.ceil(self.max_position_embeddings * self.scaling_factor), self.max_position or 0)

    def _frequencies(self) -> Frequencies:
        return rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim, scaling=self._yarn)


class Llama3RotaryEmbedding(RotaryEmbedding):
    """vLLM's ``Llama3RotaryEmbedding(head_size, rotary_dim, max_position_embeddings, base,
    is_neox_style, dtype, scaling_factor, low_freq_factor, high_freq_factor,
    orig_max_position)``: Llama 3.1's frequencies (transformers' ``llama3``)."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype,
                 scaling_factor, low_freq_factor, high_freq_factor, orig_max_position, **kwargs) -> None:
        self._llama3 = {"rope_type": "llama3", "factor": _positive(scaling_factor, "scaling_factor"),
                        "low_freq_factor": _positive(low_freq_factor, "low_freq_factor"),
                        "high_freq_factor": _positive(high_freq_factor, "high_freq_factor"),
                        "original_max_position_embeddings": _int(orig_max_position, "orig_max_position")}
        self.scaling_factor = self._llama3["factor"]
        self.low_freq_factor, self.high_freq_factor = low_freq_factor, high_freq_factor
        self.orig_max_position = orig_max_position
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, **kwargs)

    def _frequencies(self) -> Frequencies:
        return rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim, scaling=self._llama3)


class Phi3LongRoPEScaledRotaryEmbedding(RotaryEmbedding):
    """vLLM's ``Phi3LongRoPEScaledRotaryEmbedding(head_size, rotary_dim, max_position_embeddings,
    original_max_position_embeddings, base, is_neox_style, dtype, short_factor, long_factor,
    short_mscale=None, long_mscale=None)``: ``long_short_cos_sin_cache`` (also
    ``cos_sin_cache``) = the short cache (``original_max_position_embeddings`` rows,
    ``inv_freq / short_factor``, times short_mscale) above the long one
    (``max_position_embeddings`` rows, ``inv_freq / long_factor``, times long_mscale); the
    mscales default to ``sqrt(1 + ln(max / original) / ln(original))`` (1 if max <= original).
    Positions read the long cache (rows offset by the original length) when ``max_model_len``
    (default ``max_position_embeddings``, vLLM's default) exceeds the original length, as vLLM
    decides it once per model. NeoX only (``is_neox_style=False`` is a ``ValueError``, as vLLM)."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, original_max_position_embeddings,
                 base, is_neox_style, dtype, short_factor, long_factor, short_mscale=None, long_mscale=None,
                 *, max_model_len: int | None = None, **kwargs) -> None:
        if is_neox_style is False:
            raise ValueError("Phi3LongRoPEScaledRotaryEmbedding only supports is_neox_style=True (as vLLM)")
        self.original_max_position_embeddings = _int(original_max_position_embeddings,
                                                     "original_max_position_embeddings")
        self.short_factor, self.long_factor = list(short_factor), list(long_factor)
        max_pos = _int(max_position_embeddings, "max_position_embeddings")
        scale = max_pos / self.original_max_position_embeddings
        default = 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(self.original_max_position_embeddings))
        self.short_mscale = default if short_mscale is None else _positive(short_mscale, "short_mscale")
        self.long_mscale = default if long_mscale is None else _positive(long_mscale, "long_mscale")
        self.max_model_len = max_pos if max_model_len is None else _int(max_model_len, "max_model_len")
        self.use_long_rope = self.max_model_len > self.original_max_position_embeddings
        super().__init__(head_size, rotary_dim, max_pos, base, is_neox_style, dtype, **kwargs)

    def _scaled(self, seq_len: int, mscale: float) -> Frequencies:
        f = rope_frequencies(
            self.head_size, theta=self.base, rotary_dim=self.rotary_dim, seq_len=seq_len,
            scaling={"rope_type": "longrope", "short_factor": self.short_factor,
                     "long_factor": self.long_factor,
                     "original_max_position_embeddings": self.original_max_position_embeddings,
                     "factor": 1.0})
        return Frequencies(f.inv_freq, f.head_dim, attention_scaling=mscale, rope_type="longrope")

    def _compute_cos_sin_cache(self, device=None) -> Tensor:
        orig = self.original_max_position_embeddings
        short = _half_cache(self._scaled(1, self.short_mscale), orig, self.dtype, device)
        long = _half_cache(self._scaled(orig + 1, self.long_mscale), self.max_position_embeddings, self.dtype, device)
        return torch.cat([short, long], 0)

    @property
    def long_short_cos_sin_cache(self) -> Tensor:
        return self.cos_sin_cache

    def _rotate(self, positions, query, key, offsets, inplace):
        if self.use_long_rope and isinstance(positions, Tensor):
            positions = positions + self.original_max_position_embeddings
        return super()._rotate(positions, query, key, offsets, inplace)


class MRotaryEmbedding(RotaryEmbedding):
    """vLLM's ``MRotaryEmbedding(head_size, rotary_dim, max_position_embeddings, base,
    is_neox_style, dtype, mrope_section=None, mrope_interleaved=False, *, scaling_factor=None,
    ...YaRN's arguments)``: multimodal RoPE (Qwen2-VL, Qwen2.5-VL; ``mrope_interleaved=True``:
    Qwen3-VL). The cache has ``4 * max_position_embeddings`` rows (YaRN's frequencies and mscale
    with ``scaling_factor``). ``forward(positions, query, key)``: positions ``[T]`` (text: as
    ``RotaryEmbedding``) or ``[3, T]`` (t, h, w): pair k reads the row of axis
    ``rome.layouts.mrope_axes(mrope_section, interleaved=mrope_interleaved)[k]`` — contiguous
    sections, or Qwen3-VL's interleaving (k % 3 == 1 for h while k < 3 * section[1], k % 3 == 2
    for w while k < 3 * section[2], t otherwise)."""

    def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype=None,
                 mrope_section=None, mrope_interleaved=False, *, scaling_factor=None, extrapolation_factor=1,
                 attn_factor=1, beta_fast=32, beta_slow=1, truncate=True, **kwargs) -> None:
        self._yarn = None if scaling_factor is None else _yarn_params(
            scaling_factor, _int(max_position_embeddings, "max_position_embeddings"), extrapolation_factor,
            attn_factor, beta_fast, beta_slow, truncate)
        self.scaling_factor = scaling_factor
        if not isinstance(mrope_interleaved, bool):
            raise TypeError(f"mrope_interleaved must be a bool, got {mrope_interleaved!r}")
        self.mrope_section = None if mrope_section is None else list(mrope_section)
        self.mrope_interleaved = mrope_interleaved
        if self.mrope_section is not None:
            self._axis = mrope_axes(self.mrope_section, interleaved=mrope_interleaved)
            if self._axis.numel() != _int(rotary_dim, "rotary_dim") // 2:
                raise ValueError(f"mrope_section={self.mrope_section} must sum to rotary_dim // 2 = "
                                 f"{rotary_dim // 2} (sum is {self._axis.numel()})")
        self.cache_max_position_num = 4 * _int(max_position_embeddings, "max_position_embeddings")
        super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype, **kwargs)
        self.mscale = self._frequencies().attention_scaling

    def _cache_rows(self) -> int:
        return self.cache_max_position_num

    def _frequencies(self) -> Frequencies:
        return rope_frequencies(self.head_size, theta=self.base, rotary_dim=self.rotary_dim, scaling=self._yarn)

    def _rotate(self, positions, query, key, offsets, inplace):
        if not isinstance(positions, Tensor) or positions.ndim != 2:
            return super()._rotate(positions, query, key, offsets, inplace)
        if self.mrope_section is None:
            raise ValueError("positions [3, T] (multimodal) need mrope_section, got mrope_section=None")
        a = len(self.mrope_section)
        if positions.shape[0] != a:
            raise ValueError(f"positions must be [T] or [{a}, T] (one row per mrope_section entry), "
                             f"got shape {list(positions.shape)}")
        if offsets is not None:
            raise ValueError("offsets are not supported with multimodal positions [3, T]")
        if positions.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"positions must be an int32/int64 tensor, got {positions.dtype}")
        cache = self.cos_sin_cache
        _halfwidth.check_positions(
            positions.reshape(-1, 1), cache.shape[0],
            f"positions must lie in the rows of cos_sin_cache [0, {cache.shape[0]})")
        t, half = positions.shape[1], self.rotary_dim // 2
        rows = cache.index_select(0, positions.reshape(-1).to(cache.device)).view(a, t, 2, half)
        axis = self._axis.to(cache.device).view(1, 1, 1, half).expand(1, t, 2, half)
        per_token = torch.gather(rows, 0, axis)[0].reshape(t, 2 * half)  # [T, cos ‖ sin]
        tokens = torch.arange(t, device=positions.device)
        return rotary_embedding(
            tokens, query, key, head_size=self.head_size, cos_sin_cache=per_token,
            is_neox_style=self.is_neox_style, rotary_dim=self.rotary_dim, inplace=inplace,
            backend=self.backend, rounding=getattr(self, "rounding", "exact"))


_ROPE_DICT: dict[tuple, RotaryEmbedding] = {}

SCALINGS = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")  # and mrope_section
_REFUSED = {
    "ntk": "NTKScalingRotaryEmbedding", "xdrope": "XDRotaryEmbedding",
    "mllama4": "Llama4VisionRotaryEmbedding", "deepseek_yarn": "DeepseekScalingRotaryEmbedding",
    "deepseek_llama_scaling": "DeepseekScalingRotaryEmbedding",
    "openpangu": "MRotaryEmbeddingInterleaved (openpangu)", "proportional": "Gemma 4's proportional RoPE",
}


def _frozen(value):
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


def get_rope(
    head_size: int,
    max_position: int,
    is_neox_style: bool = True,
    rope_parameters: dict | None = None,
    dtype: torch.dtype | None = None,
    dual_chunk_attention_config: dict | None = None,
    *,
    backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> RotaryEmbedding:
    """vLLM's ``get_rope(head_size, max_position, is_neox_style, rope_parameters, dtype,
    dual_chunk_attention_config)``: the rotary module of ``rope_parameters`` (``rope_type``,
    ``rope_theta`` (default 10000), ``partial_rotary_factor`` (rotary_dim =
    ``int(head_size * partial_rotary_factor)``) and the type's keys), one module per distinct
    arguments (cached, as vLLM). ``dtype`` defaults to ``torch.get_default_dtype()``.

    Supported ``rope_type``: ``default`` (``mrope_section``: ``MRotaryEmbedding``, with
    ``mrope_interleaved``), ``linear`` (``factor``), ``dynamic`` (``factor`` or ``alpha``),
    ``yarn`` (``factor``, ``original_max_position_embeddings``, optional ``attn_factor``,
    ``beta_fast``, ``beta_slow``, ``truncate``; with ``mrope_section``: ``MRotaryEmbedding``),
    ``llama3``, ``longrope`` (Phi-3). Others (``ntk``, ``xdrope``, ``mllama4``,
    ``deepseek_yarn``, ``openpangu``, Gemma 4's ``proportional``, dual-chunk attention) raise
    ``ValueError`` naming what is refused. ``backend``, ``rounding``: the module's (``rounding=
    "native"``: ``forward_native``'s bits on its cache).
    """
    check_rounding(rounding)
    if dual_chunk_attention_config is not None:
        raise ValueError(
            "dual_chunk_attention_config (vLLM's DualChunkRotaryEmbedding) is not supported by rome")
    if rope_parameters is not None and not isinstance(rope_parameters, dict):
        raise TypeError(f"rope_parameters must be a dict or None, got {type(rope_parameters).__name__}")
    params = dict(rope_parameters or {})
    if dtype is None:
        dtype = torch.get_default_dtype()
    head_size, max_position = _int(head_size, "head_size"), _int(max_position, "max_position")
    if not isinstance(is_neox_style, bool):
        raise TypeError(f"is_neox_style must be a bool, got {is_neox_style!r}")
    base = params.get("rope_theta", 10000)
    scaling_type = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor", 1.0)
    if isinstance(partial, bool) or not isinstance(partial, numbers.Real) or not 0.0 < partial <= 1.0:
        raise ValueError(f"partial_rotary_factor={partial!r} must be between 0.0 and 1.0")
    rotary_dim = int(head_size * partial)
    key = (head_size, rotary_dim, max_position, is_neox_style, _frozen(params), dtype, backend, rounding)
    if key in _ROPE_DICT:
        return _ROPE_DICT[key]
    common = (head_size, rotary_dim)
    kw = {"backend": backend, "rounding": rounding}

    def need(name):
        if name not in params:
            raise ValueError(f"rope_type={scaling_type!r} needs rope_parameters[{name!r}], got {params}")
        return params[name]

    if scaling_type in ("default", "mrope"):
        if "mrope_section" in params:
            rope = MRotaryEmbedding(*common, max_position, base, is_neox_style, dtype,
                                    mrope_section=params["mrope_section"],
                                    mrope_interleaved=params.get("mrope_interleaved", False), **kw)
        else:
            rope = RotaryEmbedding(*common, max_position, base, is_neox_style, dtype, **kw)
    elif scaling_type == "llama3":
        rope = Llama3RotaryEmbedding(*common, max_position, base, is_neox_style, dtype, need("factor"),
                                     need("low_freq_factor"), need("high_freq_factor"),
                                     need("original_max_position_embeddings"), **kw)
    elif scaling_type == "linear":
        rope = LinearScalingRotaryEmbedding(*common, max_position, base, is_neox_style, need("factor"), dtype, **kw)
    elif scaling_type == "dynamic":
        if "alpha" in params:
            rope = DynamicNTKAlphaRotaryEmbedding(*common, max_position, base, is_neox_style, params["alpha"], dtype, **kw)
        elif "factor" in params:
            rope = DynamicNTKScalingRotaryEmbedding(*common, max_position, base, is_neox_style, params["factor"], dtype, **kw)
        else:
            raise ValueError("Dynamic rope scaling must contain either 'alpha' or 'factor' field")
    elif scaling_type == "yarn":
        original = need("original_max_position_embeddings")
        # (vLLM's get_rope passes these keys on, and no others: mscale, mscale_all_dim and
        # attention_factor are deepseek_yarn's; apply_yarn_scaling not to mRoPE)
        extra = {k: params[k] for k in ("extrapolation_factor", "attn_factor", "beta_fast", "beta_slow",
                                        "apply_yarn_scaling", "truncate") if k in params}
        if "mrope_section" in params:
            extra.pop("apply_yarn_scaling", None)
            rope = MRotaryEmbedding(*common, original, base, is_neox_style, dtype,
                                    mrope_section=params["mrope_section"],
                                    mrope_interleaved=params.get("mrope_interleaved", False),
                                    scaling_factor=need("factor"), **extra, **kw)
        else:
            rope = YaRNScalingRotaryEmbedding(*common, original, base, is_neox_style, need("factor"), dtype,
                                              max_position=max_position, **extra, **kw)
    elif scaling_type == "longrope":
        extra = {k: params[k] for k in ("short_mscale", "long_mscale") if k in params}
        rope = Phi3LongRoPEScaledRotaryEmbedding(
            *common, max_position, need("original_max_position_embeddings"), base, is_neox_style, dtype,
            need("short_factor"), need("long_factor"), **extra, **kw)
    elif scaling_type in _REFUSED:
        raise ValueError(
            f"rope_type={scaling_type!r} ({_REFUSED[scaling_type]}) is not supported by rome's vLLM "
            f"adapter; supported: {', '.join(SCALINGS)} (and mrope_section)")
    else:
        raise ValueError(f"Unknown RoPE scaling type {scaling_type!r}; supported: {', '.join(SCALINGS)}")
    _ROPE_DICT[key] = rope
    return rope
