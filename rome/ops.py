"""``rome.apply`` and ``rome.apply_qk``: checks, backends, torch.library ops and autograd.

Four custom ops, two families that are each other's adjoint in x:

    rome::apply                out = x*cos + (x @ M) * sin
    rome::apply_qk             the same for q and k in one launch
    rome::apply_transposed     out = x*cos + (x*sin) @ Mᵀ     (dx of apply, given dy)
    rome::apply_qk_transposed  the same for q and k

The backward of one family calls the other (so double backward works), plus the table grads:
forward:   dcos = Σ h*x,  dsin = Σ h*(x@M),  dM = Σ xᵀ(h*sin)
transpose: dcos = Σ h*x,  dsin = Σ x*(h@M),  dM = Σ hᵀ(x*sin)
(Σ over the dims cos/sin/M were broadcast along). The ops also have batching rules (vmap).
Forward-mode AD and torch.func transforms go through ``_Rotate``, an autograd.Function with the
same backward and a jvp, which the public functions use when one is active.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings

import torch
import torch.autograd.forward_ad as fwAD
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


def _check(xs: dict[str, Tensor], cos, sin, matrix, backend) -> str:
    """Validate the arguments of any of the four ops; return the backend that will run."""
    _check_types(xs, cos, sin, matrix, backend)
    named = {**xs, "cos": cos, "sin": sin, "matrix": matrix}
    _check_no_forward_ad(named)
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


def _rotate(xs, cos, sin, matrix, backend: str, transpose: bool, outs=None) -> list[Tensor]:
    """The one launcher: into ``outs`` (x's shape and dtype, unit last stride; rome.inplace checks
    them and whether one may be its x) or, by default, into new tensors."""
    names = ("q", "k") if len(xs) == 2 else ("x",)
    backend = _check(dict(zip(names, xs)), cos, sin, matrix, backend)
    outs = [_out_like(x) for x in xs] if outs is None else list(outs)
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

# the four ops by (transpose, number of tensors); the adjoint in x of (t, n) is (not t, n)
_OPS = {(False, 1): _apply, (True, 1): _apply_t, (False, 2): _apply_qk, (True, 2): _apply_qk_t}


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
        mm = torch_backend.matmul
        terms = [x * mm(h, m) if transpose else h * mm(x, m) for x, h in pairs]
        dsin = _reduce_sum(terms, sin)
    if need_m:
        outer = [(h, x * s) if transpose else (x, h * s) for x, h in pairs]
        d = matrix.shape[-1]  # Σ over rows of aᵀb; a matmul (torch's legacy vmap has no einsum)
        dm = sum(torch_backend.matmul(a.reshape(-1, d).mT, b.reshape(-1, d)) for a, b in outer).to(matrix.dtype)
    return dcos, dsin, dm


def _grads(rotate, transpose: bool, xs, grads, cos, sin, matrix, needs_x, needs_tables):
    """``(dxs, (dcos, dsin, dM))`` of op (transpose, len(grads)) given the grads of its outputs.

    dx is the adjoint map of the grad, ``rotate(not transpose, hs)``: one launch for q and k.
    """
    n = len(grads)
    dxs = [None] * n
    live = [i for i in range(n) if needs_x[i] and grads[i] is not None]
    if len(live) == n:
        dxs = rotate(not transpose, list(grads))
    else:
        for i in live:
            dxs[i] = rotate(not transpose, [grads[i]])[0]
    return dxs, _table_grads(xs, grads, cos, sin, matrix, transpose, needs_tables)


# The ops' own autograd (torch.library): reverse mode, double backward, torch.compile, opcheck.


def _setup_context(ctx, inputs, output):
    *xs, cos, sin, matrix, backend = inputs
    n = len(xs)
    ctx.n, ctx.backend = n, backend
    table_grads = any(ctx.needs_input_grad[n : n + 3])
    ctx.save_for_backward(*(xs if table_grads else [None] * n), cos, sin, matrix)


def _make_backward(transpose: bool):
    def backward(ctx, *grads):
        n = ctx.n
        *xs, cos, sin, matrix = ctx.saved_tensors
        needs = ctx.needs_input_grad

        def rotate(t, hs):
            out = _OPS[(t, len(hs))](*hs, cos, sin, matrix, ctx.backend)
            return [out] if len(hs) == 1 else list(out)

        dxs, table = _grads(rotate, transpose, xs[:n], grads, cos, sin, matrix, needs[:n], needs[n : n + 3])
        return (*dxs, *table, None)

    return backward


for (_transpose, _n), _op in _OPS.items():
    _op.register_autograd(_make_backward(_transpose), setup_context=_setup_context)


# The ops' batching rules (torch.vmap, and torch.func.jacrev/jacfwd, which vmap over tangents).


def _batch_front(t: Tensor, dim, size: int, rank: int) -> Tensor:
    """t with its batch dim first (expanded if t has none), then size-1 dims up to 1 + rank."""
    t = t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)
    return t[(slice(None),) + (None,) * (rank + 1 - t.ndim)]


def _make_vmap(transpose: bool, n: int):
    def rule(info, in_dims, *args):
        *xs, cos, sin, matrix, backend = args
        op, b = _OPS[(transpose, n)], info.batch_size
        if in_dims[n + 2] is not None:  # a batch of matrices: one launch per matrix
            per = [
                op(*(t if d is None else t.select(d, i) for t, d in zip(args[:-1], in_dims)), backend)
                for i in range(b)
            ]
            outs = [torch.stack([p if n == 1 else p[j] for p in per]) for j in range(n)]
        else:
            # x as [B, 1.., *x], the tables (if batched) as [B, 1.., *cos]: one launch, which
            # broadcasts them as the unbatched op does per sample
            ranks = [x.ndim - (d is not None) for x, d in zip(xs, in_dims)]
            rank = max(ranks)
            bxs = [_batch_front(x, d, b, rank) for x, d in zip(xs, in_dims)]
            if in_dims[n] is not None or in_dims[n + 1] is not None:
                cos, sin = (_batch_front(t, d, b, rank) for t, d in zip((cos, sin), in_dims[n : n + 2]))
            out = op(*bxs, cos, sin, matrix, backend)
            outs = [out] if n == 1 else list(out)
            outs = [o[(slice(None),) + (0,) * (rank - r)] for o, r in zip(outs, ranks)]
        return (outs[0], 0) if n == 1 else (tuple(outs), (0,) * n)

    return rule


for (_transpose, _n), _op in _OPS.items():
    _op.register_vmap(_make_vmap(_transpose, _n))


def _tangent_terms(x, tcos, tsin, tm, sin, matrix, transpose: bool):
    """The tangent of the output from those of the tables and the matrix, in compute dtype:

        apply      x*ċos + (x @ M)*ṡin + (x @ Ṁ)*sin
        transpose  x*ċos + (x*ṡin) @ Mᵀ + (x*sin) @ Ṁᵀ
    """
    dt = _compute_dtype(x)
    x = x.to(dt)
    terms = []
    if tcos is not None:
        terms.append(x * tcos.to(dt))
    if tsin is not None:
        m = matrix.to(dt)
        terms.append(torch_backend.matmul(x * tsin.to(dt), m.mT) if transpose else torch_backend.matmul(x, m) * tsin.to(dt))
    if tm is not None:
        tm = tm.to(dt)
        terms.append(torch_backend.matmul(x * sin.to(dt), tm.mT) if transpose else torch_backend.matmul(x, tm) * sin.to(dt))
    return sum(terms) if terms else None


class _Rotate(torch.autograd.Function):
    """The four ops as one autograd.Function, which the public API calls under forward-mode
    AD and torch.func transforms.

    torch.library's generated autograd for a custom op has no ``setup_context`` and no ``jvp``:
    torch.func.grad/vjp/jacrev refuse it and forward-mode AD (torch.func.jvp, jacfwd,
    torch.autograd.forward_ad) gets a zero tangent. This Function gives the same backward plus a
    forward-mode rule; vmap is generated from the ops' batching rules. out is linear in x, so

        ṫ = op(ẋ) + the table and matrix terms of ``_tangent_terms``

    (op(ẋ) alone, bitwise, when only x has a tangent; else one more rounding to x's dtype).
    forward(transpose, backend, cos, sin, matrix, *xs) returns a tuple, one output per x.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(transpose, backend, cos, sin, matrix, *xs):
        out = _OPS[(transpose, len(xs))](*xs, cos, sin, matrix, backend)
        return (out,) if len(xs) == 1 else tuple(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        transpose, backend, cos, sin, matrix, *xs = inputs
        ctx.transpose, ctx.backend = transpose, backend
        table_grads = any(ctx.needs_input_grad[2:5])
        ctx.save_for_backward(cos, sin, matrix, *(xs if table_grads else [None] * len(xs)))
        ctx.save_for_forward(cos, sin, matrix, *xs)

    @staticmethod
    def _rotate(ctx, cos, sin, matrix):
        def rotate(t, hs):
            return list(_Rotate.apply(t, ctx.backend, cos, sin, matrix, *hs))

        return rotate

    @staticmethod
    def backward(ctx, *grads):
        cos, sin, matrix, *xs = ctx.saved_tensors
        needs = ctx.needs_input_grad
        rotate = _Rotate._rotate(ctx, cos, sin, matrix)
        dxs, table = _grads(rotate, ctx.transpose, xs, grads, cos, sin, matrix, needs[5:], needs[2:5])
        return (None, None, *table, *dxs)

    @staticmethod
    def jvp(ctx, _transpose, _backend, tcos, tsin, tm, *txs):
        cos, sin, matrix, *xs = ctx.saved_tensors
        rotate = _Rotate._rotate(ctx, cos, sin, matrix)
        live = [i for i, t in enumerate(txs) if t is not None]
        base = [None] * len(xs)
        if len(live) == len(xs):
            base = rotate(ctx.transpose, list(txs))
        else:
            for i in live:
                base[i] = rotate(ctx.transpose, [txs[i]])[0]
        outs = []
        for x, b in zip(xs, base):
            terms = _tangent_terms(x, tcos, tsin, tm, sin, matrix, ctx.transpose)
            if terms is None:
                outs.append(b if b is not None else torch.zeros(x.shape, dtype=x.dtype, device=x.device))
            else:
                outs.append((terms if b is None else b.to(terms.dtype) + terms).to(x.dtype))
        return tuple(outs)


# --- public API ---------------------------------------------------------------------------


def _use_function(*tensors: Tensor) -> bool:
    """Whether the call needs _Rotate: a torch.func transform is active or an input carries a
    forward-mode tangent. Otherwise the op runs directly (its registered autograd covers reverse
    mode, at less Python overhead), and always under torch.compile, since Dynamo cannot trace
    an autograd.Function with a jvp (graph break gb0144; it traces the op itself)."""
    if torch.compiler.is_compiling():
        return False
    if torch._C._are_functorch_transforms_active():
        return True
    return any(fwAD.unpack_dual(t).tangent is not None for t in tensors)


def _distributed(*tensors: Tensor):
    """rome.distributed (imported now: it registers the ops' DTensor sharding rules) when a
    tensor is a DTensor, else None. No DTensor can exist before torch.distributed.tensor loads."""
    dt = sys.modules.get("torch.distributed.tensor")
    if dt is None or not any(isinstance(t, dt.DTensor) for t in tensors):
        return None
    from . import distributed

    return distributed


def apply(x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, backend: str = "auto") -> Tensor:
    """Rotary position embedding as a matrix: ``x*cos + (x @ matrix)*sin``, a new tensor.

    x: ``[..., D]`` float32/float16/bfloat16 (float64 on the torch backend), any strides (unit
    last stride avoids a copy). cos, sin: float32 or x's dtype, broadcasting to x's shape
    (``[S, D]`` or ``[B, 1, S, D]`` for BNSD x, ``[S, 1, D]`` for BSND x, ``[N, S, D]`` per head).
    matrix: ``[D, D]``, e.g. ``rotation_matrix(sections, mode)``; any values.

    Computed in float32 (float64 for float64 x) and rounded once to x's dtype. backend:
    ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``), ``"torch"``, or ``"auto"`` (the
    Triton kernel for CUDA tensors it supports, torch otherwise). Differentiable in x, cos, sin
    and matrix, in reverse and forward mode and under torch.func transforms; the backward of x
    runs the same fused kernel with Mᵀ.
    """
    _check_types({"x": x}, cos, sin, matrix, backend)
    if (dist := _distributed(x, cos, sin, matrix)) is not None:
        x, cos, sin, matrix = dist.prepare(("x",), x, cos, sin, matrix, backend=backend)
    if _use_function(x, cos, sin, matrix):
        return _Rotate.apply(False, backend, cos, sin, matrix, x)[0]
    return torch.ops.rome.apply(x, cos, sin, matrix, backend)


def apply_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, backend: str = "auto"
) -> tuple[Tensor, Tensor]:
    """``(apply(q, ...), apply(k, ...))`` in one kernel launch; q and k may differ in head count
    (GQA) and layout but share head_dim, dtype and the tables."""
    _check_types({"q": q, "k": k}, cos, sin, matrix, backend)
    if (dist := _distributed(q, k, cos, sin, matrix)) is not None:
        q, k, cos, sin, matrix = dist.prepare(("q", "k"), q, k, cos, sin, matrix, backend=backend)
    if _use_function(q, k, cos, sin, matrix):
        q_out, k_out = _Rotate.apply(False, backend, cos, sin, matrix, q, k)
        return q_out, k_out
    return torch.ops.rome.apply_qk(q, k, cos, sin, matrix, backend)
