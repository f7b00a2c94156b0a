"""``rome.apply`` and ``rome.apply_qk``: checks, backends, torch.library ops and autograd.

Four custom ops, two families that are each other's adjoint in x:

    rome::apply                out = x*cos + (x @ M) * sin
    rome::apply_qk             the same for q and k in one launch
    rome::apply_transposed     out = x*cos + (x*sin) @ Mᵀ     (dx of apply, given dy)
    rome::apply_qk_transposed  the same for q and k

The backward of one family calls the other (so double backward works), plus the table grads:
forward:   dcos = Σ h*x,  dsin = Σ h*(x@M),  dM = Σ xᵀ(h*sin)
transpose: dcos = Σ h*x,  dsin = Σ x*(h@M),  dM = Σ hᵀ(x*sin)
(Σ over the dims cos/sin/M were broadcast along).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import torch
from torch import Tensor

from . import torch_backend

BACKENDS = ("auto", "torch", "triton")
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Triton's interpreter patches triton.language globally while it runs a kernel, so two threads
# interpreting at once fail (InterpreterError); launches under TRITON_INTERPRET take this lock.
# Compiled (GPU) launches are thread-safe and never take it.
_INTERPRET_LOCK = threading.Lock()
_BROADCAST_HINT = "e.g. [S, D] or [B, 1, S, D] for BNSD x, [S, 1, D] for BSND x, [N, S, D] per head"


@functools.lru_cache(maxsize=None)
def _kernel():
    """The Triton kernel module, imported on first use (TRITON_INTERPRET is read then)."""
    try:
        from . import kernel
    except ImportError as e:  # pragma: no cover - platforms without triton
        raise RuntimeError(f"backend='triton' needs triton, which failed to import: {e}") from e
    return kernel


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _check_types(xs: dict[str, Tensor], cos, sin, matrix, backend) -> None:
    for name, t in (*xs.items(), ("cos", cos), ("sin", sin), ("matrix", matrix)):
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


def _check(xs: dict[str, Tensor], cos, sin, matrix, backend) -> str:
    """Validate the arguments of any of the four ops; return the backend that will run."""
    _check_types(xs, cos, sin, matrix, backend)
    named = {**xs, "cos": cos, "sin": sin, "matrix": matrix}
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
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got cos {_shape(cos)} and sin {_shape(sin)}"
        )
    if cos.ndim == 0 or cos.shape[-1] != d:
        raise ValueError(
            f"cos/sin last dim must be D={d} ({name0} {_shape(x0)}), got cos {_shape(cos)}"
        )
    for name, x in xs.items():
        try:
            fits = torch.broadcast_shapes(x.shape, cos.shape) == x.shape
        except RuntimeError:
            fits = False
        if not fits:
            raise ValueError(
                f"cos/sin of shape {_shape(cos)} must broadcast to {name} of shape "
                f"{_shape(x)} ({_BROADCAST_HINT})"
            )
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype not in (torch.float32, x0.dtype):
            raise TypeError(f"{name} must be float32 or {name0}'s dtype {x0.dtype}, got {t.dtype}")

    kernel_ok = x0.dtype != torch.float64 and d <= 256
    if backend == "auto":
        return "triton" if x0.is_cuda and kernel_ok else "torch"
    if backend == "triton":
        if x0.dtype == torch.float64:
            raise TypeError(f"backend='triton' takes float32/float16/bfloat16 {name0}, got float64")
        if d > 256:
            raise ValueError(f"backend='triton' takes head_dim D <= 256, got {name0} {_shape(x0)}")
    return backend


def _out_like(x: Tensor) -> Tensor:
    """The output buffer, always with a unit last stride (the kernel writes rows of D).

    x's layout (``torch.empty_like``) where that has one, else contiguous. empty_like of an
    overlapping x orders the dims by stride, so e.g. strides (1, 0, 1) give a last stride of 5.
    """
    if x.shape[-1] <= 1 or x.stride(-1) == 1:
        out = torch.empty_like(x)
        if x.shape[-1] <= 1 or out.stride(-1) == 1:
            return out
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _unit_last(t: Tensor) -> Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _rotate(xs, cos, sin, matrix, backend: str, transpose: bool) -> list[Tensor]:
    names = ("q", "k") if len(xs) == 2 else ("x",)
    backend = _check(dict(zip(names, xs)), cos, sin, matrix, backend)
    outs = [_out_like(x) for x in xs]
    if backend == "triton":
        kernel = _kernel()
        x0 = xs[0]
        if x0.is_cuda and x0.dtype != torch.float32 and kernel.launch.uses_fp32_dot(x0.dtype, matrix):
            warnings.warn(
                f"rome: the matrix's values are not exact in {x0.dtype} (nor bf16), so the kernel "
                "multiplies in IEEE fp32 rather than on the tensor cores",
                stacklevel=2,
            )
        with _INTERPRET_LOCK if kernel.INTERPRET else contextlib.nullcontext():
            kernel.rotate(
                [_unit_last(x) for x in xs], outs, _unit_last(cos), _unit_last(sin), matrix,
                transpose=transpose,
            )
    else:
        torch_backend.rotate_into(xs, outs, cos, sin, matrix, transpose=transpose)
    return outs


def _fake(xs, cos, sin, matrix, backend: str) -> list[Tensor]:
    names = ("q", "k") if len(xs) == 2 else ("x",)
    _check(dict(zip(names, xs)), cos, sin, matrix, backend)
    return [_out_like(x) for x in xs]


# --- the four ops -------------------------------------------------------------------------


@torch.library.custom_op("rome::apply", mutates_args=())
def _apply(x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto") -> Tensor:
    return _rotate([x], cos, sin, matrix, backend, transpose=False)[0]


@torch.library.custom_op("rome::apply_transposed", mutates_args=())
def _apply_t(x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto") -> Tensor:
    return _rotate([x], cos, sin, matrix, backend, transpose=True)[0]


@torch.library.custom_op("rome::apply_qk", mutates_args=())
def _apply_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    q_out, k_out = _rotate([q, k], cos, sin, matrix, backend, transpose=False)
    return q_out, k_out


@torch.library.custom_op("rome::apply_qk_transposed", mutates_args=())
def _apply_qk_t(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    q_out, k_out = _rotate([q, k], cos, sin, matrix, backend, transpose=True)
    return q_out, k_out


def _fake_one(x, cos, sin, matrix, backend="auto"):
    return _fake([x], cos, sin, matrix, backend)[0]


def _fake_two(q, k, cos, sin, matrix, backend="auto"):
    q_out, k_out = _fake([q, k], cos, sin, matrix, backend)
    return q_out, k_out


for _op, _fake_impl in ((_apply, _fake_one), (_apply_t, _fake_one), (_apply_qk, _fake_two), (_apply_qk_t, _fake_two)):
    _op.register_fake(_fake_impl)


# --- autograd -----------------------------------------------------------------------------

# the op whose x-map is the adjoint of each op's, by (transpose, number of tensors)
_ADJOINT = {
    (False, 1): lambda: torch.ops.rome.apply_transposed,
    (True, 1): lambda: torch.ops.rome.apply,
    (False, 2): lambda: torch.ops.rome.apply_qk_transposed,
    (True, 2): lambda: torch.ops.rome.apply_qk,
}


def _setup_context(ctx, inputs, output):
    *xs, cos, sin, matrix, backend = inputs
    n = len(xs)
    ctx.n, ctx.backend = n, backend
    table_grads = any(ctx.needs_input_grad[n : n + 3])
    ctx.save_for_backward(*(xs if table_grads else [None] * n), cos, sin, matrix)


def _reduce_sum(terms: list[Tensor], like: Tensor) -> Tensor:
    return sum(t.sum_to_size(like.shape) for t in terms).to(like.dtype)


@torch_backend.no_autocast
def _table_grads(xs, hs, cos, sin, matrix, transpose: bool, needs):
    """Grads of cos, sin and matrix; h is the incoming grad of the output of x."""
    pairs = [(x, h) for x, h in zip(xs, hs) if h is not None]
    if not pairs or not any(needs):
        return None, None, None
    dt = _compute_dtype(pairs[0][0])
    pairs = [(x.to(dt), h.to(dt)) for x, h in pairs]
    s, m = sin.to(dt), matrix.to(dt)
    need_cos, need_sin, need_m = needs
    dcos = _reduce_sum([h * x for x, h in pairs], cos) if need_cos else None
    dsin = dm = None
    if need_sin:
        terms = [x * (h @ m) if transpose else h * (x @ m) for x, h in pairs]
        dsin = _reduce_sum(terms, sin)
    if need_m:
        outer = [(h, x * s) if transpose else (x, h * s) for x, h in pairs]
        dm = sum(torch.einsum("...i,...j->ij", a, b) for a, b in outer).to(matrix.dtype)
    return dcos, dsin, dm


def _make_backward(transpose: bool):
    def backward(ctx, *grads):
        n = ctx.n
        *xs, cos, sin, matrix = ctx.saved_tensors
        xs = xs[:n]
        needs = ctx.needs_input_grad
        dxs = [None] * n
        live = [i for i in range(n) if needs[i] and grads[i] is not None]
        if len(live) == n:
            out = _ADJOINT[(transpose, n)]()(*grads, cos, sin, matrix, ctx.backend)
            dxs = list(out) if n == 2 else [out]
        else:
            for i in live:
                dxs[i] = _ADJOINT[(transpose, 1)]()(grads[i], cos, sin, matrix, ctx.backend)
        table = _table_grads(xs, grads, cos, sin, matrix, transpose, needs[n : n + 3])
        return (*dxs, *table, None)

    return backward


for _op, _transpose in ((_apply, False), (_apply_t, True), (_apply_qk, False), (_apply_qk_t, True)):
    _op.register_autograd(_make_backward(_transpose), setup_context=_setup_context)


# --- public API ---------------------------------------------------------------------------


def apply(x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, backend: str = "auto") -> Tensor:
    """Rotary position embedding as a matrix: ``x*cos + (x @ matrix)*sin``, a new tensor.

    x: ``[..., D]`` float32/float16/bfloat16 (float64 on the torch backend), any strides (unit
    last stride avoids a copy). cos, sin: float32 or x's dtype, broadcasting to x's shape
    (``[S, D]`` or ``[B, 1, S, D]`` for BNSD x, ``[S, 1, D]`` for BSND x, ``[N, S, D]`` per head).
    matrix: ``[D, D]``, e.g. ``rotation_matrix(sections, mode)``; any values.

    Computed in float32 (float64 for float64 x) and rounded once to x's dtype. backend:
    ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``), ``"torch"``, or ``"auto"`` (the
    Triton kernel for CUDA tensors it supports, torch otherwise). Differentiable in x, cos, sin
    and matrix; the backward of x runs the same fused kernel with Mᵀ.
    """
    _check_types({"x": x}, cos, sin, matrix, backend)
    return torch.ops.rome.apply(x, cos, sin, matrix, backend)


def apply_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """``(apply(q, ...), apply(k, ...))`` in one kernel launch; q and k may differ in head count
    (GQA) and layout but share head_dim, dtype and the tables."""
    _check_types({"q": q, "k": k}, cos, sin, matrix, backend)
    return torch.ops.rome.apply_qk(q, k, cos, sin, matrix, backend)
