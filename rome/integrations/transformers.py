"""rome for transformers models: the Llama family (Llama, Mistral, Mixtral, Qwen2/3 and their
MoE, Gemma 2/3, Phi-3/4, GLM-4.5), GPT-NeoX, Qwen2-VL / Qwen2.5-VL / Qwen3-VL / Qwen3.5 (mRoPE
and the vision towers), DeepSeek-V3 and GLM-4.7-Flash (MLA), Llama 4 (complex rotary), GPT-OSS
and GLM / GLM-4 (adjacent pairs); docs/families.md lists them, and those refused and why.

    handle = rome.integrations.patch(model)     # this model's RoPE now runs on rome
    handle.undo()                               # back to transformers' own, attribute for attribute

transformers computes RoPE in two places: the model's rotary module turns ``position_ids`` into
``(cos, sin)`` once per forward, and each attention layer calls its modeling file's
``apply_rotary_pos_emb(q, k, cos, sin)`` (Qwen2-VL's vision tower: ``apply_rotary_pos_emb_vision``).
The patch replaces both **on the model's own instances**, nothing process-wide:

- **rotary module**: ``forward(x, position_ids)`` returns rome's tables, ``[..., S, D]`` float32
  (float64 for a float64 model) whatever the model's dtype, from float64 angles rounded once
  (``rome.RoPE.from_hf_config`` of the module's own config: every ``rope_type``, partial rotary,
  mRoPE, the vision tower's axial RoPE); pass-through columns get ``cos = 1, sin = 0``.
- **attention layers**: ``forward`` is a new function object on the class's own code object,
  with a globals dict in which the rotary function is rome's ``apply_qk(q, k, cos, sin, M)``:
  one launch for q and k per layer, same signature, KV caching and attention backend, no copied
  source. That dict is a snapshot of the modeling module's globals at patch time.

Models of other families, other models in the process, and transformers' module functions are
untouched. ``handle.undo()`` deletes the instance attributes again, so ``layer.forward`` is
the class's once more. Length-dependent ``rope_type``s (``dynamic``, ``longrope``) get the
frequencies of each call's length, as a fresh transformers module does (transformers' module
also keeps the longest length it has seen; the two agree for prefill then decode).
``torch.compile`` traces the patched layers (``torch.ops.rome.apply_qk``) and rotary module
(float64 angles in the graph) with ``fullgraph=True``; length-dependent types run eagerly.

Families whose tables or rotation differ from Llama's (``_Family``): Gemma 3's one rotary module
gives each layer type its own tables (local and global bases: one rome RoPE per layer type);
GPT-OSS's tables hold one column per frequency (``[..., D/2]``); GLM's are Llama's and its
``apply_rotary_pos_emb`` repeat-interleaves them to turn adjacent pairs (rome's interleave), so
the patched module returns them in that same format; Llama 4's are complex (``freqs_cis``, pairs
of adjacent columns); DeepSeek-V3's MLA with ``rope_interleave`` turns adjacent pairs and writes
the result de-interleaved: rome turns the same pairs in place, a column permutation of q and k
alike that the attention scores do not see (the KV cache then holds rome's order: a cache is
not shared between the patched and the unpatched model). A patched layer handed transformers'
own tables reads them as the modeling file does.

At patch time rome's frequencies are checked against the rotary module's own ``inv_freq`` and
``attention_scaling`` (per layer type for Gemma 3); a configuration rome reads differently raises
ValueError, naming the class, rather than patching in a different RoPE. The GLM-4V family is
refused (``_REFUSED``, ValueError with the reason). GPT-J is not patched: its rotary is inlined in
its attention's forward (tables gathered from a per-layer buffer, q and k rotated by two calls
on slices), so only a copy of that forward would give one rome launch on rome's tables.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..checks import check_rounding
from ..layouts import cos_sin_cache, cos_sin_for_positions, tables_for_positions
from ..module import RoPE
from ..ops import BACKENDS, apply_qk
from ..qknorm import QKNorm, apply_qk_norm
from ..types import Backend, Rounding
from . import Patch
from ._code import calls, innermost, rebound

__all__ = ["SUPPORTED", "patch"]


@dataclass(frozen=True)
class _Family:
    """A rotary module class of ``transformers.models.<module>`` and the attention classes
    that rotate q and k with its tables by calling that modeling file's ``function``."""

    module: str
    rotary: str
    attention: tuple[str, ...]
    function: str = "apply_rotary_pos_emb"
    # text: tables [B, S, D], q [B, N, S, D]; vision: [T, D], q [T, N, D]; complex: Llama 4's
    # freqs_cis [B, S, D/2] (complex), q [B, S, N, D], apply_rotary_emb(q, k, freqs_cis)
    kind: str = "text"
    # transformers' own tables as the modeling file reads them (a patched layer reads them the
    # same way; see _to_rome): "half" cat(f, f) over the rotated width, "freqs" [..., D/2] one
    # column per frequency (GPT-OSS), "pairs" cat(f, f) of which the file repeat-interleaves the
    # first half to rotate adjacent pairs (GLM, DeepSeek's rope_interleave), "complex" (Llama 4),
    # "narrow" rome's tables cut to the rotated width, as transformers' module returns them
    tables: str = "half"
    mode: str | None = None  # the rotation, where from_hf_config cannot read it (Llama 4)
    # MLA (DeepSeek-V3, GLM-4.7-Flash): the function the layer calls when config.rope_interleave
    interleave_function: str | None = None

    def plan(self, config) -> tuple[str, str, str | None]:
        """``(function the layers call, table convention, rome mode)`` for a model's config."""
        if self.interleave_function is not None and getattr(config, "rope_interleave", False):
            return self.interleave_function, "pairs", "interleave"
        return self.function, self.tables, self.mode


def _text(module: str, prefix: str, **kw) -> _Family:
    return _Family(module, f"{prefix}RotaryEmbedding", (f"{prefix}Attention",), **kw)


def _vision(module: str, prefix: str, attention: str | None = None) -> _Family:
    return _Family(module, f"{prefix}VisionRotaryEmbedding", (attention or f"{prefix}VisionAttention",),
                   "apply_rotary_pos_emb_vision", "vision")


_FAMILIES = {
    "llama": (_Family("llama", "LlamaRotaryEmbedding", ("LlamaAttention",)),),
    "mistral": (_Family("mistral", "MistralRotaryEmbedding", ("MistralAttention",)),),
    "qwen2": (_Family("qwen2", "Qwen2RotaryEmbedding", ("Qwen2Attention",)),),
    "qwen3": (_Family("qwen3", "Qwen3RotaryEmbedding", ("Qwen3Attention",)),),
    "gpt_neox": (_Family("gpt_neox", "GPTNeoXRotaryEmbedding", ("GPTNeoXAttention",)),),
    "qwen2_vl": (
        _Family("qwen2_vl", "Qwen2VLRotaryEmbedding", ("Qwen2VLAttention",)),
        _Family("qwen2_vl", "Qwen2VLVisionRotaryEmbedding", ("VisionAttention",),
                "apply_rotary_pos_emb_vision", "vision"),
    ),
    "qwen2_5_vl": (
        _Family("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding", ("Qwen2_5_VLAttention",)),
        _Family("qwen2_5_vl", "Qwen2_5_VLVisionRotaryEmbedding", ("Qwen2_5_VLVisionAttention",),
                "apply_rotary_pos_emb_vision", "vision"),
    ),
    "qwen2_moe": (_text("qwen2_moe", "Qwen2Moe"),),
    "qwen3_moe": (_text("qwen3_moe", "Qwen3Moe"),),
    "mixtral": (_text("mixtral", "Mixtral"),),
    "gemma2": (_text("gemma2", "Gemma2"),),
    "gemma3": (_text("gemma3", "Gemma3"),),  # one rotary module, tables per layer type
    "phi3": (_text("phi3", "Phi3"),),
    # interleaved mRoPE (text) and the 2D axial vision tower
    "qwen3_vl": (_Family("qwen3_vl", "Qwen3VLTextRotaryEmbedding", ("Qwen3VLTextAttention",)),
                 _vision("qwen3_vl", "Qwen3VL")),
    "qwen3_vl_moe": (_Family("qwen3_vl_moe", "Qwen3VLMoeTextRotaryEmbedding",
                             ("Qwen3VLMoeTextAttention",)),
                     _vision("qwen3_vl_moe", "Qwen3VLMoe")),
    "qwen3_5": (_Family("qwen3_5", "Qwen3_5TextRotaryEmbedding", ("Qwen3_5Attention",)),
                _vision("qwen3_5", "Qwen3_5")),
    "qwen3_5_moe": (_Family("qwen3_5_moe", "Qwen3_5MoeTextRotaryEmbedding", ("Qwen3_5MoeAttention",)),
                    _vision("qwen3_5_moe", "Qwen3_5Moe")),
    "deepseek_v3": (_text("deepseek_v3", "DeepseekV3",
                          interleave_function="apply_rotary_pos_emb_interleave"),),
    "llama4": (_Family("llama4", "Llama4TextRotaryEmbedding", ("Llama4TextAttention",),
                       "apply_rotary_emb", "complex", "complex", "interleave"),),
    "gpt_oss": (_text("gpt_oss", "GptOss", tables="freqs"),),
    "glm": (_text("glm", "Glm", tables="pairs"),),
    "glm4": (_text("glm4", "Glm4", tables="pairs"),),
    "glm4_moe": (_text("glm4_moe", "Glm4Moe"),),
    "glm4_moe_lite": (_text("glm4_moe_lite", "Glm4MoeLite",
                            interleave_function="apply_rotary_pos_emb_interleave"),),
}

# model types refused with the reason (ValueError), rather than "not supported"
_GLM_V = (
    "its text mRoPE gives (t, h, w) sections of the frequencies to adjacent column pairs "
    "(rotate_half_llm); rome's mRoPE layouts (rome.layouts.mrope_layout: Qwen2-VL, Qwen3-VL) "
    "rotate halves, and from_hf_config has no layout for this model type"
)
_REFUSED = {"glm4v": _GLM_V, "glm4v_moe": _GLM_V, "glm46v": _GLM_V}

_CAUSAL, _VL = ("Model", "ForCausalLM"), ("Model", "TextModel", "ForConditionalGeneration")
_CLASSES = {
    "llama": ("Llama", _CAUSAL), "mistral": ("Mistral", _CAUSAL), "qwen2": ("Qwen2", _CAUSAL),
    "qwen3": ("Qwen3", _CAUSAL), "gpt_neox": ("GPTNeoX", _CAUSAL), "qwen2_vl": ("Qwen2VL", _VL),
    "qwen2_5_vl": ("Qwen2_5_VL", _VL), "qwen2_moe": ("Qwen2Moe", _CAUSAL),
    "qwen3_moe": ("Qwen3Moe", _CAUSAL), "mixtral": ("Mixtral", _CAUSAL),
    "gemma2": ("Gemma2", _CAUSAL), "gemma3": ("Gemma3", (*_VL, "ForCausalLM")),
    "phi3": ("Phi3", _CAUSAL), "qwen3_vl": ("Qwen3VL", _VL), "qwen3_vl_moe": ("Qwen3VLMoe", _VL),
    "qwen3_5": ("Qwen3_5", (*_VL, "ForCausalLM")), "qwen3_5_moe": ("Qwen3_5Moe", (*_VL, "ForCausalLM")),
    "deepseek_v3": ("DeepseekV3", _CAUSAL), "llama4": ("Llama4", ("TextModel", "ForCausalLM")),
    "gpt_oss": ("GptOss", _CAUSAL), "glm": ("Glm", _CAUSAL), "glm4": ("Glm4", _CAUSAL),
    "glm4_moe": ("Glm4Moe", _CAUSAL), "glm4_moe_lite": ("Glm4MoeLite", _CAUSAL),
}
# the families' usual model classes; any model built of a family's rotary and attention
# modules (a ...ForSequenceClassification, a bare text or vision model) is patched the same way
SUPPORTED = tuple(
    f"{prefix}{suffix}" for t in _FAMILIES for prefix, suffixes in (_CLASSES[t],) for suffix in suffixes
) + ("Qwen2VisionTransformerPretrainedModel", "Qwen2_5_VisionTransformerPretrainedModel")

# rotary and attention instances currently patched -> the patched model's class name
_PATCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _classes(family: _Family):
    """``(rotary class, attention classes)``, or None where this transformers lacks them."""
    try:
        mod = importlib.import_module(
            f"transformers.models.{family.module}.modeling_{family.module}"
        )
    except ImportError:
        return None
    rotary = getattr(mod, family.rotary, None)
    attention = tuple(c for c in (getattr(mod, n, None) for n in family.attention) if c is not None)
    if rotary is None or not attention:
        return None
    return rotary, attention


# --- tables ----------------------------------------------------------------------------------


class _Tables:
    """Per-token ``(cos, sin)`` of one ``rome.RoPE``: rows of a ``cos_sin_cache`` (grown to the
    next power of two above the largest position, one per device and dtype, never past the
    RoPE's ``cache_limit``: what the model's config allows) gathered at the positions; float64
    angles per call (bitwise the same tables) for length-dependent layouts, fractional
    positions, positions past ``cache_limit`` (transformers computes those too: no error, and
    no cache grown for them; the tables are made once per forward, not per layer) and inside
    ``torch.compile``, where the positions' values are not known on the host (so no cache
    range to check)."""

    def __init__(self, rope: RoPE):
        self.rope = rope
        self.caches: dict[tuple[torch.device, torch.dtype], tuple[Tensor, Tensor]] = {}

    def __getstate__(self):
        return {"rope": self.rope, "caches": {}}  # the caches are rebuilt on first use

    def __call__(self, positions: Tensor, axes_dim, device, dtype) -> tuple[Tensor, Tensor]:
        rope, layout = self.rope, self.rope.layout
        positions = positions.to(device)
        if torch.compiler.is_compiling():
            if rope.dynamic is not None:
                raise NotImplementedError(
                    "rome's RoPE with length-dependent frequencies (dynamic NTK, longrope) picks "
                    "them from the positions' values on the host: run the rotary module eagerly"
                )
        elif not positions.is_floating_point() and positions.numel():
            low, top = (int(v) for v in torch.stack(torch.aminmax(positions)).tolist())  # (one host read)
            top += 1
            if rope.dynamic is not None:
                layout = rope.dynamic(top)
            elif 0 <= low and top <= rope.cache_limit:  # else float64 angles of this call (below): past
                # the cache, or negative (transformers rotates by -1 where a left-padded batch's
                # position_ids are cumsum(mask) - 1 unfilled; the cache has no such row)
                key = (positions.device, dtype)
                cache = self.caches.get(key)
                if cache is None or cache[0].shape[0] < top:
                    rows = max(top, min(max(16, 1 << (top - 1).bit_length()), rope.cache_limit))
                    cache = cos_sin_cache(layout, rows, dtype=dtype, device=device)
                    self.caches[key] = cache
                return tables_for_positions(layout, cache, positions, axes_dim=axes_dim)
        return cos_sin_for_positions(layout, positions, axes_dim=axes_dim, dtype=dtype)


def _table_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _rotary_width(layout) -> int:
    """The rotated columns' count r: they are the first r of the head (partial rotary)."""
    rotated = [d for mode, d in layout.blocks if mode != "none"]
    if any(mode == "none" for mode, _ in layout.blocks[: len(rotated)]):
        raise ValueError(f"rome's layout {layout.blocks} does not rotate the first columns")
    return sum(rotated)


class _RotaryForward:
    """The rotary module's ``forward(x, position_ids[, layer_type]) -> (cos, sin)`` on rome's
    tables (a class, not a closure, so that it pickles). ``tables``: one ``_Tables``, or one per
    layer type (Gemma 3's local and global bases). The result is rome's ``[..., D]`` tables,
    except for the ``tables`` conventions a patched layer reads from transformers' format
    (``_from_rome``: "pairs", "complex")."""

    def __init__(self, tables, kind: str, n_axes: int, convention: str = "half", width: int = 0):
        self.tables, self.kind, self.n_axes = tables, kind, n_axes
        self.convention, self.width = convention, width

    @torch.no_grad()
    def __call__(self, module, x, position_ids, layer_type=None):
        tables = self.tables
        if isinstance(tables, dict):
            if layer_type not in tables:
                raise ValueError(
                    f"{type(module).__name__}: layer_type must be one of {sorted(tables)}, "
                    f"got {layer_type!r}"
                )
            tables = tables[layer_type]
        if self.kind == "vision":  # [T, A] (h, w) per patch -> [T, D]
            return tables(position_ids, -1, x.device, _table_dtype(x))
        if self.n_axes > 1:  # mRoPE: [B, S] (text only) or [A, B, S] -> [B, S, D]
            pos = position_ids.expand(self.n_axes, -1, -1) if position_ids.ndim == 2 else position_ids
            return tables(pos, 0, x.device, _table_dtype(x))
        cos, sin = tables(position_ids, None, x.device, _table_dtype(x))  # [B, S] -> [B, S, D]
        return _from_rome(cos, sin, self.convention, self.width)


def _from_rome(cos: Tensor, sin: Tensor, convention: str, r: int):
    """rome's interleave-layout tables (columns 2i, 2i+1 turn by frequency i) in the format the
    modeling file's own rotary module returns: "pairs" ``cat(f, f)`` over the r rotated columns,
    "complex" ``cos + i sin`` per frequency; the others as they are."""
    if convention == "pairs":
        c, s = cos[..., 0:r:2], sin[..., 0:r:2]
        return torch.cat([c, c], -1), torch.cat([s, s], -1)
    if convention == "complex":
        return torch.complex(cos[..., 0:r:2], sin[..., 0:r:2])
    if convention == "narrow":  # the r rotated columns only, as transformers' own module returns them
        return cos[..., :r], sin[..., :r]
    return cos, sin


# --- q and k ---------------------------------------------------------------------------------


def _full_width(cos: Tensor, sin: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """Tables of the first ``r < d`` columns (transformers' own, partial rotary) padded to d
    with the pass-through values ``cos = 1, sin = 0``."""
    r = cos.shape[-1]
    if r == d:
        return cos, sin
    pad = (*cos.shape[:-1], d - r)
    return (torch.cat([cos, cos.new_ones(pad)], -1), torch.cat([sin, sin.new_zeros(pad)], -1))


def _to_rome(cos: Tensor, sin: Tensor, d: int, convention: str) -> tuple[Tensor, Tensor]:
    """Tables a patched layer was handed, in rome's ``[..., d]`` layout: the patched rotary
    module's, or transformers' own, read as the modeling file reads them (``_Family.tables``)."""
    if convention == "pairs":  # cat(f, f) of the rotated width: the file repeat-interleaves f
        r = cos.shape[-1] // 2
        cos = cos[..., :r].repeat_interleave(2, -1)
        sin = sin[..., :r].repeat_interleave(2, -1)
    elif convention == "freqs" and 2 * cos.shape[-1] == d:  # GPT-OSS: one column per frequency
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return _full_width(cos, sin, d)


class _RotateText:
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` as one ``rome.apply_qk``.

    ``native`` (``patch(..., rounding="native")``): None (rome's exact rounding), or how the
    modeling file's function rounds, as ``_native_rule`` found it: ``"x"`` (its ops in the
    promoted dtype of q and the tables, result in that dtype: Llama's ``q * cos + rotate_half(q) *
    sin``) or ``"float"`` (q, k and the tables cast to float32 first, the result cast back to q's
    dtype: Qwen2-VL's vision function, Cohere's); rome then computes with ``rounding="native"`` in
    that dtype, bit for bit the function's result."""

    native: str | None = None

    def __init__(self, rope: RoPE, backend: str, convention: str = "half"):
        self.rope, self.backend, self.convention = rope, backend, convention

    def __getstate__(self):  # not the rebound forwards
        return {"rope": self.rope, "backend": self.backend, "convention": self.convention,
                "native": self.native}

    def __call__(self, q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = _to_rome(cos, sin, q.shape[-1], self.convention)
        return self._apply(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))

    def _apply(self, q, k, cos, sin):
        """``rome.apply_qk`` of the tables as given (broadcasting to q and k), rounded as
        ``native`` says."""
        rule, out_dtype = self.native, None
        if rule is not None:
            compute = torch.promote_types(q.dtype if rule == "x" else torch.float32, cos.dtype)
            out_dtype = compute if rule == "x" else q.dtype
            q, k, cos, sin = (t.to(compute) for t in (q, k, cos, sin))
        m = self.rope.matrix(q.dtype, q.device)
        if q.shape[-1] < m.shape[-1]:  # a forward that slices q to the rotated columns itself
            m = m[: q.shape[-1], : q.shape[-1]].contiguous()  # (they come first: _rotary_width)
        q, k = apply_qk(q, k, cos, sin, m, backend=self.backend,
                        rounding="exact" if rule is None else "native")
        if out_dtype is not None:
            q, k = q.to(out_dtype), k.to(out_dtype)
        return q, k


class _RotateNormed(_RotateText):
    """``apply_rotary_pos_emb`` of one attention layer whose q/k norms are fused into it: the
    layer's ``q_norm``/``k_norm`` modules pass their input through (``_PassThrough``) and this
    call runs ``rome.apply_qk_norm`` with their weights and eps (one launch where fused)."""

    def __init__(self, rope: RoPE, backend: str, convention: str, layer: nn.Module, over: str, offset: float):
        super().__init__(rope, backend, convention)
        self.layer, self.over, self.offset = layer, over, offset

    def __getstate__(self):
        return super().__getstate__() | {"layer": self.layer, "over": self.over, "offset": self.offset}

    def __call__(self, q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = _to_rome(cos, sin, q.shape[-1], self.convention)
        m = self.rope.matrix(q.dtype, q.device)
        spec = QKNorm.from_modules(self.layer.q_norm, self.layer.k_norm, over=self.over, weight_offset=self.offset)
        return apply_qk_norm(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim), m, spec.q_weight,
                             spec.k_weight, backend=self.backend, **spec.kwargs())


class _PassThrough:
    """A fused norm module's ``forward`` while patched: its input as it is (the layer's rotation
    normalises). Pickles as itself; the module keeps its parameters (state_dict unchanged)."""

    def __call__(self, x):
        return x

    def __reduce__(self):
        return (_PassThrough, ())


# attention classes whose q/k norms the patch fuses into the rotation: (over, weight offset), the
# norm right before RoPE with only reshapes between (read from transformers 5.24's modeling files)
_FUSED_NORMS = {
    "Qwen3Attention": ("head", 0.0), "Qwen3MoeAttention": ("head", 0.0),
    "Gemma3Attention": ("head", 1.0),  # Gemma3RMSNorm: x̂ * (1 + w)
    "Olmo2Attention": ("heads", 0.0),  # Olmo2RMSNorm over all heads, before the view to heads
}


def _fused_norms(layer: nn.Module, rope: RoPE) -> tuple[str, float] | None:
    """(over, offset) where rome fuses this layer's q/k norms: a class of ``_FUSED_NORMS``, every
    column rotated, and norm modules that compute ``x / sqrt(mean(x²) + eps) * (w + offset)`` on
    a probe (their formula checked, not assumed from the name); else None (the norms run)."""
    how = _FUSED_NORMS.get(type(layer).__name__)
    if how is None or _rotary_width(rope.layout) != rope.layout.head_dim:
        return None
    over, offset = how
    try:
        spec = QKNorm.from_modules(layer.q_norm, layer.k_norm, over=over, weight_offset=offset)
    except (AttributeError, TypeError, ValueError):
        return None
    for norm, w in ((layer.q_norm, spec.q_weight), (layer.k_norm, spec.k_weight)):
        if w is None or w.ndim != 1 or w.device.type == "meta":
            return None
        x = torch.randn(3, w.shape[0], generator=torch.Generator().manual_seed(0)).to(w.device)
        with torch.no_grad():
            want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + spec.eps) * (w.float() + offset)
            got = norm(x).float()
        if not torch.allclose(got, want, rtol=2e-2, atol=2e-2):
            return None
    return how


class _RotatePairs(_RotateText):
    """``apply_rotary_pos_emb_interleave(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)``
    (DeepSeek-V3's MLA with ``rope_interleave``): transformers rotates the adjacent pairs and
    writes the result de-interleaved (the pairs' first members, then their second members);
    rome rotates the same pairs in place. The two differ by one column permutation of q and k
    alike, which q·k (the attention scores) does not see; the KV cache holds rome's order."""

    def __call__(self, q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
        return super().__call__(q, k, cos, sin, unsqueeze_dim)


class _RotateComplex(_RotateText):
    """Llama 4's ``apply_rotary_emb(xq, xk, freqs_cis)``: q and k ``[B, S, N, D]``, freqs_cis
    ``[B, S, D/2]`` complex; ``view_as_complex`` pairs adjacent columns (rome's interleave)."""

    def __call__(self, xq, xk, freqs_cis):
        cos = freqs_cis.real.repeat_interleave(2, -1)
        sin = freqs_cis.imag.repeat_interleave(2, -1)
        return super().__call__(xq, xk, cos, sin, 2)


class _RotateVision(_RotateText):
    """``apply_rotary_pos_emb_vision(q, k, cos, sin)``, q and k ``[T, N, D]``, tables ``[T, D]``."""

    def __call__(self, q, k, cos, sin):
        return self._apply(q, k, cos.unsqueeze(-2), sin.unsqueeze(-2))


class _Forward:
    """A patched instance's ``forward``: ``function(module, *args, **kwargs)``. It pickles (and
    deep-copies) as the recipe it was made from, so an unpickled model runs rome again and counts
    as patched (``patch`` refuses it; it has no handle to undo). ``how``: ``(_RotaryForward,)``,
    or ``(attention class, function name, _RotateText)``: the class's own forward with that
    global bound to rome's rotation (``_code.rebound``, through the forward's decorators; one
    function per class and rotation)."""

    def __init__(self, module: nn.Module, how: tuple, owner: str):
        self.module, self.how, self.owner = module, how, owner
        if len(how) == 1:
            self.function = how[0]
        else:
            cls, name, rotate = how
            functions = rotate.__dict__.setdefault("_functions", {})
            if cls not in functions:
                functions[cls] = rebound(cls.forward, name, rotate)
            self.function = functions[cls]
        _PATCHED[module] = owner  # not the handle: it would keep the model alive

    def __call__(self, *args, **kwargs):
        return self.function(self.module, *args, **kwargs)

    @property
    def __func__(self):  # as a bound method's (code that inspects forward.__func__)
        return self.function

    @property
    def __self__(self):
        return self.module

    def __reduce__(self):
        return (_Forward, (self.module, self.how, self.owner))


# --- building the RoPE of a rotary module ----------------------------------------------------


def _pair_frequencies(layout) -> Tensor:
    """float64: the frequency of each rotated pair, in the order of the blocks' pairs (a half
    block's first half, an interleave block's even columns), as a rotary module's ``inv_freq``."""
    parts, offset = [], 0
    for mode, d in layout.blocks:
        cols = layout.inv_freq[offset: offset + d]
        if mode == "half":
            parts.append(cols[: d // 2])
        elif mode == "interleave":
            parts.append(cols[0::2])
        offset += d
    return torch.cat(parts) if parts else layout.inv_freq[:0]


def _rope_of(rotary: nn.Module, family: _Family, mode, backend: str, layer_type=None) -> RoPE:
    """rome's RoPE for a rotary module's config (of ``layer_type``: Gemma 3), checked against
    the module's frequencies and attention scaling."""
    name = type(rotary).__name__
    config = getattr(rotary, "config", None)
    if config is None:
        raise ValueError(f"{name} has no config to read its RoPE from")
    if getattr(config, "rope_interleave", False) and mode == "interleave":
        # MLA's interleaved pairs (_RotatePairs): rome rotates them in x's column order
        config = copy.copy(config)
        config.rope_interleave = False
    try:
        rope = RoPE.from_hf_config(config, backend=backend, layer_type=layer_type, mode=mode)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(
            f"rome cannot express the RoPE of {name} ({type(config).__name__}): {e}"
        ) from e
    layout = rope.layout
    if family.kind == "vision" and (layout.n_axes != 2 or layout.blocks != (("half", layout.head_dim),)):
        raise ValueError(f"{name}: expected an axial 2D layout, rome read {layout!r}")
    prefix = "" if layer_type is None else f"{layer_type}_"
    ref = getattr(rotary, f"{prefix}original_inv_freq", getattr(rotary, f"{prefix}inv_freq", None))
    if isinstance(ref, Tensor) and ref.device.type != "meta":
        rtol = max(1e-5, torch.finfo(ref.dtype).eps)  # a model cast to bf16 has bf16 buffers
        ref = ref.detach().double().cpu()
        got = _pair_frequencies(layout)[: ref.numel()]
        ok = ref.ndim == 1 and got.numel() == ref.numel() and torch.allclose(got, ref, rtol=rtol)
        scale = float(getattr(rotary, f"{prefix}attention_scaling", 1.0) or 1.0)
        if not ok or abs(layout.attention_scaling - scale) > 1e-6 * scale:
            where = "" if layer_type is None else f" for layer type {layer_type!r}"
            raise ValueError(
                f"rome reads the RoPE of {name} ({type(config).__name__}){where} differently from "
                f"the module: inv_freq {got.tolist()} vs the module's {ref.tolist()}, attention "
                f"scaling {layout.attention_scaling} vs {scale}; not patched"
            )
    return rope


def _layer_types(rotary: nn.Module) -> list | None:
    """The layer types of a rotary module with tables per layer type (Gemma 3's
    ``forward(x, position_ids, layer_type)``), else None."""
    if "layer_type" not in inspect.signature(type(rotary).forward).parameters:
        return None
    rope_type = getattr(rotary, "rope_type", None)
    return sorted(rope_type) if isinstance(rope_type, dict) else list(rotary.layer_types)


# --- patch -----------------------------------------------------------------------------------


def _table_convention(fn) -> str | None:
    """How ``fn(q, k, cos, sin)`` (``unsqueeze_dim=1``) reads its tables, where it rotates as one
    of rome's modes: "half" when it takes rome's own layout for its rotation (Llama's halves on
    ``cat(f, f)``; Cohere's adjacent pairs on ``f`` repeat-interleaved), "pairs" when it rotates
    adjacent pairs on ``cat(f, f)`` tables it repeat-interleaves itself (GLM, Ernie 4.5, Helium);
    None otherwise. Probed on float64 values against rome's torch backend, so a modeling file's own
    copy (OLMo 2's casts, a renamed helper) counts by what it does, not by its code; the mode
    itself is the config's (``RoPE.from_hf_config``). 1e-5: a file that computes in float32
    (Cohere's casts) is off by ~1e-7; another rotation by O(1)."""
    from ..matrices import rotation_matrix

    gen = torch.Generator().manual_seed(0)
    with torch.device("cpu"), torch.no_grad():
        q = torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64)
        k = torch.randn(1, 1, 5, 8, generator=gen, dtype=torch.float64)
        f = torch.rand(1, 5, 4, generator=gen, dtype=torch.float64) * 6
        cat, pairs = torch.cat([f, f], -1), f.repeat_interleave(2, -1)
        # (convention, mode, the tables fn is given, the angles rome rotates by)
        for convention, mode, given, angles in (("half", "half", cat, cat), ("half", "interleave", pairs, pairs),
                                                ("pairs", "interleave", cat, pairs)):
            try:
                theirs = fn(q, k, given.cos(), given.sin())[:2]
            except Exception:  # noqa: BLE001 - another signature: not such a function
                return None
            m = rotation_matrix((8,), mode, dtype=torch.float64)
            ours = apply_qk(q, k, angles.cos()[:, None], angles.sin()[:, None], m, backend="torch")
            if all(isinstance(t, Tensor) and t.shape == o.shape
                   and torch.allclose(t.double(), o, rtol=0, atol=1e-5) for t, o in zip(theirs, ours)):
                return convention
    return None


def _native_rule(fn, rotate: _RotateText, kind: str) -> str | None:
    """How the modeling file's ``fn(q, k, cos, sin)`` rounds (``_RotateText.native``): the first
    of ``"x"`` and ``"float"`` under which ``rotate`` (on the torch backend, whose native bits are
    the kernel's) gives its results bit for bit, dtype included, on bf16 q and k with bf16 and
    float32 tables in the format the file reads (``rotate.convention``); None where neither does.
    Probed on values rather than read from the code, as ``_table_convention`` does."""
    layout = rotate.rope.layout
    d, r = layout.head_dim, _rotary_width(layout)
    gen = torch.Generator().manual_seed(0)
    with torch.device("cpu"), torch.no_grad():
        width = r if rotate.convention == "narrow" else d  # (a "narrow" forward slices q to r itself)
        if kind == "vision":
            q = torch.randn(16, 2, width, generator=gen).bfloat16()
            k = torch.randn(16, 2, width, generator=gen).bfloat16()
            f = torch.rand(16, r // 2, generator=gen, dtype=torch.float64) * 6
        else:
            q = torch.randn(1, 2, 16, width, generator=gen).bfloat16()
            k = torch.randn(1, 1, 16, width, generator=gen).bfloat16()
            f = torch.rand(1, 16, r // 2, generator=gen, dtype=torch.float64) * 6
        angles = f if rotate.convention == "freqs" else torch.cat([f, f], -1)
        probe = copy.copy(rotate)
        probe.backend = "torch"
        for rule in ("x", "float"):
            probe.native = rule
            ok = True
            for dtype in (torch.bfloat16, torch.float32):
                cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
                try:
                    theirs = fn(q, k, cos, sin)[:2]
                    ours = probe(q, k, cos, sin)
                except Exception:  # noqa: BLE001 - a call rome's rotation cannot mirror
                    return None
                if not all(isinstance(t, Tensor) and t.dtype == o.dtype and t.shape == o.shape
                           and torch.equal(t, o) for t, o in zip(theirs, ours)):
                    ok = False
                    break
            if ok:
                return rule
    return None


def _discovered(model: nn.Module) -> tuple[_Family, ...]:
    """Families of a model whose type has no entry in ``_FAMILIES``, read from its modeling files:
    each ``transformers.models.<m>.modeling_<m>`` among the model's modules' classes whose text
    rotary module (one ``...RotaryEmbedding`` class, not a vision one) feeds attention classes
    whose forward (through its decorators) calls that file's ``apply_rotary_pos_emb``, which
    rotates as one of rome's modes on the tables it reads (``_table_convention``). ~105 of transformers' model types are of this kind."""
    attention: dict[str, set[str]] = {}
    for m in model.modules():
        cls = type(m)
        mod = importlib.import_module(cls.__module__) if cls.__module__.startswith("transformers.models.") else None
        if mod is None or "apply_rotary_pos_emb" not in vars(mod):
            continue
        forward = cls.__dict__.get("forward")
        # only apply_rotary_pos_emb: a forward that may call another rotary function (MLA's
        # apply_rotary_pos_emb_interleave under a config flag) would meet rome's tables unpatched
        code = getattr(innermost(forward), "__code__", None) if forward is not None else None
        rotary_calls = {n for n in code.co_names if n.startswith("apply_rotary")} if code is not None else set()
        if rotary_calls == {"apply_rotary_pos_emb"} and innermost(forward).__globals__ is vars(mod):
            attention.setdefault(cls.__module__, set()).add(cls.__name__)
    out = []
    for name, classes in attention.items():
        mod = importlib.import_module(name)
        rotary = [n for n, v in vars(mod).items() if isinstance(v, type) and n.endswith("RotaryEmbedding")
                  and "Vision" not in n and v.__module__ == name]
        parts = name.split(".")
        convention = _table_convention(mod.apply_rotary_pos_emb)
        if len(rotary) != 1 or parts[-1] != f"modeling_{parts[-2]}" or convention is None:
            continue
        # "narrow": the patched rotary module returns tables as wide as transformers' own (a
        # partial-rotary forward slices q to them itself: Phi, Persimmon, StableLM)
        out.append(_Family(parts[-2], rotary[0], tuple(sorted(classes)),
                           tables="narrow" if convention == "half" else convention))
    return tuple(out)


# rotary modules a patched model keeps as transformers runs them, as docs/families.md says
_KEPT_ROTARY = frozenset({"Llama4VisionRotaryEmbedding"})


def _model_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None) or ""
    for suffix in ("_text", "_vision"):
        if kind.endswith(suffix):
            kind = kind[: -len(suffix)]
    return kind or None


def patch(model: nn.Module, *, backend: Backend = "auto", rounding: Rounding = "exact") -> Patch | None:
    """Patch every rotary module and attention layer of ``model`` (see the module doc);
    None when ``model`` has none of a supported family's.

    ``rounding="native"``: the patched model's outputs are the unpatched model's bit for bit.
    The rotary modules are then left as they are (their tables, in the dtype they return them,
    are what the modeling file multiplies by) and only the rotation is replaced: rome with
    ``rounding="native"`` in the dtype the modeling file computes in (``_native_rule``, probed at
    patch time). A family whose rotation that cannot reproduce raises ValueError: Llama 4's
    complex products, MLA's de-interleaving ``apply_rotary_pos_emb_interleave`` (rome keeps
    the pairs in place), and any modeling function the probe finds rounding otherwise.

    Raises ValueError for a model (or a part of it) already patched, for a rotary module
    whose attention layers are not of the classes rome patches, and for a RoPE configuration
    rome cannot express; TypeError/ValueError for a bad ``backend`` or ``rounding``.
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    native = check_rounding(rounding) == "native"
    name = type(model).__name__
    kind = _model_type(model)
    if kind in _REFUSED:
        raise ValueError(f"rome.integrations.patch({name}): model_type {kind!r} is not patched: "
                         f"{_REFUSED[kind]}")
    if kind is not None and kind not in _FAMILIES:
        candidates = _discovered(model)
        if not candidates:
            rotary = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")})
            if rotary:  # a model with RoPE that rome cannot patch: said, never "not supported" silently
                raise ValueError(
                    f"rome.integrations.patch({name}): model_type {kind!r} has {', '.join(rotary)} but no "
                    f"attention class calling an apply_rotary_pos_emb of its modeling file that rotates as "
                    f"rome's half or interleave rotation on rome's tables; "
                    f"not patched"
                )
            return None
    else:
        candidates = _FAMILIES[kind] if kind is not None else sum(_FAMILIES.values(), ())
    found = []  # (family, rotary instance, its attention instances)
    for family in candidates:
        classes = _classes(family)
        if classes is None:
            continue
        rotary_cls, attention_cls = classes
        rotaries = [m for m in model.modules() if type(m) is rotary_cls]
        layers = [m for m in model.modules() if type(m) in attention_cls]
        if not rotaries and not layers:
            continue
        if len(rotaries) != 1:
            raise ValueError(
                f"rome.integrations.patch({name}): expected one {family.rotary} feeding the "
                f"{'/'.join(family.attention)} layers, found {len(rotaries)}"
            )
        found.append((family, rotaries[0], layers))
    if not found:
        return None
    covered = {id(rotary) for _, rotary, _ in found}
    left = sorted({type(m).__name__ for m in model.modules()
                   if type(m).__name__.endswith("RotaryEmbedding") and id(m) not in covered} - _KEPT_ROTARY)
    if left:  # a part rome cannot patch (another family's vision tower: Mistral 3's Pixtral) would
        # keep transformers' RoPE under a patch that says the model is patched
        raise ValueError(
            f"rome.integrations.patch({name}): it also holds {', '.join(left)}, whose attention rome does "
            f"not patch ({', '.join(sorted(type(r).__name__ for _, r, _ in found))} it would); not patched "
            f"(patch the part rome takes, e.g. the language model, on its own)"
        )
    for _, rotary, layers in found:
        for m in (rotary, *layers):
            if m in _PATCHED:
                raise ValueError(
                    f"{name} is already patched by rome (its {type(m).__name__} is part of "
                    f"the patch of a {_PATCHED[m]}): undo that patch first"
                )
    built = []  # per family: (function, table convention, RoPE or {layer type: RoPE})
    for family, rotary, _ in found:
        function, convention, mode = family.plan(rotary.config)
        if native and (family.kind == "complex" or function != family.function):
            why = ("its rotation multiplies complex numbers (freqs_cis)" if family.kind == "complex" else
                   f"{function} writes the rotated pairs de-interleaved, which rome's rotation in place does not")
            raise ValueError(f"rome.integrations.patch({name}, rounding='native'): {type(rotary).__name__}: "
                             f"{why}; rounding='native' cannot reproduce it (rounding='exact' patches it)")
        types_ = _layer_types(rotary)
        if types_ is None:
            ropes = _rope_of(rotary, family, mode, backend)
        else:
            ropes = {t: _rope_of(rotary, family, mode, backend, t) for t in types_}
            blocks = {r.layout.blocks for r in ropes.values()}
            if len(blocks) != 1:
                raise ValueError(
                    f"{type(rotary).__name__}: its layer types rotate different columns "
                    f"({blocks}); one patched attention class cannot take both"
                )
        built.append((function, convention, ropes))

    handle = Patch(model, family=kind or found[0][0].module)
    try:
        for (family, rotary, layers), (function, convention, ropes) in zip(found, built):
            one = ropes if isinstance(ropes, RoPE) else next(iter(ropes.values()))
            tables = _Tables(ropes) if isinstance(ropes, RoPE) else {
                t: _Tables(r) for t, r in ropes.items()}
            forward = _RotaryForward(tables, family.kind, one.n_axes, convention,
                                     _rotary_width(one.layout))
            if not native:  # (native: transformers' own tables, as the modeling file multiplies them)
                patched = _Forward(rotary, (forward,), name)
                handle.on_undo(lambda m=rotary: _PATCHED.pop(m, None))
                handle.set_forward(rotary, patched)
            rotate_cls = {"vision": _RotateVision, "complex": _RotateComplex}.get(
                family.kind, _RotatePairs if function != family.function else _RotateText)
            rotate = rotate_cls(one, backend, convention)
            if native:
                fn = getattr(importlib.import_module(f"transformers.models.{family.module}.modeling_{family.module}"),
                             function, None)
                rotate.native = None if fn is None else _native_rule(fn, rotate, family.kind)
                if rotate.native is None:
                    raise ValueError(
                        f"rome.integrations.patch({name}, rounding='native'): {family.module}'s {function} does not "
                        f"round as an eager chain in q's dtype nor in float32 (probed on bf16 values); "
                        f"rounding='native' cannot reproduce it (rounding='exact' patches it)")
            for layer in layers:
                cls = type(layer)
                if not calls(cls.forward, function):
                    raise ValueError(
                        f"{cls.__name__}.forward does not call {function} (a "
                        f"transformers version rome's patch does not know); not patched"
                    )
                # (native: the layer's own norms run, rounded as the model rounds them; the fused
                # norm's fp32 result is not)
                fused = _fused_norms(layer, one) if rotate_cls is _RotateText and not native else None
                layer_rotate = rotate
                if fused is not None:  # the q/k norms in the rotation: one apply_qk_norm
                    layer_rotate = _RotateNormed(one, backend, convention, layer, *fused)
                    # (the norms' forwards replaced whatever they are, a kernels hub layer's
                    # too: rome's fused call computes the norm from their weights)
                    handle.setattr(layer.q_norm, "forward", _PassThrough())
                    handle.setattr(layer.k_norm, "forward", _PassThrough())
                patched = _Forward(layer, (cls, function, layer_rotate), name)
                handle.on_undo(lambda m=layer: _PATCHED.pop(m, None))
                handle.set_forward(layer, patched)
    except BaseException:
        handle.undo()
        raise
    return handle

