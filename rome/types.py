"""The string options of rome's public API, as ``typing.Literal`` types (the package ships
``py.typed``, so a type checker reads them from the signatures), and the tuples of their values
that the run-time checks use: each is written once, here.

- ``Mode``: the rotation of a block, ``"interleave"`` (GPT-J pairs) or ``"half"`` (NeoX/Llama).
- ``Backend``: ``"auto"`` (the Triton kernel for CUDA tensors it takes, else torch), ``"torch"``
  or ``"triton"``.
- ``Rounding``: how the result is rounded, ``"exact"`` (computed exactly, rounded once to x's
  dtype) or ``"native"`` (the eager chain's bits: the tables in x's dtype, each product and the
  sum rounded to it; docs/precision.md).
- ``AngleSource``: where ``rome.RoPE`` takes cos and sin from, its ``"cache"`` or the
  ``"kernel"`` (computed in the op from positions and frequencies).
- ``QkvLayout``: a packed qkv buffer, ``"stacked"`` ``[..., 3, N, D]`` or ``"concat"``
  ``[..., N_q + 2*N_kv, D]``.
"""

from __future__ import annotations

from typing import Literal, get_args

Mode = Literal["interleave", "half"]
Backend = Literal["auto", "torch", "triton"]
Rounding = Literal["exact", "native"]
AngleSource = Literal["cache", "kernel"]
QkvLayout = Literal["stacked", "concat"]

MODES: tuple[str, ...] = get_args(Mode)
BACKENDS: tuple[str, ...] = get_args(Backend)
ROUNDINGS: tuple[str, ...] = get_args(Rounding)
ANGLE_SOURCES: tuple[str, ...] = get_args(AngleSource)
QKV_LAYOUTS: tuple[str, ...] = get_args(QkvLayout)

__all__ = ["ANGLE_SOURCES", "AngleSource", "BACKENDS", "Backend", "MODES", "Mode", "QKV_LAYOUTS", "QkvLayout", "ROUNDINGS",
           "Rounding"]
