"""``rome.RoPE``: the rotary embedding of a model as an ``nn.Module``.

``RoPE(layout)`` rotates q and k of one RoPE configuration (a ``rome.layouts.RopeLayout``):

    q_out, k_out = rope(q, k, positions)      # out = x*cos + (x @ M)*sin, M the layout's matrix

- **Tables**: a cache of ``cos_sin_cache`` rows (float64 angles rounded once to float32,
  float64 for float64 q), one row per position value, read at each token's positions inside
  the op (``rome.ops.apply_qk_at``: the kernel gathers the rows itself, no per-token table is
  built; offsets and ``cu_seqlens`` are folded into the positions first).
  The cache is process-wide, one per (layout values, device, dtype): every layer of a model, and
  every module built from an equal configuration, shares one tensor pair. It is built on first
  use and grows on demand to the next power of two above the largest position asked for, but
  never past the module's bound, ``cache_limit``: ``max_positions`` when that is set, else
  ``cache_positions`` (``from_hf_config``: what the config allows, ``max_position_embeddings``
  or its scaled length), else ``CACHE_POSITIONS`` (2**18). A position past ``max_positions`` is
  a ValueError naming it and the bound; a call with a position past the other bounds gets its
  own tables from float64 angles (bitwise the cache's rows, memory per token, as transformers
  computes positions past ``max_position_embeddings``) and the cache does not grow: one stray
  position near 10**7 no longer allocates gigabytes. ``cache_bytes()`` reports the cache's size.
  Fractional positions skip the cache: their tables come from float64 angles per call. Those,
  length-dependent layouts (``dynamic``) and calls with ``unrotated`` tokens pass per-token tables
  to ``rome.apply_qk`` instead (bitwise the same result where both apply).
- **Angles in the kernel** (``angles="kernel"``): no cache at all; the kernel computes cos/sin
  from the positions and the frequencies (``rome.ops.apply_qk_angles``): within 3.05e-8 of the
  float64 value for positions up to 2**20 (the cache's fp32 rounding: 2.98e-8), positions below
  2**24. Float32/16/bf16 q only (float64 q keeps the float64 cache).
- **Matrix**: ``layout.matrix`` in q's dtype (exact: entries are 0 and ±1), built once per
  (dtype, device) and kept on the module.
- **Attention scaling** (YaRN's ``0.1 ln(s) + 1``, LongRoPE's factor): multiplied into cos and
  sin of the rotated columns, as transformers multiplies it into its cos and sin.
- **Length-dependent frequencies** (``dynamic``; ``from_hf_config`` sets it for ``dynamic`` NTK
  and ``longrope``): each call with L = max position + 1 asks ``dynamic(L)`` for the layout of
  that length; when it differs from the base layout, the call's tables come from float64 angles
  of that layout (no cache, as transformers recomputes them). This is what a fresh transformers
  module computes for the call. transformers' module also keeps the longest L it has seen and
  uses it for shorter calls until L drops below ``max_position_embeddings``; rome does not keep
  that state, so its result depends on the call alone (equal to transformers' for a growing
  sequence of calls: prefill, then decode).

**Host syncs**: in eager mode the positions' range is read on the host (a device sync) once per
positions tensor, not once per layer: the (min, max) is remembered by the tensor's identity,
version counter, data_ptr, shape, strides and device (``position_span``), shared by every
module of the process, so an N-layer step reads it once; positions=None with an int offset is
not read at all. A tensor written in place is read again; inference tensors (no version
counter) are read on every call. Each module still checks the span against its own bound.

``torch.compile(fullgraph=True)`` traces ``forward`` for BNSD q/k with integer positions, and
CUDA graphs capture it (a serving engine's decode step): the host-side checks and the cache
growth are skipped while compiling or capturing, so reserve the cache first (``reserve(n,
device=...)``, or one eager call; RuntimeError otherwise), and positions must lie inside it: in a
compiled or captured graph nothing reads them on the host, and the op gives NaN for an element
whose position lies outside the cache (``rome.ops.position_checks`` for a check on the device or
the host instead).

**Per-call cost**: the step's positions tensor, normalised and checked by one layer, is kept
(``_remember``) with the rows it reads, so every other layer's call goes straight to the op's
lean path (``rome.ops``: the launch remembered per call signature).
Modules with ``dynamic`` set, and packed ``cu_seqlens`` calls (checked on the host), do not
compile or capture.
"""

from __future__ import annotations

import copy
import math
import numbers
import operator
import sys
import threading
import weakref
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from .checks import check_rounding
from .frequencies import _get, frequencies_from_hf, rope_frequencies
from .layouts import (
    RopeLayout,
    axial_layout,
    cos_sin_cache,
    cos_sin_for_positions,
    mrope_layout,
    rope_layout,
    section_layout,
    tables_for_positions,
)
from .matrices import check_mode, kept_matrix
from .ops import (ANGLE_POSITIONS, BACKENDS, _apply_qk_at_checked, apply_qk, apply_qk_angles, apply_qk_at,
                  positions_checked)
from .positions import (angle_frequencies, check_angle_frequencies, check_int_offset, check_range,
                        normalize_positions, token_mask)
from .qknorm import QKNorm, _normalised, apply_qk_norm, apply_qk_norm_at, check_affine
from .types import ANGLE_SOURCES, AngleSource, Backend, Mode, Rounding

__all__ = ["CACHE_POSITIONS", "RoPE", "registry_bytes"]

_MIN_ROWS = 16
# the cache's bound for a module with neither max_positions nor cache_positions: 2**18 rows of
# D float32 cos and sin, 256 MiB at D = 128
CACHE_POSITIONS = 1 << 18

# --- the process-wide cache registry ---------------------------------------------------------


def _is_dtensor(*tensors: Tensor) -> bool:
    dt = sys.modules.get("torch.distributed.tensor")  # no DTensor exists before it is imported
    return dt is not None and any(isinstance(t, dt.DTensor) for t in tensors)


def _layout_key(layout: RopeLayout) -> tuple:
    """Equal for layouts with equal values (two configs that build the same RoPE)."""
    return (
        tuple(layout.inv_freq.tolist()),  # float64 -> Python floats: exact, and no numpy needed
        tuple(layout.axis.tolist()),
        layout.n_axes,
        layout.blocks,
        layout.attention_scaling,
    )


class _Cache:
    """``(cos, sin)`` rows ``[rows, D]`` of one layout on one device and dtype."""

    __slots__ = ("layout", "device", "dtype", "cos", "sin", "rows", "lock", "__weakref__")

    def __init__(self, layout: RopeLayout, device: torch.device, dtype: torch.dtype):
        self.layout, self.device, self.dtype = layout, device, dtype
        self.cos = self.sin = None
        self.rows = 0
        self.lock = threading.Lock()

    def reserve(self, rows: int, cap: int | None = None) -> None:
        """Hold at least ``rows`` rows: the next power of two (at most ``cap`` when given)."""
        if rows <= self.rows:
            return
        with self.lock:
            if rows <= self.rows:
                return
            n = max(_MIN_ROWS, 1 << (rows - 1).bit_length())
            if cap is not None:
                n = max(rows, min(n, cap))
            # kept tables are ordinary tensors: built under inference mode they could not be
            # saved for a later training call's backward
            with torch.inference_mode(False):
                cos, sin = cos_sin_cache(self.layout, n, dtype=self.dtype, device=self.device)
            self.cos, self.sin, self.rows = cos, sin, n

    @property
    def nbytes(self) -> int:
        return 0 if self.cos is None else self.cos.nbytes + self.sin.nbytes


_REGISTRY: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_REGISTRY_LOCK = threading.Lock()


def _no_cache(device, dtype) -> RuntimeError:
    return RuntimeError(
        f"rome.RoPE has no {dtype} cache on {device} yet: call rope.reserve(n, device=..., "
        f"dtype={dtype}) or run it once eagerly before torch.compile or CUDA graph capture")


def _shared_cache(layout: RopeLayout, device: torch.device, dtype: torch.dtype, layout_key=None) -> _Cache:
    """``layout_key``: ``_layout_key(layout)`` if the caller has it (a RoPE keeps its own: reading
    the layout's values would break a torch.compile trace)."""
    key = (_layout_key(layout) if layout_key is None else layout_key, device, dtype)
    with _REGISTRY_LOCK:
        cache = _REGISTRY.get(key)
        if cache is None:
            cache = _Cache(layout, device, dtype)
            _REGISTRY[key] = cache
        return cache


def registry_bytes() -> int:
    """Bytes held by every live shared cache of the process (each counted once)."""
    with _REGISTRY_LOCK:
        return sum(c.nbytes for c in list(_REGISTRY.values()))


def _device(device) -> torch.device:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _table_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --- transformers configs --------------------------------------------------------------------

# model types whose rotate is GPT-J's every-two (pairs (x0, x1)) rather than Llama's rotate_half
INTERLEAVE_MODEL_TYPES = frozenset({
    "gptj", "codegen", "cohere", "cohere2", "cohere2_moe", "ernie4_5", "ernie4_5_moe", "glm",
    "glm4", "helium", "moonshine", "blt",
})
# model types whose rotate is Llama's rotate_half (each checked against transformers' own code in
# tests/test_hf_rotation.py); any model type in none of these tables is read from the installed
# transformers code (rome.hf_rotation.probe_mode) or refused
HALF_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "ministral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "qwen3_next", "gpt_neox", "gpt_neox_japanese", "gemma", "gemma2", "phi", "phi3",
    "phimoe", "persimmon", "stablelm", "starcoder2", "olmo", "olmo2", "olmoe", "granite",
    "granitemoe", "smollm3", "exaone4", "seed_oss", "nemotron",
    "hunyuan_v1_dense", "hunyuan_v1_moe", "dbrx", "jetmoe", "minimax", "apertus", "arcee",
})
# model types whose attention rotates inline, not through apply_rotary_pos_emb(q, k, cos, sin)
# (tests/test_module.py checks them against their own formula)
INLINE_MODEL_TYPES = frozenset({"gptj", "codegen"})
# mRoPE model types: (interleaved, transformers' default mrope_section)
MROPE_MODEL_TYPES = {
    "qwen2_vl": (False, (16, 24, 24)),
    "qwen2_5_vl": (False, (16, 24, 24)),
    "qwen3_vl": (True, (24, 20, 20)),
    "qwen3_vl_moe": (True, (24, 20, 20)),
    "qwen3_5": (True, (11, 11, 10)),
    "qwen3_5_moe": (True, (11, 11, 10)),
}
# vision configs whose rope_type "axial" is Qwen2-VL's (rows then columns of a patch grid, each
# half of the rotated width, one half rotation: rome.layouts.axial_layout), checked against
# transformers' own vision rotary in tests/test_hf_rotation.py; any other model type's "axial" is
# read from its installed vision code (rome.hf_rotation.probe_axial) or refused (Pixtral's and
# Kimi-K2.5's alternate the axes)
AXIAL_MODEL_TYPES = frozenset({"qwen2_vl_vision", "qwen2_5_vl_vision"})


def _text_config(config):
    if isinstance(config, Mapping):
        return config.get("text_config") or config
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _model_type(config) -> str:
    """The config's model_type; a text config's ``<type>_text`` is read as ``<type>`` where that is
    in rome's tables (``qwen2_5_vl_text``), else kept whole (``kyutai_speech_to_text``)."""
    kind = _get(config, "model_type") or ""
    if not isinstance(kind, str):
        raise ValueError(f"model_type must be a string, got {kind!r}")
    base = kind[: -len("_text")] if kind.endswith("_text") else kind
    known = HALF_MODEL_TYPES | INTERLEAVE_MODEL_TYPES | MROPE_MODEL_TYPES.keys()
    return base if base in known else kind


def _hf_refusal(config, error: Exception) -> ValueError:
    """``error`` (raised while reading ``config``) as a ValueError naming the model type, and the
    text config's where ``config`` is composite: every refusal of ``from_hf_config`` says which
    model type it could not read and why."""
    kind = _get(config, "model_type")
    names = [f"model_type {kind!r}" if kind else "no model_type"]
    try:
        text = _text_config(config)
    except Exception:  # noqa: BLE001 - the refusal itself may be about the text config
        text = config
    if text is not config:
        names.append(f"text config model_type {_get(text, 'model_type')!r}")
    message = str(error) if type(error) is ValueError else f"{type(error).__name__}: {error}"
    if type(error) is ValueError and all(n in message for n in names):
        return error
    return ValueError(f"RoPE.from_hf_config({type(config).__name__}, {', '.join(names)}): {message}")


def _check_heads(config) -> None:
    """A config without head_dim must have one head count to derive it from."""
    if _get(config, "head_dim") is not None:
        return
    heads = _get(config, "num_attention_heads", "num_heads", "n_head")
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, numbers.Integral)):
        raise ValueError(
            f"num_attention_heads={heads!r} is not one head count (a hierarchical model's heads per "
            f"stage), and there is no head_dim: rome cannot tell the head width its RoPE turns"
        )


def _rope_params(config, layer_type) -> dict:
    params = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    if layer_type is not None and isinstance(params.get(layer_type), Mapping):
        params = params[layer_type]
    return dict(params)


def _hf_layout_builder(config, layer_type, mode=None) -> Callable[..., RopeLayout]:
    """``seq_len -> RopeLayout`` for a transformers config (checked once, up front); ``mode``:
    the rotation where the caller knows it (else read from the model type)."""
    name = type(config).__name__
    kind = _model_type(config)
    params = _rope_params(config, layer_type)
    if _get(config, "rope_interleave") and mode is None:
        # MLA (DeepSeek-V2/V3, GLM-4.7-Flash): transformers rotates the adjacent pairs of the rope
        # block and writes them de-interleaved; rome rotates the same pairs in x's column order.
        # The two differ by one column permutation of q and k alike, which q.k does not see
        # (docs/families.md); the patch relies on the same reading. Only where the installed
        # modeling file has that function: rome does not guess another file's meaning of the flag
        import importlib

        from .hf_rotation import modeling_module

        try:
            known = hasattr(importlib.import_module(modeling_module(config, kind)), "apply_rotary_pos_emb_interleave")
        except ImportError:
            known = False
        if not known:
            raise ValueError(
                f"{name} (model_type {kind!r}): rope_interleave=True, and transformers' installed code for "
                f"it has no apply_rotary_pos_emb_interleave to say what the flag means; pass mode= yourself"
            )
        mode = "interleave"
    section = params.get("mrope_section")
    if kind in MROPE_MODEL_TYPES:
        interleaved, default = MROPE_MODEL_TYPES[kind]
        section = list(section if section is not None else default)
    elif section is not None:
        raise ValueError(
            f"{name} (model_type {kind!r}): rope_parameters['mrope_section']={section} of a model "
            f"type rome does not know the mRoPE layout of (known: {sorted(MROPE_MODEL_TYPES)}); "
            f"build RoPE(mrope_layout(...)) yourself"
        )
    interleaved = interleaved if section is not None else False
    if section is None and kind not in AXIAL_MODEL_TYPES and _axial(config, layer_type):
        from .hf_rotation import probe_axial  # ValueError unless the installed code is Qwen2-VL's

        probe_axial(config, kind, _HFLayouts(config, layer_type, None, False, "half")())
    if mode is not None:
        check_mode(mode)
    elif kind in INTERLEAVE_MODEL_TYPES:
        mode = "interleave"
    elif kind in HALF_MODEL_TYPES or section is not None or _axial(config, layer_type):
        mode = "half"  # (axial: vision towers, one half rotation whatever the model type)
    elif not kind:
        raise ValueError(
            f"{name} has no model_type: rome cannot tell whether it rotates halves (Llama's "
            f"rotate_half) or adjacent pairs (GPT-J's); add model_type, or build "
            f"RoPE(rope_layout(frequencies_from_hf(config), mode=...)) yourself"
        )
    else:  # a model type rome's tables do not know: ask transformers' installed code
        from .hf_rotation import PROBE_LENGTH, probe_mode

        layouts = {m: _HFLayouts(config, layer_type, None, False, m)(PROBE_LENGTH) for m in ("half", "interleave")}
        return _HFLayouts(config, layer_type, None, False, probe_mode(config, kind, layouts, layer_type))
    build = _HFLayouts(config, layer_type, section, interleaved, mode)
    if section is None and kind not in INLINE_MODEL_TYPES and _transformers_installed():
        from .hf_rotation import PROBE_LENGTH, probe_mode

        layout = build(PROBE_LENGTH)  # the probe's positions (dynamic, longrope: their frequencies)
        if any(m == "none" for m, _ in layout.blocks):
            # partial rotary: a model type of the tables whose code ignores the config's
            # partial_rotary_factor (Llama's copies: Granite, EXAONE 4) rotates every column

            probe_mode(config, kind, {mode: layout}, layer_type)
    return build


def _transformers_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformers") is not None


def _axial(config, layer_type) -> bool:
    with torch.device("cpu"):
        return frequencies_from_hf(config, layer_type=layer_type).rope_type == "axial"


class _HFLayouts:
    """``seq_len -> RopeLayout`` of one transformers config (a class, not a closure: a RoPE
    with ``dynamic`` set pickles)."""

    def __init__(self, config, layer_type, section, interleaved: bool, mode: str):
        self.config, self.layer_type = config, layer_type
        self.section, self.interleaved, self.mode = section, interleaved, mode

    def __call__(self, seq_len=None) -> RopeLayout:
        # layouts live on the CPU, also inside `with torch.device("meta")` (a model built empty)
        with torch.device("cpu"):
            freqs = frequencies_from_hf(self.config, seq_len=seq_len, layer_type=self.layer_type)
            if freqs.rope_type == "axial":
                return axial_layout(freqs)
            if self.section is not None:
                return mrope_layout(freqs, self.section, interleaved=self.interleaved)
            return rope_layout(freqs, mode=self.mode)


# --- the module ------------------------------------------------------------------------------


class RoPE(nn.Module):
    """Rotary position embedding of one ``RopeLayout``: ``forward(q, k, positions)``.

    ``max_positions``: positions must be below it (ValueError otherwise); None: no bound of its
    own. ``cache_positions``: the cache holds at most this many positions (None:
    ``CACHE_POSITIONS``); a call with a position past it gets its own tables from float64
    angles instead (``cache_limit``: the smaller of the two bounds). ``backend``: as ``rome.apply_qk`` (``"auto"``, ``"torch"``,
    ``"triton"``). ``dynamic``: None, or ``seq_len -> RopeLayout`` giving the layout of a call
    whose largest position is ``seq_len - 1`` (same blocks as ``layout``); see the module doc.
    ``angles``: ``"cache"`` (cos/sin rows of the shared cache) or ``"kernel"`` (computed in the
    op from positions and frequencies, no cache; see the module doc). ``rounding``: as
    ``rome.apply`` (``"native"``: the tables rounded to q's dtype, each product and the sum
    rounded to it, as an eager chain given those tables; the tables are rome's, from float64
    angles, not a model's own fp32 ones, so a model's bits need its own tables:
    ``rome.integrations.patch(model, rounding="native")``).
    The module has no parameters or buffers: caches and matrices follow q's device and dtype.
    """

    def __init__(
        self,
        layout: RopeLayout,
        *,
        max_positions: int | None = None,
        backend: Backend = "auto",
        dynamic: Callable[[int], RopeLayout] | None = None,
        angles: AngleSource = "cache",
        cache_positions: int | None = None,
        rounding: Rounding = "exact",
    ):
        super().__init__()
        check_rounding(rounding)
        if angles not in ANGLE_SOURCES:
            raise ValueError(f"angles must be 'cache' or 'kernel', got {angles!r}")
        if not isinstance(layout, RopeLayout):
            raise TypeError(f"layout must be a rome.layouts.RopeLayout, got {type(layout).__name__}")
        if max_positions is not None:
            if isinstance(max_positions, bool) or not isinstance(max_positions, numbers.Integral) \
                    or max_positions <= 0:
                raise ValueError(f"max_positions must be a positive int or None, got {max_positions!r}")
            max_positions = operator.index(max_positions)
        if cache_positions is not None:
            if isinstance(cache_positions, bool) or not isinstance(cache_positions, numbers.Integral) \
                    or cache_positions <= 0:
                raise ValueError(f"cache_positions must be a positive int or None, got {cache_positions!r}")
            cache_positions = operator.index(cache_positions)
        if not isinstance(backend, str) or backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if dynamic is not None and not callable(dynamic):
            raise TypeError(f"dynamic must be a callable seq_len -> RopeLayout, got {dynamic!r}")
        if angles == "kernel":
            check_angle_frequencies(layout.inv_freq)
        self.layout = layout
        self.max_positions = max_positions
        self.cache_positions = cache_positions
        self.backend = backend
        self.dynamic = dynamic
        self.angles = angles
        self.rounding = rounding
        self._freqs: dict[torch.device, tuple[Tensor, Tensor]] = {}  # angles="kernel"
        self._key = _layout_key(layout)
        self._caches: dict[tuple[torch.device, torch.dtype], _Cache] = {}
        self._matrices: dict[tuple[torch.dtype, torch.device], Tensor] = {}
        self._axes: dict[torch.device, Tensor] = {}  # layout.axis on each device (n_axes > 1)
        self._lengths: dict[int, RopeLayout | None] = {}  # dynamic's layouts by length, memo

    # --- constructors ---

    @classmethod
    def from_hf_config(
        cls,
        config,
        *,
        device=None,
        layer_type: str | None = None,
        max_positions: int | None = None,
        backend: Backend = "auto",
        angles: AngleSource = "cache",
        cache_positions: int | None = None,
        mode: Mode | None = None,
        rounding: Rounding = "exact",
    ) -> RoPE:
        """The RoPE of a transformers ``PretrainedConfig`` (or config.json dict); composite
        configs (Qwen2-VL) use their text config.

        Layouts: Llama's ``rotate_half`` (partial rotary: the first ``rotary_dim`` columns turn,
        GPT-NeoX's ``rotary_pct``), GPT-J's interleave (``rotary_dim``) and the other model
        types in ``INTERLEAVE_MODEL_TYPES``, mRoPE for the model types in ``MROPE_MODEL_TYPES``
        (``rope_parameters['mrope_section']``, else transformers' default), axial for
        Qwen2-VL's vision config. Every ``rope_type`` of ``rome.frequencies``; ``dynamic`` and
        ``longrope`` get length-dependent layouts. ``layer_type`` picks per-layer-type
        parameters (Gemma 3). ``max_positions``, ``backend``, ``angles``, ``rounding``: as the
        constructor's.
        ``cache_positions``: as the constructor's; None: what the config allows
        (``config_positions``: ``max_position_embeddings``, or the length a ``factor`` scales
        ``original_max_position_embeddings`` to where that is more).
        ``mode``: ``"half"`` or ``"interleave"``, the rotation where the caller knows it (the
        transformers integration, for model types whose code this cannot read: Llama 4's complex
        pairs); None: read from the model type as above.
        ``device``: build the float32 cache for
        ``max_position_embeddings`` positions there now (8 * head_dim bytes per position).
        Raises ValueError naming the config class, its model type (and its text config's) and
        the setting rome cannot express or the reason it cannot tell the rotation.
        """
        # the caller's own arguments first: a bad one is not the config's refusal
        if mode is not None:
            check_mode(mode)
        check_rounding(rounding)
        if layer_type is not None and not isinstance(layer_type, str):
            raise TypeError(f"layer_type must be a str (a config's layer type) or None, got "
                            f"{type(layer_type).__name__} {layer_type!r}")
        try:  # reading the config: any refusal names the model type (_hf_refusal)
            text = _text_config(config)
            _check_heads(text)
            build = _hf_layout_builder(text, layer_type, mode)
            layout = build()  # on the CPU (float64), whatever the default device
            dynamic = build if _rope_type(text, layer_type) in ("dynamic", "longrope") else None
            if cache_positions is None:
                cache_positions = config_positions(text, layer_type)
        except Exception as e:  # noqa: BLE001 - whatever reading the config raised (transformers' own too)
            raise _hf_refusal(config, e) from e
        rope = cls(layout, max_positions=max_positions, backend=backend, dynamic=dynamic, angles=angles,
                   cache_positions=cache_positions, rounding=rounding)
        if device is not None:
            n = _get(text, "max_position_embeddings", "n_positions")
            if n is None:
                raise ValueError(
                    f"{type(text).__name__} has no max_position_embeddings to reserve on {device}"
                )
            rope.reserve(min(n, rope.cache_limit), device=device)
        return rope

    @classmethod
    def sections(cls, sections, *, mode: Mode = "half", theta=10000.0, **kwargs) -> RoPE:
        """Multi-axis (2D/3D video) RoPE, one ``mode`` block per section, section i reading
        position axis i with base ``theta`` (one, or one per section): ``section_layout``."""
        with torch.device("cpu"):
            layout = section_layout(sections, mode=mode, theta=theta)
        return cls(layout, **kwargs)

    @classmethod
    def vision(cls, head_dim: int, *, theta: float = 10000.0, n_axes: int = 2, **kwargs) -> RoPE:
        """Axial RoPE of a ViT (Qwen2-VL's vision tower): every axis turns by the frequencies of
        ``head_dim // n_axes`` inside one half rotation (``axial_layout``)."""
        if isinstance(n_axes, bool) or not isinstance(n_axes, numbers.Integral) or n_axes <= 0:
            raise ValueError(f"n_axes must be a positive int, got {n_axes!r}")
        if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) \
                or head_dim <= 0 or head_dim % (2 * n_axes):
            raise ValueError(
                f"head_dim must be a positive multiple of 2 * n_axes = {2 * n_axes}, got {head_dim!r}"
            )
        with torch.device("cpu"):
            layout = axial_layout(rope_frequencies(head_dim // n_axes, theta=theta), n_axes=n_axes)
        return cls(layout, **kwargs)

    # --- state ---

    def __getstate__(self):
        """Pickle / deepcopy without the per-device memos (the shared caches hold a lock and
        belong to this process): they are rebuilt on first use."""
        state = dict(super().__getstate__())
        for name in ("_freqs", "_caches", "_matrices", "_axes", "_lengths"):
            state[name] = {}
        return state

    @property
    def cache_limit(self) -> int:
        """The most positions the cache may hold: ``max_positions``, ``cache_positions`` (the
        smaller where both are set) or ``CACHE_POSITIONS``."""
        bounds = [b for b in (self.max_positions, getattr(self, "cache_positions", None)) if b is not None]
        return min(bounds) if bounds else CACHE_POSITIONS

    def _bound(self, rows: int) -> int:
        """``cache_limit``, after checking that ``rows`` positions fit under it."""
        limit = self.cache_limit
        if rows > limit:
            if self.max_positions is not None and self.max_positions <= limit:
                what = f"max_positions={self.max_positions}"
            elif getattr(self, "cache_positions", None) is not None:
                what = f"cache_positions={self.cache_positions}"
            else:
                what = f"rome.module.CACHE_POSITIONS={CACHE_POSITIONS}"
            raise ValueError(
                f"position {rows - 1} is past the bound of rome.RoPE's cache, {what} positions "
                f"(0 .. {limit - 1}); pass a larger cache_positions (or max_positions) to reserve it"
            )
        return limit

    @property
    def head_dim(self) -> int:
        return self.layout.head_dim

    @property
    def n_axes(self) -> int:
        return self.layout.n_axes

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, n_axes={self.n_axes}, blocks={list(self.layout.blocks)}, "
            f"attention_scaling={self.layout.attention_scaling}, max_positions="
            f"{self.max_positions}, cache_limit={self.cache_limit}, backend={self.backend!r}, "
            f"dynamic={self.dynamic is not None}"
            + (f", angles={self.angles!r}" if self.angles != "cache" else "")
            + (f", rounding={self._rounding!r}" if self._rounding != "exact" else "")
        )

    @property
    def _rounding(self) -> str:
        return getattr(self, "rounding", "exact")  # (a RoPE pickled before the option: exact)

    def _cache(self, device: torch.device, dtype: torch.dtype) -> _Cache:
        key = (device, dtype)
        cache = self._caches.get(key)
        if cache is None:
            if torch.compiler.is_compiling():  # (the shared caches' registry takes a lock: not in a trace)
                raise _no_cache(device, dtype)
            cache = _shared_cache(self.layout, device, dtype, self._key)
            _keep(self._caches, key, cache)
        return cache

    def __deepcopy__(self, memo):
        """A copy whose memo of shared caches is this module's (``_Cache`` holds a lock, and is
        shared by equal layouts anyway): a reserved module's copy runs under torch.compile as the
        module does. Everything else deep-copied; pickling drops the memos (``__getstate__``)."""
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            new.__dict__[name] = dict(value) if name == "_caches" else copy.deepcopy(value, memo)
        return new

    def reserve(self, positions: int, *, device=None, dtype=torch.float32) -> None:
        """Make the shared cache on ``device`` (float32 tables; float64 for float64 q) hold
        positions ``0 .. positions - 1``, e.g. before ``torch.compile`` or CUDA graphs."""
        if isinstance(positions, bool) or not isinstance(positions, numbers.Integral) or positions <= 0:
            raise ValueError(f"positions must be a positive int, got {positions!r}")
        if self.max_positions is not None and positions > self.max_positions:
            raise ValueError(
                f"positions={positions} is more than max_positions={self.max_positions}"
            )
        device = _device("cpu" if device is None else device)
        positions = operator.index(positions)
        limit = self._bound(positions)
        self._cache(device, _table_dtype(dtype)).reserve(positions, limit)
        # the matrices (and axis) a call will read, kept now: a graph traced later reads these
        # kept tensors rather than building its own each run (which the op would analyse again)
        if not torch.compiler.is_compiling():
            for dt in (torch.float64,) if _table_dtype(dtype) == torch.float64 else \
                    (torch.float32, torch.bfloat16, torch.float16):
                self.matrix(dt, device)
            self._axis(device)

    def cache_bytes(self) -> int:
        """Bytes of the cos/sin caches this module reads (shared with equal configurations)."""
        return sum(c.nbytes for c in self._caches.values())

    def matrix(self, dtype=torch.float32, device=None) -> Tensor:
        """The layout's D×D matrix in ``dtype`` on ``device``, built once and kept."""
        device = _device("cpu" if device is None else device)
        if torch.compiler.is_compiling():  # a kept one (reserve, an eager call): the graph reads it, the op
            m = self._matrices.get((dtype, device))  # knows its structure (a built one it analyses per run)
            if m is not None:
                return m
        return kept_matrix((dtype, device), lambda: self.layout.matrix(dtype, device), memo=self._matrices)

    def _axis(self, device: torch.device) -> Tensor | None:
        """``layout.axis`` on ``device``, kept (None for one axis: every column reads it)."""
        if self.n_axes == 1:
            return None
        axis = self._axes.get(device)
        if axis is None:
            axis = self.layout.axis.to(device)
            _keep(self._axes, device, axis)
        return axis

    def _cached(self, q, k, pos, device, dtype, rows, graph, norm=None):
        """Rotate with the cache read at the positions inside the op: pos ``[B', S, A]``
        (``[T, A]`` packed) broadcast over heads as ``[B', 1, S, A]`` (``[T, 1, A]``). ``graph``:
        traced or captured, so ``rows`` is unknown and nothing is checked or grown here."""
        m = self.matrix(q.dtype, device)
        pos = pos[:, None]
        if self.angles == "kernel" and dtype == torch.float32:
            if norm is not None:  # (no norm prologue with kernel angles: the norm's fp32 ops first)
                check_affine(q, k, norm.q_weight, norm.k_weight, norm.q_bias, norm.k_bias, norm=norm.norm,
                             over=norm.over)
                qn, kn = (_normalised(x, w, b, norm=norm.norm, over=norm.over, eps=norm.eps,
                                      offset=norm.weight_offset, dt=torch.float32)
                          for x, w, b in ((q, norm.q_weight, norm.q_bias), (k, norm.k_weight, norm.k_bias)))
                qo, ko = self._cached(qn, kn, pos[:, 0], device, dtype, rows, graph)
                return qo.to(q.dtype), ko.to(k.dtype)
            freqs = self._freqs.get(device)
            if freqs is None:
                freqs = tuple(
                    t.to(device) for t in angle_frequencies(self.layout.inv_freq, self.layout.attention_scaling))
                _keep(self._freqs, device, freqs)
            if graph:  # the op checks positions when a compiled graph runs
                return apply_qk_angles(q, k, *freqs, m, pos, axis=self._axis(device),
                                   backend=self.backend, rounding=self._rounding)
            if rows is not None and rows > ANGLE_POSITIONS:
                raise ValueError(f"positions must be < 2**24 with angles='kernel', got max {rows - 1}")
            with positions_checked():
                return apply_qk_angles(q, k, *freqs, m, pos, axis=self._axis(device),
                                   backend=self.backend, rounding=self._rounding)
        cache = self._cache(device, dtype)
        if graph:  # the op checks positions when a compiled graph runs (not a captured one)
            if cache.cos is None:
                raise _no_cache(device, dtype)
            return self._at(q, k, cache.cos, cache.sin, m, pos, self._axis(device), norm)
        rows = max(rows or 1, 1)
        cache.reserve(rows, self._bound(rows))
        with positions_checked():  # check_range has run: 0 <= pos < rows <= cache rows
            return self._at(q, k, cache.cos, cache.sin, m, pos, self._axis(device), norm)

    def _fast(self, q, k, positions, offsets, axes_dim, norm=None):
        """The call as ``_cached`` makes it, where an earlier call normalised and checked these
        positions (``_remember``) and built what it reads: None otherwise (the full path)."""
        if type(q) is not Tensor or type(k) is not Tensor or self.dynamic is not None or self.angles != "cache" \
                or torch.compiler.is_compiling():
            return None
        qs, ks = q.shape, k.shape
        if len(qs) != 4 or len(ks) != 4 or qs[3] != self.layout.head_dim or ks[3] != qs[3] or qs[0] != ks[0] \
                or qs[2] != ks[2]:
            return None
        device = q.device
        hit = _recall(positions, offsets, self.n_axes, qs[0], qs[2], device, axes_dim)
        if hit is None:
            return None
        pos, rows = hit
        if rows > (CACHE_POSITIONS if self.max_positions is None and getattr(self, "cache_positions", None) is None
                   else self.cache_limit):  # (also past max_positions: the full path says so)
            return None
        cache = self._caches.get((device, torch.float64 if q.dtype == torch.float64 else torch.float32))
        m = self._matrices.get((q.dtype, device))
        if cache is None or m is None or cache.rows < rows:
            return None
        if self.n_axes == 1:
            axis = None
        elif (axis := self._axes.get(device)) is None:
            return None
        if norm is not None:
            with positions_checked():
                return self._at(q, k, cache.cos, cache.sin, m, pos, axis, norm)
        return _apply_qk_at_checked(q, k, cache.cos, cache.sin, m, pos, axis, self.backend, self._rounding)

    def _layout_for(self, length: int) -> RopeLayout | None:
        """``dynamic``'s layout for a call of ``length``, None when it is the base layout."""
        if length in self._lengths:
            return self._lengths[length]
        layout = self.dynamic(length)
        if not isinstance(layout, RopeLayout) or layout.blocks != self.layout.blocks \
                or layout.n_axes != self.layout.n_axes:
            raise ValueError(
                f"dynamic({length}) must return a RopeLayout with blocks {list(self.layout.blocks)} "
                f"and n_axes={self.layout.n_axes}, got {layout!r}"
            )
        if _layout_key(layout) == self._key:
            layout = None
        if len(self._lengths) >= 64:
            self._lengths.clear()
        self._lengths[length] = layout
        return layout

    # --- forward ---

    def _tables(
        self, positions: Tensor, layout: RopeLayout, device: torch.device, dtype: torch.dtype,
        rows: int | None,
    ) -> tuple[Tensor, Tensor]:
        """Per-token ``(cos, sin)`` ``[..., S, D]`` for positions ``[..., S, A]``: gathered from
        the shared cache (grown to ``rows`` first), or from float64 angles for fractional
        positions and length-dependent layouts."""
        if positions.is_floating_point() or layout is not self.layout or (rows or 0) > self.cache_limit:
            return cos_sin_for_positions(layout, positions, axes_dim=-1, dtype=dtype)
        cache = self._cache(device, dtype)
        if torch.compiler.is_compiling():
            index = positions[..., layout.axis.to(device)]
            columns = torch.arange(layout.head_dim, device=device)
            return cache.cos[index, columns], cache.sin[index, columns]
        rows = max(rows or 1, 1)
        cache.reserve(rows, self._bound(rows))
        return tables_for_positions(layout, (cache.cos, cache.sin), positions, axes_dim=-1)

    def _check_qk(self, q, k, packed: bool) -> None:
        for name, t in (("q", q), ("k", k)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        want = "[T, N, D] (packed, with cu_seqlens)" if packed else "[B, N, S, D] (BNSD)"
        ndim = 3 if packed else 4
        if q.ndim != ndim or k.ndim != ndim:
            raise ValueError(f"q and k must be {want}, got q {list(q.shape)} and k {list(k.shape)}")
        d = self.head_dim
        if q.shape[-1] != d or k.shape[-1] != d:
            raise ValueError(
                f"q and k must have head_dim D={d} (the layout's), got q {list(q.shape)} and k "
                f"{list(k.shape)}"
            )
        tokens = (0,) if packed else (0, 2)
        if any(q.shape[i] != k.shape[i] for i in tokens):
            what = "T" if packed else "B and S"
            raise ValueError(f"q and k must share {what}, got q {list(q.shape)} and k {list(k.shape)}")

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        positions: Tensor | None = None,
        *,
        offsets=None,
        cu_seqlens: Tensor | None = None,
        unrotated=None,
        axes_dim: int | None = None,
        norm: QKNorm | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Rotated ``(q, k)``, new tensors in q's dtype.

        q, k: ``[B, N, S, D]`` (head counts may differ), or ``[T, N, D]`` packed with
        ``cu_seqlens`` (int ``[n + 1]``, flash-attn's). positions: None (0..S-1, per sequence
        when packed), ``[S]``, ``[B, S]``, ``[S, A]``, ``[B, S, A]`` or transformers' mRoPE
        ``[A, B, S]``; integer, or floating (fractional grids, tables from float64 angles).
        offsets: int or one per sequence, added to every axis. unrotated: tokens left as they
        are (a slice, slices, or a bool mask ``[S]``/``[B, S]``). axes_dim: the dimension of
        positions that indexes the axes (0 for ``[A, B, S]``, -1 for ``[.., S, A]``), needed only
        where the shape matches two forms (B = S = A): a ValueError says so. See ``rome.positions``.
        norm: a ``rome.QKNorm`` (the model's q/k norm, e.g. ``QKNorm.from_modules(attn.norm_q,
        attn.norm_k)``): q and k are normalised first, in the same pass where fused
        (``rome.apply_qk_norm``; BNSD q/k). The normalised values are never rounded to q's dtype,
        so a module with ``rounding="native"`` refuses ``norm`` (ValueError).
        """
        if norm is not None and not isinstance(norm, QKNorm):
            raise TypeError(f"norm must be a rome.QKNorm or None, got {type(norm).__name__}")
        if norm is not None and (cu_seqlens is not None or q.ndim != 4):
            raise ValueError("norm= takes BNSD q/k ([B, N, S, D]), not packed ones (cu_seqlens)")
        if norm is not None and self._rounding == "native":
            raise ValueError("norm= is rome's fused q/k norm, whose fp32 result is not rounded as a model's "
                             "norm is: with rounding='native', run the model's norm first and call without norm=")
        if cu_seqlens is None and unrotated is None:
            out = self._fast(q, k, positions, offsets, axes_dim, norm)
            if out is not None:
                return out
        # (after the fast path: a positions tensor it remembers passed these checks once)
        if _is_dtensor(positions, offsets, cu_seqlens):
            name = next(n for n, t in (("positions", positions), ("offsets", offsets), ("cu_seqlens", cu_seqlens))
                        if _is_dtensor(t))
            raise TypeError(f"{name} must be a plain tensor (every rank's whole positions), got a DTensor: "
                            f"pass {name}.full_tensor(); q and k may be DTensors")
        packed = cu_seqlens is not None
        self._check_qk(q, k, packed)
        batch, seq = (1, q.shape[0]) if packed else (q.shape[0], q.shape[2])
        device, dtype = q.device, _table_dtype(q.dtype)
        pos = normalize_positions(
            positions, n_axes=self.n_axes, batch=batch, seq=seq, offsets=offsets,
            cu_seqlens=cu_seqlens, device=device, axes_dim=axes_dim,
        )
        layout, rows = self.layout, None
        # traced (torch.compile) or captured (CUDA graphs): no host sync to read the positions;
        # the cache must already hold them (reserve), and the op's kernel NaNs any beyond it
        graph = torch.compiler.is_compiling() or _capturing(pos)
        if graph:
            if self.dynamic is not None:
                raise NotImplementedError(
                    "rome.RoPE with length-dependent frequencies (dynamic NTK, longrope) picks its "
                    "layout from the positions' values on the host: run it eagerly (not under "
                    "torch.compile or CUDA graph capture)"
                )
        else:
            span = position_span(pos, positions, offsets, packed, axes_dim)
            if span is not None and self.max_positions is not None and span[1] >= self.max_positions:
                raise ValueError(
                    f"positions must be < max_positions={self.max_positions}, got max {span[1]}"
                )
            if span is not None:
                rows = math.floor(span[1]) + 1
                if self.dynamic is not None:
                    layout = self._layout_for(rows) or layout
        # integer positions into the shared cache, read inside the op; DTensor q/k take the table
        # path, whose op has sharding rules (rome.distributed) for tables sharded like q and k
        # past the cache's bound (no max_positions): this call's own tables, no cache grown
        beyond = rows is not None and rows > self.cache_limit
        kernel_angles = self.angles == "kernel" and dtype == torch.float32
        if (not pos.is_floating_point() and layout is self.layout and unrotated is None
                and not _is_dtensor(q, k) and (kernel_angles or not beyond)):
            out = self._cached(q, k, pos, device, dtype, rows, graph, norm)
            if not graph and not packed and rows is not None:
                _remember(positions, offsets, self.n_axes, batch, seq, device, axes_dim, pos[:, None], rows)
            return out
        cos, sin = self._tables(pos, layout, device, dtype, rows)
        mask = token_mask(unrotated, batch=batch, seq=seq, device=device)
        if mask is not None:
            mask = (mask[0] if packed else mask)[..., None]
            cos = torch.where(mask, torch.ones((), dtype=cos.dtype, device=device), cos)
            sin = torch.where(mask, torch.zeros((), dtype=sin.dtype, device=device), sin)
        if packed:
            cos, sin = cos[:, None], sin[:, None]  # [T, 1, D] against [T, N, D]
        elif cos.shape[0] == 1:
            cos, sin = cos[0], sin[0]  # [S, D]
        else:
            cos, sin = cos[:, None], sin[:, None]  # [B, 1, S, D]
        if norm is not None:
            return apply_qk_norm(q, k, cos, sin, self.matrix(q.dtype, device), norm.q_weight, norm.k_weight,
                                 backend=self.backend, **norm.kwargs())
        return apply_qk(q, k, cos, sin, self.matrix(q.dtype, device), backend=self.backend, rounding=self._rounding)

    def _at(self, q, k, cos, sin, m, pos, axis, norm):
        """``apply_qk_at`` of the cache, or with ``norm`` ``apply_qk_norm_at``."""
        if norm is None:
            return apply_qk_at(q, k, cos, sin, m, pos, axis=axis, backend=self.backend, rounding=self._rounding)
        return apply_qk_norm_at(q, k, cos, sin, m, pos, norm.q_weight, norm.k_weight, axis=axis,
                                backend=self.backend, **norm.kwargs())


# --- positions checked once per positions tensor -----------------------------------------------
#
# Every attention layer of a model calls its RoPE with the same positions tensor; reading their
# range on the host (check_range) is a device sync. ``position_span`` checks a positions tensor
# once and remembers its (min, max) by the tensor's identity and everything that changes with its
# values or its reading: the version counter (bumped by every in-place write, shared by views),
# data_ptr, storage offset, shape, strides, dtype and device, with the offsets likewise and the
# normalized shape. An entry holds weak references and is used only while they still resolve to
# the very tensors of the call, so a freed tensor's id reused by a new one never hits. Tensors
# without a version counter (inference tensors: writable in place under inference_mode without
# a trace) and tensor subclasses are checked on every call. positions=None with an int offset
# needs no check at all: the span is known on the host.

_SPANS: dict = {}  # id(positions) -> (weakref(positions), weakref(offsets) or offsets, key, span)
_SPANS_LOCK = threading.Lock()
_SPANS_MAX = 32


def _tensor_key(t: Tensor):
    """What identifies ``t``'s values for the memo, or None where nothing does."""
    if type(t) not in (Tensor, nn.Parameter) or t.is_inference() or t.device.type == "meta":
        return None
    return (t._version, t.data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, t.device)


def position_span(pos: Tensor, positions, offsets, packed: bool, axes_dim=None) -> tuple[float, float] | None:
    """``check_range(pos)`` (``0 <= pos``, finite; the (min, max)) of the normalized positions
    ``pos`` of ``positions`` and ``offsets`` (read along ``axes_dim``: one tensor read two ways
    adds the offsets to other rows), read on the host once per positions tensor (see above), or
    computed without reading for positions=None with an int offset."""
    if positions is None and not packed and (offsets is None or (
            isinstance(offsets, numbers.Integral) and not isinstance(offsets, bool))):
        seq = pos.shape[-2]
        if seq == 0 or pos.numel() == 0:
            return None
        lo = 0 if offsets is None else operator.index(offsets)
        if lo < 0:
            raise ValueError(f"positions must be >= 0, got min {lo}")
        check_int_offset(lo)  # (as normalize_positions checks it; here no tensor was built)
        return lo, lo + seq - 1
    if positions is None or packed:
        return check_range(pos)
    pkey = _tensor_key(positions)
    if pkey is None:
        return check_range(pos)
    if isinstance(offsets, Tensor):
        okey = _tensor_key(offsets)
        if okey is None:
            return check_range(pos)
        oref = weakref.ref(offsets)
    elif offsets is None or (isinstance(offsets, numbers.Integral) and not isinstance(offsets, bool)):
        okey = oref = None if offsets is None else operator.index(offsets)
    else:
        return check_range(pos)  # (normalize_positions has already refused it)
    key = (pkey, okey, tuple(pos.shape), pos.dtype, pos.device, axes_dim)
    with _SPANS_LOCK:
        entry = _SPANS.get(id(positions))
    if entry is not None:
        ref, oref_, key_, span = entry
        same_offsets = oref_() is offsets if isinstance(oref_, weakref.ref) else oref_ == oref
        if ref() is positions and same_offsets and key_ == key:
            return span
    span = check_range(pos)  # one host sync (raises for negative or non-finite positions)
    with _SPANS_LOCK:
        _SPANS.pop(id(positions), None)
        if len(_SPANS) >= _SPANS_MAX:
            del _SPANS[next(iter(_SPANS))]  # the oldest
        _SPANS[id(positions)] = (weakref.ref(positions), oref, key, span)
    return span


# The positions of a step are the same tensor in every layer: ``_remember`` keeps, per positions
# tensor (the same identity, version counter, address, shape and strides as ``position_span``'s
# memo; positions=None by its int offset), the normalised ``[B', 1, S, A]`` positions on q's device
# and the rows they read, so that the next layer's call (``RoPE._fast``) neither normalises nor
# checks them again. Only plain int or no offsets; never while compiling or capturing.

_FAST: dict = {}
_FAST_MAX = 32


def _fast_key(positions, offsets, n_axes, batch, seq, device, axes_dim):
    if offsets is not None and type(offsets) is not int:
        return None
    if positions is None:
        return (None, offsets, n_axes, batch, seq, device, axes_dim)
    # the version counter and the address (shape, strides and offset change in place only with a
    # bump of the version: as_strided_, resize_, set_, unsqueeze_, ...; dtype and device never)
    if type(positions) is not Tensor or positions.is_inference():
        return None
    try:
        return (id(positions), positions._version, positions.data_ptr(), offsets, n_axes, batch, seq, device,
                axes_dim)
    except RuntimeError:  # no storage (a functorch-wrapped or fake tensor)
        return None


def _remember(positions, offsets, n_axes, batch, seq, device, axes_dim, pos, rows) -> None:
    key = _fast_key(positions, offsets, n_axes, batch, seq, device, axes_dim)
    if key is None or torch.compiler.is_compiling() or pos.is_inference():  # (a training call would
        return  # save it for backward: an inference tensor cannot be)
    ref = None if positions is None else weakref.ref(positions)
    with _SPANS_LOCK:
        if len(_FAST) >= _FAST_MAX:
            del _FAST[next(iter(_FAST))]
        _FAST[key] = (ref, pos, rows)


def _recall(positions, offsets, n_axes, batch, seq, device, axes_dim):
    """``(pos, rows)`` that ``_remember`` kept for these arguments, or None."""
    key = _fast_key(positions, offsets, n_axes, batch, seq, device, axes_dim)
    if key is None:
        return None
    entry = _FAST.get(key)
    if entry is None or (entry[0] is not None and entry[0]() is not positions):
        return None
    return entry[1], entry[2]


def _keep(memo: dict, key, value) -> None:
    """``memo[key] = value``, except while torch.compile traces: a dict filled during tracing
    fails the guard the trace put on it (the key was absent), so the second call of the compiled
    function would recompile. The traced graph builds the value instead (a matrix, an axis)."""
    if not torch.compiler.is_compiling():
        memo[key] = value


def _capturing(t: Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream (no host sync allowed)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def config_positions(config, layer_type=None) -> int | None:
    """The positions a transformers config allows: ``max_position_embeddings`` (or
    ``n_positions``), or, where the RoPE parameters scale a length by ``factor`` (linear,
    dynamic, YaRN, LongRoPE, Llama 3), ``factor`` times ``original_max_position_embeddings``
    (else times ``max_position_embeddings``) when that is more; None when it names none."""
    text = _text_config(config)
    n = _get(text, "max_position_embeddings", "n_positions")
    params = _rope_params(text, layer_type)
    original = params.get("original_max_position_embeddings") or _get(
        text, "original_max_position_embeddings") or n
    factor = params.get("factor")
    if n is None and original is None:
        return None
    try:
        n = operator.index(n) if n is not None else None
        scaled = None
        if isinstance(factor, numbers.Real) and not isinstance(factor, bool) and factor > 1 \
                and original is not None and _rope_type(text, layer_type) != "default":
            scaled = math.ceil(float(factor) * operator.index(original))
    except TypeError:
        return None
    bounds = [b for b in (n, scaled) if b is not None and b > 0]
    return max(bounds) if bounds else None


def _rope_type(config, layer_type=None) -> str:
    """The config's rope_type as ``rome.frequencies`` reads it (``type`` or ``rope_type``)."""
    params = _rope_params(config, layer_type)
    kind = params.get("rope_type", params.get("type")) or _get(config, "default_rope_type")
    if kind == "dynamic" and params.get("alpha") is not None:
        return "ntk_alpha"
    return kind or "default"
