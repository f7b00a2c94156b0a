"""rome's versions of diffusers' rotary functions: same signature, same result, one rome launch.

Each class stands for one function of diffusers (or a modeling file's own copy of it) that rotates
q or k: an instance, built on a ``rotate`` (``rome.integrations.diffusers._Rotate``: ``one(x, cos,
sin, mode)`` is one ``rome.apply``, ``rotate(q, k, cos, sin, mode)`` one ``rome.apply_qk``), is
called with the arguments the diffusers function takes and reads its tables as that function
reads them, turned into rome's ``[..., D]`` tables and rotation. ``mode`` is ``"interleave"``
(pairs ``(2i, 2i+1)``), ``"half"`` (pairs ``(i, i + D/2)``, ``rotate_half``) or a tuple of
``(mode, width)`` blocks (``"none"``: columns passed through, ``cos = 1, sin = 0``).

``rome.integrations.diffusers`` binds them, per processor class, in place of the function the
processor's ``__call__`` calls (``_code``-style rebinding of the function's globals; a relative
``from ..embeddings import apply_rotary_emb`` inside ``__call__`` is resolved to them too). The
modeling file and diffusers' own functions are never changed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["FUNCTIONS"]


def complex_tables(freqs: Tensor) -> tuple[Tensor, Tensor]:
    """A complex table ``[..., D/2]`` (``x * e^{iθ}`` on pairs ``(2i, 2i+1)``) as rome's
    interleave tables ``[..., D]``: ``cos θ_i``, ``sin θ_i`` twice."""
    parts = torch.view_as_real(freqs)
    return parts[..., 0].repeat_interleave(2, -1), parts[..., 1].repeat_interleave(2, -1)


def _partial(x: Tensor, cos: Tensor, sin: Tensor, mode: str) -> tuple[Tensor, Tensor, object]:
    """Tables of the leading ``r = cos.shape[-1]`` columns of x widened to x's head dim (the rest
    ``cos = 1, sin = 0``) and the rotation: ``mode`` over r columns, the rest passed through."""
    r, d = cos.shape[-1], x.shape[-1]
    if r == d:
        return cos, sin, mode
    pad = (*cos.shape[:-1], d - r)
    cos = torch.cat([cos, cos.new_ones(pad)], -1)
    sin = torch.cat([sin, sin.new_zeros(pad)], -1)
    return cos, sin, ((mode, r), ("none", d - r))


class _Function:
    """A diffusers rotary function on rome (``rotate``: the patch's ``_Rotate``)."""

    function = ""  # the diffusers function it stands for, with its arguments
    tables = ""  # the tables that function reads (docs/families.md)
    mode = ""  # the rotation, in rome's words (docs/families.md)
    fused = False  # q and k in one launch (the function takes both)

    def __init__(self, rotate):
        self.rotate = rotate


class ApplyRotaryEmb(_Function):
    """``diffusers.models.embeddings.apply_rotary_emb(x, freqs_cis, use_real=True,
    use_real_unbind_dim=-1, sequence_dim=2)``: real tables ``(cos, sin)`` ``[S, D]`` (pairs
    ``(2i, 2i+1)`` for ``use_real_unbind_dim=-1``, halves for ``-2``), or a complex table
    ``[B, S, D/2]`` (``use_real=False``)."""

    function = "embeddings.apply_rotary_emb"
    tables = "real `(cos, sin)` `[S, D]`, or complex `[B, S, D/2]`"
    mode = "interleave (`use_real_unbind_dim=-1`, complex tables) or half (`-2`)"

    def __call__(self, x, freqs_cis, use_real=True, use_real_unbind_dim=-1, sequence_dim=2):
        if not use_real:
            cos, sin = complex_tables(freqs_cis.unsqueeze(2))
            return self.rotate.one(x, cos, sin)
        cos, sin = freqs_cis
        if sequence_dim == 2:
            cos, sin = cos[None, None], sin[None, None]
        elif sequence_dim == 1:
            cos, sin = cos[None, :, None], sin[None, :, None]
        else:
            raise ValueError(f"`sequence_dim={sequence_dim}` but should be 1 or 2.")
        if use_real_unbind_dim not in (-1, -2):
            raise ValueError(f"`use_real_unbind_dim={use_real_unbind_dim}` but should be -1 or -2.")
        return self.rotate.one(x, cos, sin, "interleave" if use_real_unbind_dim == -1 else "half")


class ApplyRotaryEmbQwen(_Function):
    """``apply_rotary_emb_qwen(x, freqs_cis, use_real=True, use_real_unbind_dim=-1)`` (Qwen-Image's,
    and the copies of Qwen-Image 2.1 and NucleusMoE): x ``[B, S, H, D]``, real tables ``[S, D]`` or
    a complex table ``[S, D/2]``."""

    function = "apply_rotary_emb_qwen"
    tables = "complex `[S, D/2]` (or real `(cos, sin)` `[S, D]`)"
    mode = "interleave"

    def __call__(self, x, freqs_cis, use_real=True, use_real_unbind_dim=-1):
        if not use_real:
            cos, sin = complex_tables(freqs_cis.unsqueeze(1))
            return self.rotate.one(x, cos, sin)
        cos, sin = freqs_cis
        if use_real_unbind_dim not in (-1, -2):
            raise ValueError(f"`use_real_unbind_dim={use_real_unbind_dim}` but should be -1 or -2.")
        return self.rotate.one(x, cos[None, None], sin[None, None],
                               "interleave" if use_real_unbind_dim == -1 else "half")


class ApplyRotaryEmbAllegro(_Function):
    """``diffusers.models.embeddings.apply_rotary_emb_allegro(x, freqs_cis, positions)``: x
    ``[B, H, S, D]`` in three chunks (t, h, w), each rotating its halves by its axis's table
    ``[P, D/3]`` gathered at that axis's positions ``[B, S]``: one launch with the three gathered
    tables side by side and three half blocks."""

    function = "embeddings.apply_rotary_emb_allegro"
    tables = "per axis `(cos, sin)` `[P, D/3]`, gathered at positions `[B, S]`"
    mode = "half per axis chunk (t, h, w)"

    def __call__(self, x, freqs_cis, positions):
        tables = [(F.embedding(p, c), F.embedding(p, s)) for p, (c, s) in zip(positions, freqs_cis, strict=True)]
        cos = torch.cat([c for c, _ in tables], -1)[:, None]  # [B, 1, S, D]
        sin = torch.cat([s for _, s in tables], -1)[:, None]
        return self.rotate.one(x, cos, sin, tuple(("half", c.shape[-1]) for c, _ in tables))


class ComplexProduct(_Function):
    """``apply_rotary_emb(hidden_states, freqs)`` of AnyFlow: x ``[B, S, H, D]`` times a complex
    table broadcasting to ``[B, S, H, D/2]`` (pairs ``(2i, 2i+1)``; diffusers multiplies in
    float64, rome in float32)."""

    function = "apply_rotary_emb(hidden_states, freqs)"
    tables = "complex, broadcasting to `[B, S, H, D/2]`"
    mode = "interleave"

    def __call__(self, hidden_states, freqs):
        cos, sin = complex_tables(freqs)
        return self.rotate.one(hidden_states, cos, sin)


class ApplyRotaryEmbTransposed(_Function):
    """Helios's ``apply_rotary_emb_transposed(hidden_states, freqs_cis)``: ``freqs_cis`` is
    ``cat(cos, sin)`` ``[B, S, 2D]`` of repeat-interleaved tables, pair i turning by ``cos[2i]``
    and ``sin[2i + 1]``."""

    function = "apply_rotary_emb_transposed"
    tables = "`cat(cos, sin)` `[B, S, 2D]`, pair i read at `cos[2i]`, `sin[2i+1]`"
    mode = "interleave"

    def __call__(self, hidden_states, freqs_cis):
        cos, sin = freqs_cis.unsqueeze(-2).chunk(2, dim=-1)
        cos = cos[..., 0::2].repeat_interleave(2, -1)
        sin = sin[..., 1::2].repeat_interleave(2, -1)
        return self.rotate.one(hidden_states, cos, sin)


class RotateQKSequence(_Function):
    """JoyImage's ``_apply_rotary_emb(xq, xk, freqs_cis)``: q and k ``[B, S, H, D]``, tables
    ``(cos, sin)`` viewed as ``[1, S, 1, D]``, pairs ``(2i, 2i+1)``: one ``apply_qk``."""

    function = "_apply_rotary_emb(xq, xk, freqs_cis)"
    tables = "`(cos, sin)` `[S, D]`"
    mode = "interleave"
    fused = True

    def __call__(self, xq, xk, freqs_cis):
        shape = [d if i == 1 or i == xq.ndim - 1 else 1 for i, d in enumerate(xq.shape)]
        return self.rotate(xq, xk, freqs_cis[0].view(*shape), freqs_cis[1].view(*shape))


class RotateQKBatched(_Function):
    """JoyImage-Edit-Plus's ``_apply_rotary_emb_batched(xq, xk, freqs_cis)``: tables
    ``[B, S, D]`` (one row per sample), pairs ``(2i, 2i+1)``: one ``apply_qk``."""

    function = "_apply_rotary_emb_batched(xq, xk, freqs_cis)"
    tables = "`(cos, sin)` `[B, S, D]`"
    mode = "interleave"
    fused = True

    def __call__(self, xq, xk, freqs_cis):
        return self.rotate(xq, xk, freqs_cis[0].unsqueeze(2), freqs_cis[1].unsqueeze(2))


class RotationPerPair(_Function):
    """A table of 2x2 rotations ``[[cos, -sin], [sin, cos]]`` per pair ``(2i, 2i+1)``,
    ``[..., D/2, 2, 2]`` (PRX's ``apply_rope(xq, freqs_cis)``, Kandinsky 6's ``apply_rotary(x,
    rope)``: ``out_r = rope[r, 0] * x_0 + rope[r, 1] * x_1``): rome's tables are its first column.
    The models' rotary modules build exactly such rotations."""

    function = "apply_rope(xq, freqs_cis) / apply_rotary(x, rope)"
    tables = "2x2 rotations `[..., D/2, 2, 2]`"
    mode = "interleave"

    def __call__(self, x, rope):
        rope = rope.to(x.device)
        return self.rotate.one(x, rope[..., 0, 0].repeat_interleave(2, -1), rope[..., 1, 0].repeat_interleave(2, -1))


class HalfSequence(_Function):
    """LongCat-AudioDiT's ``_apply_rotary_emb(hidden_states, rope)``: ``(cos, sin)`` ``[S, D]``
    as ``[1, S, 1, D]``, ``rotate_half``."""

    function = "_apply_rotary_emb(hidden_states, rope)"
    tables = "`(cos, sin)` `[S, D]`"
    mode = "half"

    def __call__(self, hidden_states, rope):
        cos, sin = rope
        return self.rotate.one(hidden_states, cos[None, :, None], sin[None, :, None], "half")


class HalfLeading(_Function):
    """MiniMax-H3's ``_apply_rotary_emb(hidden_states, cos, sin)``: the leading ``r =
    cos.shape[-1]`` columns of each head rotate their halves by ``[S, r]`` tables (cast to x's
    dtype), the rest pass through."""

    function = "_apply_rotary_emb(hidden_states, cos, sin)"
    tables = "`cos`, `sin` `[S, r]`, r <= D"
    mode = "half over the leading r columns"

    def __call__(self, hidden_states, cos, sin):
        cos = cos.to(hidden_states.dtype)[None, :, None, :]
        sin = sin.to(hidden_states.dtype)[None, :, None, :]
        return self.rotate.one(hidden_states, *_partial(hidden_states, cos, sin, "half"))


class HalfLeadingPair(_Function):
    """MiniMax-Music3's ``_apply_partial_rotary_emb(hidden_states, rotary_emb)``: ``(cos, sin)``
    ``[S, r]`` as ``[S, 1, r]`` in x's dtype, the leading r columns rotating their halves."""

    function = "_apply_partial_rotary_emb(hidden_states, rotary_emb)"
    tables = "`(cos, sin)` `[S, r]`, r <= D"
    mode = "half over the leading r columns"

    def __call__(self, hidden_states, rotary_emb):
        cos, sin = rotary_emb
        cos = cos[:, None, :].to(hidden_states.dtype)
        sin = sin[:, None, :].to(hidden_states.dtype)
        return self.rotate.one(hidden_states, *_partial(hidden_states, cos, sin, "half"))


class HalfLeadingAngles(_Function):
    """Stable Audio 3's ``_apply_rotary_partial(t, freqs)``: angles ``[>= S, r]`` (the last S
    rows), the leading r columns of each head rotating their halves in float32."""

    function = "_apply_rotary_partial(t, freqs)"
    tables = "angles `[S, r]`, r <= D"
    mode = "half over the leading r columns"

    def __call__(self, t, freqs):
        freqs = freqs[-t.shape[-3]:].float().unsqueeze(1)
        return self.rotate.one(t, *_partial(t, freqs.cos(), freqs.sin(), "half"))


FUNCTIONS = (ApplyRotaryEmb, ApplyRotaryEmbQwen, ApplyRotaryEmbAllegro, ComplexProduct,
             ApplyRotaryEmbTransposed, RotateQKSequence, RotateQKBatched, RotationPerPair,
             HalfSequence, HalfLeading, HalfLeadingPair, HalfLeadingAngles)
