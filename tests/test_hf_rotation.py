"""Issue 21 item 4: ``RoPE.from_hf_config`` rotates as transformers' own code does for every
model type it accepts, and refuses (ValueError naming the model type) those it cannot read.

Each model type: a tiny config (``AutoConfig.for_model``, no hub), transformers' rotary module
and its modeling file's ``apply_rotary_pos_emb`` against rome's module at positions up to 63. The
oracle (``_hf_rotation``) decides partial rotary from the config's declared
``partial_rotary_factor`` (the first int(head_dim * f) columns rotated, the rest passed through),
not, as rome's own probe does, from whether a whole-head call fails."""

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
    return _hf_rotation(module, config, q, k, POS)


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
    text = config.get_text_config()
    try:
        rope = RoPE.from_hf_config(config, backend="torch")
    except ValueError as e:
        # refused because transformers' own code does not run on this tiny config (glm_ocr's
        # mrope_section outgrows head_dim on transformers < 5.24): right only if it really does not
        assert "did not run on a probe" in str(e) and f"'{kind}" in str(e), e
        d = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        q = torch.randn(1, 2, POS.shape[1], d, generator=torch.Generator().manual_seed(0))
        with pytest.raises(Exception):  # noqa: B017 - whatever transformers raises
            _transformers_rotation(kind, text, q, q)
        return
    assert {m for m, _ in rope.layout.blocks} - {"none"} == {mode}
    d = rope.head_dim
    q = torch.randn(1, 2, POS.shape[1], d, generator=torch.Generator().manual_seed(0))
    want = _transformers_rotation(kind, text, q, q)
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


class TransformersRaised(Exception):
    """transformers' own rotary module could not be built or run on the config."""


def _as_config(config):
    """A config.json dict as transformers reads it (``AutoConfig.for_model``), else ``config``;
    TransformersRaised where transformers cannot build it."""
    if not isinstance(config, dict):
        return config
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        return transformers.AutoConfig.for_model(config.get("model_type"), **fields)
    except Exception as e:  # noqa: BLE001
        raise TransformersRaised(f"AutoConfig.for_model({config.get('model_type')!r}): {type(e).__name__}: {e}") from e


def _partial_factor(config) -> float:
    """The rotated fraction of the head that the config declares in transformers' standardized
    ``rope_parameters`` (``partial_rotary_factor``, default 1; per layer type: the first type's)."""
    params = getattr(config, "rope_parameters", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):
        params = next(iter(params.values()))
    return float(params.get("partial_rotary_factor", 1.0))


def _hf_rotation(module, config, q, k, pos):
    """The oracle: transformers' own rotary module's tables for ``pos`` and its modeling file's
    ``apply_rotary_pos_emb``, applied as transformers documents ``partial_rotary_factor``: where
    the config declares f < 1, the first int(head_dim * f) columns are rotated (the tables must be
    that wide) and the rest passed through (Phi, GPT-NeoX, StableLM, GLM slice them so);
    otherwise the function gets the whole head, whatever the tables' width (GPT-OSS's half-width
    tables). Decided from the config, not from whether a call fails; TransformersRaised where the
    rotary module itself raises."""
    rotary = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("RotaryEmbedding")
              and "Vision" not in n and v.__module__ == module.__name__]
    assert len(rotary) == 1 and callable(getattr(module, "apply_rotary_pos_emb", None)), \
        f"{module.__name__}: no single text rotary module and apply_rotary_pos_emb to check against"
    try:
        with torch.no_grad():
            module_ = rotary[0](config).to(q.dtype)
            try:
                cos, sin = module_(q, pos)
            except IndexError:  # mRoPE text modules of transformers < 5.24 want [3, B, S] positions
                cos, sin = module_(q, pos.expand(3, -1, -1))
    except Exception as e:  # noqa: BLE001
        raise TransformersRaised(f"{rotary[0].__name__}: {type(e).__name__}: {e}") from e
    d, factor = q.shape[-1], _partial_factor(config)
    with torch.no_grad():
        if getattr(config, "rope_interleave", False):
            # MLA: the pairs rotated and written de-interleaved; back to x's column order (rome's)
            qi, ki = module.apply_rotary_pos_emb_interleave(q, k, cos.to(q.dtype), sin.to(q.dtype))[:2]
            back = torch.argsort(torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)]))
            return qi[..., back], ki[..., back]
        if factor >= 1:
            return module.apply_rotary_pos_emb(q, k, cos.to(q.dtype), sin.to(q.dtype))[:2]
        r = int(d * factor)
        assert cos.shape[-1] == r, (f"{rotary[0].__name__}: tables {cos.shape[-1]} wide, the config's "
                                    f"partial_rotary_factor {factor} of head_dim {d} is {r}")
        qr, kr = module.apply_rotary_pos_emb(q[..., :r], k[..., :r], cos.to(q.dtype), sin.to(q.dtype))[:2]
    return torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1)


def _reference_text(config, rope, gen):
    """transformers' own rotation (``_hf_rotation``) vs rome's module at POS; the max difference."""
    config = _as_config(config)
    d = rope.head_dim
    q = torch.randn(1, 2, POS.shape[1], d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 1, POS.shape[1], d, generator=gen, dtype=torch.float64)
    want = _hf_rotation(_modeling(config), config, q, k, POS)
    got = rope(q, k, POS)
    return max((a - b).abs().max().item() for a, b in zip(got, want))


GRID = torch.tensor([[0, 0], [0, 1], [3, 5], [7, 2], [40, 63], [63, 40]])


def _reference_axial(config, rope, gen):
    """A vision config: transformers' ``...VisionRotaryEmbedding`` on ``[T, 2]`` (row, column)
    patch positions and ``apply_rotary_pos_emb_vision`` vs rome's layout's tables and matrix."""
    from rome import apply_qk
    from rome.layouts import cos_sin_for_positions

    config = _as_config(config)
    module = _modeling(config)
    rotary = [v for n, v in vars(module).items() if isinstance(v, type) and n.endswith("VisionRotaryEmbedding")
              and v.__module__ == module.__name__]
    assert len(rotary) == 1, rotary
    d = rope.head_dim
    q = torch.randn(len(GRID), 2, d, generator=gen, dtype=torch.float64)
    try:
        with torch.no_grad():
            cos, sin = rotary[0](config).double()(q, GRID)
    except Exception as e:  # noqa: BLE001
        raise TransformersRaised(f"{rotary[0].__name__}: {type(e).__name__}: {e}") from e
    with torch.no_grad():
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
    config there is no rotation to compare with, outcome "unchecked"; any other failure of the
    check (transformers' apply function, the tables' width against the config's
    partial_rotary_factor) is a problem in either mode, and an accepted RoPE whose rotation
    transformers computes must still match it."""
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
        params = (text.get("rope_parameters") if isinstance(text, dict) else getattr(text, "rope_parameters", None))
        if rope.n_axes == 2 and (params or {}).get("rope_type") == "axial":
            error = _reference_axial(text, rope, gen)
        else:
            error = _reference_text(text, rope, gen)
    except TransformersRaised as e:
        if not strict:
            return "unchecked", None
        return "accepted", f"accepted ({rope.layout.blocks}) but transformers' rotary module raised: {e}"
    except Exception as e:  # noqa: BLE001 - the oracle itself failed: a problem in either mode
        return "accepted", (f"accepted ({rope.layout.blocks}) but the check against transformers' code failed: "
                            f"{type(e).__name__}: {e}")
    ok = error <= 2e-5
    return "accepted", None if ok else f"accepted ({rope.layout.blocks}), max difference {error:.3g} from transformers"


def test_check_hf_config_unchecked_only_where_transformers_rotary_raises(monkeypatch):
    """The oracle's own outcomes, on Llama (rome reads it from its tables, not from transformers'
    code, so only the oracle sees these changes): "unchecked" (strict=False) only where
    transformers' rotary module raises; its apply function raising, or tables narrower than the
    head with no partial_rotary_factor declared (where running the whole head and, on failure,
    the first columns would have passed), are problems in either mode."""
    warnings.filterwarnings("ignore")
    llama = importlib.import_module("transformers.models.llama.modeling_llama")
    config = transformers.AutoConfig.for_model("llama", **TINY)
    gen = torch.Generator().manual_seed(0)
    for strict in (True, False):
        assert check_hf_config(config, gen, strict=strict) == ("accepted", None)
    real_forward, real_apply = llama.LlamaRotaryEmbedding.forward, llama.apply_rotary_pos_emb

    def raising(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(llama.LlamaRotaryEmbedding, "forward", raising)
    assert check_hf_config(config, gen, strict=False) == ("unchecked", None)
    outcome, problem = check_hf_config(config, gen, strict=True)
    assert outcome == "accepted" and "rotary module raised" in problem and "boom" in problem, problem

    monkeypatch.setattr(llama.LlamaRotaryEmbedding, "forward", real_forward)
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", raising)
    for strict in (True, False):
        outcome, problem = check_hf_config(config, gen, strict=strict)
        assert outcome == "accepted" and "check against transformers' code failed" in problem, problem

    def half_width(self, x, position_ids):  # the rotation of the first 8 columns' frequencies
        cos, sin = real_forward(self, x, position_ids)
        return cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]

    monkeypatch.setattr(llama, "apply_rotary_pos_emb", real_apply)
    monkeypatch.setattr(llama.LlamaRotaryEmbedding, "forward", half_width)
    outcome, problem = check_hf_config(config, gen, strict=False)
    assert outcome == "accepted" and problem is not None, (outcome, problem)


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
