"""The argument checks of rome's four ops (types, devices, shapes, the rounding), below both ``rome.ops`` and
``rome.distributed``: ``check_arguments`` raises for any argument the ops cannot take, and is all
``rome.distributed.prepare`` needs of the ops' checks (it checks DTensors on their global shapes).
What needs more than the arguments stays in ``rome.ops``: the backend ``"auto"`` picks, and the
position values (the thread's ``position_checks``)."""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from .tables import FLOAT_DTYPES
from .types import BACKENDS, ROUNDINGS

DTYPES = FLOAT_DTYPES  # (x, tables and matrix: float16/bfloat16/float32/float64)
_BROADCAST_HINT = "e.g. [S, D] or [B, 1, S, D] for BNSD x, [S, 1, D] for BSND x, [N, S, D] per head"


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _broadcasts_to(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` itself. Plain ints are compared here (about 50
    µs a call faster than ``torch.broadcast_shapes``); symbolic sizes go through torch's rules."""
    if all(type(n) is int for n in (*shape, *target)):
        return len(shape) <= len(target) and all(
            n == t or n == 1 for n, t in zip(reversed(shape), reversed(target)))
    try:
        return torch.broadcast_shapes(target, shape) == target
    except RuntimeError:
        return False


def check_types(xs: dict[str, Tensor], cos, sin, matrix, backend, tables=("cos", "sin")) -> None:
    """``tables``: the names of the cos and sin arguments (``("freqs", "scales")`` with angles)."""
    for name, t in (*xs.items(), *zip(tables, (cos, sin)), ("matrix", matrix)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.is_nested:
            raise TypeError(
                f"{name} must be a dense tensor, got a nested tensor (pad it, or call rome on "
                "each sequence / on the packed values)"
            )
        if t.layout != torch.strided:
            raise TypeError(
                f"{name} must be a dense (strided) tensor, got layout {t.layout} "
                f"(use {name}.to_dense())"
            )
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be a float16/bfloat16/float32/float64 tensor, got {t.dtype}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def check_rounding(rounding) -> str:
    """``rounding`` itself (``"exact"`` or ``"native"``), or ValueError naming the argument and
    its value: every entry point that takes ``rounding=`` checks it here."""
    if not isinstance(rounding, str) or rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return rounding


def _check_no_forward_ad(named: dict[str, Tensor]) -> None:
    """The ops themselves have no forward-mode rule (torch.library has none to register): a
    dual tensor reaching one would get a zero tangent. rome.apply / apply_qk have the rule."""
    for name, t in named.items():
        if fwAD.unpack_dual(t).tangent is not None:
            raise RuntimeError(
                f"forward-mode AD through the raw op torch.ops.rome.* is not supported ({name} "
                "has a tangent); call rome.apply / rome.apply_qk, which support forward_ad and "
                "every torch.func transform"
            )


def check_arguments(xs: dict[str, Tensor], cos, sin, matrix, backend, positions=None, axis=None,
                    angles=False) -> None:
    """Validate the arguments of any of the four ops (``rome.ops._check`` then picks the backend
    for ``"auto"``; ``rome.distributed.prepare`` checks DTensors on their global shapes)."""
    tables = ("freqs", "scales") if angles else ("cos", "sin")
    check_types(xs, cos, sin, matrix, backend, tables)
    named = {**xs, **dict(zip(tables, (cos, sin))), "matrix": matrix}
    _check_no_forward_ad(named)
    if positions is not None or axis is not None or angles:
        named |= check_position_types(positions, axis)
    if len({t.device for t in named.values()}) > 1:
        where = ", ".join(f"{n} on {t.device}" for n, t in named.items())
        raise ValueError(f"all tensors must be on one device, got {where}")
    (name0, x0), *rest = xs.items()
    for name, x in xs.items():
        if x.ndim == 0:
            raise ValueError(f"{name} must have at least one dim (head_dim last), got a scalar")
    for name, x in rest:
        if x.dtype != x0.dtype:
            raise TypeError(f"{name0} and {name} must have one dtype, got {x0.dtype} and {x.dtype}")
        if x.shape[-1] != x0.shape[-1]:
            raise ValueError(
                f"{name0} and {name} must have the same head_dim, got {name0} {_shape(x0)} "
                f"and {name} {_shape(x)}"
            )
    d = x0.shape[-1]
    if matrix.shape != (d, d):
        raise ValueError(
            f"matrix must be [D, D] = [{d}, {d}] for {name0} of shape {_shape(x0)}, "
            f"got {_shape(matrix)}"
        )
    if angles:
        _check_angles(cos, sin, x0.shape[-1])
    elif cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got cos {_shape(cos)} and sin {_shape(sin)}"
        )
    if cos.ndim == 0 or cos.shape[-1] != d:
        raise ValueError(
            f"cos/sin last dim must be D={d} ({name0} {_shape(x0)}), got cos {_shape(cos)}"
        )
    if positions is not None:
        _check_positions(xs, cos, positions, axis, angles)
    for name, x in (xs.items() if positions is None else ()):
        if not _broadcasts_to(cos.shape, x.shape):
            raise ValueError(
                f"cos/sin of shape {_shape(cos)} must broadcast to {name} of shape "
                f"{_shape(x)} ({_BROADCAST_HINT})"
            )
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype not in (torch.float32, x0.dtype):
            raise TypeError(f"{name} must be float32 or {name0}'s dtype {x0.dtype}, got {t.dtype}")
    if backend == "triton":
        if x0.dtype == torch.float64:
            raise TypeError(f"backend='triton' takes float32/float16/bfloat16 {name0}, got float64")
        if d > 256:
            raise ValueError(f"backend='triton' takes head_dim D <= 256, got {name0} {_shape(x0)}")


_INT_DTYPES = (torch.int32, torch.int64)


def check_position_types(positions, axis) -> dict[str, Tensor]:
    for name, t in (("positions", positions), ("axis", axis)):
        if t is None and name == "axis":
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be an int32/int64 torch.Tensor, got {type(t).__name__}")
        if t.is_nested or t.layout != torch.strided:
            raise TypeError(f"{name} must be a dense (strided) tensor")
        if t.dtype not in _INT_DTYPES:
            raise TypeError(f"{name} must be an int32 or int64 tensor, got {t.dtype}")
    return {"positions": positions} | ({} if axis is None else {"axis": axis})


def _check_angles(freqs: Tensor, scales: Tensor, d: int) -> None:
    if freqs.shape != (2, d) or scales.shape != (2, d) or freqs.dtype != torch.float32 \
            or scales.dtype != torch.float32:
        raise ValueError(
            f"freqs must be the float32 frequencies [2, D] = [2, {d}] (inv_freq as hi + lo, "
            f"rome.positions.angle_frequencies) and scales the float32 scales [2, D] = [2, {d}], got "
            f"freqs {_shape(freqs)} {freqs.dtype} and scales {_shape(scales)} {scales.dtype}"
        )


def _check_positions(xs: dict[str, Tensor], cos: Tensor, positions: Tensor, axis, angles=False) -> None:
    """Shapes with positions: caches ``[P, D]``, positions ``[..., A]`` broadcasting to the rows
    of every x, axis ``[D]`` (needed for A > 1). Values are checked in ``rome.ops``."""
    (name0, x0), d = next(iter(xs.items())), cos.shape[-1]
    if cos.ndim != 2 and not angles:
        raise ValueError(
            f"with positions, cos/sin must be caches [P, D] = [P, {d}] (one row per position), "
            f"got cos {_shape(cos)}"
        )
    if positions.ndim == 0 or positions.shape[-1] == 0:
        raise ValueError(
            f"positions must be [..., A] with A >= 1 position axes, got {_shape(positions)}"
        )
    for name, x in xs.items():
        if not _broadcasts_to(positions.shape[:-1], x.shape[:-1]):
            raise ValueError(
                f"positions of shape {_shape(positions)} ([..., A]) must broadcast to the rows of "
                f"{name} {_shape(x)} (e.g. [B, 1, S, A] or [S, A] for BNSD x, [T, 1, A] for THD)"
            )
    a = positions.shape[-1]
    if axis is None and a > 1:
        raise ValueError(
            f"positions with A={a} axes ({_shape(positions)}) need axis, the int [D={d}] axis "
            f"each column reads"
        )
    if axis is not None and axis.shape != (d,):
        raise ValueError(f"axis must be [D] = [{d}], got {_shape(axis)}")
