"""Which rotation a transformers model type applies, read from the installed model code.

``rome.RoPE.from_hf_config`` knows the rotation of the model types in its tables
(``HALF_MODEL_TYPES``, ``INTERLEAVE_MODEL_TYPES``, ``MROPE_MODEL_TYPES``). For any other model
type it asks transformers' own code: ``probe_mode`` builds the model type's rotary module from the
config (no weights, CPU), runs its modeling file's ``apply_rotary_pos_emb`` on random q and k at
a few positions, and compares the result with rome's half and interleave rotations of the same
frequencies. A match names the mode; anything else (no such module or function, a rotary module
it cannot build or call, a result neither rotation gives: Llama 4's and DeepSeek-V2's complex
pairs, a per-head or per-layer variant) is a ValueError naming the model type.
"""

from __future__ import annotations

import importlib
import inspect

import torch

__all__ = ["PROBE_LENGTH", "modeling_module", "probe_axial", "probe_mode"]

_POSITIONS = (0, 1, 5, 17, 63)
PROBE_LENGTH = max(_POSITIONS) + 1  # the sequence length length-dependent layouts are built for


def _cannot(kind: str, why: str) -> ValueError:
    return ValueError(
        f"rome cannot tell the rotation of model_type {kind!r} ({why}); build the layout yourself: "
        f"RoPE(rope_layout(frequencies_from_hf(config), mode='half' or 'interleave'))"
    )


def modeling_module(config, kind: str) -> str:
    """The name of the transformers modeling module of ``config``: its config class's sibling
    (``transformers.models.<m>.configuration_<m>`` -> ``modeling_<m>``; a config object names its
    code whatever its ``model_type`` string says), else transformers' own map from ``kind`` to
    its folder (``clip_text_model`` -> ``clip``, ``kyutai_speech_to_text`` stays whole)."""
    owner = type(config).__module__ if not isinstance(config, dict) else ""
    package, _, leaf = owner.rpartition(".")
    if package.startswith("transformers.models.") and leaf.startswith("configuration_"):
        return f"{package}.modeling_{leaf[len('configuration_'):]}"
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    name = model_type_to_module_name(kind)
    return f"transformers.models.{name}.modeling_{name}"


def _config_object(config, kind: str):
    if not isinstance(config, dict):
        return config
    try:
        from transformers import AutoConfig

        fields = {k: v for k, v in config.items() if k != "model_type"}
        return AutoConfig.for_model(kind, **fields)
    except Exception as e:  # noqa: BLE001 - any failure means: cannot tell
        raise _cannot(kind, f"transformers cannot build its config: {type(e).__name__}: {e}") from None


def _installed_rotary(config, kind: str, *, vision: bool):
    """The installed transformers modeling module's rotary function and its one rotary module class
    for ``config`` (text: ``apply_rotary_pos_emb`` and ``...RotaryEmbedding``; vision:
    ``apply_rotary_pos_emb_vision`` and ``...VisionRotaryEmbedding``); ValueError naming ``kind``
    where it has not exactly those."""
    try:
        module = importlib.import_module(modeling_module(config, kind))
    except Exception as e:  # noqa: BLE001
        raise _cannot(kind, f"no transformers modeling module to read: {type(e).__name__}: {e}") from None
    name = "apply_rotary_pos_emb_vision" if vision else "apply_rotary_pos_emb"
    fn = getattr(module, name, None)
    rotary_classes = [
        v for n, v in vars(module).items()
        if isinstance(v, type) and v.__module__ == module.__name__
        and (n.endswith("VisionRotaryEmbedding") if vision else n.endswith("RotaryEmbedding") and "Vision" not in n)
    ]
    if not callable(fn) or len(rotary_classes) != 1:
        raise _cannot(kind, f"{module.__name__} does not define both {name} and one {'vision' if vision else 'text'} "
                            f"rotary module (found {[c.__name__ for c in rotary_classes]})")
    return fn, rotary_classes[0]


def probe_mode(config, kind: str, layouts: dict, layer_type=None) -> str:
    """The mode among ``layouts`` (``{"half": RopeLayout, "interleave": RopeLayout}``, rome's
    reading of ``config`` in each mode) whose rotation equals what transformers' installed code
    for ``kind`` computes; ValueError naming ``kind`` where it cannot tell."""
    from .layouts import cos_sin_for_positions
    from .ops import apply_qk

    fn, rotary_cls = _installed_rotary(config, kind, vision=False)
    config = _config_object(config, kind)
    head_dim = next(iter(layouts.values())).head_dim
    # the probe on the CPU whatever the default device (a model built under torch.device("meta")
    # is patched before its weights exist)
    with torch.device("cpu"), torch.no_grad():
        pos = torch.tensor([_POSITIONS])
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(1, 2, len(_POSITIONS), head_dim, generator=gen, dtype=torch.float64)
        k = torch.randn(1, 1, len(_POSITIONS), head_dim, generator=gen, dtype=torch.float64)
        try:
            rotary = rotary_cls(config).double()
            params = inspect.signature(rotary.forward).parameters
            extra = (layer_type,) if "layer_type" in params and layer_type is not None else ()
            try:
                cos, sin = rotary(q, pos, *extra)
            except IndexError:  # an mRoPE module that wants [3, B, S] (transformers < 5.24):
                cos, sin = rotary(q, pos.expand(3, -1, -1), *extra)  # text tokens, equal on each axis
            theirs = _rotate(fn, q, k, cos.double(), sin.double())
        except Exception as e:  # noqa: BLE001
            raise _cannot(kind, f"its rotary code did not run on a probe: {type(e).__name__}: {e}") from None
        errors = {}
        for mode, layout in layouts.items():
            rc, rs = cos_sin_for_positions(layout, pos[0], dtype=torch.float64)
            ours = apply_qk(q, k, rc, rs, layout.matrix(torch.float64), backend="torch")
            errors[mode] = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    mode = min(errors, key=errors.get)
    if not errors[mode] <= 1e-3:  # the other mode, or another rotation, is off by O(1)
        raise _cannot(kind, f"transformers' code rotates as none of rome's {' or '.join(errors)} rotation of "
                            f"the config's frequencies and rotated columns {next(iter(layouts.values())).blocks} "
                            f"(max differences {errors})")
    return mode


def _rotate(fn, q, k, cos, sin):
    """``apply_rotary_pos_emb`` as the attention layers call it: on the whole head where the
    tables fit it (GPT-OSS's half-width tables too), else, tables narrower than the head only, on
    the first ``cos.shape[-1]`` columns, the rest passed through (partial rotary: Phi, GPT-NeoX,
    StableLM). A failure with tables as wide as the head is the function's own: raised."""
    try:
        return fn(q, k, cos, sin)[:2]
    except RuntimeError:
        r = cos.shape[-1]
        if r >= q.shape[-1]:
            raise
        qr, kr = fn(q[..., :r], k[..., :r], cos, sin)[:2]
        return torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1)


_GRID = ((0, 0), (0, 1), (3, 5), (7, 2), (40, 63))  # (row, column) of a few patches


def probe_axial(config, kind: str, layout) -> None:
    """Check that transformers' installed vision code for ``kind`` rotates as ``layout`` (rome's
    axial layout of ``config``: Qwen2-VL's rows then columns, one half rotation): its one
    ``...VisionRotaryEmbedding`` on ``[T, 2]`` patch positions and its
    ``apply_rotary_pos_emb_vision``; ValueError naming ``kind`` otherwise (another axial layout,
    Pixtral's or Kimi-K2.5's alternating axes; code it cannot find or run)."""
    from .layouts import cos_sin_for_positions
    from .ops import apply_qk

    fn, rotary_cls = _installed_rotary(config, kind, vision=True)
    with torch.device("cpu"), torch.no_grad():  # (whatever the default device: see probe_mode)
        pos = torch.tensor(_GRID)
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(len(_GRID), 2, layout.head_dim, generator=gen, dtype=torch.float64)
        k = torch.randn(len(_GRID), 1, layout.head_dim, generator=gen, dtype=torch.float64)
        try:
            cos, sin = rotary_cls(_config_object(config, kind)).double()(q, pos)
            theirs = fn(q, k, cos.double(), sin.double())[:2]
        except Exception as e:  # noqa: BLE001
            raise _cannot(kind, f"its vision rotary code did not run on a probe: {type(e).__name__}: {e}") from None
        rc, rs = cos_sin_for_positions(layout, pos, axes_dim=-1, dtype=torch.float64)
        ours = apply_qk(q, k, rc.unsqueeze(-2), rs.unsqueeze(-2), layout.matrix(torch.float64), backend="torch")
        error = max((a - b).abs().max().item() for a, b in zip(ours, theirs))
    if not error <= 1e-3:
        raise _cannot(kind, f"transformers' vision code lays its rope_type 'axial' out otherwise than rome's "
                            f"axial layout (rows then columns, one half rotation; max difference {error:.3g})")
