"""TEMPORARY stand-in (the torchbk branch brings the real module): matrix structure, cached."""
from __future__ import annotations
from dataclasses import dataclass
import torch

@dataclass(frozen=True, eq=False)
class MatrixInfo:
    gather: bool
    index: torch.Tensor | None
    sign: torch.Tensor | None
    bf16_exact: bool

_CACHE = {}

def describe(matrix: torch.Tensor) -> MatrixInfo:
    key = (id(matrix), matrix._version, matrix.data_ptr(), tuple(matrix.shape), matrix.stride(), matrix.dtype, matrix.device)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is matrix:
        return hit[1]
    m = matrix.detach().to("cpu", torch.float64)
    nz = m != 0
    gather = bool(((nz.sum(0) <= 1) & (nz.sum(1) <= 1)).all() and (m[nz].abs() == 1).all())
    index = sign = None
    if gather:
        index = nz.to(torch.int64).argmax(0)
        sign = m.gather(0, index[None])[0]
    info = MatrixInfo(gather, index, sign, bool((m.to(torch.bfloat16).double() == m).all()))
    _CACHE[key] = (matrix, info)
    return info
