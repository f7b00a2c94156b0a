"""What the flash-attn and vLLM adapters share: half-width cos/sin tables read at token
positions and brought to rome's full width, and the matrix of a partial rotary.

Other libraries keep one cos and one sin value per rotated *pair*: tables ``[P, rotary_dim/2]``
(flash-attn's ``cos``/``sin``, the two halves of vLLM's ``cos_sin_cache``). rome's formula
``x*cos + (x @ M)*sin`` reads one value per *column*: pair k's value goes to columns k and
k + rotary_dim/2 (``half``, NeoX/Llama) or 2k and 2k + 1 (``interleave``, GPT-J), and the
``head_dim - rotary_dim`` columns past the rotary ones pass through (cos 1, sin 0, a zero block
in M: ``rome.layouts.RopeLayout``). The rows are gathered first (``rome.positions.gather_rows``)
and widened after, so the work follows the tokens, not the table's length.
"""

from __future__ import annotations

import torch
from einops import repeat
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

from ..matrices import kept_matrix, rotation_matrix
from ..positions import check_range, gather_rows

# pair k -> its two columns (the einops patterns of rome.layouts' columns, with leading dims)
_WIDEN = {"half": "... k -> ... (r k)", "interleave": "... k -> ... (k r)"}


def token_tables(cos: Tensor, sin: Tensor, positions: Tensor, head_dim: int, mode: str):
    """``(cos, sin)`` ``[..., head_dim]`` for int ``positions`` ``[..., 1]``, read from half-width
    caches ``[P, rotary_dim/2]`` (differentiable in them) in their dtype."""
    c, s = (gather_rows(t, positions) for t in (cos, sin))
    c, s = (repeat(t, _WIDEN[mode], r=2) for t in (c, s))
    rest = head_dim - c.shape[-1]
    if rest:
        ones = torch.ones(*c.shape[:-1], rest, dtype=c.dtype, device=c.device)
        c, s = torch.cat([c, ones], -1), torch.cat([s, torch.zeros_like(ones)], -1)
    return c, s


def matrix(mode: str, rotary_dim: int, head_dim: int, dtype: torch.dtype, device, *, transposed=False) -> Tensor:
    """The ``head_dim``² matrix rotating the first ``rotary_dim`` columns by ``mode`` (zero on
    the rest), or its transpose: one tensor per arguments (rome reads a matrix's structure once
    per tensor)."""
    device = torch.device(device)
    return kept_matrix(("halfwidth", mode, rotary_dim, head_dim, dtype, device, transposed),
                       lambda: _build(mode, rotary_dim, head_dim, dtype, device, transposed))


def _build(mode, rotary_dim, head_dim, dtype, device, transposed) -> Tensor:
    """``RopeLayout.matrix`` of this partial rotary (a rotation block, a zero block), built from
    ``rotation_matrix`` directly so that tracing it takes no host check."""
    rest = head_dim - rotary_dim
    m = torch.block_diag(rotation_matrix(rotary_dim, mode, dtype=dtype, device=device),
                         torch.zeros(rest, rest, dtype=dtype, device=device))
    return m.mT.contiguous() if transposed else m


def check_positions(positions: Tensor, rows: int, what: str) -> None:
    """``0 <= positions < rows`` on the host (one sync), with ``what`` saying where the
    positions and rows come from; skipped where values cannot be read (tracing, fake or meta
    tensors, CUDA graph capture)."""
    if (torch.compiler.is_compiling() or is_fake(positions) or positions.device.type == "meta"
            or (positions.is_cuda and torch.cuda.is_current_stream_capturing())):
        return
    try:
        check_range(positions, rows, name="rows")
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
