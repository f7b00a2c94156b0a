"""q/k normalisation then RoPE, as models run it right before attention:

    q_out = rope(norm(q) * (q_weight + weight_offset) [+ q_bias]),  likewise k

``rome.apply_qk_norm(q, k, cos, sin, matrix, q_weight, k_weight, *, eps=1e-6, norm="rms",
over="head", weight_offset=0.0, q_bias=None, k_bias=None, backend="auto") -> (q_out, k_out)``

- ``norm="rms"``: ``x / sqrt(mean(x²) + eps)`` (Qwen3, Gemma 3 with ``weight_offset=1.0``, Flux,
  HunyuanVideo, Cosmos, Wan); ``norm="layer"``: ``(x - mean) / sqrt(var + eps)`` with the biases
  added (CogVideoX's LayerNorm per head).
- ``over="head"``: each head's D values (weights ``[D]``); ``over="heads"``: all H·D values of a
  token (weights ``[H·D]``, head-major as a projection's output: Wan's
  ``rms_norm_across_heads``, LTX-Video, OLMo 2).
- q, k ``[B, H, S, D]`` with any strides (a projection's ``[B, S, H, D]`` output viewed with
  ``.transpose(1, 2)`` is what models pass); q and k may differ in H (GQA). cos, sin, matrix as
  for ``rome.apply_qk``.

Precision: the normalised value is never rounded to q's dtype before the rotation; the result
is rounded once at the end. The torch backend (CPU tensors, ``backend="torch"``) computes the
norm and the rotation in float64: within half an ulp of a float64 oracle of norm-then-rotate
(plus the rounding of the float64 steps). The triton backend computes the norm in float32: within
``rome.precision.tolerance`` for bf16/fp16, 1 ulp plus ``4·2**-24·(|x̂·cos| + |x̂[src]·sin|)``
(the fp32 norm's rounding, which a rotation that cancels carries into a result far below its
terms: fp16 LayerNorm at 1e-4 of the terms measured 2.46 ulp, 0.94·2**-24 of them past 1 ulp);
2e-6 relative for fp32.

Fused (the triton backend, a rotation the gather kernel takes, tables that need no gradient; over
heads, tables shared by a token's heads): one launch of the gather kernel with its norm prologue
(``rome::apply_qk_norm``, a torch.library op: torch.compile traces it without a break). Each
head's D values are one row of the kernel's tile, so the row's mean and 1/sqrt(var + eps) (RMSNorm:
the hardware's reciprocal square root, as torch's rsqrt; LayerNorm: square root and division
correctly rounded) come from registers, the partner ``x[:, src]`` shares them and
takes the weight at src: q and k are read and written once, as by ``rome.apply_qk`` alone (over
heads a program holds a token's heads: a first sweep sums the squares). The backward
(``rome::apply_qk_norm_backward``): one launch of the transposed kernel with the norm's backward
as its epilogue: g = the rotation's adjoint of dy in fp32, then per row
``dx = rstd·(g·w − x̂·mean(g·w·x̂) [− mean(g·w)])`` with the statistics recomputed from q/k,
``dw = Σ g·x̂``, ``db = Σ g`` from per-program partial sums; its own backward (the double
backward) differentiates the same math as fp32 torch ops. Elsewhere (the
seed's dot under ``product("dot")``, a general matrix, tables requiring grad, per-head tables over
heads) the norm's float32 torch ops then one ``rome.apply_qk`` launch, the same rounding, and the
backward's same math in fp32 torch ops (autograd through torch's where the op is not taken).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from . import ops
from .checks import check_arguments
from .ops import BACKENDS, apply_qk, apply_qk_at
from .positions import rows_of
from .torch_backend import matmul

__all__ = ["NORMS", "OVER", "QKNorm", "apply_qk_norm", "apply_qk_norm_at"]

NORMS = ("rms", "layer")
OVER = ("head", "heads")


@dataclass(frozen=True, eq=False)
class QKNorm:
    """A model's q/k norm, for ``rome.RoPE``'s ``norm=`` (its call then runs ``apply_qk_norm`` /
    ``apply_qk_norm_at``: the norm and the rotation in one pass where fused). The fields are
    ``apply_qk_norm``'s arguments; ``from_modules`` reads them off the model's norm modules."""

    q_weight: Tensor | None = None
    k_weight: Tensor | None = None
    eps: float = 1e-6
    norm: str = "rms"
    over: str = "head"
    weight_offset: float = 0.0
    q_bias: Tensor | None = None
    k_bias: Tensor | None = None

    @classmethod
    def from_modules(cls, q_norm: torch.nn.Module, k_norm: torch.nn.Module, *, over: str = "head",
                     weight_offset: float = 0.0) -> QKNorm:
        """The spec of two norm modules: ``torch.nn.RMSNorm`` / ``LayerNorm``, transformers'
        ``*RMSNorm`` (``variance_epsilon``), diffusers' ``RMSNorm`` / ``LayerNorm``: weight (None
        without an affine), bias (LayerNorm), eps; RMS unless the module is a LayerNorm.
        ``weight_offset``: 1.0 for Gemma's ``(1 + w)`` (its module does not say so)."""
        specs = [_module_spec(name, m) for name, m in (("q_norm", q_norm), ("k_norm", k_norm))]
        (qn, qeps, qw, qb), (kn, keps, kw, kb) = specs
        if qn != kn or qeps != keps:
            raise ValueError(f"q_norm and k_norm must be the same kind of norm with the same eps, got "
                             f"{type(q_norm).__name__}(eps={qeps}) and {type(k_norm).__name__}(eps={keps})")
        return cls(qw, kw, eps=qeps, norm=qn, over=over, weight_offset=weight_offset, q_bias=qb, k_bias=kb)

    def kwargs(self) -> dict:
        """The keyword arguments of ``apply_qk_norm`` (weights excluded)."""
        return dict(eps=self.eps, norm=self.norm, over=self.over, weight_offset=self.weight_offset,
                    q_bias=self.q_bias, k_bias=self.k_bias)


def _module_spec(name: str, m) -> tuple[str, float, Tensor | None, Tensor | None]:
    if not isinstance(m, torch.nn.Module):
        raise TypeError(f"{name} must be a norm module, got {type(m).__name__}")
    kind = "layer" if isinstance(m, torch.nn.LayerNorm) or "LayerNorm" in type(m).__name__ else "rms"
    eps = getattr(m, "eps", None)
    if eps is None:
        eps = getattr(m, "variance_epsilon", None)
    if eps is None and isinstance(m, torch.nn.RMSNorm):  # eps=None: torch's machine epsilon of the
        # dtype it computes in (float32 for half and float32 inputs, float64 for float64), here the
        # module's parameters' dtype
        w = getattr(m, "weight", None)
        dt = w.dtype if isinstance(w, Tensor) else torch.get_default_dtype()
        eps = torch.finfo(torch.float64 if dt == torch.float64 else torch.float32).eps
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise ValueError(f"{name} ({type(m).__name__}) has no eps rome can read (eps or variance_epsilon)")
    w = getattr(m, "weight", None)
    b = getattr(m, "bias", None) if kind == "layer" else None
    shape = getattr(m, "normalized_shape", None)
    if isinstance(shape, (tuple, list)) and len(shape) != 1:
        raise ValueError(f"{name} normalises over {tuple(shape)}: rome's norm is over one dimension")
    return kind, float(eps), w if isinstance(w, Tensor) else None, b if isinstance(b, Tensor) else None


def _check_weight(name: str, w, x: Tensor, over: str, *, required: bool) -> None:
    if w is None:
        if required:
            raise TypeError(f"{name} must be a tensor, got None")
        return
    if not isinstance(w, Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"{name} must be floating point, got {w.dtype}")
    h, d = x.shape[1], x.shape[-1]
    want = (d,) if over == "head" else (h * d,)
    if tuple(w.shape) != want:
        raise ValueError(f"{name} must have shape {list(want)} for over={over!r} and a tensor of shape "
                         f"{list(x.shape)} ([B, H, S, D]), got {list(w.shape)}")
    if w.device != x.device:
        raise ValueError(f"{name} is on {w.device}, the tensors on {x.device}")


def check_affine(q: Tensor, k: Tensor, q_weight, k_weight, q_bias, k_bias, *, norm: str, over: str) -> None:
    """The norm's weights and biases for q and k ``[B, H, S, D]``: tensors of the shape ``over``
    asks, floating, on q's and k's devices; biases only for ``norm="layer"``."""
    for name, w, x in (("q_weight", q_weight, q), ("k_weight", k_weight, k)):
        _check_weight(name, w, x, over, required=False)
    for name, b, x in (("q_bias", q_bias, q), ("k_bias", k_bias, k)):
        if b is not None and norm != "layer":
            raise ValueError(f"{name} is for norm='layer' (LayerNorm's bias); norm={norm!r} has none")
        _check_weight(name, b, x, over, required=False)


def _normalised(x: Tensor, w: Tensor | None, b: Tensor | None, *, norm: str, over: str, eps: float,
                offset: float, dt: torch.dtype) -> Tensor:
    """``norm(x) * (w + offset) [+ b]`` in ``dt``, x ``[B, H, S, D]``."""
    x = x.to(dt)
    dims = (-1,) if over == "head" else (1, -1)
    if norm == "layer":
        x = x - x.mean(dim=dims, keepdim=True)
        var = x.square().mean(dim=dims, keepdim=True)
    else:
        var = x.square().mean(dim=dims, keepdim=True)
    y = x * torch.rsqrt(var + eps)
    h, d = x.shape[1], x.shape[-1]

    def per_column(t: Tensor) -> Tensor:
        t = t.to(dt)
        return t if over == "head" else t.view(h, 1, d)  # [H*D] head-major -> [H, 1, D]: broadcasts

    if w is not None:
        y = y * (per_column(w) + offset) if offset else y * per_column(w)
    elif offset:
        y = y * (1.0 + offset)
    if b is not None:
        y = y + per_column(b)
    return y


def apply_qk_norm(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, q_weight: Tensor | None,
    k_weight: Tensor | None, *, eps: float = 1e-6, norm: str = "rms", over: str = "head",
    weight_offset: float = 0.0, q_bias: Tensor | None = None, k_bias: Tensor | None = None,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """q and k normalised (``norm`` over ``over``, scaled by ``weight + weight_offset``, plus the
    biases for ``norm="layer"``), then rotated as ``rome.apply_qk(q, k, cos, sin, matrix)``; see
    the module doc. ``q_weight``/``k_weight`` None: no scale (``elementwise_affine=False``).
    No ``rounding``: the normalised values are not rounded to q's dtype before the rotation, so
    no model's eager bits to reproduce (``rounding="native"``: the model's norm, then ``apply_qk``)."""
    return _norm_rope(q, k, cos, sin, matrix, q_weight, k_weight, None, None, eps=eps, norm=norm, over=over,
                      weight_offset=weight_offset, q_bias=q_bias, k_bias=k_bias, backend=backend)


def apply_qk_norm_at(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, positions: Tensor,
    q_weight: Tensor | None, k_weight: Tensor | None, *, axis: Tensor | None = None, eps: float = 1e-6,
    norm: str = "rms", over: str = "head", weight_offset: float = 0.0, q_bias: Tensor | None = None,
    k_bias: Tensor | None = None, backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """``apply_qk_norm`` with cos/sin caches ``[P, D]`` read at ``positions`` (and ``axis`` for
    several position axes), as ``rome.apply_qk_at``: a decode step's or a model's whole
    "norm → rope" in one call (one launch where fused)."""
    return _norm_rope(q, k, cos, sin, matrix, q_weight, k_weight, positions, axis, eps=eps, norm=norm, over=over,
                      weight_offset=weight_offset, q_bias=q_bias, k_bias=k_bias, backend=backend)


def _table_for(t, dt: torch.dtype):
    """A table in q's dtype (bf16/fp16 tables are valid with bf16/fp16 q) for the normalised q in
    ``dt``: as ``dt`` (exact: a half value widens exactly); float32 and ``dt`` tables as given."""
    return t.to(dt) if isinstance(t, Tensor) and t.dtype not in (torch.float32, dt) else t


def _norm_rope(q, k, cos, sin, matrix, q_weight, k_weight, positions, axis, *, eps, norm, over, weight_offset,
               q_bias, k_bias, backend):
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name} must be [B, H, S, D] (4 dims), got shape {list(x.shape)}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if q.shape[-1] != k.shape[-1] or q.dtype != k.dtype:
        raise ValueError(f"q and k must share head_dim and dtype, got {list(q.shape)} {q.dtype} and "
                         f"{list(k.shape)} {k.dtype}")
    if not isinstance(norm, str) or norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    if not isinstance(over, str) or over not in OVER:
        raise ValueError(f"over must be one of {OVER}, got {over!r}")
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a positive finite float, got {eps!r}")
    if isinstance(weight_offset, bool) or not isinstance(weight_offset, numbers.Real) \
            or not math.isfinite(weight_offset):
        raise ValueError(f"weight_offset must be a finite float, got {weight_offset!r}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    check_affine(q, k, q_weight, k_weight, q_bias, k_bias, norm=norm, over=over)
    if positions is not None and not isinstance(positions, Tensor):
        raise TypeError(f"positions must be an integer tensor, got {type(positions).__name__}")
    torch_path = backend == "torch" or (backend == "auto" and q.device.type != "cuda") \
        or q.dtype == torch.float64
    if not torch_path and _fusable(q, k, cos, sin, matrix, over, backend) and (over == "head" or norm == "rms"):
        return _fused_call(q, k, cos, sin, matrix, q_weight, k_weight, q_bias, k_bias,
                           norm=norm if over == "head" else "rms_heads",
                           eps=float(eps), offset=float(weight_offset), backend=backend, positions=positions,
                           axis=axis)
    # the unfused steps convert the tables and the matrix before apply_qk sees them: their types
    # are checked as apply_qk checks them first (a complex or integer table is no table)
    check_arguments({"q": q, "k": k}, cos, sin, matrix, backend, positions, axis)
    dt = torch.float64 if torch_path else torch.float32
    kw = dict(norm=norm, over=over, eps=float(eps), offset=float(weight_offset), dt=dt)
    qn = _normalised(q, q_weight, q_bias, **kw)
    kn = _normalised(k, k_weight, k_bias, **kw)
    m = matrix.to(dt) if isinstance(matrix, Tensor) else matrix
    cos, sin = (_table_for(t, dt) for t in (cos, sin))
    be = "torch" if torch_path else backend
    if positions is None:
        q_out, k_out = apply_qk(qn, kn, cos, sin, m, backend=be)
    else:
        q_out, k_out = apply_qk_at(qn, kn, cos, sin, m, positions, axis=axis, backend=be)
    return q_out.to(q.dtype), k_out.to(k.dtype)


# --- the fused path: the norm as the gather kernel's prologue ------------------------------


def _fusable(q: Tensor, k: Tensor, cos, sin, matrix, over: str, backend: str) -> bool:
    """Whether to take ``rome::apply_qk_norm`` (the norm as the gather kernel's prologue): a norm
    over each head (its D values are one row of the kernel's tile), a matrix given as a tensor,
    tables that need no gradient (the fused backward gives none). Only metadata is read here (so
    torch.compile traces it); the op itself checks whether the kernel takes the rotation and
    otherwise runs the same steps unfused."""
    if not isinstance(matrix, Tensor) or not isinstance(cos, Tensor) \
            or not isinstance(sin, Tensor) or q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return False
    return not (torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad or matrix.requires_grad))


def _affine(w: Tensor | None, b: Tensor | None, x: Tensor, offset: float, layer: bool,
            heads: bool = False) -> tuple[Tensor, Tensor | None]:
    """The kernel's weight ``w + offset`` and bias as fp32 ``[D]`` (``[H·D]`` over heads;
    differentiable: the weights' gradients flow back through these ops)."""
    d = x.shape[-1] * (x.shape[1] if heads else 1)
    w = torch.ones(d, dtype=torch.float32, device=x.device) if w is None else w.to(torch.float32)
    if offset:
        w = w + offset
    if layer:
        b = torch.zeros(d, dtype=torch.float32, device=x.device) if b is None else b.to(torch.float32)
    return w.contiguous(), (None if b is None else b.contiguous())


def _fused_call(q, k, cos, sin, matrix, q_weight, k_weight, q_bias, k_bias, *, norm, eps, offset, backend,
                positions=None, axis=None):
    layer, heads = norm == "layer", norm == "rms_heads"
    qw, qb = _affine(q_weight, q_bias, q, offset, layer, heads)
    kw, kb = _affine(k_weight, k_bias, k, offset, layer, heads)
    return tuple(_fused(q, k, cos, sin, matrix, qw, kw, qb, kb, eps, norm, backend, positions, axis))


@torch.library.custom_op("rome::apply_qk_norm", mutates_args=())
def _fused(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, q_weight: Tensor, k_weight: Tensor,
           q_bias: Tensor | None, k_bias: Tensor | None, eps: float, norm: str, backend: str = "auto",
           positions: Tensor | None = None, axis: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """q and k normalised (``norm``: "rms" or "layer" per head, fp32 weights [D] with the offset,
    biases for LayerNorm; "rms_heads": RMSNorm over a token's heads, weights [H·D]) and rotated
    (tables, or caches read at ``positions``): one launch of the gather kernel with its
    norm prologue where the kernel takes the rotation, else the norm in fp32 torch ops and one
    rotation launch (same result)."""
    be = ops._check({"q": q, "k": k}, cos, sin, matrix, backend, positions, axis)
    norms = [(q_weight, q_bias), (k_weight, k_bias)]
    if be == "triton" and _kernel_takes(norm, cos, sin, matrix, q.dtype, positions):
        q_out, k_out = ops._rotate([q, k], cos, sin, matrix, "triton", False, positions, axis,
                                   norm=(norm, eps, norms))
        return q_out, k_out
    kind, over = ("rms", "heads") if norm == "rms_heads" else (norm, "head")
    qn, kn = (_normalised(x, w, b, norm=kind, over=over, eps=eps, offset=0.0, dt=torch.float32)
              for x, (w, b) in zip((q, k), norms))
    cos, sin = (_table_for(t, torch.float32) for t in (cos, sin))
    q_out, k_out = ops._rotate([qn, kn], cos, sin, matrix.to(torch.float32), be, False, positions, axis)
    return q_out.to(q.dtype), k_out.to(k.dtype)


def _kernel_takes(norm: str, cos: Tensor, sin: Tensor, matrix: Tensor, dtype, positions) -> bool:
    """Whether the gather kernel takes the norm (forward prologue, backward epilogue): a rotation
    it takes; over heads, tables (or positions) shared by a token's heads (the program holds them
    all: LTX's per-head tables make each head its own row, so that norm is unfused)."""
    mode = 0 if positions is None else (1 if positions.shape[-1] == 1 else 2)
    per_head = norm == "rms_heads" and any(
        t.ndim >= 3 and t.shape[-3] > 1 and t.stride(-3) != 0
        for t in ((cos, sin) if positions is None else (positions[..., :1].expand(*positions.shape[:-1], 2),)))
    return not per_head and ops._kernel().norm_fusable(matrix, dtype, cos.dtype, sin.dtype, positions=mode)


@_fused.register_fake
def _fused_fake(q, k, cos, sin, matrix, q_weight, k_weight, q_bias, k_bias, eps, norm, backend="auto",
                positions=None, axis=None):
    return ops._out_like(q), ops._out_like(k)


def _norm_backward(x: Tensor, g: Tensor, w: Tensor, eps: float, layer: bool, need_w: bool, need_b: bool,
                   heads: bool = False):
    """The norm's backward in fp32 (per head, or ``heads``: over a token's H·D values, x
    ``[B, H, S, D]``, w ``[H·D]``), from ``g`` = the gradient of the normalised value
    (``norm(x) * w + b``): ``dx = rstd * (g*w - mean(g*w) - x̂ * mean(g*w * x̂))`` (no ``mean(g*w)``
    term for RMSNorm), ``dw = Σ g * x̂``, ``db = Σ g`` over every row."""
    x = x.to(torch.float32)
    dims = (1, -1) if heads else (-1,)
    if heads:
        w = w.view(x.shape[1], 1, x.shape[-1])
    if layer:
        x = x - x.mean(dim=dims, keepdim=True)
    rstd = torch.rsqrt(x.square().mean(dim=dims, keepdim=True) + eps)
    xhat = x * rstd
    gw = g * w
    inner = gw - xhat * (gw * xhat).mean(dim=dims, keepdim=True)
    if layer:
        inner = inner - gw.mean(dim=dims, keepdim=True)
    dx = rstd * inner
    rows = (0, 2) if heads else tuple(range(x.ndim - 1))
    dw = (g * xhat).sum(dim=rows).reshape(-1) if need_w else None
    db = g.sum(dim=rows).reshape(-1) if need_b else None
    return dx, dw, db


def _fused_setup(ctx, inputs, output):
    q, k, cos, sin, matrix, q_weight, k_weight, q_bias, k_bias, eps, norm, backend, positions, axis = inputs
    ctx.save_for_backward(q, k, cos, sin, matrix, q_weight, k_weight, positions, axis)
    ctx.backend = backend
    ctx.eps, ctx.layer, ctx.heads = eps, norm == "layer", norm == "rms_heads"
    ctx.has_bias = (q_bias is not None, k_bias is not None)


def _fused_backward(ctx, gq, gk):
    """``rome::apply_qk_norm_backward``: one launch of the transposed gather kernel with the norm's
    backward as its epilogue where the forward's kernel took the rotation (dq, dk and the weights'
    and biases' sums), else the same math in fp32 torch ops (the double backward: ``_fused_grad_backward``)."""
    q, k, cos, sin, matrix, q_weight, k_weight, positions, axis = ctx.saved_tensors
    need = ctx.needs_input_grad
    gq = torch.zeros_like(q) if gq is None else gq
    gk = torch.zeros_like(k) if gk is None else gk
    norm = "rms_heads" if ctx.heads else "layer" if ctx.layer else "rms"
    dq, dk, sq, sk = _fused_grad(gq, gk, q, k, cos, sin, matrix, q_weight, k_weight, ctx.eps, norm, ctx.backend,
                                 positions, axis)
    return (dq if need[0] else None, dk if need[1] else None, None, None, None,
            sq[0] if need[5] else None, sk[0] if need[6] else None,
            sq[1] if need[7] and ctx.has_bias[0] else None, sk[1] if need[8] and ctx.has_bias[1] else None,
            None, None, None, None, None)


_fused.register_autograd(_fused_backward, setup_context=_fused_setup)


@torch.library.custom_op("rome::apply_qk_norm_backward", mutates_args=())
def _fused_grad(gq: Tensor, gk: Tensor, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor,
                q_weight: Tensor, k_weight: Tensor, eps: float, norm: str, backend: str = "auto",
                positions: Tensor | None = None, axis: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward of ``rome::apply_qk_norm`` (``norm`` as its: "rms", "layer", "rms_heads"): dq, dk
    (q's and k's dtype) and per tensor the fp32 ``[2, W]`` sums ``(Σ g·x̂, Σ g)`` over its rows (the
    weight's and the bias's gradients; W the weight's length), g the gradient of the normalised
    value. One launch of the transposed gather kernel with the norm's backward as its epilogue
    where the kernel takes the rotation (it reads dy and the forward's q/k and writes dx: three
    passes' DRAM bytes where the unfused pair moves five; over heads dy and x are read a second
    time from cache); else the same math in fp32 torch ops."""
    be = ops._check({"q": gq, "k": gk}, cos, sin, matrix, backend, positions, axis)
    if be == "triton" and _kernel_takes(norm, cos, sin, matrix, q.dtype, positions):
        xs, gs = [q, k], [gq, gk]
        kernel = ops._kernel()
        for i in range(2):  # the kernel reads the forward's x at dy's offsets: one layout for both
            if not kernel.same_strides(gs[i], xs[i]) or xs[i].stride(-1) != 1:
                xs[i], gs[i] = xs[i].contiguous(), gs[i].contiguous()
        outs = [ops._out_like(x) for x in xs]
        with ops._INTERPRET_LOCK if kernel.INTERPRET else contextlib.nullcontext():
            sums = kernel.rotate(gs, outs, ops._unit_last(cos), ops._unit_last(sin), matrix, transpose=True,
                                 positions=positions, axis=axis,
                                 norm_grad=(norm, eps, [(q_weight, None), (k_weight, None)], xs))
        return outs[0], outs[1], sums[0], sums[1]
    dqn, dkn = ops._rotate([gq.to(torch.float32), gk.to(torch.float32)], cos, sin, matrix.to(torch.float32), be,
                           True, positions, axis)
    return _norm_grads(dqn, dkn, q, k, q_weight, k_weight, eps, norm)


def _norm_grads(dqn: Tensor, dkn: Tensor, q: Tensor, k: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
                norm: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """From g of q and k (the gradients of the normalised values, fp32): dq, dk in q's and k's
    dtypes and the ``[2, W]`` sums (dweight, dbias) per tensor: the op's result (fp32 torch ops)."""
    layer, heads = norm == "layer", norm == "rms_heads"
    dq, dqw, dqb = _norm_backward(q, dqn, q_weight, eps, layer, True, True, heads)
    dk, dkw, dkb = _norm_backward(k, dkn, k_weight, eps, layer, True, True, heads)
    return dq.to(q.dtype), dk.to(k.dtype), torch.stack([dqw, dqb]), torch.stack([dkw, dkb])


def _grad_math(gq, gk, q, k, cos, sin, matrix, q_weight, k_weight, eps, norm, positions, axis):
    """``rome::apply_qk_norm_backward``'s result as differentiable fp32 torch ops (its double
    backward differentiates these): g = the rotation's adjoint of dy, ``dy*cos + (dy*sin) @ Mᵀ``
    (the tables at q/k's rows: broadcast, or the caches read at ``positions`` by ``axis``,
    ``positions.rows_of``; the product without TF32, ``torch_backend.matmul``), then
    ``_norm_grads`` as the op's own fallback."""
    c, s = (cos, sin) if positions is None else rows_of((cos, sin), positions, axis)
    c, s, mt = c.to(torch.float32), s.to(torch.float32), matrix.to(torch.float32).t()
    dqn, dkn = (g.to(torch.float32) * c + matmul(g.to(torch.float32) * s, mt) for g in (gq, gk))
    return _norm_grads(dqn, dkn, q, k, q_weight, k_weight, eps, norm)


def _fused_grad_setup(ctx, inputs, output):
    gq, gk, q, k, cos, sin, matrix, q_weight, k_weight, eps, norm, backend, positions, axis = inputs
    ctx.save_for_backward(gq, gk, q, k, cos, sin, matrix, q_weight, k_weight, positions, axis)
    ctx.eps, ctx.norm = eps, norm


def _fused_grad_backward(ctx, ddq, ddk, dsq, dsk):
    """The double backward of the fused QK-norm: ``_grad_math`` (the backward's math as fp32 torch
    ops) differentiated with respect to dy, q, k and the weights (the tables, the matrix and the
    positions take none, as in the fused forward)."""
    gq, gk, q, k, cos, sin, matrix, q_weight, k_weight, positions, axis = ctx.saved_tensors
    need = ctx.needs_input_grad
    which = (0, 1, 2, 3, 7, 8)  # gq, gk, q, k, q_weight, k_weight
    with torch.enable_grad():
        leaves = [t.detach().requires_grad_(bool(need[i])) for t, i in zip((gq, gk, q, k, q_weight, k_weight), which)]
        outs = _grad_math(*leaves[:4], cos, sin, matrix, *leaves[4:], ctx.eps, ctx.norm, positions, axis)
        pairs = [(o, g) for o, g in zip(outs, (ddq, ddk, dsq, dsk)) if g is not None]
        wrt = [t for t in leaves if t.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], materialize_grads=True)
                   if wrt and pairs else [torch.zeros_like(t) for t in wrt])
    dgq, dgk, dq, dk, dqw, dkw = (next(got) if t.requires_grad else None for t in leaves)
    return dgq, dgk, dq, dk, None, None, None, dqw, dkw, None, None, None, None, None


_fused_grad.register_autograd(_fused_grad_backward, setup_context=_fused_grad_setup)


@_fused_grad.register_fake
def _fused_grad_fake(gq, gk, q, k, cos, sin, matrix, q_weight, k_weight, eps, norm, backend="auto",
                     positions=None, axis=None):
    return (ops._out_like(q), ops._out_like(k), q.new_empty((2, q_weight.shape[0]), dtype=torch.float32),
            k.new_empty((2, k_weight.shape[0]), dtype=torch.float32))
