"""flashinfer's RoPE entry points (``flashinfer.rope``) on rome's op: drop-in functions.

    from rome.integrations.flashinfer import apply_rope_with_cos_sin_cache, apply_rope_pos_ids
    q_rot, k_rot = apply_rope_with_cos_sin_cache(positions, query, key, head_size, cache, True)
    q_rot, k_rot = apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False)

The names, positional order, defaults and shapes of flashinfer's functions (flashinfer is not
needed):

- ``apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True)``
  and ``..._inplace``: vLLM's convention (``rome.integrations.vllm.rotary_embedding``): positions
  ``[nnz]``, query/key ``[nnz, H * head_size]`` (or ``[nnz, H, head_size]``), ``cos_sin_cache`` ``[max_seq_len, rotary_dim]``
  float32 (cos ‖ sin halves; another dtype is a ``ValueError``, as in flashinfer).
- ``apply_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1,
  rope_theta=1e4)`` and ``apply_rope_inplace``: ragged q/k ``[nnz, H, D]``; token t of segment i
  (``indptr[i] <= t < indptr[i + 1]``) at position ``t - indptr[i] + offsets[i]``.
- ``apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1,
  rope_theta=1e4)`` and ``..._inplace``: the position of each token given, ``pos_ids`` ``[nnz]``.
- ``apply_llama31_rope`` / ``apply_llama31_rope_pos_ids`` (and ``_inplace``): the same with
  Llama 3.1's frequencies (``rope_scale=8``, ``rope_theta=5e5``, ``low_freq_factor=1``,
  ``high_freq_factor=4``, ``old_context_len=8192``).

Frequencies: pair i of the first ``rotary_dim`` columns (default: the whole head) turns by
``position * rope_theta ** (-2i / rotary_dim) / rope_scale`` (Llama 3.1: those frequencies
smoothed between ``freq / rope_scale`` and ``freq`` by wavelength, transformers' ``llama3``);
``interleave=False`` pairs the halves (NeoX), ``True`` adjacent columns (GPT-J); the rest of the
head passes through. The functional forms return ``(q_rope, k_rope)``, new tensors; the
``_inplace`` forms rotate q and k and return None (neither differentiable, as flashinfer).

How: flashinfer computes the angles in float32 in its kernel; rome takes them from float64
frequencies and positions (``rome.rope_frequencies``, ``rome.layouts.cos_sin_for_positions``),
rounds the tables once to float32, and calls ``rome.apply_qk`` / ``rome.apply_qk_`` (float32
arithmetic, one rounding to q's dtype). So rome's results are the more accurate of the two:
they agree with flashinfer's to flashinfer's float32 angle error, not bit for bit.

``rounding="native"`` (every function; default ``"exact"``): the eager chain's rounding on the same
tables, each product and sum rounded to q's dtype with the tables rounded to it first (for the
cos/sin-cache forms vLLM's ``forward_native`` bits on that cache). Not flashinfer's own bits:
its kernels compute in float32 (their angles too) and round once.

Differences: bad shapes, dtypes, indptr and positions raise ``ValueError``/``TypeError`` naming
the argument (flashinfer's kernel reads out of bounds or asserts); the functional forms are
differentiable in q and k (flashinfer's are not).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from ..frequencies import rope_frequencies
from ..inplace import apply_qk_
from ..layouts import cos_sin_for_positions, rope_layout
from ..ops import apply_qk
from ..positions import normalize_positions
from ..types import Backend, Rounding
from . import _halfwidth
from .vllm import rotary_embedding

__all__ = [
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


# --- the cos/sin-cache forms (vLLM's convention) -------------------------------------------


def _cache_call(positions, query, key, head_size, cos_sin_cache, is_neox, inplace, backend, rounding="exact"):
    if not isinstance(key, Tensor):
        raise TypeError(f"key must be a torch.Tensor, got {type(key).__name__}")
    if isinstance(cos_sin_cache, Tensor) and cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"cos_sin_cache should be float32 (as flashinfer), got {cos_sin_cache.dtype}")
    if isinstance(positions, Tensor) and positions.ndim != 1:
        raise ValueError(f"positions must be [nnz], got shape {_shape(positions)}")
    for name, t in (("query", query), ("key", key)):  # flashinfer views them as [nnz, -1, head_size]
        if isinstance(t, Tensor) and isinstance(positions, Tensor) and (t.ndim < 2 or t.shape[0] != positions.shape[0]):
            raise ValueError(
                f"{name} must be [nnz, num_heads * head_size] (or [nnz, num_heads, head_size]) with nnz = "
                f"positions.shape[0] = {positions.shape[0]}, got shape {_shape(t)}")
    return rotary_embedding(positions, query, key, head_size=head_size, cos_sin_cache=cos_sin_cache,
                            is_neox_style=is_neox, inplace=inplace, backend=backend, rounding=rounding)


def apply_rope_with_cos_sin_cache(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    *,
    backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """flashinfer's ``apply_rope_with_cos_sin_cache``: ``(query_out, key_out)``, new tensors of
    query's and key's shapes ``[nnz, H * head_size]``; ``cos_sin_cache`` ``[max_seq_len,
    rotary_dim]`` float32, cos in the first half, sin in the second; ``is_neox`` NeoX halves
    (False: GPT-J pairs). The columns past rotary_dim pass through."""
    return _cache_call(positions, query, key, head_size, cos_sin_cache, is_neox, False, backend, rounding)


def apply_rope_with_cos_sin_cache_inplace(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    *,
    backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> None:
    """flashinfer's ``apply_rope_with_cos_sin_cache_inplace``: query and key rotated in place."""
    _cache_call(positions, query, key, head_size, cos_sin_cache, is_neox, True, backend, rounding)


# --- the on-the-fly forms: frequencies from rope_theta/rope_scale --------------------------


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _check_qk(q, k) -> None:
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim != 3:
            raise ValueError(f"{name} must be a ragged tensor [nnz, num_heads, head_dim], got shape {_shape(t)}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"q and k must share nnz and head_dim ([nnz, num_heads, head_dim]), got q {_shape(q)} "
            f"and k {_shape(k)}")
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must have one dtype, got {q.dtype} and {k.dtype}")


def _frequencies(head_dim, rotary_dim, interleave, scaling, rope_theta):
    if rotary_dim is None:
        rotary_dim = head_dim
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim must be an int or None, got {rotary_dim!r}")
    if not 0 < rotary_dim <= head_dim or rotary_dim % 2:
        raise ValueError(
            f"rotary_dim must be a positive even int <= head_dim = {head_dim}, got {rotary_dim}")
    if not isinstance(interleave, bool):
        raise TypeError(f"interleave must be a bool, got {interleave!r}")
    theta = _number(rope_theta, "rope_theta")
    freqs = rope_frequencies(head_dim, theta=theta, rotary_dim=rotary_dim, scaling=scaling)
    return rope_layout(freqs, mode="interleave" if interleave else "half"), rotary_dim


def _rotate(q, k, positions, rotary_dim, interleave, scaling, rope_theta, inplace, backend, rounding="exact"):
    """q, k ``[nnz, H, D]`` rotated at int ``positions`` ``[nnz]``."""
    head_dim = q.shape[-1]
    layout, rotary_dim = _frequencies(head_dim, rotary_dim, interleave, scaling, rope_theta)
    cos, sin = cos_sin_for_positions(layout, positions.to(q.device), dtype=torch.float32)
    cos, sin = cos[:, None], sin[:, None]  # [nnz, 1, D]: over heads
    mode = "interleave" if interleave else "half"
    dtype = q.dtype if q.is_floating_point() else torch.float32  # another dtype: rome names it
    m = _halfwidth.matrix(mode, rotary_dim, head_dim, dtype, q.device)
    if inplace:
        apply_qk_(q, k, cos, sin, m, backend=backend, rounding=rounding)
        return None
    return apply_qk(q, k, cos, sin, m, backend=backend, rounding=rounding)


def _ragged_positions(q, indptr, offsets) -> Tensor:
    """int64 ``[nnz]``: ``t - indptr[i] + offsets[i]`` for token t of segment i."""
    if not isinstance(indptr, Tensor):
        raise TypeError(f"indptr must be an integer tensor [batch_size + 1], got {type(indptr).__name__}")
    if not isinstance(offsets, Tensor) or offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"offsets must be an int32/int64 tensor [batch_size], got {offsets!r}")
    if indptr.ndim == 1 and offsets.shape != (max(indptr.numel() - 1, 0),):
        raise ValueError(
            f"offsets must be [batch_size] = [len(indptr) - 1] = [{indptr.numel() - 1}], got shape "
            f"{_shape(offsets)}")
    try:
        pos = normalize_positions(None, n_axes=1, batch=1, seq=q.shape[0], offsets=offsets,
                                  cu_seqlens=indptr, device=q.device)
    except (ValueError, TypeError) as e:
        message = str(e).replace("cu_seqlens", "indptr").replace("packed tokens T", "tokens nnz")
        raise type(e)(message) from None
    return pos[:, 0]


def _pos_ids(q, pos_ids) -> Tensor:
    if not isinstance(pos_ids, Tensor) or pos_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"pos_ids must be an int32/int64 tensor [nnz], got {pos_ids!r}")
    if pos_ids.shape != (q.shape[0],):
        raise ValueError(f"pos_ids must be [nnz] = [{q.shape[0]}], got shape {_shape(pos_ids)}")
    return pos_ids  # (any integer, as apply_rope's offsets: the angles are computed from it, no cache row read)


def _linear(rope_scale):
    return {"rope_type": "linear", "factor": _number(rope_scale, "rope_scale")}


def _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len):
    old = _number(old_context_len, "old_context_len")
    if old != int(old):
        raise ValueError(f"old_context_len must be a whole number, got {old_context_len!r}")
    return {"rope_type": "llama3", "factor": _number(rope_scale, "rope_scale"),
            "low_freq_factor": _number(low_freq_factor, "low_freq_factor"),
            "high_freq_factor": _number(high_freq_factor, "high_freq_factor"),
            "original_max_position_embeddings": int(old)}


def apply_rope(
    q: Tensor, k: Tensor, indptr: Tensor, offsets: Tensor, rotary_dim: int | None = None,
    interleave: bool = False, rope_scale: float = 1, rope_theta: float = 1e4, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """flashinfer's ``apply_rope``: ``(q_rope, k_rope)`` for ragged q ``[nnz, Hq, D]``, k ``[nnz,
    Hk, D]``, segments ``indptr`` ``[batch_size + 1]`` and position ``offsets`` ``[batch_size]``."""
    _check_qk(q, k)
    return _rotate(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave,
                   _linear(rope_scale), rope_theta, False, backend, rounding)


def apply_rope_inplace(
    q: Tensor, k: Tensor, indptr: Tensor, offsets: Tensor, rotary_dim: int | None = None,
    interleave: bool = False, rope_scale: float = 1, rope_theta: float = 1e4, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> None:
    """flashinfer's ``apply_rope_inplace``: ``apply_rope`` written into q and k."""
    _check_qk(q, k)
    _rotate(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave,
            _linear(rope_scale), rope_theta, True, backend, rounding)


def apply_rope_pos_ids(
    q: Tensor, k: Tensor, pos_ids: Tensor, rotary_dim: int | None = None, interleave: bool = False,
    rope_scale: float = 1, rope_theta: float = 1e4, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """flashinfer's ``apply_rope_pos_ids``: ``(q_rope, k_rope)``, token t at ``pos_ids[t]``."""
    _check_qk(q, k)
    return _rotate(q, k, _pos_ids(q, pos_ids), rotary_dim, interleave, _linear(rope_scale),
                   rope_theta, False, backend, rounding)


def apply_rope_pos_ids_inplace(
    q: Tensor, k: Tensor, pos_ids: Tensor, rotary_dim: int | None = None, interleave: bool = False,
    rope_scale: float = 1, rope_theta: float = 1e4, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> None:
    """flashinfer's ``apply_rope_pos_ids_inplace``."""
    _check_qk(q, k)
    _rotate(q, k, _pos_ids(q, pos_ids), rotary_dim, interleave, _linear(rope_scale), rope_theta,
            True, backend, rounding)


def apply_llama31_rope(
    q: Tensor, k: Tensor, indptr: Tensor, offsets: Tensor, rotary_dim: int | None = None,
    interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
    low_freq_factor: float = 1, high_freq_factor: float = 4, old_context_len: int = 8192, *,
    backend: Backend = "auto", rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """flashinfer's ``apply_llama31_rope``: ``apply_rope`` with Llama 3.1's frequencies."""
    _check_qk(q, k)
    return _rotate(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave,
                   _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len),
                   rope_theta, False, backend, rounding)


def apply_llama31_rope_inplace(
    q: Tensor, k: Tensor, indptr: Tensor, offsets: Tensor, rotary_dim: int | None = None,
    interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
    low_freq_factor: float = 1, high_freq_factor: float = 4, old_context_len: int = 8192, *,
    backend: Backend = "auto", rounding: Rounding = "exact",
) -> None:
    """flashinfer's ``apply_llama31_rope_inplace``."""
    _check_qk(q, k)
    _rotate(q, k, _ragged_positions(q, indptr, offsets), rotary_dim, interleave,
            _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len), rope_theta,
            True, backend, rounding)


def apply_llama31_rope_pos_ids(
    q: Tensor, k: Tensor, pos_ids: Tensor, rotary_dim: int | None = None, interleave: bool = False,
    rope_scale: float = 8, rope_theta: float = 5e5, low_freq_factor: float = 1,
    high_freq_factor: float = 4, old_context_len: int = 8192, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """flashinfer's ``apply_llama31_rope_pos_ids``."""
    _check_qk(q, k)
    return _rotate(q, k, _pos_ids(q, pos_ids), rotary_dim, interleave,
                   _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len),
                   rope_theta, False, backend, rounding)


def apply_llama31_rope_pos_ids_inplace(
    q: Tensor, k: Tensor, pos_ids: Tensor, rotary_dim: int | None = None, interleave: bool = False,
    rope_scale: float = 8, rope_theta: float = 5e5, low_freq_factor: float = 1,
    high_freq_factor: float = 4, old_context_len: int = 8192, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> None:
    """flashinfer's ``apply_llama31_rope_pos_ids_inplace``."""
    _check_qk(q, k)
    _rotate(q, k, _pos_ids(q, pos_ids), rotary_dim, interleave,
            _llama31(rope_scale, low_freq_factor, high_freq_factor, old_context_len), rope_theta,
            True, backend, rounding)
