"""rome for transformers models: the Llama family, Qwen2-VL / Qwen2.5-VL and GPT-NeoX.

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

At patch time rome's frequencies are checked against the rotary module's own ``inv_freq`` and
``attention_scaling``; a configuration rome reads differently raises ValueError, naming the
class, rather than patching in a different RoPE. GPT-J is not patched: its rotary is inlined in
its attention's forward (tables gathered from a per-layer buffer, q and k rotated by two calls
on slices), so only a copy of that forward would give one rome launch on rome's tables.
"""

from __future__ import annotations

import importlib
import types
import weakref
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..layouts import cos_sin_cache, cos_sin_for_positions, tables_for_positions
from ..module import RoPE
from ..ops import BACKENDS, apply_qk
from ..types import Backend
from . import Patch

__all__ = ["SUPPORTED", "patch"]


@dataclass(frozen=True)
class _Family:
    """A rotary module class of ``transformers.models.<module>`` and the attention classes
    that rotate q and k with its tables by calling that modeling file's ``function``."""

    module: str
    rotary: str
    attention: tuple[str, ...]
    function: str = "apply_rotary_pos_emb"
    kind: str = "text"  # text: tables [B, S, D], q [B, N, S, D]; vision: [T, D], q [T, N, D]


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
}

_PREFIX = {
    "llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
    "gpt_neox": "GPTNeoX", "qwen2_vl": "Qwen2VL", "qwen2_5_vl": "Qwen2_5_VL",
}
# the families' usual model classes; any model built of a family's rotary and attention
# modules (a ...ForSequenceClassification, a bare text or vision model) is patched the same way
SUPPORTED = tuple(
    f"{_PREFIX[t]}{suffix}"
    for t in _FAMILIES
    for suffix in (
        ("Model", "TextModel", "ForConditionalGeneration") if t.endswith("_vl")
        else ("Model", "ForCausalLM")
    )
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
            top = int(positions.max()) + 1
            if rope.dynamic is not None:
                layout = rope.dynamic(top)
            elif top <= rope.cache_limit:  # past it: float64 angles of this call (below)
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


class _RotaryForward:
    """The rotary module's ``forward(x, position_ids) -> (cos, sin)`` on rome's tables (a
    class, not a closure, so that it pickles)."""

    def __init__(self, tables: _Tables, kind: str, n_axes: int):
        self.tables, self.kind, self.n_axes = tables, kind, n_axes

    @torch.no_grad()
    def __call__(self, module, x, position_ids):
        tables = self.tables
        if self.kind == "vision":  # [T, A] (h, w) per patch -> [T, D]
            return tables(position_ids, -1, x.device, _table_dtype(x))
        if self.n_axes > 1:  # mRoPE: [B, S] (text only) or [A, B, S] -> [B, S, D]
            pos = position_ids.expand(self.n_axes, -1, -1) if position_ids.ndim == 2 else position_ids
            return tables(pos, 0, x.device, _table_dtype(x))
        return tables(position_ids, None, x.device, _table_dtype(x))  # [B, S] -> [B, S, D]


# --- q and k ---------------------------------------------------------------------------------


def _full_width(cos: Tensor, sin: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """Tables of the first ``r < d`` columns (transformers' own, partial rotary) padded to d
    with the pass-through values ``cos = 1, sin = 0``."""
    r = cos.shape[-1]
    if r == d:
        return cos, sin
    pad = (*cos.shape[:-1], d - r)
    return (torch.cat([cos, cos.new_ones(pad)], -1), torch.cat([sin, sin.new_zeros(pad)], -1))


class _RotateText:
    """``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` as one ``rome.apply_qk``."""

    def __init__(self, rope: RoPE, backend: str):
        self.rope, self.backend = rope, backend

    def __getstate__(self):
        return {"rope": self.rope, "backend": self.backend}  # not the rebound forwards

    def __call__(self, q, k, cos, sin, unsqueeze_dim=1):
        cos, sin = _full_width(cos, sin, q.shape[-1])
        m = self.rope.matrix(q.dtype, q.device)
        return apply_qk(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim), m,
                        backend=self.backend)


class _RotateVision(_RotateText):
    """``apply_rotary_pos_emb_vision(q, k, cos, sin)``, q and k ``[T, N, D]``, tables ``[T, D]``."""

    def __call__(self, q, k, cos, sin):
        m = self.rope.matrix(q.dtype, q.device)
        return apply_qk(q, k, cos.unsqueeze(-2), sin.unsqueeze(-2), m, backend=self.backend)


def _rebound(fn, name: str, value):
    """``fn`` with the global ``name`` bound to ``value`` (same code, defaults and closure).

    The new globals dict has no ``__name__``: torch.compile then guards on the dict itself
    rather than on the modeling module's attribute of that name (transformers' own function)."""
    scope = dict(fn.__globals__)
    scope.pop("__name__", None)
    scope[name] = value
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    new.__dict__.update(fn.__dict__)
    new.__wrapped__ = fn
    return new


class _Forward:
    """A patched instance's ``forward``: ``function(module, *args, **kwargs)``. It pickles (and
    deep-copies) as the recipe it was made from, so an unpickled model runs rome again and counts
    as patched (``patch`` refuses it; it has no handle to undo). ``how``: ``(_RotaryForward,)``,
    or ``(attention class, function name, _RotateText)``: the class's own forward with that
    global bound to rome's rotation (``_rebound``; one function per class and rotation)."""

    def __init__(self, module: nn.Module, how: tuple, owner: str):
        self.module, self.how, self.owner = module, how, owner
        if len(how) == 1:
            self.function = how[0]
        else:
            cls, name, rotate = how
            functions = rotate.__dict__.setdefault("_functions", {})
            if cls not in functions:
                functions[cls] = _rebound(cls.forward, name, rotate)
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


def _rope_of(rotary: nn.Module, kind: str, backend: str) -> RoPE:
    """rome's RoPE for a rotary module's config, checked against the module's frequencies."""
    name = type(rotary).__name__
    config = getattr(rotary, "config", None)
    if config is None:
        raise ValueError(f"{name} has no config to read its RoPE from")
    try:
        rope = RoPE.from_hf_config(config, backend=backend)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(
            f"rome cannot express the RoPE of {name} ({type(config).__name__}): {e}"
        ) from e
    layout = rope.layout
    if kind == "vision" and (layout.n_axes != 2 or layout.blocks != (("half", layout.head_dim),)):
        raise ValueError(f"{name}: expected an axial 2D layout, rome read {layout!r}")
    ref = getattr(rotary, "original_inv_freq", getattr(rotary, "inv_freq", None))
    if isinstance(ref, Tensor) and ref.device.type != "meta":
        rtol = max(1e-5, torch.finfo(ref.dtype).eps)  # a model cast to bf16 has bf16 buffers
        ref = ref.detach().double().cpu()
        got = layout.inv_freq[: ref.numel()]
        ok = ref.ndim == 1 and got.numel() == ref.numel() and torch.allclose(got, ref, rtol=rtol)
        scale = float(getattr(rotary, "attention_scaling", 1.0) or 1.0)
        if not ok or abs(layout.attention_scaling - scale) > 1e-6 * scale:
            raise ValueError(
                f"rome reads the RoPE of {name} ({type(config).__name__}) differently from the "
                f"module: inv_freq {got.tolist()} vs the module's {ref.tolist()}, attention "
                f"scaling {layout.attention_scaling} vs {scale}; not patched"
            )
    return rope


# --- patch -----------------------------------------------------------------------------------


def _model_type(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None) or ""
    for suffix in ("_text", "_vision"):
        if kind.endswith(suffix):
            kind = kind[: -len(suffix)]
    return kind or None


def patch(model: nn.Module, *, backend: Backend = "auto") -> Patch | None:
    """Patch every rotary module and attention layer of ``model`` (see the module doc);
    None when ``model`` has none of a supported family's.

    Raises ValueError for a model (or a part of it) already patched, for a rotary module
    whose attention layers are not of the classes rome patches, and for a RoPE configuration
    rome cannot express; TypeError/ValueError for a bad ``backend``.
    """
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    name = type(model).__name__
    kind = _model_type(model)
    if kind is not None and kind not in _FAMILIES:
        return None
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
    for _, rotary, layers in found:
        for m in (rotary, *layers):
            if m in _PATCHED:
                raise ValueError(
                    f"{name} is already patched by rome (its {type(m).__name__} is part of "
                    f"the patch of a {_PATCHED[m]}): undo that patch first"
                )
    ropes = [_rope_of(rotary, family.kind, backend) for family, rotary, _ in found]

    handle = Patch(model, family=kind or found[0][0].module)
    try:
        for (family, rotary, layers), rope in zip(found, ropes):
            forward = _RotaryForward(_Tables(rope), family.kind, rope.n_axes)
            handle.setattr(rotary, "forward", _Forward(rotary, (forward,), name))
            handle.on_undo(lambda m=rotary: _PATCHED.pop(m, None))
            rotate = (_RotateVision if family.kind == "vision" else _RotateText)(rope, backend)
            for layer in layers:
                cls = type(layer)
                if family.function not in cls.forward.__code__.co_names:
                    raise ValueError(
                        f"{cls.__name__}.forward does not call {family.function} (a "
                        f"transformers version rome's patch does not know); not patched"
                    )
                handle.setattr(layer, "forward", _Forward(layer, (cls, family.function, rotate), name))
                handle.on_undo(lambda m=layer: _PATCHED.pop(m, None))
    except BaseException:
        handle.undo()
        raise
    return handle

