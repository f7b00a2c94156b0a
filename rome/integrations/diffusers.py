"""diffusers video/image transformers with rome's RoPE: ``patch(model, backend=...)``.

Families (``SUPPORTED``; docs/families.md is generated from this module's tables): Wan, WanVACE,
WanAnimate, ChronoEdit, SkyReels-V2, HunyuanVideo, HunyuanVideo FramePack, HunyuanVideo 1.5,
HunyuanImage, CogVideoX, ConsisID, Flux, Chroma, FLUX.2, Qwen-Image, LTX-Video, LTX-2, Z-Image,
Cosmos, Mochi, Lumina2, CogView4, HiDream with a processor of rome's restating the library's;
and, through the rotary function their processor calls (rebound to rome's, below), Allegro,
HunyuanDiT, Lumina-Next, Stable Audio, EasyAnimate, OmniGen, GLM-Image, ACE-Step, Bria, Bria-FIBO,
FLUX.3, Krea 2, LongCat-Image, Ovis-Image, Motif-Video, NucleusMoE-Image, Qwen-Image 2.1, AnyFlow,
AnyFlow-FAR, Helios, JoyImage-Edit, JoyImage-Edit-Plus, PRX, Kandinsky 6, Kandinsky 6 SR,
LongCat-AudioDiT, MiniMax-H3, MiniMax-Music3, Stable Audio 3. ``REFUSED``: the classes with RoPE
rome does not patch, and why; ``NO_ROPE``: those without RoPE. Every one rotates each head's q
and k (or the leading columns of each head) by ``x*cos + rot(x)*sin``, with ``rot`` one of two
signed permutations (per axis chunk for Allegro):

- pairs ``(2i, 2i+1)``, ``rome.interleave_matrix(D)``: the real tables of
  ``get_1d_rotary_pos_embed(..., repeat_interleave_real=True)`` (``[c0, c0, c1, c1, ...]`` per
  axis: Wan and its copies, Hunyuan*, CogVideoX, Flux, Chroma, FLUX.2, LTX-Video, LTX-2's
  ``interleaved`` RoPE) are rome's tables as they are; the complex tables ``e^{iθ}`` ``[..., D/2]``
  of Qwen-Image, Z-Image and Lumina2 (``use_real=False``), Mochi's half-width per-head
  ``(cos, sin)`` and HiDream's 2x2 rotation per pair are widened to them (each entry twice).
- pairs ``(i, i + D/2)``, ``rome.half_matrix(D)`` (``rotate_half``, diffusers'
  ``use_real_unbind_dim=-2``): Cosmos, CogView4, and LTX-2's ``split`` RoPE (per-head tables
  ``[B, N, S, D/2]``, each column used for both halves).

The patch replaces, per model instance:

- the attention **processor** of every attention layer that applies RoPE with a subclass of the
  model's own processor class (instance state such as the attention backend is kept) whose
  ``__call__`` is the original's with the two per-tensor rotations replaced by one
  ``rome.apply_qk`` launch for q and k (one ``rome.apply`` each where the keys have their own
  tables: LTX-2's audio/video cross attention). The rotation sits between the q/k projections
  and the attention call inside the processor (in Wan, a function nested in ``__call__``), so
  the processor body that has both q and k is restated here, using the library's own projection
  and attention helpers; calls it does not cover (no RoPE, Wan's image-context branch, LTX's and
  Cosmos's cross attention, LTX-2 tables of another shape) go to the original ``__call__``.
- the **rotary module's** ``forward`` where the model computes its angles in float32
  (HunyuanVideo, LTX-Video): the patched one returns the same tables, shapes and dtype from
  float64 angles rounded once (``rome.layouts``). The other families keep their rotary modules
  (Wan and Flux build their tables from float64 angles already); CogVideoX receives its tables
  from the pipeline (``image_rotary_emb``, crop-and-interpolate grids with fractional positions)
  and uses them as given.

Text tokens that the model leaves unrotated (HunyuanVideo's single-stream blocks append them,
CogVideoX and CogView4 prepend them) and the second half of each head where HiDream rotates only
the first get ``cos = 1``, ``sin = 0``, which rome returns exactly as x, so one launch covers the
whole sequence. Only processors of the exact classes below are replaced; another processor on a
RoPE attention layer (IP-adapter, fused, KV-cache, perturbed, custom) raises ValueError.
"""

from __future__ import annotations

import dis
import functools
import importlib
import inspect
import math
import re
import sys
import types
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_rounding
from ..layouts import RopeLayout, cos_sin_cache, cos_sin_for_positions, section_layout
from ..matrices import kept_matrix, kept_rotation_matrix, rotation_matrix
from ..ops import BACKENDS, apply, apply_qk
from ..qknorm import QKNorm, apply_qk_norm
from ..tables import grid_positions
from ..types import Backend, Rounding
from . import Patch
from . import _diffusers_rope as _fn

__all__ = ["SUPPORTED", "patch"]



def _heads(attn, states, to_q, to_k, to_v, norm_q, norm_k):
    """HunyuanVideo's projections of ``states`` into BSND q, k, v, with its optional per-head
    norms of q and k (the same steps for the image and the text stream)."""
    query, key, value = (proj(states).unflatten(2, (attn.heads, -1)) for proj in (to_q, to_k, to_v))
    if norm_q is not None:
        query = norm_q(query)
    if norm_k is not None:
        key = norm_k(key)
    return query, key, value


# --- the one launch ----------------------------------------------------------------------------


class _Rotate:
    """``(q, k) -> rome.apply_qk(q, k, cos, sin, M)`` with M ``interleave_matrix(D)`` (pairs
    ``(2i, 2i+1)``, the default) or ``half_matrix(D)`` (``mode="half"``: pairs ``(i, i + D/2)``),
    built once per (mode, D, dtype, device). Tables in a dtype rome does not take with q's (bf16
    tables for fp32 q) go in as float32.

    ``native`` (``patch(..., rounding="native")``): None (rome's exact rounding), or how the
    family's code rounds its rotation (``_Family.native``): ``"float"`` (diffusers'
    ``apply_rotary_emb`` and LTX's: ``(x.float() * cos + x_rotated.float() * sin).to(x.dtype)``:
    float32 ops, or the tables' dtype where that is wider, then one rounding to x's dtype) or
    ``"x"`` (Wan's nested ``apply_rotary_emb``: ``x1 * cos - x2 * sin`` in the promoted dtype of x
    and the tables, written into a tensor of x's dtype); rome then computes with
    ``rounding="native"`` in that dtype and casts back, bit for bit the family's result."""

    native: str | None = None

    def __init__(self, backend: Backend = "auto", native: str | None = None):
        self.backend = backend
        self.native = native

    @staticmethod
    def _matrix(x: Tensor, mode="interleave") -> Tensor:
        """``mode``: "interleave", "half", or ``((mode, width), ...)`` blocks over the head
        ("none": columns passed through, a zero block)."""
        if isinstance(mode, str):
            return kept_rotation_matrix(x.shape[-1], mode, dtype=x.dtype, device=x.device)
        blocks, dtype, device = tuple(mode), x.dtype, x.device

        def build():
            return torch.block_diag(*(
                torch.zeros(d, d, dtype=dtype, device=device) if m == "none"
                else rotation_matrix(d, m, dtype=dtype, device=device) for m, d in blocks))

        return kept_matrix(("diffusers-blocks", blocks, dtype, torch.device(device)), build)

    @staticmethod
    def _tables(x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """On x's device (diffusers moves them there too), float32 unless in x's dtype."""
        dtype = cos.dtype if cos.dtype in (torch.float32, x.dtype) else torch.float32
        return cos.to(x.device, dtype), sin.to(x.device, dtype)

    def _compute(self, x: Tensor, cos: Tensor, sin: Tensor) -> torch.dtype:
        """The dtype the family's code rotates x in (``native``)."""
        base = x.dtype if self.native == "x" else torch.float32
        return torch.promote_types(torch.promote_types(base, cos.dtype), sin.dtype)

    def __call__(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, mode: str = "interleave"
                 ) -> tuple[Tensor, Tensor]:
        if self.native is not None:
            dt = self._compute(q, cos, sin)
            qc, kc = q.to(dt), k.to(dt)
            qo, ko = apply_qk(qc, kc, cos.to(q.device, dt), sin.to(q.device, dt), self._matrix(qc, mode),
                              backend=self.backend, rounding="native")
            return qo.to(q.dtype), ko.to(k.dtype)
        cos, sin = self._tables(q, cos, sin)
        return apply_qk(q, k, cos, sin, self._matrix(q, mode), backend=self.backend)

    def normed(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, norm_q, norm_k, mode: str = "interleave"):
        """BSND q, k (``[B, S, H, D]``) as they leave the projections, with the model's q/k norms
        fused into the rotation (``rome.apply_qk_norm``: one launch where the kernel takes it):
        ``(q, k)`` normalised and rotated, or None where the norms are not ones rome fuses (then
        the caller runs them, and ``__call__``). Tables as ``__call__``'s, broadcasting to BSND.
        None with ``native``: the fused norm's fp32 result is not the model's norm rounded to q's
        dtype, so the model's norms run and then the native rotation."""
        if self.native is not None:
            return None
        spec = _norm_spec(norm_q, norm_k, q, k)
        if spec is None:
            return None
        cos, sin = self._tables(q, cos, sin)
        cos, sin = (t.transpose(-2, -3) if t.ndim >= 3 else t for t in (cos, sin))  # to BNSD
        q_out, k_out = apply_qk_norm(q.transpose(1, 2), k.transpose(1, 2), cos, sin, self._matrix(q, mode),
                                     spec.q_weight, spec.k_weight, backend=self.backend, **spec.kwargs())
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    def norm_then(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, norm_q, norm_k, mode: str = "interleave"):
        """``normed``, or where rome does not fuse those norms the model's own (None: no norm)
        then ``__call__``: BSND q, k as they leave the projections."""
        if norm_q is not None and norm_k is not None:
            fused = self.normed(q, k, cos, sin, norm_q, norm_k, mode)
            if fused is not None:
                return fused
        return self(_own_norm(norm_q, q), _own_norm(norm_k, k), cos, sin, mode)

    def one(self, x: Tensor, cos: Tensor, sin: Tensor, mode: str = "interleave") -> Tensor:
        """``rome.apply`` of x alone (cross attention: the keys are not rotated, or rotated by
        other tables)."""
        if self.native is not None:
            dt = self._compute(x, cos, sin)
            xc = x.to(dt)
            return apply(xc, cos.to(x.device, dt), sin.to(x.device, dt), self._matrix(xc, mode),
                         backend=self.backend, rounding="native").to(x.dtype)
        cos, sin = self._tables(x, cos, sin)
        return apply(x, cos, sin, self._matrix(x, mode), backend=self.backend)


def _own_norm(norm, x: Tensor) -> Tensor:
    """The model's norm module run on BSND x as the model runs it: over a head's D values, or
    (its shape H·D: LTX's RMSNorm over a token's heads) on the heads flattened; None: x."""
    if norm is None:
        return x
    shape = tuple(getattr(norm, "normalized_shape", None) or getattr(norm, "dim", None) or ())
    if x.ndim >= 2 and shape == (x.shape[-2] * x.shape[-1],) != (x.shape[-1],):
        return norm(x.flatten(-2)).unflatten(-1, x.shape[-2:])
    return norm(x)


# q/k norm modules rome fuses into the rotation: torch's RMSNorm / LayerNorm, diffusers' RMSNorm
# (without a bias), over a head's D values or over a token's H·D
_FUSED_NORMS = ("torch.nn.modules.normalization.RMSNorm", "torch.nn.modules.normalization.LayerNorm",
                "diffusers.models.normalization.RMSNorm")


def _norm_spec(norm_q, norm_k, q: Tensor, k: Tensor) -> QKNorm | None:
    """The ``QKNorm`` of two of the model's norm modules for BSND q, k, or None where rome does not
    fuse them (another module, a bias on an RMSNorm, eps None, weights in another dtype than fp32
    or q's, a shape that is neither D nor H·D)."""
    h, d = q.shape[2], q.shape[-1]
    overs = []
    for m, x in ((norm_q, q), (norm_k, k)):
        name = f"{type(m).__module__}.{type(m).__name__}"
        if name not in _FUSED_NORMS or getattr(m, "eps", None) is None:
            return None
        if name.endswith("RMSNorm") and getattr(m, "bias", None) is not None:
            return None
        if isinstance(m, torch.nn.LayerNorm) and not m.elementwise_affine:
            return None
        shape = tuple(getattr(m, "normalized_shape", None) or getattr(m, "dim", ()))
        over = "head" if shape == (d,) else "heads" if shape == (x.shape[2] * d,) else None
        w = getattr(m, "weight", None)
        if over is None or (w is not None and w.dtype not in (torch.float32, q.dtype)):
            return None
        overs.append(over)
    if overs[0] != overs[1] or h == 0:
        return None
    try:
        return QKNorm.from_modules(norm_q, norm_k, over=overs[0])
    except (TypeError, ValueError):
        return None


def _pad_rows(cos: Tensor, sin: Tensor, n: int, *, before: bool, dim: int = 0):
    """Tables with ``n`` rows of ``cos = 1``, ``sin = 0`` (tokens left as they are) before or
    after the given rows along ``dim``."""
    shape = list(cos.shape)
    shape[dim] = n
    ones, zeros = cos.new_ones(shape), sin.new_zeros(shape)
    if before:
        return torch.cat([ones, cos], dim), torch.cat([zeros, sin], dim)
    return torch.cat([cos, ones], dim), torch.cat([sin, zeros], dim)


# --- processors: the original's body with one rome launch ---------------------------------------
#
# Module-level classes (pickle, torch.save and deepcopy find them by name), each a subclass of the
# library's processor class (a placeholder where this diffusers lacks it: patch() then refuses).


def _import(name: str):
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a diffusers without it: patch() says which is missing
        return None


class _Missing:
    """Stands in for a processor class this diffusers does not have (never instantiated)."""


def _base(module, name: str) -> type:
    cls = getattr(module, name, None)
    return cls if isinstance(cls, type) else _Missing


_wan = _import("diffusers.models.transformers.transformer_wan")
_hy = _import("diffusers.models.transformers.transformer_hunyuan_video")
_cog = _import("diffusers.models.attention_processor")
_flux = _import("diffusers.models.transformers.transformer_flux")
_ltx = _import("diffusers.models.transformers.transformer_ltx")
_wan_animate = _import("diffusers.models.transformers.transformer_wan_animate")
_chrono = _import("diffusers.models.transformers.transformer_chronoedit")
_skyreels = _import("diffusers.models.transformers.transformer_skyreels_v2")
_hyimage = _import("diffusers.models.transformers.transformer_hunyuanimage")
_hy15 = _import("diffusers.models.transformers.transformer_hunyuan_video15")
_flux2 = _import("diffusers.models.transformers.transformer_flux2")
_qwen = _import("diffusers.models.transformers.transformer_qwenimage")
_ltx2 = _import("diffusers.models.transformers.transformer_ltx2")
_zimage = _import("diffusers.models.transformers.transformer_z_image")
_cosmos = _import("diffusers.models.transformers.transformer_cosmos")
_lumina2 = _import("diffusers.models.transformers.transformer_lumina2")
_cogview4 = _import("diffusers.models.transformers.transformer_cogview4")
_hidream = _import("diffusers.models.transformers.transformer_hidream_image")


class _RomeProcessor:
    """What every rome processor adds to the library's: ``_rome``, its ``_Rotate``. Patching sets
    it (sharing one per model); ``type(p)()`` (diffusers' IP-adapter load/unload) builds one,
    ``backend="auto"`` unless given, and an instance without one (``__new__`` and a copied
    ``__dict__``) builds it on first use."""

    def __init__(self, *args, backend: Backend = "auto", **kwargs):
        super().__init__(*args, **kwargs)
        self._rome = _Rotate(backend)

    def __getattr__(self, name):
        if name == "_rome":
            rotate = self.__dict__["_rome"] = _Rotate()
            return rotate
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class _WanBody:
    """``WanAttnProcessor.__call__`` with q and k rotated by one ``rome.apply_qk``; ``_lib`` is the
    diffusers module whose ``_get_qkv_projections`` and ``dispatch_attention_fn`` it calls (Wan,
    WanAnimate, ChronoEdit and SkyReels-V2 each carry a copy of that processor)."""

    _lib = None
    _parallel_cross = False  # SkyReels-V2 passes its parallel config to cross attention too

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        if rotary_emb is None or attn.add_k_proj is not None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    rotary_emb)
        lib = self._lib
        query, key, value = lib._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        value = value.unflatten(2, (attn.heads, -1))
        # the q/k RMSNorm over a token's heads fused into the rotation where rome takes it
        fused = self._rome.normed(query.unflatten(2, (attn.heads, -1)), key.unflatten(2, (attn.heads, -1)),
                                  *rotary_emb, attn.norm_q, attn.norm_k)
        if fused is not None:
            query, key = fused
        else:
            query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
            key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
            query, key = self._rome(query, key, *rotary_emb)  # BSND, tables [1, S, 1, D]
        parallel = self._parallel_cross or encoder_hidden_states is None
        hidden_states = lib.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config if parallel else None,
        )
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](hidden_states))


class RomeWanAttnProcessor(_RomeProcessor, _WanBody, _base(_wan, "WanAttnProcessor")):
    """``WanAttnProcessor`` (Wan, WanVACE) with q and k rotated by one ``rome.apply_qk``."""

    _lib = _wan


class RomeWanAnimateAttnProcessor(_RomeProcessor, _WanBody, _base(_wan_animate, "WanAttnProcessor")):
    """WanAnimate's copy of ``WanAttnProcessor`` with q and k rotated by one ``rome.apply_qk``."""

    _lib = _wan_animate


class RomeChronoEditAttnProcessor(_RomeProcessor, _WanBody, _base(_chrono, "WanAttnProcessor")):
    """ChronoEdit's copy of ``WanAttnProcessor`` with q and k rotated by one ``rome.apply_qk``."""

    _lib = _chrono


class RomeSkyReelsV2AttnProcessor(_RomeProcessor, _WanBody, _base(_skyreels, "SkyReelsV2AttnProcessor")):
    """``SkyReelsV2AttnProcessor`` (Wan's body; its cross attention keeps the parallel config)
    with q and k rotated by one ``rome.apply_qk``."""

    _lib = _skyreels
    _parallel_cross = True


class _HunyuanBody:
    """``HunyuanVideoAttnProcessor2_0.__call__`` (HunyuanImage's processor is the same body) with
    q and k rotated by one ``rome.apply_qk``; the text tokens a single-stream block appends get
    identity rows. ``_lib``: the module whose ``dispatch_attention_fn`` it calls."""

    _lib = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        cos, sin = image_rotary_emb  # [S_img, D]
        if attn.add_q_proj is None and encoder_hidden_states is not None:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
            cos, sin = _pad_rows(cos, sin, encoder_hidden_states.shape[1], before=False)
        query, key, value = _heads(attn, hidden_states, attn.to_q, attn.to_k, attn.to_v, None, None)
        # (the per-head q/k norms fused into the rotation where rome takes them)
        query, key = self._rome.norm_then(query, key, cos[:, None], sin[:, None], attn.norm_q,
                                          attn.norm_k)  # BSND, [S, 1, D]
        if attn.add_q_proj is not None and encoder_hidden_states is not None:
            encoder_query, encoder_key, encoder_value = _heads(
                attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj,
                attn.norm_added_q, attn.norm_added_k)
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)
        hidden_states = self._lib.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            n = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = hidden_states[:, :-n], hidden_states[:, -n:]
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


class RomeHunyuanVideoAttnProcessor(_RomeProcessor, _HunyuanBody, _base(_hy, "HunyuanVideoAttnProcessor2_0")):
    """``HunyuanVideoAttnProcessor2_0`` with q and k rotated by one ``rome.apply_qk``."""

    _lib = _hy


class RomeHunyuanImageAttnProcessor(_RomeProcessor, _HunyuanBody, _base(_hyimage, "HunyuanImageAttnProcessor")):
    """``HunyuanImageAttnProcessor`` (HunyuanVideo's body) with q and k rotated by one
    ``rome.apply_qk``."""

    _lib = _hyimage


class RomeCogVideoXAttnProcessor(_RomeProcessor, _base(_cog, "CogVideoXAttnProcessor2_0")):
    """``CogVideoXAttnProcessor2_0`` with q and k rotated by one ``rome.apply_qk`` (the
    leading text tokens get identity rows; cross attention rotates q alone)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch_size, sequence_length, _ = hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = key.shape[-1] // attn.heads
        query = query.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        key = key.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        value = value.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
        cos, sin = _pad_rows(*image_rotary_emb, text_seq_length, before=True)  # [S, D]
        if attn.is_cross_attention:
            if attn.norm_q is not None:
                query = attn.norm_q(query)
            if attn.norm_k is not None:
                key = attn.norm_k(key)
            query = self._rome.one(query, cos, sin)
        else:  # (its per-head LayerNorms fused into the rotation where rome takes them; BSND
            # views of its BNSD q and k, tables [S, 1, D])
            query, key = (t.transpose(1, 2) for t in self._rome.norm_then(
                query.transpose(1, 2), key.transpose(1, 2), cos[:, None], sin[:, None], attn.norm_q, attn.norm_k))
        hidden_states = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False
        )
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states


def _flux_fused(proc, attn, query, key, encoder_query, encoder_key, cos, sin):
    """Flux's q/k norms fused into the rotation (``_Rotate.normed``): the image tokens' with
    ``norm_q``/``norm_k``, the text tokens' (double-stream blocks) with ``norm_added_q``/``_k``,
    each one launch, then text before image as the model concatenates them. None where rome does
    not fuse those norms (the caller runs the model's steps), and with ``rounding="native"``."""
    if proc._rome.native is not None:
        return None
    if attn.added_kv_proj_dim is None:
        return proc._rome.normed(query, key, cos[:, None], sin[:, None], attn.norm_q, attn.norm_k)
    eq, ek = (t.unflatten(-1, (-1, attn.head_dim)) for t in (encoder_query, encoder_key))
    n = eq.shape[1]
    if _norm_spec(attn.norm_q, attn.norm_k, query, key) is None \
            or _norm_spec(attn.norm_added_q, attn.norm_added_k, eq, ek) is None:
        return None
    img = proc._rome.normed(query, key, cos[n:, None], sin[n:, None], attn.norm_q, attn.norm_k)
    txt = proc._rome.normed(eq, ek, cos[:n, None], sin[:n, None], attn.norm_added_q, attn.norm_added_k)
    return torch.cat([txt[0], img[0]], dim=1), torch.cat([txt[1], img[1]], dim=1)


def _flux_attention(proc, lib, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb):
    """Flux's and FLUX.2's double-stream attention up to the output projections (the two
    processors' shared body; ``lib`` the diffusers module whose helpers it calls): q, k, v of the
    text and image tokens, normed, q and k rotated by one ``rome.apply_qk``, attention, heads
    flattened."""
    query, key, value, encoder_query, encoder_key, encoder_value = lib._get_qkv_projections(
        attn, hidden_states, encoder_hidden_states
    )
    query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in (query, key, value))
    cos, sin = image_rotary_emb  # [S_txt + S_img, D]
    fused = _flux_fused(proc, attn, query, key, encoder_query, encoder_key, cos, sin)
    if fused is not None:  # the q/k norms (text and image tokens each their own) in the rotation
        query, key = fused
        if attn.added_kv_proj_dim is not None:
            value = torch.cat([encoder_value.unflatten(-1, (-1, attn.head_dim)), value], dim=1)
    else:
        query, key = attn.norm_q(query), attn.norm_k(key)
        if attn.added_kv_proj_dim is not None:
            encoder_query = attn.norm_added_q(encoder_query.unflatten(-1, (-1, attn.head_dim)))
            encoder_key = attn.norm_added_k(encoder_key.unflatten(-1, (-1, attn.head_dim)))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        query, key = proc._rome(query, key, cos[:, None], sin[:, None])  # BSND, [S, 1, D]
    hidden_states = lib.dispatch_attention_fn(
        query, key, value, attn_mask=attention_mask, backend=proc._attention_backend,
        parallel_config=proc._parallel_config,
    )
    hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
    return hidden_states


class RomeFluxAttnProcessor(_RomeProcessor, _base(_flux, "FluxAttnProcessor")):
    """``FluxAttnProcessor`` with q and k (text and image tokens) rotated by one
    ``rome.apply_qk``."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        hidden_states = _flux_attention(self, _flux, attn, hidden_states, encoder_hidden_states,
                                        attention_mask, image_rotary_emb)
        if encoder_hidden_states is None:
            return hidden_states
        n = encoder_hidden_states.shape[1]
        encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
            [n, hidden_states.shape[1] - n], dim=1
        )
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states.contiguous()))
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states.contiguous())
        return hidden_states, encoder_hidden_states


class RomeLTXVideoAttnProcessor(_RomeProcessor, _base(_ltx, "LTXVideoAttnProcessor")):
    """``LTXVideoAttnProcessor`` with q and k rotated by one ``rome.apply_qk``. LTX's RoPE
    spans the whole ``heads * head_dim`` vector (tables ``[B, S, C]``): split per head it is
    an interleave rotation of each head with per-head tables ``[B, S, N, D]``."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None or encoder_hidden_states is not None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        batch_size, sequence_length, _ = hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        cos, sin = (t.unflatten(-1, (attn.heads, -1)) for t in image_rotary_emb)
        # its q/k RMSNorm over a token's heads into the same call (per-head tables: normalised in
        # fp32 by the op, then one rotation launch)
        query, key = self._rome.norm_then(query, key, cos, sin, attn.norm_q, attn.norm_k)
        hidden_states = _ltx.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](hidden_states))


_complex_tables = _fn.complex_tables  # complex [..., D/2] -> rome's interleave tables [..., D]


def _pair_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """Half-width tables ``[..., D/2]`` of pairs ``(2i, 2i+1)`` (Mochi) as rome's interleave
    tables ``[..., D]``."""
    return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)


def _hidream_tables(freqs: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """HiDream's table of 2x2 rotations ``[[cos, -sin], [sin, cos]]`` per pair ``(2i, 2i+1)``
    (``[..., D_rot/2, 2, 2]``) as rome's interleave tables ``[..., head_dim]``: where the model
    rotates only the first half of each head (``D_rot = head_dim / 2``), the rest gets
    ``cos = 1``, ``sin = 0``."""
    cos, sin = _pair_tables(freqs[..., 0, 0], freqs[..., 1, 0])
    if cos.shape[-1] != head_dim:
        cos, sin = _pad_rows(cos, sin, head_dim - cos.shape[-1], before=False, dim=-1)
    return cos, sin


class RomeFlux2AttnProcessor(_RomeProcessor, _base(_flux2, "Flux2AttnProcessor")):
    """``Flux2AttnProcessor`` (FLUX.2's double-stream blocks) with q and k (text and image
    tokens) rotated by one ``rome.apply_qk``."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        hidden_states = _flux_attention(self, _flux2, attn, hidden_states, encoder_hidden_states,
                                        attention_mask, image_rotary_emb)
        if encoder_hidden_states is not None:
            n = encoder_hidden_states.shape[1]
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [n, hidden_states.shape[1] - n], dim=1
            )
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if encoder_hidden_states is not None:
            return hidden_states, encoder_hidden_states
        return hidden_states


class RomeFlux2ParallelSelfAttnProcessor(_RomeProcessor, _base(_flux2, "Flux2ParallelSelfAttnProcessor")):
    """``Flux2ParallelSelfAttnProcessor`` (FLUX.2's single-stream blocks: fused QKV + MLP input
    projection) with q and k rotated by one ``rome.apply_qk``."""

    def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, attention_mask, image_rotary_emb)
        hidden_states = attn.to_qkv_mlp_proj(hidden_states)
        qkv_dim = 3 * attn.inner_dim
        mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
        local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
        qkv, mlp_hidden_states = torch.split(
            hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1
        )
        query, key, value = (t.unflatten(-1, (-1, attn.head_dim)) for t in qkv.chunk(3, dim=-1))
        query, key = attn.norm_q(query), attn.norm_k(key)
        cos, sin = image_rotary_emb  # [S, D]
        query, key = self._rome(query, key, cos[:, None], sin[:, None])  # BSND, [S, 1, D]
        hidden_states = _flux2.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        mlp_hidden_states = attn.mlp_act_fn(mlp_hidden_states)
        return attn.to_out(torch.cat([hidden_states, mlp_hidden_states], dim=-1))


class RomeQwenImageAttnProcessor(_RomeProcessor, _base(_qwen, "QwenDoubleStreamAttnProcessor2_0")):
    """``QwenDoubleStreamAttnProcessor2_0`` with q and k of both streams rotated by one
    ``rome.apply_qk``: the text and image tokens are joined first ([text, image], the model's
    order) and the two complex tables (``x * e^{iθ}`` on interleaved pairs) become one interleave
    table."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, encoder_hidden_states_mask=None,
                 attention_mask=None, image_rotary_emb=None):
        if image_rotary_emb is None or encoder_hidden_states is None or attention_mask is not None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, encoder_hidden_states_mask,
                                    attention_mask, image_rotary_emb)  # the original's errors
        if encoder_hidden_states_mask is not None:
            image_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
            attention_mask = torch.cat([encoder_hidden_states_mask, image_mask], dim=1)[:, None, None, :]
        seq_txt = encoder_hidden_states.shape[1]
        head_dim = attn.inner_dim // attn.heads

        def heads(x):
            return x.unflatten(-1, (-1, head_dim))

        img_query, img_key = heads(attn.to_q(hidden_states)), heads(attn.to_k(hidden_states))
        txt_query = heads(attn.add_q_proj(encoder_hidden_states))
        txt_key = heads(attn.add_k_proj(encoder_hidden_states))
        if attn.norm_q is not None:
            img_query = attn.norm_q(img_query)
        if attn.norm_k is not None:
            img_key = attn.norm_k(img_key)
        if attn.norm_added_q is not None:
            txt_query = attn.norm_added_q(txt_query)
        if attn.norm_added_k is not None:
            txt_key = attn.norm_added_k(txt_key)
        img_freqs, txt_freqs = image_rotary_emb  # complex [S_img, D/2], [S_txt, D/2]
        cos, sin = _complex_tables(torch.cat([txt_freqs, img_freqs], dim=-2))
        query = torch.cat([txt_query, img_query], dim=1)
        key = torch.cat([txt_key, img_key], dim=1)
        value = torch.cat([heads(attn.add_v_proj(encoder_hidden_states)), heads(attn.to_v(hidden_states))], dim=1)
        query, key = self._rome(query, key, cos[:, None], sin[:, None])  # BSND, [S, 1, D]
        hidden_states = _qwen.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        txt_out, img_out = hidden_states[:, :seq_txt, :], hidden_states[:, seq_txt:, :]
        img_out = attn.to_out[0](img_out.contiguous())
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)
        return img_out, attn.to_add_out(txt_out.contiguous())


class RomeHunyuanVideo15AttnProcessor(_RomeProcessor, _base(_hy15, "HunyuanVideo15AttnProcessor2_0")):
    """``HunyuanVideo15AttnProcessor2_0`` with the image tokens' q and k rotated by one
    ``rome.apply_qk`` (the text tokens it appends afterwards are not rotated)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        query, key, value = (proj(hidden_states).unflatten(2, (attn.heads, -1))
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        query, key = attn.norm_q(query), attn.norm_k(key)
        cos, sin = image_rotary_emb  # [S_img, D]
        query, key = self._rome(query, key, cos[:, None], sin[:, None])  # BSND, [S, 1, D]
        if encoder_hidden_states is not None:
            encoder_query, encoder_key, encoder_value = _heads(
                attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj,
                attn.norm_added_q, attn.norm_added_k)
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)
        batch_size, seq_len, _, _ = query.shape
        attention_mask = F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0), value=True).bool()
        mask_1 = attention_mask.view(batch_size, 1, 1, seq_len).repeat(1, 1, seq_len, 1)
        attention_mask = mask_1 & mask_1.transpose(2, 3)
        hidden_states = _hy15.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if encoder_hidden_states is not None:
            n = encoder_hidden_states.shape[1]
            hidden_states, encoder_hidden_states = hidden_states[:, :-n], hidden_states[:, -n:]
            if getattr(attn, "to_out", None) is not None:
                hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
            if getattr(attn, "to_add_out", None) is not None:
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


def _ltx2_tables(attn, freqs):
    """LTX-2's ``(cos, sin)`` as per-head tables ``[B, S, N, D]`` and the rotation's mode:
    ``interleaved`` tables ``[B, S, N*D]`` span the whole inner vector (split per head they are
    each head's interleave tables); ``split`` tables ``[B, N, S, D/2]`` turn pair ``(i, i + D/2)``
    of each head (``half``)."""
    cos, sin = freqs
    if attn.rope_type == "interleaved":
        return cos.unflatten(-1, (attn.heads, -1)), sin.unflatten(-1, (attn.heads, -1)), "interleave"
    cos, sin = (t.transpose(1, 2) for t in (cos, sin))
    return torch.cat([cos, cos], -1), torch.cat([sin, sin], -1), "half"


class RomeLTX2AttnProcessor(_RomeProcessor, _base(_ltx2, "LTX2AudioVideoAttnProcessor")):
    """``LTX2AudioVideoAttnProcessor`` with q and k rotated by rome: one ``rome.apply_qk`` where
    they share their tables (video and audio self attention), one ``rome.apply`` each where the
    keys have their own (audio-to-video and video-to-audio cross attention)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 query_rotary_emb=None, key_rotary_emb=None):
        split_4d = attn.rope_type == "split" and query_rotary_emb is not None and query_rotary_emb[0].ndim == 4
        if query_rotary_emb is None or not (attn.rope_type == "interleaved" or split_4d):
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    query_rotary_emb, key_rotary_emb)
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        if attn.to_gate_logits is not None:
            gate_logits = attn.to_gate_logits(hidden_states)
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(attn.to_k(encoder_hidden_states)).unflatten(2, (attn.heads, -1))
        value = attn.to_v(encoder_hidden_states).unflatten(2, (attn.heads, -1))
        cos, sin, mode = _ltx2_tables(attn, query_rotary_emb)
        if key_rotary_emb is None:
            query, key = self._rome(query, key, cos, sin, mode)
        else:
            query = self._rome.one(query, cos, sin, mode)
            key = self._rome.one(key, *_ltx2_tables(attn, key_rotary_emb))
        hidden_states = _ltx2.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        if attn.to_gate_logits is not None:
            gates = 2.0 * torch.sigmoid(gate_logits)  # [B, T, N]
            hidden_states = (hidden_states.unflatten(2, (attn.heads, -1)) * gates.unsqueeze(-1)).flatten(2, 3)
        return attn.to_out[1](attn.to_out[0](hidden_states))


class RomeZImageAttnProcessor(_RomeProcessor, _base(_zimage, "ZSingleStreamAttnProcessor")):
    """``ZSingleStreamAttnProcessor`` (Z-Image) with q and k rotated by one ``rome.apply_qk``;
    its complex table ``freqs_cis`` (``[B, S, D/2]``) becomes rome's interleave tables."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 freqs_cis=None):
        if freqs_cis is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, freqs_cis)
        query, key, value = (proj(hidden_states).unflatten(-1, (attn.heads, -1))
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        cos, sin = _complex_tables(freqs_cis)  # [B, S, D]
        query, key = self._rome(query, key, cos[:, :, None], sin[:, :, None])  # BSND, [B, S, 1, D]
        if attention_mask is not None and attention_mask.ndim == 2:
            attention_mask = attention_mask[:, None, None, :]
        hidden_states = _zimage.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        output = attn.to_out[0](hidden_states)
        if len(attn.to_out) > 1:
            output = attn.to_out[1](output)
        return output


class RomeCosmosAttnProcessor(_RomeProcessor, _base(_cosmos, "CosmosAttnProcessor2_0")):
    """``CosmosAttnProcessor2_0`` (self attention) with q and k rotated by one ``rome.apply_qk``
    with ``half_matrix`` (Cosmos turns pair ``(i, i + D/2)``: ``use_real_unbind_dim=-2``)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None or encoder_hidden_states is not None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        query, key, value = (proj(hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        query, key = attn.norm_q(query), attn.norm_k(key)
        cos, sin = image_rotary_emb  # [S, D]
        query, key = self._rome(query, key, cos, sin, "half")  # BNSD
        key = key.repeat_interleave(query.size(3) // key.size(3), dim=3)  # the original's "GQA" step
        value = value.repeat_interleave(query.size(3) // value.size(3), dim=3)
        hidden_states = _cosmos.dispatch_attention_fn(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=attention_mask,
            dropout_p=0.0, is_causal=False,
        )
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](hidden_states))


class RomeMochiAttnProcessor(_RomeProcessor, _base(_cog, "MochiAttnProcessor2_0")):
    """``MochiAttnProcessor2_0`` with the video tokens' q and k rotated by one ``rome.apply_qk``;
    Mochi's half-width per-head tables ``[S, N, D/2]`` (pair ``(2i, 2i+1)``) become rome's
    interleave tables ``[S, N, D]``."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        query, key, value = _heads(attn, hidden_states, attn.to_q, attn.to_k, attn.to_v,
                                   attn.norm_q, attn.norm_k)
        encoder_query, encoder_key, encoder_value = _heads(
            attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj,
            attn.norm_added_q, attn.norm_added_k)
        cos, sin = _pair_tables(*image_rotary_emb)  # [S, N, D]
        query, key = self._rome(query, key, cos, sin)  # BSND
        query, key, value = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        encoder_query, encoder_key, encoder_value = (
            encoder_query.transpose(1, 2), encoder_key.transpose(1, 2), encoder_value.transpose(1, 2))
        sequence_length, encoder_sequence_length = query.size(2), encoder_query.size(2)
        total_length = sequence_length + encoder_sequence_length
        attn_outputs = []
        for idx in range(query.shape[0]):
            valid = torch.nonzero(attention_mask[idx][None, :].flatten(), as_tuple=False).flatten()
            out = F.scaled_dot_product_attention(
                torch.cat([query[idx: idx + 1], encoder_query[idx: idx + 1, :, valid, :]], dim=2),
                torch.cat([key[idx: idx + 1], encoder_key[idx: idx + 1, :, valid, :]], dim=2),
                torch.cat([value[idx: idx + 1], encoder_value[idx: idx + 1, :, valid, :]], dim=2),
                dropout_p=0.0, is_causal=False,
            )
            attn_outputs.append(F.pad(out, (0, 0, 0, total_length - out.size(2))))
        hidden_states = torch.cat(attn_outputs, dim=0).transpose(1, 2).flatten(2, 3)
        hidden_states, encoder_hidden_states = hidden_states.split_with_sizes(
            (sequence_length, encoder_sequence_length), dim=1
        )
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if hasattr(attn, "to_add_out"):
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
        return hidden_states, encoder_hidden_states


class RomeLumina2AttnProcessor(_RomeProcessor, _base(_lumina2, "Lumina2AttnProcessor2_0")):
    """``Lumina2AttnProcessor2_0`` with q and k (GQA head counts) rotated by one
    ``rome.apply_qk``; its complex per-batch table ``[B, S, D/2]`` becomes rome's interleave
    tables."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None,
                 image_rotary_emb=None, base_sequence_length=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb, base_sequence_length)
        batch_size, sequence_length, _ = hidden_states.shape
        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        head_dim = query.shape[-1] // attn.heads
        kv_heads = key.shape[-1] // head_dim
        dtype = query.dtype
        query = query.view(batch_size, -1, attn.heads, head_dim)
        key = key.view(batch_size, -1, kv_heads, head_dim)
        value = value.view(batch_size, -1, kv_heads, head_dim)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        cos, sin = _complex_tables(image_rotary_emb)  # [B, S, D]
        query, key = self._rome(query, key, cos[:, :, None], sin[:, :, None])  # BSND, [B, S, 1, D]
        query, key = query.to(dtype), key.to(dtype)  # the projections' dtype, as the original
        if base_sequence_length is not None:
            softmax_scale = math.sqrt(math.log(sequence_length, base_sequence_length)) * attn.scale
        else:
            softmax_scale = attn.scale
        n_rep = attn.heads // kv_heads
        if n_rep >= 1:
            key = key.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
            value = value.unsqueeze(3).repeat(1, 1, 1, n_rep, 1).flatten(2, 3)
        if attention_mask is not None:
            attention_mask = attention_mask.bool().view(batch_size, 1, 1, -1)
        hidden_states = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), attn_mask=attention_mask,
            scale=softmax_scale,
        )
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = hidden_states.type_as(query)
        return attn.to_out[1](attn.to_out[0](hidden_states))


class RomeCogView4AttnProcessor(_RomeProcessor, _base(_cogview4, "CogView4AttnProcessor")):
    """``CogView4AttnProcessor`` with q and k rotated by one ``rome.apply_qk`` with
    ``half_matrix`` (``use_real_unbind_dim=-2``); the leading text tokens get identity rows."""

    def __call__(self, attn, hidden_states, encoder_hidden_states, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        dtype = encoder_hidden_states.dtype
        batch_size, text_seq_length, _ = encoder_hidden_states.shape
        image_seq_length = hidden_states.shape[1]
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        query, key, value = (proj(hidden_states).unflatten(2, (attn.heads, -1)).transpose(1, 2)
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            query = attn.norm_q(query).to(dtype=dtype)
        if attn.norm_k is not None:
            key = attn.norm_k(key).to(dtype=dtype)
        cos, sin = _pad_rows(*image_rotary_emb, text_seq_length, before=True)  # [S, D]
        query, key = self._rome(query, key, cos, sin, "half")  # BNSD
        if attention_mask is not None:
            mix = torch.ones((batch_size, text_seq_length + image_seq_length), device=query.device)
            mix[:, :text_seq_length] = attention_mask.float().to(query.device)
            mix = mix.unsqueeze(2)
            attention_mask = ((mix @ mix.transpose(1, 2)) > 0).unsqueeze(1).to(query.dtype)
        hidden_states = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False
        )
        hidden_states = hidden_states.transpose(1, 2).flatten(2, 3).type_as(query)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states


class RomeHiDreamAttnProcessor(_RomeProcessor, _base(_hidream, "HiDreamAttnProcessor")):
    """``HiDreamAttnProcessor`` with q and k rotated by one ``rome.apply_qk``. HiDream's table
    holds a 2x2 rotation per pair (``[[cos, -sin], [sin, cos]]``, ``[B, S, 1, D/2, 2, 2]``) on
    interleaved pairs: rome's interleave tables are its first column; where it rotates only the
    first half of each head, the rest gets ``cos = 1``, ``sin = 0``."""

    def __call__(self, attn, hidden_states, hidden_states_masks=None, encoder_hidden_states=None,
                 image_rotary_emb=None, *args, **kwargs):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, hidden_states_masks, encoder_hidden_states,
                                    image_rotary_emb, *args, **kwargs)
        dtype = hidden_states.dtype
        batch_size = hidden_states.shape[0]
        query_i = attn.q_rms_norm(attn.to_q(hidden_states)).to(dtype=dtype)
        key_i = attn.k_rms_norm(attn.to_k(hidden_states)).to(dtype=dtype)
        value_i = attn.to_v(hidden_states)
        head_dim = key_i.shape[-1] // attn.heads
        query_i, key_i, value_i = (t.view(batch_size, -1, attn.heads, head_dim) for t in (query_i, key_i, value_i))
        if hidden_states_masks is not None:
            key_i = key_i * hidden_states_masks.view(batch_size, -1, 1, 1)
        if not attn.single:
            query_t = attn.q_rms_norm_t(attn.to_q_t(encoder_hidden_states)).to(dtype=dtype)
            key_t = attn.k_rms_norm_t(attn.to_k_t(encoder_hidden_states)).to(dtype=dtype)
            value_t = attn.to_v_t(encoder_hidden_states)
            query_t, key_t, value_t = (t.view(batch_size, -1, attn.heads, head_dim) for t in (query_t, key_t, value_t))
            num_image_tokens, num_text_tokens = query_i.shape[1], query_t.shape[1]
            query = torch.cat([query_i, query_t], dim=1)
            key = torch.cat([key_i, key_t], dim=1)
            value = torch.cat([value_i, value_t], dim=1)
        else:
            query, key, value = query_i, key_i, value_i
        cos, sin = _hidream_tables(image_rotary_emb, head_dim)  # [B, S, 1, D]
        query, key = self._rome(query, key, cos, sin)  # BSND, [B, S, 1, D]
        hidden_states = F.scaled_dot_product_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout_p=0.0, is_causal=False
        )
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = hidden_states.to(query.dtype)
        if not attn.single:
            hidden_states_i, hidden_states_t = torch.split(hidden_states, [num_image_tokens, num_text_tokens], dim=1)
            return attn.to_out(hidden_states_i), attn.to_out_t(hidden_states_t)
        return attn.to_out(hidden_states)


# --- processors that call a rotary function: that function rebound to rome's ----------------------
#
# Where a processor's ``__call__`` rotates q and k by calling a function (a global of its module,
# a helper of that module that calls it, or ``from ..embeddings import apply_rotary_emb`` inside
# ``__call__``), rome's subclass runs the library's own ``__call__`` code with that function bound
# to rome's version of it (``_diffusers_rope``): the same code object, defaults and closure under
# a copy of the module's globals, nothing of the library changed. A relative import inside the
# rebound function resolves in a package of rome's (``_SHIM`` + backend) whose ``embeddings``
# module holds rome's ``apply_rotary_emb`` and ``apply_rotary_emb_allegro`` and reads every other
# name from diffusers' ``embeddings``. One rome launch per rotated tensor (per q and k pair where
# the function takes both); the rest of the processor is the library's, attention backend, masks
# and all.

_SHIM = "rome.integrations._diffusers_embeddings_"  # + backend
_SHIM_FUNCTIONS = {"apply_rotary_emb": _fn.ApplyRotaryEmb, "apply_rotary_emb_allegro": _fn.ApplyRotaryEmbAllegro}
_ROTARY = re.compile(r"rot|rope", re.IGNORECASE)  # names of rotary functions (and of other things)


def _shim(backend: str) -> str:
    """The package (in ``sys.modules``, no file) a rebound ``__call__``'s relative imports
    resolve in for ``backend``: its ``embeddings`` is rome's rotary functions over diffusers'."""
    root = _SHIM + backend
    if root + ".embeddings" not in sys.modules:
        embeddings = importlib.import_module("diffusers.models.embeddings")
        package = types.ModuleType(root, "rome: diffusers' rotary functions on rome (a rebound processor's imports)")
        package.__path__ = []
        module = types.ModuleType(root + ".embeddings", "diffusers.models.embeddings, rotary functions on rome")
        rotate = _Rotate(backend)
        for name, cls in _SHIM_FUNCTIONS.items():
            setattr(module, name, cls(rotate))
        module.__getattr__ = functools.partial(getattr, embeddings)  # every other name: diffusers'
        sys.modules.setdefault(root, package)
        sys.modules.setdefault(root + ".embeddings", module)
    return root


def _imported(fn) -> set[str]:
    """The names ``fn``'s code (and the functions it defines) imports with ``from ... import``."""
    code = fn.__code__
    names = set()
    stack = [code]
    while stack:
        c = stack.pop()
        names.update(i.argval for i in dis.get_instructions(c) if i.opname == "IMPORT_FROM")
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _relative_imports(fn) -> set[str]:
    """The modules ``fn``'s code (and the functions it defines) imports relatively (``from ..x
    import y``: ``"x"``), which a rebound function resolves in rome's package."""
    stack, names = [fn.__code__], set()
    while stack:
        c = stack.pop()
        ops = list(dis.get_instructions(c))
        for i, op in enumerate(ops):
            # LOAD_CONST level, LOAD_CONST fromlist, IMPORT_NAME module
            if op.opname == "IMPORT_NAME" and i >= 2 and ops[i - 2].opname == "LOAD_CONST" and ops[i - 2].argval:
                names.add(op.argval)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _read_globals(fn) -> set[str]:
    """The global names ``fn`` (and the functions it defines) reads that are functions of its
    module's globals: what it may call."""
    stack, names = [fn.__code__], set()
    while stack:
        c = stack.pop()
        names.update(n for n in c.co_names if callable(fn.__globals__.get(n)))
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


def _rebind(fn, values: dict, helpers: tuple, package: str):
    """``fn`` with the globals in ``values`` (those it reads) and the ``helpers`` (module
    functions it calls, each rebound the same way) bound to the given objects, and its relative
    imports resolved in ``package`` for diffusers' ``diffusers.models``."""
    if not isinstance(fn, types.FunctionType) or hasattr(fn, "__wrapped__"):
        raise ValueError(f"{getattr(fn, '__qualname__', fn)!r} is not a plain function; rome cannot rebind it")
    scope = dict(fn.__globals__)
    scope.pop("__name__", None)  # torch.compile guards on this dict, not on the modeling module
    scope.pop("__spec__", None)  # (the relative imports read __package__ alone)
    own = fn.__globals__.get("__package__") or ""
    if own.startswith("diffusers.models"):
        scope["__package__"] = package + own[len("diffusers.models"):]
    for name, value in values.items():
        if name in scope:
            scope[name] = value
    for name in helpers:
        scope[name] = _rebind(fn.__globals__[name], values, (), package)
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return new


_REBOUND: dict = {}  # (rome processor class, backend, library __call__) -> that __call__, rebound


def _rebound_call(cls, backend: str):
    """The library ``__call__`` of ``cls`` rebound for ``backend``, made on its first call: its
    module's globals are read then (a snapshot, as transformers' patched forwards take), and again
    if the library's ``__call__`` itself is replaced."""
    library = cls._rome_base.__call__
    key = (cls, backend, library)
    fn = _REBOUND.get(key)
    if fn is None:
        rotate = _Rotate(backend)
        values = {name: f(rotate) for name, f in cls._rome_functions.items()}
        fn = _REBOUND[key] = _rebind(library, values, cls._rome_helpers, _shim(backend))
    return fn


class _ReboundProcessor(_RomeProcessor):
    """A library processor class whose ``__call__`` runs rebound to rome's rotary functions
    (``_rome_functions``: the name it calls -> the ``_diffusers_rope`` class standing for it;
    ``_rome_helpers``: module functions it calls that call them). Subclasses are made by
    ``_rebound_processor``."""

    _rome_base: type = _Missing
    _rome_functions: dict = {}
    _rome_helpers: tuple = ()


def _rebound_processor(name: str, module, base_name: str, functions: dict, helpers: tuple = ()) -> type:
    """The module-level class ``name`` (pickle finds it): ``module.<base_name>`` with its
    ``__call__`` rebound to rome's ``functions``; a placeholder subclass where this diffusers
    lacks the base (patch() then says so)."""
    base = _base(module, base_name)

    def __call__(self, *args, **kwargs):
        return _rebound_call(type(self), self._rome.backend)(self, *args, **kwargs)

    if base is not _Missing and hasattr(base, "__call__"):
        # diffusers passes a processor the keyword arguments its __call__'s signature names
        __call__.__signature__ = inspect.signature(base.__call__)
    __call__.__qualname__ = f"{name}.__call__"
    cls = type(name, (_ReboundProcessor, base), {
        "__call__": __call__, "__module__": __name__, "__qualname__": name,
        "__doc__": f"``{base_name}`` with its ``__call__`` calling rome's "
                   f"{', '.join(f.function for f in functions.values())}.",
        "_rome_base": base, "_rome_functions": dict(functions), "_rome_helpers": tuple(helpers),
    })
    globals()[name] = cls
    return cls


def _check_rebinding(model_name: str, cls) -> None:
    """ValueError unless the library ``__call__`` (and its helpers) calls at least one of the
    functions rome rebinds and no other rotary function: otherwise the patch would leave a
    rotation in place (a diffusers version whose processor rome's patch does not know)."""
    base = cls._rome_base
    fn = base.__call__
    known = set(cls._rome_functions) | set(cls._rome_helpers)
    functions = [fn, *(fn.__globals__.get(h) for h in cls._rome_helpers)]
    if any(not isinstance(f, types.FunctionType) for f in functions):
        raise ValueError(f"{model_name}: {base.__name__}.__call__ or its helpers {cls._rome_helpers} are not "
                         f"plain functions in this diffusers; rome cannot rebind them")
    called = set().union(*(_read_globals(f) | _imported(f) for f in functions))
    other = sorted(n for n in called - known if _ROTARY.search(n) and not n.startswith("get_"))
    if not called & set(cls._rome_functions) or other:
        raise ValueError(
            f"{model_name}: {base.__name__}.__call__ calls {other or 'none of ' + str(sorted(cls._rome_functions))} "
            f"(rome rebinds {sorted(cls._rome_functions)}): a diffusers version rome's patch does not know; not patched"
        )
    relative = set().union(*(_relative_imports(f) for f in functions)) - {"embeddings"}
    if relative:
        raise ValueError(
            f"{model_name}: {base.__name__}.__call__ imports {sorted(relative)} relatively, which rome's rebound "
            f"function cannot resolve (only diffusers.models.embeddings); not patched"
        )


# --- rotary modules with float64 angles ---------------------------------------------------------


class _HunyuanRopeForward:
    """``HunyuanVideoRotaryPosEmbed.forward`` from float64 angles: ``(cos, sin)`` float32
    ``[T*H*W, D]``, section i of ``rope_dim`` turning by ``grid[:, i] * theta ** (-2j / d_i)``.
    A module-level class (the patched module pickles); the layout is built on the CPU whatever
    the default device (patching inside ``with torch.device("meta")``)."""

    _rome = True  # marks a patched rotary module

    def __init__(self, rope):
        with torch.device("cpu"):
            self.layout = section_layout(tuple(rope.rope_dim), mode="interleave", theta=float(rope.theta))
        self.patch_size_t, self.patch_size = rope.patch_size_t, rope.patch_size

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor]:
        layout = self.layout
        _, _, frames, height, width = hidden_states.shape
        sizes = [frames // self.patch_size_t, height // self.patch_size, width // self.patch_size]
        device = hidden_states.device
        cos, sin = cos_sin_cache(layout, max(max(sizes), 1), device=device)  # [max size, D]
        # tables_for_positions without its host-side range check (positions < max size here)
        index = grid_positions(sizes, device=device)[:, layout.axis.to(device)]
        columns = torch.arange(layout.head_dim, device=device)
        return cos[index, columns], sin[index, columns]


def _ltx_layout(dim: int, theta: float) -> RopeLayout:
    """LTX-Video's RoPE over the whole ``dim = heads * head_dim`` vector: ``dim % 6`` leading
    pass-through columns, then pairs ``(k, axis)`` for k < dim // 6 and axis in (t, h, w), pair k
    turning by ``theta ** (k / (dim // 6 - 1)) * pi / 2`` (theta ** linspace(0, 1)), the
    positions being ``2 * grid - 1``."""
    n, pad = dim // 6, dim % 6
    freqs = torch.tensor(theta, dtype=torch.float64) ** torch.linspace(0, 1, n, dtype=torch.float64)
    freqs = freqs * (math.pi / 2)
    inv = torch.cat([torch.zeros(pad, dtype=torch.float64), freqs.repeat_interleave(6)])
    axis = torch.cat([torch.zeros(pad, dtype=torch.int64), torch.arange(3).repeat_interleave(2).repeat(n)])
    blocks = ((("none", pad),) if pad else ()) + (("interleave", 6 * n),)
    return RopeLayout(inv, axis, 3, blocks)


class _LTXRopeForward:
    """``LTXVideoRotaryPosEmbed.forward`` from float64 grids and angles: ``(cos, sin)`` float32
    ``[B, S, dim]`` (a module-level class, as ``_HunyuanRopeForward``)."""

    _rome = True

    def __init__(self, rope):
        with torch.device("cpu"):
            self.layout = _ltx_layout(rope.dim, float(rope.theta))
        self.base = (rope.base_num_frames, rope.base_height, rope.base_width)
        self.patch = (rope.patch_size_t, rope.patch_size, rope.patch_size)

    def __call__(self, hidden_states, num_frames=None, height=None, width=None,
                 rope_interpolation_scale=None, video_coords=None):
        base, patch = self.base, self.patch
        batch, device = hidden_states.size(0), hidden_states.device
        if video_coords is None:
            grid = grid_positions([num_frames, height, width], device=device).to(torch.float64)
            grid = grid.expand(batch, -1, -1)
            if rope_interpolation_scale is not None:
                grid = torch.stack([
                    grid[..., i] * torch.as_tensor(s, dtype=torch.float64, device=device) * p / b
                    for i, (s, p, b) in enumerate(zip(rope_interpolation_scale, patch, base))
                ], dim=-1)
        else:
            coords = video_coords.to(torch.float64)  # [B, 3, S]
            grid = coords.transpose(1, 2) / torch.tensor(base, dtype=torch.float64, device=device)
        return cos_sin_for_positions(self.layout, 2 * grid - 1)


_hunyuan_rope_forward, _ltx_rope_forward = _HunyuanRopeForward, _LTXRopeForward  # former names


# --- the patch ----------------------------------------------------------------------------------

_T = "diffusers.models.transformers."
_WAN_PROC = (_T + "transformer_wan", "WanAttnProcessor", RomeWanAttnProcessor,
             ("_get_qkv_projections", "dispatch_attention_fn"))
_FLUX_PROC = (_T + "transformer_flux", "FluxAttnProcessor", RomeFluxAttnProcessor,
              ("_get_qkv_projections", "dispatch_attention_fn"))
_HUNYUAN_PROC = (_T + "transformer_hunyuan_video", "HunyuanVideoAttnProcessor2_0",
                 RomeHunyuanVideoAttnProcessor, ("dispatch_attention_fn",))
_DOUBLE_SINGLE = (("transformer_blocks", "attn"), ("single_transformer_blocks", "attn"))


class _Family(NamedTuple):
    """How rome patches one diffusers transformer class."""

    # (module, the default processor's class name, its rome subclass, the module's functions
    # that subclass calls), one per processor class on its RoPE attention layers
    processors: tuple
    # (blocks, attribute): the attention module ``block.<attribute>`` of every block in
    # ``model.<blocks>`` applies RoPE
    layers: tuple
    # the class of the rotary module's float64 forward, or None (the model's tables as given)
    rope_forward: type | None = None
    # attention classes (names) every instance of which applies RoPE, beside ``layers``
    attention: tuple = ()
    # how the family's code rounds its rotation (_Rotate.native: "float" or "x"), for
    # patch(..., rounding="native"); None: a rotation rounding="native" does not reproduce
    native: str | None = None


_FAMILIES = {
    "WanTransformer3DModel": _Family((_WAN_PROC,), (("blocks", "attn1"),)),
    "HunyuanVideoTransformer3DModel": _Family((_HUNYUAN_PROC,), _DOUBLE_SINGLE, _HunyuanRopeForward),
    "CogVideoXTransformer3DModel": _Family(
        (("diffusers.models.attention_processor", "CogVideoXAttnProcessor2_0", RomeCogVideoXAttnProcessor, ()),),
        (("transformer_blocks", "attn1"),)),
    # issue 26: ConsisID's blocks are CogVideoX's attention with its processor; FramePack's are
    # HunyuanVideo's (its rotary module, which builds the tables of several latent histories, is kept)
    "ConsisIDTransformer3DModel": _Family(
        (("diffusers.models.attention_processor", "CogVideoXAttnProcessor2_0", RomeCogVideoXAttnProcessor, ()),),
        (("transformer_blocks", "attn1"),)),
    "HunyuanVideoFramepackTransformer3DModel": _Family((_HUNYUAN_PROC,), _DOUBLE_SINGLE),
    "FluxTransformer2DModel": _Family((_FLUX_PROC,), _DOUBLE_SINGLE),
    "LTXVideoTransformer3DModel": _Family(
        ((_T + "transformer_ltx", "LTXVideoAttnProcessor", RomeLTXVideoAttnProcessor, ("dispatch_attention_fn",)),),
        (("transformer_blocks", "attn1"),), _LTXRopeForward),
    # issue 19: the families diffusers 0.42 adds
    "QwenImageTransformer2DModel": _Family(
        ((_T + "transformer_qwenimage", "QwenDoubleStreamAttnProcessor2_0", RomeQwenImageAttnProcessor,
          ("dispatch_attention_fn",)),), (("transformer_blocks", "attn"),)),
    "Flux2Transformer2DModel": _Family(
        ((_T + "transformer_flux2", "Flux2AttnProcessor", RomeFlux2AttnProcessor,
          ("_get_qkv_projections", "dispatch_attention_fn")),
         (_T + "transformer_flux2", "Flux2ParallelSelfAttnProcessor", RomeFlux2ParallelSelfAttnProcessor,
          ("dispatch_attention_fn",))), _DOUBLE_SINGLE),
    "ChromaTransformer2DModel": _Family((_FLUX_PROC,), _DOUBLE_SINGLE),
    "WanVACETransformer3DModel": _Family((_WAN_PROC,), (("blocks", "attn1"), ("vace_blocks", "attn1"))),
    "WanAnimateTransformer3DModel": _Family(
        ((_T + "transformer_wan_animate", "WanAttnProcessor", RomeWanAnimateAttnProcessor,
          ("_get_qkv_projections", "dispatch_attention_fn")),), (("blocks", "attn1"),)),
    "ChronoEditTransformer3DModel": _Family(
        ((_T + "transformer_chronoedit", "WanAttnProcessor", RomeChronoEditAttnProcessor,
          ("_get_qkv_projections", "dispatch_attention_fn")),), (("blocks", "attn1"),)),
    "SkyReelsV2Transformer3DModel": _Family(
        ((_T + "transformer_skyreels_v2", "SkyReelsV2AttnProcessor", RomeSkyReelsV2AttnProcessor,
          ("_get_qkv_projections", "dispatch_attention_fn")),), (("blocks", "attn1"),)),
    "HunyuanVideo15Transformer3DModel": _Family(
        ((_T + "transformer_hunyuan_video15", "HunyuanVideo15AttnProcessor2_0", RomeHunyuanVideo15AttnProcessor,
          ("dispatch_attention_fn",)),), (("transformer_blocks", "attn"),)),
    "HunyuanImageTransformer2DModel": _Family(
        ((_T + "transformer_hunyuanimage", "HunyuanImageAttnProcessor", RomeHunyuanImageAttnProcessor,
          ("dispatch_attention_fn",)),), _DOUBLE_SINGLE),
    "LTX2VideoTransformer3DModel": _Family(
        ((_T + "transformer_ltx2", "LTX2AudioVideoAttnProcessor", RomeLTX2AttnProcessor,
          ("dispatch_attention_fn",)),),
        tuple(("transformer_blocks", a)
              for a in ("attn1", "audio_attn1", "audio_to_video_attn", "video_to_audio_attn"))),
    "ZImageTransformer2DModel": _Family(
        ((_T + "transformer_z_image", "ZSingleStreamAttnProcessor", RomeZImageAttnProcessor,
          ("dispatch_attention_fn",)),),
        tuple((g, "attention") for g in ("noise_refiner", "context_refiner", "layers"))),
    "CosmosTransformer3DModel": _Family(
        ((_T + "transformer_cosmos", "CosmosAttnProcessor2_0", RomeCosmosAttnProcessor, ("dispatch_attention_fn",)),),
        (("transformer_blocks", "attn1"),)),
    "MochiTransformer3DModel": _Family(
        (("diffusers.models.attention_processor", "MochiAttnProcessor2_0", RomeMochiAttnProcessor, ()),),
        (("transformer_blocks", "attn1"),)),
    "Lumina2Transformer2DModel": _Family(
        ((_T + "transformer_lumina2", "Lumina2AttnProcessor2_0", RomeLumina2AttnProcessor, ()),),
        tuple((g, "attn") for g in ("noise_refiner", "context_refiner", "layers"))),
    "CogView4Transformer2DModel": _Family(
        ((_T + "transformer_cogview4", "CogView4AttnProcessor", RomeCogView4AttnProcessor, ()),),
        (("transformer_blocks", "attn1"),)),
    "HiDreamImageTransformer2DModel": _Family(
        ((_T + "transformer_hidream_image", "HiDreamAttnProcessor", RomeHiDreamAttnProcessor, ()),),
        (("double_stream_blocks", "block.attn1"), ("single_stream_blocks", "block.attn1"))),
}


def _rebound(module: str, base: str, functions: dict, helpers: tuple = (), name: str | None = None) -> tuple:
    """A ``_Family.processors`` entry for the processor ``module.<base>`` rebound to rome's
    ``functions`` (``module``: under ``diffusers.models.transformers.`` unless dotted)."""
    module = module if "." in module else _T + module
    name = name or f"Rome{base}"
    cls = globals().get(name)
    if cls is None or cls._rome_functions != functions:
        cls = _rebound_processor(name, _import(module), base, functions, helpers)
    return (module, base, cls, ())


_EMB = {"apply_rotary_emb": _fn.ApplyRotaryEmb}
_AP = "diffusers.models.attention_processor"
# issue 26: every other diffusers 0.42 transformer whose processor calls a rotary function of
# rome's kinds, its processor rebound (one launch per rotated tensor; per q and k pair where the
# function takes both)
_FAMILIES.update({
    "AllegroTransformer3DModel": _Family(
        (_rebound(_AP, "AllegroAttnProcessor2_0", {"apply_rotary_emb_allegro": _fn.ApplyRotaryEmbAllegro}),),
        (("transformer_blocks", "attn1"),)),
    "HunyuanDiT2DModel": _Family((_rebound(_AP, "HunyuanAttnProcessor2_0", _EMB),),
                                 (("blocks", "attn1"), ("blocks", "attn2"))),
    "LuminaNextDiT2DModel": _Family((_rebound(_AP, "LuminaAttnProcessor2_0", _EMB),),
                                    (("layers", "attn1"), ("layers", "attn2"))),
    "StableAudioDiTModel": _Family((_rebound(_AP, "StableAudioAttnProcessor2_0", _EMB),),
                                   (("transformer_blocks", "attn1"), ("transformer_blocks", "attn2"))),
    "EasyAnimateTransformer3DModel": _Family(
        (_rebound("transformer_easyanimate", "EasyAnimateAttnProcessor2_0", _EMB),),
        (("transformer_blocks", "attn1"),)),
    "OmniGenTransformer2DModel": _Family(
        (_rebound("transformer_omnigen", "OmniGenAttnProcessor2_0", _EMB),), (("layers", "self_attn"),)),
    "GlmImageTransformer2DModel": _Family(
        (_rebound("transformer_glm_image", "GlmImageAttnProcessor", _EMB),), (("transformer_blocks", "attn1"),)),
    "AceStepTransformer1DModel": _Family(
        (_rebound("ace_step_transformer", "AceStepAttnProcessor2_0", _EMB),), (), attention=("AceStepAttention",)),
    "BriaTransformer2DModel": _Family((_rebound("transformer_bria", "BriaAttnProcessor", _EMB),), _DOUBLE_SINGLE),
    "BriaFiboTransformer2DModel": _Family(
        (_rebound("transformer_bria_fibo", "BriaFiboAttnProcessor", _EMB),
         _rebound("transformer_bria", "BriaAttnProcessor", _EMB)), _DOUBLE_SINGLE),
    "Flux3Transformer2DModel": _Family(
        (_rebound("transformer_flux3", "Flux3AttnProcessor", _EMB),), (), attention=("Flux3Attention",)),
    "Krea2Transformer2DModel": _Family(
        (_rebound("transformer_krea2", "Krea2AttnProcessor", _EMB),), (), attention=("Krea2Attention",)),
    "LongCatImageTransformer2DModel": _Family(
        (_rebound("transformer_longcat_image", "LongCatImageAttnProcessor", _EMB),), _DOUBLE_SINGLE),
    "OvisImageTransformer2DModel": _Family(
        (_rebound("transformer_ovis_image", "OvisImageAttnProcessor", _EMB),), _DOUBLE_SINGLE),
    "MotifVideoTransformer3DModel": _Family(
        (_rebound("transformer_motif_video", "MotifVideoAttnProcessor2_0", _EMB),
         _rebound("transformer_motif_video", "MotifVideoCrossAttnProcessor2_0", _EMB)), (),
        attention=("MotifVideoAttention", "MotifVideoCrossAttention")),
    "NucleusMoEImageTransformer2DModel": _Family(
        (_rebound("transformer_nucleusmoe_image", "NucleusMoEAttnProcessor2_0",
                  {"_apply_rotary_emb_nucleus": _fn.ApplyRotaryEmbQwen}),),
        (("transformer_blocks", "attn"),)),
    "QwenImage21Transformer2DModel": _Family(
        (_rebound("transformer_qwenimage21", "QwenImage21AttnProcessor",
                  {"apply_rotary_emb_qwen": _fn.ApplyRotaryEmbQwen}, ("_qwenimage21_prepare_qkv",)),),
        (), attention=("QwenImage21Attention",)),
    "AnyFlowTransformer3DModel": _Family(
        (_rebound("transformer_anyflow", "AnyFlowAttnProcessor", {"apply_rotary_emb": _fn.ComplexProduct}),),
        (("blocks", "attn1"),)),
    "AnyFlowFARTransformer3DModel": _Family(
        (_rebound("transformer_anyflow_far", "AnyFlowCausalAttnProcessor", {"apply_rotary_emb": _fn.ComplexProduct}),),
        (("blocks", "attn1"),)),
    "HeliosTransformer3DModel": _Family(
        (_rebound("transformer_helios", "HeliosAttnProcessor",
                  {"apply_rotary_emb_transposed": _fn.ApplyRotaryEmbTransposed}),), (("blocks", "attn1"),)),
    "JoyImageEditTransformer3DModel": _Family(
        (_rebound("transformer_joyimage", "JoyImageAttnProcessor", {"_apply_rotary_emb": _fn.RotateQKSequence}),),
        (), attention=("JoyImageAttention",)),
    "JoyImageEditPlusTransformer3DModel": _Family(
        (_rebound("transformer_joyimage_edit_plus", "JoyImageEditPlusAttnProcessor",
                  {"_apply_rotary_emb_batched": _fn.RotateQKBatched}),), (), attention=("JoyImageEditPlusAttention",)),
    "PRXTransformer2DModel": _Family(
        (_rebound("transformer_prx", "PRXAttnProcessor2_0", {"apply_rope": _fn.RotationPerPair}),), (),
        attention=("PRXAttention",)),
    "Kandinsky6Transformer3DModel": _Family(
        (_rebound("transformer_kandinsky6", "Kandinsky6AttnProcessor", {"apply_rotary": _fn.RotationPerPair}),), (),
        attention=("Kandinsky6Attention",)),
    "Kandinsky6SRTransformer3DModel": _Family(
        (_rebound("transformer_kandinsky6_sr", "Kandinsky6SRAttnProcessor", {"apply_rotary": _fn.RotationPerPair}),),
        (), attention=("Kandinsky6SRAttention",)),
    "LongCatAudioDiTTransformer": _Family(
        (_rebound("transformer_longcat_audio_dit", "AudioDiTSelfAttnProcessor", {"_apply_rotary_emb": _fn.HalfSequence}),
         _rebound("transformer_longcat_audio_dit", "AudioDiTCrossAttnProcessor", {"_apply_rotary_emb": _fn.HalfSequence})),
        (), attention=("AudioDiTAttention",)),
    "MiniMaxH3Transformer3DModel": _Family(
        (_rebound("transformer_minimax_h3", "MiniMaxH3AttnProcessor", {"_apply_rotary_emb": _fn.HalfLeading}),), (),
        attention=("MiniMaxH3Attention",)),
    "MiniMaxMusic3Transformer1DModel": _Family(
        (_rebound("transformer_minimax_music3", "MiniMaxMusic3AttnProcessor",
                  {"_apply_partial_rotary_emb": _fn.HalfLeadingPair}),), (), attention=("MiniMaxMusic3Attention",)),
    "StableAudio3DiTModel": _Family(
        (_rebound("transformer_stable_audio3", "StableAudio3SelfAttnProcessor",
                  {"_apply_rotary_partial": _fn.HalfLeadingAngles}),), (), attention=("StableAudio3SelfAttention",)),
})
# patch(..., rounding="native"): how each family's code rounds its rotation (_Rotate.native):
# "x", Wan's nested apply_rotary_emb (x1 * cos - x2 * sin, in x's dtype promoted with the
# tables'); "float", diffusers' apply_rotary_emb(use_real=True) and LTX's / LTX-2's copies
# ((x.float() * cos + x_rotated.float() * sin).to(x.dtype)). The others are refused: complex
# products (Qwen-Image, Z-Image, Lumina2), Mochi's and HiDream's own per-pair formulas.
_NATIVE = {
    "WanTransformer3DModel": "x", "WanVACETransformer3DModel": "x", "WanAnimateTransformer3DModel": "x",
    "ChronoEditTransformer3DModel": "x", "SkyReelsV2Transformer3DModel": "x",
    "HunyuanVideoTransformer3DModel": "float", "HunyuanVideoFramepackTransformer3DModel": "float",
    "HunyuanVideo15Transformer3DModel": "float", "HunyuanImageTransformer2DModel": "float",
    "FluxTransformer2DModel": "float", "ChromaTransformer2DModel": "float", "Flux2Transformer2DModel": "float",
    "CogVideoXTransformer3DModel": "float", "ConsisIDTransformer3DModel": "float",
    "LTXVideoTransformer3DModel": "float", "LTX2VideoTransformer3DModel": "float",
    "CosmosTransformer3DModel": "float", "CogView4Transformer2DModel": "float",
}
_FAMILIES = {name: f._replace(native=_NATIVE.get(name)) for name, f in _FAMILIES.items()}
SUPPORTED = tuple(_FAMILIES)

# diffusers 0.42's transformer classes with RoPE that rome does not patch, and why (ValueError)
_INLINE = ("writes its rotation inline in the processor ({}), so there is no function to rebind; rome "
           "would need a copy of the processor body")
_NESTED = ("rotates q and k with a function defined inside its processor's __call__ ({}), which rome "
           "cannot rebind without copying the processor body")
REFUSED = {
    "Kandinsky5Transformer3DModel": _NESTED.format("Kandinsky5AttnProcessor: apply_rotary, 2x2 tables"),
    "BriaFibo2Transformer2DModel": _NESTED.format("BriaFibo2AttnProcessor: apply_rotary_emb"),
    "ErnieImageTransformer2DModel": _NESTED.format("ErnieImageSingleStreamAttnProcessor: apply_rotary_emb"),
    "SanaVideoTransformer3DModel": _NESTED.format(
        "SanaLinearAttnProcessor3_0: apply_rotary_emb, on linear attention's kernel features"),
    "Cosmos3OmniTransformer": _INLINE.format(
        "Cosmos3AttnProcessor: q * cos + _rotate_half(q) * sin for its understanding and generation streams"),
    "Ideogram4Transformer2DModel": _INLINE.format("Ideogram4AttnProcessor: query * cos + _rotate_half(query) * sin"),
    "WanAnimate2Transformer3DModel": (
        "not added yet: WanAnimate2AttnProcessor calls rope_apply(x, grid_sizes, freqs), which builds each "
        "sample's complex table from its grid in float64, and rome has no version of it; its generation pass "
        "(kv_cache_mode='cached') needs FlexAttention under torch.compile, which rome's CPU tests cannot run"),
    "SanaWMTransformer3DModel": (
        "its attention modules rotate in their own forward, not in a processor (and its gated delta-net "
        "linear attention rotates the numerator's q and k only); rome patches processors"),
    "SanaWMLTX2RefinerTransformer3DModel": (
        "its processors pick LTX-2's apply_interleaved_rotary_emb or apply_split_rotary_emb by rope_type and "
        "record q and k before and after the rotation; rome's LTX-2 patch restates LTX-2's own processor and "
        "has no version of these copies yet"),
}
# diffusers 0.42's transformer classes whose attention applies no RoPE: nothing for rome to patch
NO_ROPE = (
    "AuraFlowTransformer2DModel", "CogView3PlusTransformer2DModel", "DiTTransformer2DModel",
    "DreamLiteTransformer2DModel", "LatteTransformer3DModel",
    "MiniMaxMusic3RVQDepthDecoder", "PixArtTransformer2DModel", "PriorTransformer", "RFD4ProteinaTransformer",
    "SanaTransformer2DModel", "SD3Transformer2DModel", "T5FilmDecoder",
    "Transformer2DModel", "TransformerTemporalModel",
)


def _family(model) -> str | None:
    import diffusers

    classes = [(name, getattr(diffusers, name, None)) for name in SUPPORTED]
    classes = [(name, cls) for name, cls in classes if isinstance(cls, type)]
    for name, cls in classes:  # the model's own class first, then a class it derives from
        if type(model) is cls:
            return name
    for name, cls in classes:
        if isinstance(model, cls):
            return name
    return None


def _attention_layers(model, family: str) -> list[tuple[str, object]]:
    """``(name, attention module)`` of every layer that applies RoPE."""
    spec = _FAMILIES[family]
    layers = [
        (f"{group}.{i}.{attr}", block.get_submodule(attr))
        for group, attr in spec.layers
        for i, block in enumerate(model.get_submodule(group))
    ]
    if spec.attention:
        layers += [(n, m) for n, m in model.named_modules() if type(m).__name__ in spec.attention]
    return layers


def _check_axes(name: str, what: str, dims, head_dim: int, *, halves: bool = False) -> None:
    """Per-axis sections rome's layout takes: positive even sizes summing to the head dim (or,
    ``halves``, to it or to its first half)."""
    dims = [int(d) for d in dims]
    sums = (head_dim, head_dim // 2) if halves else (head_dim,)
    if sum(dims) not in sums or any(d <= 0 or d % 2 for d in dims):
        also = f" (or its first half, {head_dim // 2})" if halves else ""
        raise ValueError(
            f"{name}: {what}={dims} must be positive even sizes summing to "
            f"attention_head_dim={head_dim}{also} for rome's per-axis interleave layout"
        )


def _check_config(model, family: str) -> None:
    """ValueError for a RoPE configuration rome (or this patch) cannot express."""
    name = type(model).__name__
    config = model.config
    if family == "HunyuanVideoTransformer3DModel":
        _check_axes(name, "rope_axes_dim", model.rope.rope_dim, config.attention_head_dim)
    if family in ("FluxTransformer2DModel", "ChromaTransformer2DModel"):
        _check_axes(name, "axes_dims_rope", model.pos_embed.axes_dim, config.attention_head_dim)
    if family == "HiDreamImageTransformer2DModel":
        _check_axes(name, "axes_dims_rope", config.axes_dims_rope, config.attention_head_dim, halves=True)
    if family == "HunyuanVideoFramepackTransformer3DModel":
        _check_axes(name, "rope_axes_dim", config.rope_axes_dim, config.attention_head_dim)
    if family in ("CogVideoXTransformer3DModel", "ConsisIDTransformer3DModel") \
            and not config.use_rotary_positional_embeddings:
        raise ValueError(
            f"{name}: use_rotary_positional_embeddings=False (learned or sincos positional "
            f"embeddings, no RoPE): nothing for rome to patch"
        )
    if family == "LTXVideoTransformer3DModel":
        rope = model.rope
        if rope.dim < 6:
            raise ValueError(f"{name}: inner dim {rope.dim} < 6 gives no RoPE frequency per axis")


def patch(model, *, backend: Backend = "auto", rounding: Rounding = "exact") -> Patch | None:
    """Patch a diffusers transformer of ``SUPPORTED`` in place (this instance only) to rotate q
    and k with one rome launch per attention layer; None for another diffusers model.

    ``rounding="native"``: the patched model's outputs are the unpatched model's bit for bit: the
    rotary modules are kept (the model's own tables) and each launch rounds as the family's code
    does (``_NATIVE``); a family whose rotation it cannot reproduce raises ValueError.

    Raises ValueError for a model patched already, a RoPE configuration rome cannot express, or a
    RoPE attention layer whose processor is not the model's default (naming the layer and class).
    """
    family = _family(model)
    name = type(model).__name__
    if family is None:
        for cls in type(model).__mro__:  # the model's class, then the classes it derives from
            if cls.__name__ in REFUSED:
                raise ValueError(f"rome.integrations.patch({name}): {cls.__name__} is not patched: "
                                 f"{REFUSED[cls.__name__]}")
            if cls.__name__ in NO_ROPE:
                raise ValueError(f"rome.integrations.patch({name}): {cls.__name__} applies no rotary position "
                                 f"embedding (RoPE): nothing for rome to patch")
        return None
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    native = check_rounding(rounding) == "native"
    spec = _FAMILIES[family]
    if native and spec.native is None:
        rebound = all(issubclass(r, _ReboundProcessor) for _, _, r, _ in spec.processors)
        why = ("its processor is rebound to rome's rotary functions (rome/integrations/_diffusers_rope.py), "
               "which round exactly only" if rebound else
               "its rotation (complex products, or its own per-pair formula) is not one rounding='native' "
               "reproduces")
        raise ValueError(
            f"rome.integrations.patch({name}, rounding='native'): {why}; rounding='native' "
            f"patches {', '.join(n for n in SUPPORTED if _FAMILIES[n].native)} (rounding='exact' patches {name})")
    rome_classes = {}  # the library's processor class -> its rome subclass
    for module_name, proc_name, rome_cls, helpers in spec.processors:
        module = importlib.import_module(module_name)
        missing = [a for a in (proc_name, *helpers) if not hasattr(module, a)]
        if missing:
            import diffusers

            raise ValueError(
                f"{name}: diffusers {diffusers.__version__} has no {module_name}.{missing[0]}, which "
                f"rome's patch of this model uses (written against diffusers 0.42)"
            )
        base = getattr(module, proc_name)
        if not issubclass(rome_cls, base):  # another class of that name than rome's import saw
            raise ValueError(
                f"{name}: {module_name}.{proc_name} is not the class rome's {rome_cls.__name__} "
                f"subclasses (replaced after rome.integrations.diffusers was imported)"
            )
        if issubclass(rome_cls, _ReboundProcessor):
            _check_rebinding(name, rome_cls)
        rome_classes[base] = rome_cls
    _check_config(model, family)
    layers = _attention_layers(model, family)
    if getattr(getattr(model, "rope", None), "__dict__", {}).get("forward") is not None:
        if getattr(model.rope.__dict__["forward"], "_rome", False):
            raise ValueError(f"{name} is already patched by rome (rope); undo that patch first")
    for path, attn in layers:
        proc = attn.processor
        if isinstance(proc, _RomeProcessor):
            raise ValueError(f"{name} is already patched by rome ({path}); undo that patch first")
        if type(proc) not in rome_classes:
            defaults = " or ".join(sorted(p for _, p, _, _ in spec.processors))
            raise ValueError(
                f"{name}: {path} has processor {type(proc).__name__}; rome patches only "
                f"{defaults} (the model's default)"
            )
    handle = Patch(model, family)
    rotate = _Rotate(backend, spec.native if native else None)
    for _, attn in layers:
        proc = attn.processor
        rome_cls = rome_classes[type(proc)]
        new = rome_cls.__new__(rome_cls)
        new.__dict__.update(proc.__dict__)  # attention backend, parallel config
        new._rome = rotate
        handle.setattr(attn, "processor", new)
    if spec.rope_forward is not None and not native:  # (native: the model's own tables)
        handle.set_forward(model.rope, spec.rope_forward(model.rope))
    return handle
