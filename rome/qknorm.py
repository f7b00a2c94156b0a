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
(plus the rounding of the float64 steps). On a GPU (``backend="triton"``, or ``"auto"`` on CUDA)
the norm is computed in float32 and fed to ``rome.apply_qk``'s kernel as float32, rounded once to
q's dtype: within 1 ulp for bf16/fp16.

Speed: **not fused yet** — on a GPU this is the norm's float32 torch ops followed by one
``rome.apply_qk`` launch (issue 29's fused prologue in the gather kernel is the work left); it
gives models the one call and its exact rounding today. Autograd: dq, dk, and the weights' and
biases' gradients, through torch's autograd of these steps.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from .ops import BACKENDS, apply_qk

__all__ = ["NORMS", "OVER", "apply_qk_norm"]

NORMS = ("rms", "layer")
OVER = ("head", "heads")


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
    the module doc. ``q_weight``/``k_weight`` None: no scale (``elementwise_affine=False``)."""
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
    for name, w, x in (("q_weight", q_weight, q), ("k_weight", k_weight, k)):
        _check_weight(name, w, x, over, required=False)
    for name, b, x in (("q_bias", q_bias, q), ("k_bias", k_bias, k)):
        if b is not None and norm != "layer":
            raise ValueError(f"{name} is for norm='layer' (LayerNorm's bias); norm={norm!r} has none")
        _check_weight(name, b, x, over, required=False)
    torch_path = backend == "torch" or (backend == "auto" and q.device.type != "cuda") \
        or q.dtype == torch.float64
    dt = torch.float64 if torch_path else torch.float32
    kw = dict(norm=norm, over=over, eps=float(eps), offset=float(weight_offset), dt=dt)
    qn = _normalised(q, q_weight, q_bias, **kw)
    kn = _normalised(k, k_weight, k_bias, **kw)
    m = matrix.to(dt) if isinstance(matrix, Tensor) else matrix
    q_out, k_out = apply_qk(qn, kn, cos, sin, m, backend="torch" if torch_path else backend)
    return q_out.to(q.dtype), k_out.to(k.dtype)
