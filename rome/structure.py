"""What a rotation matrix is, found once per matrix: a signed (partial) permutation or not.

For ``M`` of shape ``[R, C]`` with at most one nonzero per row and per column, each nonzero
being ±1 (``gather``), the product is a gather with signs, and so is the transposed product:

    (x @ M)[..., j]  == sign[j]   * x[..., index[j]]      (sign 0: column j of M is zero)
    (y @ Mᵀ)[..., i] == sign_t[i] * y[..., index_t[i]]    (sign_t 0: row i of M is zero)

Every ``rotation_matrix`` is one (``signed_permutation``: exactly one nonzero per row and per
column); partial rotary's matrix, with a zero block on the pass-through columns, is a ``gather``
but not a ``signed_permutation``.

Detecting this reads the matrix on the host (a device sync), so ``describe`` caches its answer
per matrix object: the key is the tensor's identity, its version counter (bumped by in-place
changes), shape, strides, dtype, device and data pointer, and the cache holds a reference to the
tensor (detached: the same storage and version counter, without the autograd graph a computed
matrix carries), so its memory cannot be freed and reused by another matrix while the entry
lives; an object that later gets the same identity at the same address is a view of that very
memory, which its version says is unchanged. On
the CPU, where reading is cheap, a hit is also compared with a copy of the values it was found
for, so writes that bypass the version counter (through ``.data``, as ``gradcheck`` does) are
seen too; on other devices such writes are not seen. Inference tensors have no version counter:
they are analysed on every call. Not for fake or meta tensors (under
``torch.compile`` the custom op's real implementation is where this runs).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

CACHE_SIZE = 64


@dataclass(frozen=True)
class MatrixInfo:
    """The structure of one ``[R, C]`` matrix (see the module docstring).

    ``index``/``sign`` (``[C]``) and ``index_t``/``sign_t`` (``[R]``) are int64 / float32 tensors
    on the matrix's device, meaningful when ``gather`` (zeros otherwise; index 0 for a zero
    column or row). ``take``/``take_t``: ``index``/``index_t`` with a zero column (row) pointing
    at its own position instead (0 past the other side's length), so a gather with them never
    moves an element of x into a column that only multiplies it by 0 (a non-finite x stays in
    its own column). ``pairs``/``pairs_t``: ``take``/``take_t`` as an index of column pairs where
    it moves whole aligned pairs in order (``take[2i:2i+2] == (2k, 2k+1)``: half rotation with
    even halves), so a gather can move two elements at a time; None where it splits a pair
    (interleave rotation swaps within one). ``bf16_exact``: every entry is exactly representable
    in bfloat16 (NaN and ±inf count as representable).
    """

    shape: tuple[int, int]
    gather: bool
    signed_permutation: bool
    bf16_exact: bool
    index: Tensor
    sign: Tensor
    index_t: Tensor
    sign_t: Tensor
    take: Tensor
    take_t: Tensor
    pairs: Tensor | None = None
    pairs_t: Tensor | None = None


def _analyse(matrix: Tensor) -> MatrixInfo:
    m = matrix.detach()
    rows, cols = m.shape
    nonzero = m != 0  # NaN counts as nonzero
    unit = (m == 1) | (m == -1)
    per_col, per_row = nonzero.sum(0), nonzero.sum(1)
    bf16 = m.to(torch.bfloat16).to(m.dtype)
    flags = torch.stack([
        (per_col <= 1).all() & (per_row <= 1).all() & (unit | ~nonzero).all(),  # gather
        (per_col == 1).all() & (per_row == 1).all(),  # every row and column used
        ((bf16 == m) | (m.isnan() & bf16.isnan())).all(),
    ]).tolist()  # the one device -> host transfer
    gather, full, bf16_exact = (bool(f) for f in flags)
    if gather and rows and cols:
        index = nonzero.to(torch.uint8).argmax(0)  # the row holding column j's nonzero
        index_t = nonzero.to(torch.uint8).argmax(1)  # the column holding row i's nonzero
        sign = m.gather(0, index[None]).squeeze(0).float()
        sign_t = m.gather(1, index_t[:, None]).squeeze(1).float()
    else:
        index, index_t = (torch.zeros(n, dtype=torch.int64, device=m.device) for n in (cols, rows))
        sign, sign_t = (torch.zeros(n, dtype=torch.float32, device=m.device) for n in (cols, rows))
    take, take_t = _own_where_zero(index, sign, rows), _own_where_zero(index_t, sign_t, cols)
    pairs, pairs_t = (_pairwise(t) if gather else None for t in (take, take_t))
    return MatrixInfo((rows, cols), gather, gather and full, bf16_exact, index, sign, index_t, sign_t,
                      take, take_t, pairs, pairs_t)


def _pairwise(take: Tensor) -> Tensor | None:
    """``take[0::2] // 2`` where ``take`` moves aligned pairs whole and in order, else None."""
    even, odd = take[0::2], take[1::2]
    if len(take) % 2 or not bool(((even % 2 == 0) & (odd == even + 1)).all()):
        return None
    return even // 2


def _own_where_zero(index: Tensor, sign: Tensor, limit: int) -> Tensor:
    """``index``, where ``sign`` is 0 replaced by the position itself (0 at or past ``limit``)."""
    own = torch.arange(len(index), device=index.device)
    return torch.where(sign != 0, index, torch.where(own < limit, own, 0))


_cache: OrderedDict[tuple, tuple[Tensor, MatrixInfo, Tensor | None]] = OrderedDict()
_lock = threading.Lock()


def _key(matrix: Tensor) -> tuple:
    return (
        id(matrix), matrix._version, tuple(matrix.shape), matrix.stride(), matrix.dtype,
        matrix.device, matrix.data_ptr(),
    )


def _check(matrix) -> None:
    if not isinstance(matrix, Tensor):
        raise TypeError(f"matrix must be a torch.Tensor, got {type(matrix).__name__}")
    if matrix.ndim != 2:
        raise ValueError(f"matrix must be 2-D, got shape {list(matrix.shape)}")
    if matrix.layout != torch.strided:
        raise ValueError(f"matrix must be a dense (strided) tensor, got layout {matrix.layout}")
    if matrix.device.type == "meta" or is_fake(matrix):
        raise ValueError(
            "describe(matrix) reads the matrix's values, which a meta or fake tensor does not "
            "have (under torch.compile it runs in the custom op's real implementation)"
        )


def cached(matrix: Tensor) -> MatrixInfo | None:
    """The cached ``describe(matrix)`` if there is one, else None; never syncs a device."""
    _check(matrix)
    if matrix.is_inference():
        return None
    key = _key(matrix)
    with _lock:
        hit = _cache.get(key)
        if hit is None:
            return None
        _cache.move_to_end(key)
    _, info, values = hit
    if values is not None and not torch.equal(matrix.detach(), values):
        return None  # changed behind the version counter
    return info


def describe(matrix: Tensor) -> MatrixInfo:
    """The ``MatrixInfo`` of a 2-D ``matrix``, analysed once per matrix (see module docstring)."""
    info = cached(matrix)
    if info is not None:
        return info
    info = _analyse(matrix)
    if not matrix.is_inference():
        values = matrix.detach().clone() if matrix.device.type == "cpu" else None
        key = _key(matrix)
        with _lock:
            _cache[key] = (matrix.detach(), info, values)
            _cache.move_to_end(key)
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return info


def clear_cache() -> None:
    with _lock:
        _cache.clear()
