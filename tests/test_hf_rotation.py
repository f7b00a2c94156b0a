"""Issue 21 item 4: ``RoPE.from_hf_config`` rotates as transformers' own code does for every
model type it accepts, and refuses (ValueError naming the model type) those it cannot read.

Each model type: a tiny config (``AutoConfig.for_model``, no hub), transformers' rotary module
and its modeling file's ``apply_rotary_pos_emb`` (on the rotated columns, the rest passed through,
as the partial-rotary attention layers do) against rome's module at positions up to 63."""

import collections
import importlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rome import RoPE  # noqa: E402
from rome.module import HALF_MODEL_TYPES, INTERLEAVE_MODEL_TYPES  # noqa: E402

TINY = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=64, intermediate_size=64, num_hidden_layers=1, vocab_size=50)
POS = torch.tensor([[0, 1, 5, 17, 40, 63]])


def _transformers_rotation(kind, config, q, k):
    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    rotary = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("RotaryEmbedding")
              and "Vision" not in n and v.__module__ == module.__name__]
    fn = module.apply_rotary_pos_emb
    assert len(rotary) == 1, rotary
    with torch.no_grad():
        cos, sin = rotary[0](config)(q, POS)
        r = cos.shape[-1]  # partial rotary: the attention layer rotates the first r columns
        qr, kr = fn(q[..., :r], k[..., :r], cos, sin)[:2]
    return torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1)


# GPT-J and CodeGen rotate inside their attention's forward (no apply_rotary_pos_emb taking
# tables): tests/test_module.py checks them against their formula
INLINE = {"gptj", "codegen"}


@pytest.mark.parametrize("kind", sorted((HALF_MODEL_TYPES | INTERLEAVE_MODEL_TYPES) - INLINE))
def test_known_model_types_rotate_as_transformers(kind):
    warnings.filterwarnings("ignore")
    config = transformers.AutoConfig.for_model(kind, **TINY)
    text = config.get_text_config()
    rope = RoPE.from_hf_config(config, backend="torch")
    d = rope.head_dim
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, POS.shape[1], d, generator=gen), torch.randn(1, 2, POS.shape[1], d, generator=gen)
    want = _transformers_rotation(kind, text, q, k)
    got = rope(q, k, POS)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


# read from the installed code: model types in none of rome's tables
@pytest.mark.parametrize("kind, mode", [("bamba", "half"), ("afmoe", "half"), ("glm_ocr", "interleave")])
def test_unknown_model_type_read_from_transformers_code(kind, mode):
    warnings.filterwarnings("ignore")
    assert kind not in HALF_MODEL_TYPES | INTERLEAVE_MODEL_TYPES
    config = transformers.AutoConfig.for_model(kind, **TINY)
    rope = RoPE.from_hf_config(config, backend="torch")
    assert {m for m, _ in rope.layout.blocks} - {"none"} == {mode}
    d = rope.head_dim
    q = torch.randn(1, 2, POS.shape[1], d, generator=torch.Generator().manual_seed(0))
    want = _transformers_rotation(kind, config.get_text_config(), q, q)
    for a, b in zip(rope(q, q, POS), want):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


@pytest.mark.parametrize("kind, why", [
    ("llama4", "does not define both apply_rotary_pos_emb"),  # complex pairs, freqs_cis
    ("deepseek_v2", "does not define both apply_rotary_pos_emb"),
    ("nanochat", "rotates as none of rome's half or interleave rotation"),
])
def test_unreadable_model_types_refused(kind, why):
    warnings.filterwarnings("ignore")
    config = transformers.AutoConfig.for_model(kind, **TINY)
    with pytest.raises(ValueError, match=rf"model_type '{kind}'.*\(.*{why}"):
        RoPE.from_hf_config(config)


def test_dict_configs_unknown_or_without_model_type():
    with pytest.raises(ValueError, match="has no model_type: rome cannot tell"):
        RoPE.from_hf_config({"head_dim": 16, "rope_theta": 1e4})
    with pytest.raises(ValueError, match=r"model_type 'no_such_model' \(no transformers modeling module"):
        RoPE.from_hf_config({"model_type": "no_such_model", "head_dim": 16, "rope_theta": 1e4})
    rope = RoPE.from_hf_config({"model_type": "afmoe", **TINY})
    assert rope.layout.blocks == (("half", 16),)


# --- every config class transformers registers --------------------------------------------------

CONFIG_MAPPING = transformers.CONFIG_MAPPING


def _modeling(config):
    """The modeling module next to the config's class (the test's own lookup)."""
    return importlib.import_module(type(config).__module__.replace(".configuration_", ".modeling_"))


def _reference_text(config, rope, gen):
    """transformers' own rotary module and apply_rotary_pos_emb (as _transformers_rotation) vs
    rome's module at POS; the max difference."""
    module = _modeling(config)
    rotary = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("RotaryEmbedding")
              and "Vision" not in n and v.__module__ == module.__name__]
    assert len(rotary) == 1 and callable(getattr(module, "apply_rotary_pos_emb", None)), \
        f"{module.__name__}: no single text rotary module and apply_rotary_pos_emb to check against"
    d = rope.head_dim
    q = torch.randn(1, 2, POS.shape[1], d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, POS.shape[1], d, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        cos, sin = rotary[0](config).double()(q, POS)
        r = cos.shape[-1]
        try:  # GPT-OSS: half-width tables for the whole head (its apply splits the head itself)
            want = module.apply_rotary_pos_emb(q, k, cos, sin)[:2]
        except RuntimeError:  # partial rotary: the attention layer rotates the first r columns
            qr, kr = module.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos, sin)[:2]
            want = torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1)
    got = rope(q, k, POS)
    return max((a - b).abs().max().item() for a, b in zip(got, want))


GRID = torch.tensor([[0, 0], [0, 1], [3, 5], [7, 2], [40, 63], [63, 40]])


def _reference_axial(config, rope, gen):
    """A vision config: transformers' ``...VisionRotaryEmbedding`` on ``[T, 2]`` (row, column)
    patch positions and ``apply_rotary_pos_emb_vision`` vs rome's layout's tables and matrix."""
    from rome import apply_qk
    from rome.layouts import cos_sin_for_positions

    module = _modeling(config)
    rotary = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("VisionRotaryEmbedding")
              and v.__module__ == module.__name__]
    assert len(rotary) == 1, rotary
    d = rope.head_dim
    q = torch.randn(len(GRID), 2, d, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        cos, sin = rotary[0](config).double()(q, GRID)
        want = module.apply_rotary_pos_emb_vision(q, q, cos, sin)[0]
    rc, rs = cos_sin_for_positions(rope.layout, GRID, axes_dim=-1, dtype=torch.float64)
    got = apply_qk(q, q, rc.unsqueeze(-2), rs.unsqueeze(-2), rope.matrix(torch.float64), backend="torch")[0]
    return (got - want).abs().max().item()


def _model_types(config):
    """The model types a refusal must name (the config's, its text config's) and the text config."""
    if isinstance(config, dict):  # config.json: rome reads its text_config
        text = config.get("text_config") or config
        kinds = [config.get("model_type")] + ([text.get("model_type")] if text is not config else [])
        return kinds, text
    kinds = [getattr(config, "model_type", None)]
    try:
        text = config.get_text_config()
    except Exception:  # noqa: BLE001 - transformers' own refusal (several text configs)
        text = config
    if text is not config:
        kinds.append(getattr(text, "model_type", None))
    return kinds, text


def check_hf_config(config, gen, strict=True) -> tuple[str, str | None]:
    """``(outcome, problem)``: outcome "accepted" where ``RoPE.from_hf_config(config)`` returned a
    RoPE, checked here against transformers' own code for the config, "refused" where it raised
    a ValueError, which must name the model type(s); problem: None, or what is wrong. 2e-5:
    rome's float64 angles vs transformers' float32 inv_freq at positions < 64. ``strict=False``
    (perturbed configs, tests/test_fuzz.py): where transformers' own rotary code raises on the
    config there is no rotation to compare with, outcome "unchecked" (an accepted RoPE whose
    rotation transformers computes must still match it)."""
    kinds, text = _model_types(config)
    try:
        rope = RoPE.from_hf_config(config, backend="torch")
    except ValueError as e:
        missing = [k for k in kinds if f"model_type {k!r}" not in str(e)]
        return "refused", (f"refusal does not name {missing}: {e}" if missing else None)
    except Exception as e:  # noqa: BLE001 - the defect this looks for
        return "raised", f"{type(e).__name__} (not a ValueError): {e}"
    if kinds[-1] in INLINE:
        return "accepted", None  # tests/test_module.py: test_gptj_interleave
    try:
        if rope.n_axes == 2 and getattr(text, "rope_parameters", {}).get("rope_type") == "axial":
            error = _reference_axial(text, rope, gen)
        else:
            error = _reference_text(text, rope, gen)
    except Exception as e:  # noqa: BLE001
        if not strict:
            return "unchecked", None
        return "accepted", (f"accepted ({rope.layout.blocks}) but transformers' code could not check it: "
                            f"{type(e).__name__}: {e}")
    ok = error <= 2e-5
    return "accepted", None if ok else f"accepted ({rope.layout.blocks}), max difference {error:.3g} from transformers"


def default_configs():
    """``(name, config)``: every class of CONFIG_MAPPING default-constructed, and its nested
    text_config where that is of a class the mapping does not register itself (the others are
    walked as their own entry). Those transformers itself cannot build with defaults are left out
    (gemma4_assistant, nougat in 5.23: its validators or its sub-config lookup refuse)."""
    registered = set(CONFIG_MAPPING.values())
    for kind in sorted(CONFIG_MAPPING.keys()):
        try:
            config = CONFIG_MAPPING[kind]()
        except Exception:  # noqa: BLE001
            continue
        yield kind, config
        text = getattr(config, "text_config", None)
        if text is not None and text is not config and type(text) not in registered:
            yield f"{kind}.text_config", text


def test_every_registered_config_rotates_as_transformers_or_is_refused_by_name():
    """Issue 21: over every config class of the installed transformers, from_hf_config either
    rotates as transformers' own code for that model type or raises a ValueError naming it; never
    another exception (swin's per-stage head counts were a TypeError), never a silently different
    rotation (Pixtral's axial). transformers 5.23: 804 model types, 802 built with defaults, 238
    accepted and checked, 564 refused; about 22 s of CPU (most of it importing modeling files)."""
    warnings.filterwarnings("ignore")
    gen = torch.Generator().manual_seed(0)
    problems, outcomes = {}, collections.Counter()
    for name, config in default_configs():
        outcome, problem = check_hf_config(config, gen)
        outcomes[outcome] += 1
        if problem is not None:
            problems[name] = problem
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())
    assert outcomes["accepted"] > 150 and outcomes["refused"] > 250, outcomes  # the registry was walked


@pytest.mark.parametrize("kind, why", [
    ("swin", r"num_attention_heads=\(3, 6, 12, 24\) is not one head count"),
    ("pixtral", "does not define both apply_rotary_pos_emb_vision"),  # its own 2D rotary
    ("kimi_k25_vision", "lays its rope_type 'axial' out otherwise"),
    ("gemma4", "AmbiguousGlobalPerLayerAttributeError"),
    ("deepseek_v3", "rope_interleave=True"),
])
def test_refusals_name_the_model_type(kind, why):
    warnings.filterwarnings("ignore")
    config = CONFIG_MAPPING[kind]()
    with pytest.raises(ValueError, match=rf"model_type '{kind}'.*{why}"):
        RoPE.from_hf_config(config)


def test_composite_refusal_names_both_model_types():
    warnings.filterwarnings("ignore")
    config = CONFIG_MAPPING["llava"](text_config={"model_type": "llama4_text"})
    with pytest.raises(ValueError, match=r"model_type 'llava', text config model_type 'llama4_text'"):
        RoPE.from_hf_config(config)


def test_axial_read_from_the_vision_code():
    """A vision type outside AXIAL_MODEL_TYPES whose installed code is Qwen2-VL's axial layout is
    accepted (probe_axial) and rotates as that code."""
    warnings.filterwarnings("ignore")
    from rome.module import AXIAL_MODEL_TYPES

    config = CONFIG_MAPPING["glm4v_vision"]()
    assert config.model_type not in AXIAL_MODEL_TYPES
    rope = RoPE.from_hf_config(config, backend="torch")
    assert _reference_axial(config, rope, torch.Generator().manual_seed(0)) <= 2e-5
