"""RoPE inverse frequencies for every scaling type, in float64.

Column pair k of a rotary block turns by ``p * inv_freq[k]`` at position p. The base frequencies
of a rotary dimension d are ``inv_freq[k] = theta ** (-2k / d)``, k < d/2 (the convention of
``rome.tables``); each scaling type rewrites them as transformers' ``ROPE_INIT_FUNCTIONS`` do
(same formulas, in float64 instead of float32):

- ``default``: the base frequencies.
- ``linear``: ``inv_freq / factor`` (position interpolation).
- ``dynamic`` (NTK): ``theta' = theta * (factor * L / max_pos - (factor - 1)) ** (d / (d - 2))``
  with ``L = max(seq_len, max_pos)``: a function of the current sequence length (what a fresh
  transformers module computes; a module that has seen a longer input keeps that one's).
- ``ntk_alpha`` (HunYuan: a ``dynamic`` config with ``alpha``):
  ``theta' = theta * alpha ** (d / (d - 2))``, independent of the length.
- ``yarn``: interpolated ``inv_freq / factor`` and extrapolated ``inv_freq`` blended by a linear
  ramp over the correction range of ``beta_fast``/``beta_slow`` rotations in
  ``original_max_position_embeddings``; attention factor ``0.1 ln(factor) + 1`` (or the
  ``mscale``/``mscale_all_dim`` ratio, or ``attention_factor``).
- ``llama3``: ``inv_freq / factor`` for wavelengths above ``orig / low_freq_factor``, unchanged
  below ``orig / high_freq_factor``, smoothly interpolated between.
- ``longrope``: ``inv_freq / long_factor`` when ``seq_len > original_max_position_embeddings``,
  else ``inv_freq / short_factor``; attention factor ``sqrt(1 + ln(factor) / ln(orig))``.
- ``proportional`` (Gemma 4): the first ``int(partial_rotary_factor * head_dim // 2)`` pairs turn by
  ``theta ** (-2k / head_dim)``, the rest have frequency 0 (not rotated); all over ``factor``.

``freq_factors`` (ggml's ``rope_freqs``) then divide pair k's frequency by ``freq_factors[k]``.
A frequency of 0 means "not rotated": ``rome.layouts`` passes such columns through unchanged.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_ALIASES = {"mrope": "default"}  # Qwen2-VL's config.json says "mrope" for default frequencies


@dataclass(frozen=True, eq=False)
class Frequencies:
    """Inverse frequencies of one RoPE configuration.

    ``inv_freq``: float64 ``[rotary_dim // 2]``, pair k turns by ``p * inv_freq[k]`` (0: not
    rotated). ``head_dim``: the full head size; columns ``rotary_dim:`` pass through.
    ``attention_scaling``: the factor transformers multiplies into cos and sin (YaRN, LongRoPE).
    """

    inv_freq: torch.Tensor
    head_dim: int
    attention_scaling: float = 1.0
    rope_type: str = "default"

    def __post_init__(self):
        inv = self.inv_freq
        if not isinstance(inv, torch.Tensor) or inv.dtype != torch.float64 or inv.ndim != 1:
            raise TypeError(f"inv_freq must be a 1-D float64 tensor, got {_describe(inv)}")
        inv = inv.detach().to("cpu", copy=True)
        if inv.numel() == 0 or not bool(torch.isfinite(inv).all()) or bool((inv < 0).any()):
            raise ValueError(f"inv_freq must be non-empty, finite and >= 0, got {inv.tolist()}")
        head_dim = _positive_int(self.head_dim, "head_dim")
        if 2 * inv.numel() > head_dim:
            raise ValueError(
                f"inv_freq has {inv.numel()} pairs ({2 * inv.numel()} columns), more than "
                f"head_dim={head_dim}"
            )
        scaling = _number(self.attention_scaling, "attention_scaling", positive=True)
        object.__setattr__(self, "inv_freq", inv)
        object.__setattr__(self, "head_dim", head_dim)
        object.__setattr__(self, "attention_scaling", scaling)

    @property
    def rotary_dim(self) -> int:
        """Columns covered, ``2 * len(inv_freq)``; the rest of the head passes through."""
        return 2 * self.inv_freq.numel()

    def __repr__(self) -> str:
        return (
            f"Frequencies(rope_type={self.rope_type!r}, head_dim={self.head_dim}, "
            f"rotary_dim={self.rotary_dim}, attention_scaling={self.attention_scaling})"
        )


def _describe(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"tensor of dtype {v.dtype} and shape {list(v.shape)}"
    return repr(v)


def _positive_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name} must be a positive int, got {v!r}")
    v = operator.index(v)
    if v <= 0:
        raise ValueError(f"{name} must be a positive int, got {v}")
    return v


def _number(v, name: str, *, positive: bool = False) -> float:
    """A finite real (positive when asked), as a Python float."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if positive and v <= 0:
        raise ValueError(f"{name} must be > 0, got {v!r}")
    return float(v)


def _factors(v, name: str, n: int) -> torch.Tensor:
    """A sequence (or 1-D tensor) of n positive finite numbers, as float64."""
    if isinstance(v, torch.Tensor):
        if v.ndim != 1 or v.dtype == torch.bool or v.is_complex():
            raise ValueError(
                f"{name} must be a 1-D real sequence of length {n}, got {_describe(v)}"
            )
        values = v.detach().to("cpu", torch.float64)
    elif isinstance(v, Sequence) and not isinstance(v, str):
        values = [_number(x, f"{name}[{i}]") for i, x in enumerate(v)]
        values = torch.tensor(values, dtype=torch.float64)
    else:
        raise ValueError(f"{name} must be a sequence of {n} positive numbers, got {v!r}")
    if values.numel() != n:
        raise ValueError(
            f"{name} must have one entry per rotated pair (rotary_dim // 2 = {n}), got length "
            f"{values.numel()}"
        )
    bad = ~torch.isfinite(values) | (values <= 0)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"{name} must be finite and > 0, got {name}[{i}] = {values[i].item()}")
    return values


def base_inv_freq(dim: int, theta: float, device=None) -> torch.Tensor:
    """float64 ``[dim // 2]``: ``theta ** (-2k / dim)``, each by Python's float power (the C
    library's ``pow``, within 0.52 ulp of exact), so the bits are the same on every CPU: torch's
    vectorised float64 pow differs by an ulp between its AVX2 and AVX-512 kernels (CogView4's
    ``10000 ** -0.1``: the committed record was made on one, CI ran on the other).
    ``rome.tables.rope_angles`` reads it too."""
    theta = float(theta)
    return torch.tensor([theta ** (-2.0 * k / dim) for k in range(dim // 2)], dtype=torch.float64, device=device)


def _require(params: Mapping, key: str, rope_type: str):
    if params.get(key) is None:
        raise ValueError(
            f"rope_type={rope_type!r} needs scaling[{key!r}], got scaling={dict(params)}"
        )
    return params[key]


def _factor(params: Mapping, rope_type: str) -> float:
    return _number(_require(params, "factor", rope_type), "factor", positive=True)


def _original_max(params: Mapping, rope_type: str, max_pos) -> int:
    value = params.get("original_max_position_embeddings", max_pos)
    if value is None:
        raise ValueError(
            f"rope_type={rope_type!r} needs scaling['original_max_position_embeddings'] (or "
            f"max_position_embeddings), got scaling={dict(params)}"
        )
    return _positive_int(value, "original_max_position_embeddings")


# One function per rope_type: (dim, theta, params, max_pos, seq_len, turning) -> (inv, attention),
# dim the rotary dimension of the exponents. Each validates its own keys before computing.


def _default(dim, theta, params, max_pos, seq_len, turning):
    return base_inv_freq(dim, theta), 1.0


def _linear(dim, theta, params, max_pos, seq_len, turning):
    return base_inv_freq(dim, theta) / _factor(params, "linear"), 1.0


def _ntk(dim: int, theta: float, stretch: float, rope_type: str) -> torch.Tensor:
    if dim <= 2:
        raise ValueError(
            f"rope_type={rope_type!r} needs rotary_dim > 2 (exponent d/(d-2)), got {dim}"
        )
    return base_inv_freq(dim, theta * stretch ** (dim / (dim - 2)))


def _dynamic(dim, theta, params, max_pos, seq_len, turning):
    factor = _factor(params, "dynamic")
    if max_pos is None:
        raise ValueError("rope_type='dynamic' needs max_position_embeddings, got None")
    length = max(seq_len or 0, max_pos)
    return _ntk(dim, theta, factor * length / max_pos - (factor - 1), "dynamic"), 1.0


def _ntk_alpha(dim, theta, params, max_pos, seq_len, turning):
    alpha = _number(_require(params, "alpha", "ntk_alpha"), "alpha", positive=True)
    return _ntk(dim, theta, alpha, "ntk_alpha"), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim, theta, params, max_pos, seq_len, turning):
    factor = _factor(params, "yarn")
    original = _original_max(params, "yarn", max_pos)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale is not None:
        mscale = _number(mscale, "mscale")
    if mscale_all_dim is not None:
        mscale_all_dim = _number(mscale_all_dim, "mscale_all_dim")
    attention = params.get("attention_factor")
    if attention is not None:
        attention = _number(attention, "attention_factor", positive=True)
    elif mscale and mscale_all_dim:
        attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    else:
        attention = _yarn_mscale(factor)
    # transformers reads `get(...) or default`: 0 and None both mean the default
    beta_fast = _number(params.get("beta_fast") or 32, "beta_fast", positive=True)
    beta_slow = _number(params.get("beta_slow") or 1, "beta_slow", positive=True)
    if beta_fast <= beta_slow:
        raise ValueError(
            f"yarn needs beta_fast > beta_slow, got beta_fast={beta_fast}, beta_slow={beta_slow}"
        )
    truncate = params.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ValueError(f"truncate must be a bool, got {truncate!r}")

    def correction_dim(rotations: float) -> float:  # the dimension turning `rotations` times
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    inv = base_inv_freq(dim, theta)
    # ramp 0: extrapolate (keep inv), ramp 1: interpolate (inv / factor)
    return (inv / factor) * ramp + inv * (1 - ramp), attention


def _llama3(dim, theta, params, max_pos, seq_len, turning):
    factor = _factor(params, "llama3")
    low, high = (
        _number(_require(params, key, "llama3"), key, positive=True)
        for key in ("low_freq_factor", "high_freq_factor")
    )
    if high < low:
        raise ValueError(
            f"llama3 needs high_freq_factor >= low_freq_factor, got high_freq_factor={high}, "
            f"low_freq_factor={low}"
        )
    original = _original_max(params, "llama3", max_pos)
    inv = base_inv_freq(dim, theta)
    wavelen = 2 * math.pi / inv
    if high == low:  # no band between: each frequency kept or divided (transformers and vLLM
        # divide by high - low there, and take 0/0 where a wavelength is exactly at the edge)
        return torch.where(wavelen > original / low, inv / factor, inv), 1.0
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv / factor + smooth * inv
    out = torch.where(wavelen > original / low, inv / factor, inv)
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, smoothed, out), 1.0


def _longrope(dim, theta, params, max_pos, seq_len, turning):
    original = _original_max(params, "longrope", max_pos)
    short, long = (
        _factors(_require(params, key, "longrope"), key, dim // 2)
        for key in ("short_factor", "long_factor")
    )
    factor = params.get("factor")
    if factor is None:
        if max_pos is None:
            raise ValueError(
                "rope_type='longrope' needs scaling['factor'] or max_position_embeddings (factor "
                f"= max_position_embeddings / original_max_position_embeddings), got "
                f"scaling={dict(params)}"
            )
        factor = max_pos / original
    factor = _number(factor, "factor", positive=True)
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    attention = _number(attention, "attention_factor", positive=True)
    ext = long if seq_len is not None and seq_len > original else short
    return base_inv_freq(dim, theta) / ext, attention


def _proportional(dim, theta, params, max_pos, seq_len, turning):
    factor = _number(params.get("factor", 1.0), "factor", positive=True)
    inv = base_inv_freq(dim, theta)
    inv[turning:] = 0.0
    return inv / factor, 1.0


_SCALINGS = {
    "default": _default, "linear": _linear, "dynamic": _dynamic, "ntk_alpha": _ntk_alpha,
    "yarn": _yarn, "longrope": _longrope, "llama3": _llama3, "proportional": _proportional,
}
ROPE_TYPES = tuple(_SCALINGS)


def rope_frequencies(
    head_dim: int,
    *,
    theta: float | None = None,
    scaling: Mapping[str, Any] | None = None,
    rotary_dim: int | None = None,
    partial_rotary_factor: float | None = None,
    max_position_embeddings: int | None = None,
    seq_len: int | None = None,
    freq_factors=None,
) -> Frequencies:
    """Inverse frequencies of a RoPE with ``head_dim`` columns, ``rotary_dim`` of them rotated.

    ``scaling`` is a transformers ``rope_parameters``/``rope_scaling`` dict (``rope_type`` or
    ``type``, ``factor``, ...; ``rope_theta``/``partial_rotary_factor`` in it are read too). Keys
    a type does not use are ignored. ``rotary_dim`` (or ``int(head_dim * partial_rotary_factor)``,
    transformers' rule) defaults to head_dim. ``max_position_embeddings`` is needed by
    ``dynamic`` and is the default ``original_max_position_embeddings``; ``seq_len`` (the current
    sequence length, i.e. max position + 1) selects ``dynamic``'s and ``longrope``'s frequencies.
    ``freq_factors`` (``[rotary_dim // 2]``) divide the result pair by pair.
    """
    head_dim = _positive_int(head_dim, "head_dim")
    if scaling is None:
        scaling = {}
    if not isinstance(scaling, Mapping):
        raise ValueError(f"scaling must be a dict of rope parameters or None, got {scaling!r}")
    params = dict(scaling)
    rope_type = params.get("rope_type", params.get("type")) or "default"
    if not isinstance(rope_type, str):
        raise ValueError(f"rope_type must be a string, got {rope_type!r}")
    rope_type = _ALIASES.get(rope_type, rope_type)
    if rope_type == "dynamic" and params.get("alpha") is not None:
        rope_type = "ntk_alpha"  # HunYuan's checkpoints label fixed-alpha NTK "dynamic"
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unknown rope_type {rope_type!r}; known types are {ROPE_TYPES}")
    theta = _merge(theta, params.get("rope_theta"), "theta", "rope_theta")
    theta = 10000.0 if theta is None else _number(theta, "theta", positive=True)
    partial = _merge(partial_rotary_factor, params.get("partial_rotary_factor"),
                     "partial_rotary_factor", "partial_rotary_factor")
    if partial is not None:
        partial = _number(partial, "partial_rotary_factor", positive=True)
        if partial > 1:
            raise ValueError(f"partial_rotary_factor must be in (0, 1], got {partial}")
    if rotary_dim is not None and partial is not None:
        raise ValueError(
            f"pass rotary_dim or partial_rotary_factor, not both (got rotary_dim={rotary_dim}, "
            f"partial_rotary_factor={partial})"
        )
    max_pos = max_position_embeddings
    if max_pos is not None:
        max_pos = _positive_int(max_pos, "max_position_embeddings")
    if seq_len is not None:
        seq_len = _positive_int(seq_len, "seq_len")

    if rope_type == "proportional":
        if rotary_dim is not None:
            raise ValueError(
                f"rope_type='proportional' takes partial_rotary_factor, not rotary_dim={rotary_dim}"
            )
        if head_dim % 2:
            raise ValueError(f"rope_type='proportional' needs an even head_dim, got {head_dim}")
        # exponents over the whole head; only the first `turning` pairs rotate
        dim, turning = head_dim, int((partial or 1.0) * head_dim // 2)
    else:
        if rotary_dim is None:
            if partial is None:
                rotary_dim, name = head_dim, "head_dim (no rotary_dim or partial_rotary_factor given)"
            else:
                rotary_dim = int(head_dim * partial)
                name = f"int(head_dim * partial_rotary_factor) = int({head_dim} * {partial})"
        else:
            rotary_dim = _positive_int(rotary_dim, "rotary_dim")
            name = "rotary_dim"
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise ValueError(
                f"{name} must be a positive even int <= head_dim={head_dim}, got {rotary_dim}"
            )
        dim, turning = rotary_dim, rotary_dim // 2
    if freq_factors is not None:
        freq_factors = _factors(freq_factors, "freq_factors", dim // 2)

    inv, attention = _SCALINGS[rope_type](dim, theta, params, max_pos, seq_len, turning)
    if freq_factors is not None:
        inv = inv / freq_factors
    return Frequencies(inv, head_dim, attention, rope_type)


def _merge(arg, key, arg_name: str, key_name: str):
    """One value from an argument and the same setting inside the scaling dict."""
    if arg is not None and key is not None and arg != key:
        raise ValueError(
            f"{arg_name}={arg!r} disagrees with scaling[{key_name!r}]={key!r}; give it once"
        )
    return key if arg is None else arg


def _get(config, *names):
    """The first of ``names`` that the config (object or dict) has and is not None."""
    for name in names:
        value = config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)
        if value is not None:
            return value
    return None


def frequencies_from_hf(
    config,
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
    layer_type: str | None = None,
) -> Frequencies:
    """``Frequencies`` of a transformers config (a ``PretrainedConfig`` or a config.json dict).

    Reads ``rope_parameters`` (transformers 5) or ``rope_scaling`` + ``rope_theta`` (older
    configs), ``partial_rotary_factor``/``rotary_pct``/``rotary_dim``, ``head_dim`` (else
    ``hidden_size // num_attention_heads``; ``embed_dim`` for axial vision configs),
    ``max_position_embeddings`` and a top-level ``original_max_position_embeddings`` (Phi-3's,
    which wins over the one in the rope dict, as in transformers). Per-layer-type rope
    parameters (Gemma 3/4) need ``layer_type``. ``seq_len`` as in ``rope_frequencies``.

    ``rope_type == "axial"`` (Qwen2-VL's vision tower): the frequencies of one axis, a
    ``Frequencies`` with ``head_dim // 2``; pass them to ``rome.layouts.axial_layout``.
    """
    params = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"config's rope_parameters must be a dict, got {params!r}")
    nested = [k for k, v in params.items() if isinstance(v, Mapping)]
    if nested:
        if layer_type not in nested:
            raise ValueError(
                f"config's rope_parameters are per layer type {nested}: pass layer_type= one of "
                f"them, got {layer_type!r}"
            )
        params = params[layer_type]
    elif layer_type is not None:
        raise ValueError(
            f"config's rope_parameters are not per layer type, got layer_type={layer_type!r}"
        )
    params = dict(params)
    rope_type = params.get("rope_type", params.get("type"))
    rope_type = rope_type or _get(config, "default_rope_type") or "default"
    params["rope_type"] = rope_type
    params.pop("type", None)
    if params.get("rope_theta") is None:
        params["rope_theta"] = _get(config, "rope_theta", "rotary_emb_base", "default_theta")
    if params.get("partial_rotary_factor") is None:
        params["partial_rotary_factor"] = _get(config, "partial_rotary_factor", "rotary_pct")
    rotary_dim = None
    if params["partial_rotary_factor"] is None:
        rotary_dim = _get(config, "rotary_dim")
    if rope_type in ("llama3", "yarn", "longrope"):
        original = _get(config, "original_max_position_embeddings")
        if original is not None:
            params["original_max_position_embeddings"] = original

    if head_dim is None:
        head_dim = _get(config, "head_dim")
    if head_dim is None:
        width = _get(config, "embed_dim", "hidden_size") if rope_type == "axial" else None
        width = width or _get(config, "hidden_size", "n_embd", "d_model")
        heads = _get(config, "num_attention_heads", "num_heads", "n_head")
        if width is None or heads is None:
            raise ValueError(
                "config has no head_dim and no hidden_size/num_attention_heads to derive it; "
                "pass head_dim="
            )
        head_dim = width // heads
    max_pos = _get(config, "max_position_embeddings", "n_positions")
    if rope_type == "axial":
        params["rope_type"] = "default"
        head_dim = _positive_int(head_dim, "head_dim")
        if head_dim % 4:
            raise ValueError(f"axial rope needs head_dim divisible by 4, got {head_dim}")
        f = rope_frequencies(head_dim // 2, scaling=params, max_position_embeddings=max_pos)
        return Frequencies(f.inv_freq, f.head_dim, f.attention_scaling, "axial")
    return rope_frequencies(
        head_dim, scaling=params, rotary_dim=rotary_dim, max_position_embeddings=max_pos,
        seq_len=seq_len,
    )
