"""diffusers video/image transformers with rome's RoPE: ``patch(model, backend=...)``.

Every model here rotates each head's q and k by ``x*cos + rotate_every_two(x)*sin`` with tables
laid out as rome's ``interleave`` tables (``get_1d_rotary_pos_embed(..., repeat_interleave_real=
True)``: ``[c0, c0, c1, c1, ...]`` per axis), so the matrix is ``rome.interleave_matrix(D)`` and
the model's tables are rome's tables. The patch replaces, per model instance:

- the attention **processor** of every attention layer that applies RoPE with a subclass of the
  model's own processor class (instance state such as the attention backend is kept) whose
  ``__call__`` is the original's with the two per-tensor rotations replaced by one
  ``rome.apply_qk`` launch for q and k. The rotation sits between the q/k projections and the
  attention call inside the processor (in Wan, a function nested in ``__call__``), so the
  processor body that has both q and k is restated here, using the library's own projection and
  attention helpers; calls it does not cover (no RoPE, Wan's image-context branch, LTX's cross
  attention) go to the original ``__call__``.
- the **rotary module's** ``forward`` where the model computes its angles in float32
  (HunyuanVideo, LTX-Video): the patched one returns the same tables, shapes and dtype from
  float64 angles rounded once (``rome.layouts``). Wan and Flux already build their tables from
  float64 angles and keep their rotary modules. CogVideoX receives its tables from the pipeline
  (``image_rotary_emb``, crop-and-interpolate grids with fractional positions) and uses them as
  given.

Text tokens that the model leaves unrotated (HunyuanVideo's single-stream blocks append them,
CogVideoX prepends them) get ``cos = 1``, ``sin = 0`` rows, which rome returns exactly as x, so
one launch covers the whole sequence. Only processors of the exact classes below are replaced;
another processor on a RoPE attention layer (IP-adapter, fused, custom) raises ValueError.
"""

from __future__ import annotations

import importlib
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..layouts import RopeLayout, cos_sin_cache, cos_sin_for_positions, section_layout
from ..matrices import interleave_matrix
from ..ops import BACKENDS, apply, apply_qk
from ..tables import grid_positions
from ..types import Backend
from . import Patch

__all__ = ["SUPPORTED", "patch"]

SUPPORTED = (
    "WanTransformer3DModel",
    "HunyuanVideoTransformer3DModel",
    "CogVideoXTransformer3DModel",
    "FluxTransformer2DModel",
    "LTXVideoTransformer3DModel",
)


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
    """``(q, k) -> rome.apply_qk(q, k, cos, sin, interleave_matrix(D))``, the matrix built once
    per (D, dtype, device). Tables in a dtype rome does not take with q's (bf16 tables for fp32 q)
    go in as float32."""

    def __init__(self, backend: Backend = "auto"):
        self.backend = backend
        self._matrices: dict = {}

    def _matrix(self, x: Tensor) -> Tensor:
        key = (x.shape[-1], x.dtype, x.device)
        m = self._matrices.get(key)
        if m is None:
            m = interleave_matrix(x.shape[-1], dtype=x.dtype, device=x.device)
            # not while torch.compile traces: a dict filled during tracing fails the guard that
            # the trace put on it, and the second call would recompile (the graph builds M)
            if not torch.compiler.is_compiling():
                self._matrices[key] = m
        return m

    def __getstate__(self):
        return {"backend": self.backend, "_matrices": {}}  # matrices are rebuilt on demand

    @staticmethod
    def _tables(x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """On x's device (diffusers moves them there too), float32 unless in x's dtype."""
        dtype = cos.dtype if cos.dtype in (torch.float32, x.dtype) else torch.float32
        return cos.to(x.device, dtype), sin.to(x.device, dtype)

    def __call__(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self._tables(q, cos, sin)
        return apply_qk(q, k, cos, sin, self._matrix(q), backend=self.backend)

    def one(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """``rome.apply`` of x alone (cross attention: the keys are not rotated)."""
        cos, sin = self._tables(x, cos, sin)
        return apply(x, cos, sin, self._matrix(x), backend=self.backend)


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


class RomeWanAttnProcessor(_RomeProcessor, _base(_wan, "WanAttnProcessor")):
    """``WanAttnProcessor`` with q and k rotated by one ``rome.apply_qk``."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 rotary_emb=None):
        if rotary_emb is None or attn.add_k_proj is not None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    rotary_emb)
        query, key, value = _wan._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        query, key = self._rome(query, key, *rotary_emb)  # BSND, tables [1, S, 1, D]
        hidden_states = _wan.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend,
            parallel_config=self._parallel_config if encoder_hidden_states is None else None,
        )
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        return attn.to_out[1](attn.to_out[0](hidden_states))


class RomeHunyuanVideoAttnProcessor(_RomeProcessor, _base(_hy, "HunyuanVideoAttnProcessor2_0")):
    """``HunyuanVideoAttnProcessor2_0`` with q and k rotated by one ``rome.apply_qk``; the
    text tokens a single-stream block appends get identity rows."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        cos, sin = image_rotary_emb  # [S_img, D]
        if attn.add_q_proj is None and encoder_hidden_states is not None:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
            cos, sin = _pad_rows(cos, sin, encoder_hidden_states.shape[1], before=False)
        query, key, value = _heads(attn, hidden_states, attn.to_q, attn.to_k, attn.to_v,
                                   attn.norm_q, attn.norm_k)
        query, key = self._rome(query, key, cos[:, None], sin[:, None])  # BSND, [S, 1, D]
        if attn.add_q_proj is not None and encoder_hidden_states is not None:
            encoder_query, encoder_key, encoder_value = _heads(
                attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj,
                attn.norm_added_q, attn.norm_added_k)
            query = torch.cat([query, encoder_query], dim=1)
            key = torch.cat([key, encoder_key], dim=1)
            value = torch.cat([value, encoder_value], dim=1)
        hidden_states = _hy.dispatch_attention_fn(
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
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        cos, sin = _pad_rows(*image_rotary_emb, text_seq_length, before=True)  # [S, D]
        if attn.is_cross_attention:
            query = self._rome.one(query, cos, sin)
        else:
            query, key = self._rome(query, key, cos, sin)  # BNSD
        hidden_states = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False
        )
        hidden_states = hidden_states.transpose(1, 2).reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states


class RomeFluxAttnProcessor(_RomeProcessor, _base(_flux, "FluxAttnProcessor")):
    """``FluxAttnProcessor`` with q and k (text and image tokens) rotated by one
    ``rome.apply_qk``."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                 image_rotary_emb=None):
        if image_rotary_emb is None:
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                    image_rotary_emb)
        query, key, value, encoder_query, encoder_key, encoder_value = _flux._get_qkv_projections(
            attn, hidden_states, encoder_hidden_states
        )
        query = attn.norm_q(query.unflatten(-1, (-1, attn.head_dim)))
        key = attn.norm_k(key.unflatten(-1, (-1, attn.head_dim)))
        value = value.unflatten(-1, (-1, attn.head_dim))
        if attn.added_kv_proj_dim is not None:
            encoder_query = attn.norm_added_q(encoder_query.unflatten(-1, (-1, attn.head_dim)))
            encoder_key = attn.norm_added_k(encoder_key.unflatten(-1, (-1, attn.head_dim)))
            encoder_value = encoder_value.unflatten(-1, (-1, attn.head_dim))
            query = torch.cat([encoder_query, query], dim=1)
            key = torch.cat([encoder_key, key], dim=1)
            value = torch.cat([encoder_value, value], dim=1)
        cos, sin = image_rotary_emb  # [S_txt + S_img, D]
        query, key = self._rome(query, key, cos[:, None], sin[:, None])  # BSND, [S, 1, D]
        hidden_states = _flux.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
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
        query = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        cos, sin = (t.unflatten(-1, (attn.heads, -1)) for t in image_rotary_emb)
        query, key = self._rome(query, key, cos, sin)
        hidden_states = _ltx.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](hidden_states))


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

# family -> (module of its default processor, that processor's class name, its rome subclass,
#            the class of the rotary module's float64 forward or None)
_FAMILIES = {
    "WanTransformer3DModel": (
        "diffusers.models.transformers.transformer_wan", "WanAttnProcessor", RomeWanAttnProcessor, None,
    ),
    "HunyuanVideoTransformer3DModel": (
        "diffusers.models.transformers.transformer_hunyuan_video", "HunyuanVideoAttnProcessor2_0",
        RomeHunyuanVideoAttnProcessor, _HunyuanRopeForward,
    ),
    "CogVideoXTransformer3DModel": (
        "diffusers.models.attention_processor", "CogVideoXAttnProcessor2_0", RomeCogVideoXAttnProcessor, None,
    ),
    "FluxTransformer2DModel": (
        "diffusers.models.transformers.transformer_flux", "FluxAttnProcessor", RomeFluxAttnProcessor, None,
    ),
    "LTXVideoTransformer3DModel": (
        "diffusers.models.transformers.transformer_ltx", "LTXVideoAttnProcessor", RomeLTXVideoAttnProcessor,
        _LTXRopeForward,
    ),
}
# the library functions each rome processor calls (checked at patch time)
_HELPERS = {
    "WanTransformer3DModel": ("_get_qkv_projections", "dispatch_attention_fn"),
    "HunyuanVideoTransformer3DModel": ("dispatch_attention_fn",),
    "FluxTransformer2DModel": ("_get_qkv_projections", "dispatch_attention_fn"),
    "LTXVideoTransformer3DModel": ("dispatch_attention_fn",),
}


def _family(model) -> str | None:
    import diffusers

    for name in SUPPORTED:
        cls = getattr(diffusers, name, None)
        if cls is not None and isinstance(model, cls):
            return name
    return None


def _attention_layers(model, family: str) -> list[tuple[str, object]]:
    """``(name, attention module)`` of every layer that applies RoPE."""
    if family == "WanTransformer3DModel":
        return [(f"blocks.{i}.attn1", b.attn1) for i, b in enumerate(model.blocks)]
    if family == "CogVideoXTransformer3DModel":
        return [(f"transformer_blocks.{i}.attn1", b.attn1) for i, b in enumerate(model.transformer_blocks)]
    if family == "LTXVideoTransformer3DModel":
        return [(f"transformer_blocks.{i}.attn1", b.attn1) for i, b in enumerate(model.transformer_blocks)]
    return [
        (f"{group}.{i}.attn", b.attn)
        for group in ("transformer_blocks", "single_transformer_blocks")
        for i, b in enumerate(getattr(model, group))
    ]


def _check_config(model, family: str) -> None:
    """ValueError for a RoPE configuration rome (or this patch) cannot express."""
    name = type(model).__name__
    if family == "HunyuanVideoTransformer3DModel":
        dims = list(model.rope.rope_dim)
        head_dim = model.config.attention_head_dim
        if sum(dims) != head_dim or any(d <= 0 or d % 2 for d in dims):
            raise ValueError(
                f"{name}: rope_axes_dim={dims} must be positive even sizes summing to "
                f"attention_head_dim={head_dim} for rome's per-axis interleave layout"
            )
    if family == "FluxTransformer2DModel":
        dims = list(model.pos_embed.axes_dim)
        head_dim = model.config.attention_head_dim
        if sum(dims) != head_dim or any(d <= 0 or d % 2 for d in dims):
            raise ValueError(
                f"{name}: axes_dims_rope={dims} must be positive even sizes summing to "
                f"attention_head_dim={head_dim} for rome's per-axis interleave layout"
            )
    if family == "CogVideoXTransformer3DModel" and not model.config.use_rotary_positional_embeddings:
        raise ValueError(
            f"{name}: use_rotary_positional_embeddings=False (learned or sincos positional "
            f"embeddings, no RoPE): nothing for rome to patch"
        )
    if family == "LTXVideoTransformer3DModel":
        rope = model.rope
        if rope.dim < 6:
            raise ValueError(f"{name}: inner dim {rope.dim} < 6 gives no RoPE frequency per axis")


def patch(model, *, backend: Backend = "auto") -> Patch | None:
    """Patch a diffusers transformer of ``SUPPORTED`` in place (this instance only) to rotate q
    and k with one rome launch per attention layer; None for another diffusers model.

    Raises ValueError for a model patched already, a RoPE configuration rome cannot express, or a
    RoPE attention layer whose processor is not the model's default (naming the layer and class).
    """
    family = _family(model)
    if family is None:
        return None
    name = type(model).__name__
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    module_name, proc_name, rome_cls, make_rope_forward = _FAMILIES[family]
    module = importlib.import_module(module_name)
    missing = [a for a in (proc_name, *_HELPERS.get(family, ())) if not hasattr(module, a)]
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
    _check_config(model, family)
    layers = _attention_layers(model, family)
    if getattr(getattr(model, "rope", None), "__dict__", {}).get("forward") is not None:
        if getattr(model.rope.__dict__["forward"], "_rome", False):
            raise ValueError(f"{name} is already patched by rome (rope); undo that patch first")
    for path, attn in layers:
        proc = attn.processor
        if isinstance(proc, rome_cls):
            raise ValueError(f"{name} is already patched by rome ({path}); undo that patch first")
        if type(proc) is not base:
            raise ValueError(
                f"{name}: {path} has processor {type(proc).__name__}; rome patches only "
                f"{proc_name} (the model's default)"
            )
    handle = Patch(model, family)
    rotate = _Rotate(backend)
    for _, attn in layers:
        proc = attn.processor
        new = rome_cls.__new__(rome_cls)
        new.__dict__.update(proc.__dict__)  # attention backend, parallel config
        new._rome = rotate
        handle.setattr(attn, "processor", new)
    if make_rope_forward is not None:
        forward = make_rope_forward(model.rope)
        handle.setattr(model.rope, "forward", forward)
    return handle
