"""rome.integrations.patch on the transformers families of issue 19: MoE (Qwen2/3-MoE, Mixtral),
Gemma 2/3 (local and global bases), Phi-3/Phi-4 (LongRoPE, partial rotary), Qwen3-VL / Qwen3.5
(interleaved mRoPE), DeepSeek-V3 and GLM-4.7-Flash (MLA, interleaved pairs), Llama 4 (complex
rotary), GPT-OSS (half-width tables), GLM / GLM-4 (adjacent pairs, partial), GLM-4.5 (MoE); and
the GLM-4V family's refusal.

Every model is a tiny random one (1 layer; 2 for Gemma 3 and the hybrid Qwen3.5: one per layer type; hidden 64) with a fixed seed; the reference is the
same model unpatched: logits within FP32_REL of its largest value, gradients within
rtol 1e-4 / atol 1e-5 x the gradient's largest value, greedy generation with a KV cache the same
tokens with each step's logits within FP32_REL. rome's tables come from float64 angles rounded
once, transformers' from float32 angles, so the two differ by ~1e-7 relative (measured <= 5e-7).
Where rome computes the rotation differently from the modeling file (another table format, the
complex product, a per-layer-type or length-dependent base, interleaved mRoPE) the patched
rotation is also compared with the modeling file's own function on the unpatched module's own
tables, on random q and k (``test_rotation_against_model_tables``).
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402

from rome.integrations import patch  # noqa: E402
from rome.integrations import transformers as rome_tf  # noqa: E402
from helpers import RomeCalls, max_rel, token_ids  # noqa: E402

FP32_REL = 1e-5
TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=97, max_position_embeddings=64, pad_token_id=0,
            eos_token_id=None, bos_token_id=None)
MOE = dict(moe_intermediate_size=32, num_experts_per_tok=2)
MLA = dict(kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8,
           v_head_dim=8, num_key_value_heads=4, n_routed_experts=4, n_group=1, topk_group=1,
           first_k_dense_replace=1, **MOE)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0}
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 16, "partial_rotary_factor": 0.75,
            "short_factor": [1.0 + i / 12 for i in range(6)],
            "long_factor": [2.0 + i / 3 for i in range(6)]}

# family -> (model class, config class, config arguments); model_type in the comment where the
# family name is not it
FAMILIES = {
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig",
                  dict(num_experts=4, shared_expert_intermediate_size=32, **MOE)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(num_experts=4, head_dim=16, **MOE)),
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(head_dim=16, sliding_window=4)),
    # local (sliding) layers: base 1e4; global: base 1e6 with linear scaling 8 (Gemma 3's)
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        head_dim=16, sliding_window=4, layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}})),
    # Phi-4-mini: LongRoPE with short/long factors and partial rotary 0.75
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(rope_parameters=LONGROPE, original_max_position_embeddings=16)),
    # MLA, interleaved pairs (rope_interleave=True, DeepSeek-V3's default), YaRN
    "deepseek_v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(
        rope_parameters={**YARN, "mscale": 1.0, "mscale_all_dim": 1.0}, **MLA)),
    "deepseek_v3_half": ("DeepseekV3ForCausalLM", "DeepseekV3Config", dict(rope_interleave=False, **MLA)),
    # complex rotary (freqs_cis), Llama 3 scaling as Llama 4 ships
    "llama4": ("Llama4ForCausalLM", "Llama4TextConfig", dict(
        head_dim=16, intermediate_size_mlp=96, num_local_experts=2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16})),
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig", dict(
        head_dim=16, sliding_window=4, num_local_experts=4, num_experts_per_tok=2,
        rope_parameters={**YARN, "truncate": False})),
    "glm": ("GlmForCausalLM", "GlmConfig", dict(head_dim=16)),  # adjacent pairs, partial 0.5
    "glm4": ("Glm4ForCausalLM", "Glm4Config", dict(head_dim=16)),
    "glm4_moe": ("Glm4MoeForCausalLM", "Glm4MoeConfig", dict(  # GLM-4.5: rotate_half, partial 0.5
        head_dim=16, n_routed_experts=4, n_group=1, topk_group=1, first_k_dense_replace=1, **MOE)),
    "glm4_moe_lite": ("Glm4MoeLiteForCausalLM", "Glm4MoeLiteConfig", MLA),  # MLA like DeepSeek-V3
    # Qwen3.5: linear-attention and full-attention layers, interleaved mRoPE, partial rotary 0.25
    "qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig", dict(
        head_dim=32, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, num_hidden_layers=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]})),
    "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig", dict(
        head_dim=32, layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        num_experts=4, shared_expert_intermediate_size=32, num_hidden_layers=2, **MOE,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]})),
}


def _build(family, **extra):
    cls_name, config_name, kw = FAMILIES[family]
    cls, config = getattr(transformers, cls_name, None), getattr(transformers, config_name, None)
    if cls is None or config is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    torch.manual_seed(0)
    return cls(config(**{**TEXT, **kw, **extra})).eval()




def _rope_layers(model) -> int:
    """Attention layers that rotate q and k: Qwen3.5's linear-attention layers have no RoPE,
    Llama 4's NoPE layers (``use_rope`` False) skip it."""
    return sum(type(m).__name__.endswith("Attention") and getattr(m, "use_rope", True)
               for m in model.modules())


def _patched(model):
    return sorted({type(m).__name__ for m in model.modules() if "forward" in m.__dict__})


# --- outputs, gradients, generation -----------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_unpatched(family, monkeypatch):
    """Logits (one rome launch per RoPE layer; undo bitwise) and every parameter's gradient."""
    model = _build(family)
    ids = token_ids()
    count = RomeCalls(monkeypatch, rome_tf)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    handle = patch(model, backend="torch")
    try:
        assert any(n.endswith("RotaryEmbedding") for n in _patched(model)), _patched(model)
        with torch.no_grad():
            out = model(input_ids=ids).logits
    finally:
        handle.undo()
    assert _patched(model) == []
    n = _rope_layers(model)
    assert n >= 1 and count.n == n
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    assert max_rel(out, ref) <= FP32_REL, max_rel(out, ref)

    model.train()

    def grads():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    want = grads()
    with patch(model, backend="torch"):
        got = grads()
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4,
                                   atol=1e-5 * want[k].abs().max().item() + 1e-12, msg=k)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in ("deepseek_v3_half",)])
def test_family_greedy_generation(family, monkeypatch):
    """Greedy decoding with a KV cache (prefill 6, then 3 single-token steps through rome): the
    same tokens, each step's logits within FP32_REL (Phi-3: positions pass the original 16, so
    the decode steps switch to LongRoPE's long factors, as transformers does)."""
    model = _build(family)
    ids = token_ids(1, 14 if family == "phi3" else 6)
    kw = dict(max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)
    ref = model.generate(ids, **kw)
    count = RomeCalls(monkeypatch, rome_tf)
    with patch(model, backend="torch"):
        got = model.generate(ids, **kw)
    assert count.n == 4 * _rope_layers(model)
    assert torch.equal(got.sequences, ref.sequences)
    for a, b in zip(got.logits, ref.logits):
        assert max_rel(a, b) <= FP32_REL


# --- the rotation against the model's own tables -----------------------------------------------


def _modeling(model):
    kind = model.config.model_type.removesuffix("_text")
    return importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")


def _tables_case(family, layer_type=None, length=12):
    """(model, rotary module, attention layer, function name, q, k, rotary args)."""
    model = _build(family)
    rotary = next(m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    layer = next(m for m in model.modules()
                 if type(m).__name__.endswith("Attention") and getattr(m, "use_rope", True))
    function = rome_tf._FAMILIES[model.config.model_type.removesuffix("_text")][0].plan(model.config)[0]
    d = rotary.config.qk_rope_head_dim if hasattr(rotary.config, "qk_rope_head_dim") else layer.head_dim
    gen = torch.Generator().manual_seed(3)
    if family == "llama4":  # [B, S, N, D]
        q, k = torch.randn(2, length, 4, d, generator=gen), torch.randn(2, length, 2, d, generator=gen)
    else:
        q, k = torch.randn(2, 4, length, d, generator=gen), torch.randn(2, 2, length, d, generator=gen)
    pos = torch.arange(length).expand(2, length)
    if family.startswith("qwen3_5"):  # t, h, w of an image-like span: interleaved mRoPE reads all three
        pos = torch.stack([pos, pos // 3, pos % 3 + 5])
    args = (q, pos) + (() if layer_type is None else (layer_type,))
    return model, rotary, layer, function, q, k, args


def _rotations(family, layer_type=None, length=12):
    """transformers' function on its own tables; the patched function on rome's tables and on
    transformers' own; and the two tables."""
    model, rotary, layer, function, q, k, args = _tables_case(family, layer_type, length)
    theirs = getattr(_modeling(model), function)
    hf_tables = rotary(*args)
    hf_tables = hf_tables if isinstance(hf_tables, tuple) else (hf_tables,)
    with patch(model, backend="torch"):
        ours = inspect.unwrap(layer.forward.__func__).__globals__[function]
        assert ours is not theirs
        rome_tables = rotary(*args)
        rome_tables = rome_tables if isinstance(rome_tables, tuple) else (rome_tables,)
        got = ours(q, k, *rome_tables)
        got_hf = ours(q, k, *hf_tables)  # a patched layer handed transformers' own tables
    if getattr(ours, "over", None) is not None:  # the layer's q/k norms fused: the function normalises
        assert ours.over == "head"
        q, k = (type(n).forward(n, x) for n, x in ((layer.q_norm, q), (layer.k_norm, k)))
    want = theirs(q, k, *hf_tables)
    return want, got, got_hf, hf_tables, rome_tables


def _close(got, want, atol=2e-5):
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)


# (family, layer type, length): Gemma 3's two bases, Phi's short and long factors (length past
# the original 16), the complex product, GPT-OSS's half-width tables, GLM's pairs, mRoPE
TABLES = [("gemma3", "sliding_attention", 12), ("gemma3", "full_attention", 12), ("phi3", None, 12),
          ("phi3", None, 40), ("llama4", None, 40), ("gpt_oss", None, 40), ("glm4", None, 12),
          ("qwen3_5", None, 12), ("deepseek_v3_half", None, 12)]


@pytest.mark.parametrize("family,layer_type,length", TABLES)
def test_rotation_against_model_tables(family, layer_type, length):
    """The patched rotation equals the modeling file's own function on the unpatched module's
    own tables (within 2e-5: transformers' fp32 angles at positions < 40 are off by <= 40 ulp
    of 1, rome's by half an ulp), on rome's tables and on transformers' (which a patched layer
    reads in the file's own format)."""
    want, got, got_hf, hf_tables, rome_tables = _rotations(family, layer_type, length)
    _close(got, want)
    _close(got_hf, want)
    assert hf_tables[0].shape == rome_tables[0].shape or family in ("phi3", "gpt_oss", "qwen3_5")


def test_gemma3_layer_types_use_their_own_base():
    """The local and global layers get different tables from the one patched module, each the
    module's own for that layer type."""
    tables = {t: _rotations("gemma3", t)[4] for t in ("sliding_attention", "full_attention")}
    assert not torch.allclose(tables["sliding_attention"][0], tables["full_attention"][0])


def test_phi3_long_factors_past_original_length():
    """Positions past original_max_position_embeddings (16) rotate by the long factors: the
    tables of the first 12 positions differ between a 12- and a 40-token call, in rome's as in
    transformers' module."""
    short, long_ = _rotations("phi3", None, 12), _rotations("phi3", None, 40)
    for i in (3, 4):  # hf, rome tables
        assert not torch.allclose(short[i][0][:, :12], long_[i][0][:, :12])


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe_lite"])
def test_mla_interleaved_pairs(family):
    """MLA with rope_interleave: transformers rotates adjacent pairs and writes them
    de-interleaved (first members, then second members); rome rotates the same pairs in place.
    The patched result, de-interleaved, equals transformers' within 2e-5, and q·k (what the
    attention reads) equals without any permutation."""
    want, got, got_hf, _, _ = _rotations(family, None, 40)

    def deinterleave(x):
        return torch.cat([x[..., 0::2], x[..., 1::2]], -1)

    _close([deinterleave(t) for t in got], want)
    _close([deinterleave(t) for t in got_hf], want)
    scores = got[0] @ got[1].repeat_interleave(2, 1).transpose(-1, -2)
    ref = want[0] @ want[1].repeat_interleave(2, 1).transpose(-1, -2)
    torch.testing.assert_close(scores, ref, rtol=0, atol=1e-4)


def _qwen3_vl(kind):
    """A tiny Qwen3-VL / Qwen3-VL-MoE and an input with one 4x8-patch image (8 merged tokens)."""
    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64, max_position_embeddings=128, head_dim=32,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [6, 5, 5]})
    vision = dict(depth=2, num_heads=2, in_channels=3, patch_size=2, temporal_patch_size=2,
                  spatial_merge_size=2, hidden_size=32, intermediate_size=48, out_hidden_size=64,
                  num_position_embeddings=16, deepstack_visual_indexes=[1])
    if kind == "qwen3_vl_moe":
        text.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
        names = ("Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeConfig")
    else:
        names = ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig")
    cls, config = (getattr(transformers, n, None) for n in names)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {names[0]}")
    torch.manual_seed(0)
    model = cls(config(text_config=text, vision_config=vision, image_token_id=60, video_token_id=61,
                       vision_start_token_id=62, vision_end_token_id=63)).eval()
    ids = torch.cat([torch.tensor([[5, 6, 7, 62]]), torch.full((1, 8), 60),
                     torch.tensor([[63, 8, 9, 10]])], dim=1)
    pixels = torch.randn(32, 3 * 2 * 2 * 2, generator=torch.Generator().manual_seed(2))
    return model, {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": torch.tensor([[1, 4, 8]]),
                   "mm_token_type_ids": (ids == 60).int()}


@pytest.mark.parametrize("kind", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_text_and_vision(kind, monkeypatch):
    """Interleaved mRoPE text positions (t, h, w of the image tokens) and the 2D axial vision
    tower, both patched: logits within FP32_REL, one rome launch per attention layer."""
    model, inputs = _qwen3_vl(kind)
    count = RomeCalls(monkeypatch, rome_tf)
    with torch.no_grad():
        ref = model(**inputs).logits
    with patch(model, backend="torch"):
        patched = _patched(model)
        with torch.no_grad():
            out = model(**inputs).logits
    assert sum("RotaryEmbedding" in n for n in patched) == 2 and sum("Attention" in n for n in patched) == 2
    assert count.n == _rope_layers(model) == 4
    assert max_rel(out, ref) <= FP32_REL, max_rel(out, ref)


@pytest.mark.parametrize("kind", ["qwen3_vl", "qwen3_vl_moe"])
def test_qwen3_vl_gradients_and_generation(kind, monkeypatch):
    """With the image input: every parameter's gradient (the vision tower's included) as the
    unpatched model's (rtol 1e-4, atol 1e-5 x the largest), and greedy generation with a KV cache
    (prefill with the image: 2 text + 2 vision launches; then one launch per text layer and step,
    positions continuing from the mRoPE deltas): the same tokens, each step's logits within FP32_REL."""
    model, inputs = _qwen3_vl(kind)
    labels = inputs["input_ids"]

    def grads():
        model.zero_grad(set_to_none=True)
        model(**inputs, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.train()
    want = grads()
    with patch(model, backend="torch"):
        got = grads()
    assert want.keys() == got.keys() and any(n.startswith("model.visual.") for n in want), sorted(want)[:5]
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-4, atol=1e-5 * want[n].abs().max().item() + 1e-12,
                                   msg=n)

    model.eval()
    kw = dict(max_new_tokens=3, do_sample=False, use_cache=True, pad_token_id=0, eos_token_id=None,
              output_logits=True, return_dict_in_generate=True)
    ref = model.generate(**inputs, **kw)
    count = RomeCalls(monkeypatch, rome_tf)
    with patch(model, backend="torch"):
        out = model.generate(**inputs, **kw)
    text_layers = model.config.text_config.num_hidden_layers
    vision_layers = model.config.vision_config.depth
    assert count.n == vision_layers + text_layers * 3, count.n  # the vision tower once, the text layers each step
    assert out.sequences.shape[1] == labels.shape[1] + 3
    assert torch.equal(out.sequences, ref.sequences)
    for a, b in zip(out.logits, ref.logits, strict=True):
        assert max_rel(a, b) <= FP32_REL, max_rel(a, b)


def test_qwen3_vl_tables():
    """Qwen3-VL's text rotary (interleaved mRoPE on [3, B, S] positions) and vision rotary
    (rows, columns): the patched rotation equals the modeling file's on the module's own tables."""
    model, _ = _qwen3_vl("qwen3_vl")
    mod = _modeling(model)
    text_rotary, vision_rotary = model.model.language_model.rotary_emb, model.model.visual.rotary_pos_emb
    text_layer = model.model.language_model.layers[0].self_attn
    vision_layer = model.model.visual.blocks[0].attn
    gen = torch.Generator().manual_seed(3)
    pos = torch.stack([torch.arange(12), torch.arange(12) // 4 + 3, torch.arange(12) % 4 + 3])[:, None]
    q, k = torch.randn(1, 2, 12, 32, generator=gen), torch.randn(1, 1, 12, 32, generator=gen)
    grid = torch.stack([torch.arange(16) // 4, torch.arange(16) % 4], -1)  # [T, 2] (h, w)
    vq, vk = torch.randn(16, 2, 16, generator=gen), torch.randn(16, 2, 16, generator=gen)
    want = mod.apply_rotary_pos_emb(q, k, *text_rotary(q, pos))
    want_v = mod.apply_rotary_pos_emb_vision(vq, vk, *vision_rotary(vq, grid))
    with patch(model, backend="torch"):
        got = inspect.unwrap(text_layer.forward.__func__).__globals__["apply_rotary_pos_emb"](q, k, *text_rotary(q, pos))
        got_v = inspect.unwrap(vision_layer.forward.__func__).__globals__["apply_rotary_pos_emb_vision"](
            vq, vk, *vision_rotary(vq, grid))
    _close(got, want)
    _close(got_v, want_v)


# --- the Triton kernel, one family per rotation kind ----------------------------------------


@pytest.mark.parametrize("family", ["gemma3", "phi3", "deepseek_v3", "llama4", "gpt_oss", "glm4", "qwen3_5"])
def test_family_triton_backend(family, monkeypatch):
    """The Triton kernel (under the interpreter without a GPU) in one patched layer of each
    rotation kind: per-layer-type bases, LongRoPE + partial, MLA pairs, complex, half-width
    tables, GLM's pairs + partial, interleaved mRoPE + partial."""
    model = _build(family)
    ids = token_ids(1, 20 if family == "phi3" else 6)
    count = RomeCalls(monkeypatch, rome_tf)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        with patch(model, backend="triton"):
            out = model(input_ids=ids).logits
    assert count.n == _rope_layers(model) >= 1
    assert max_rel(out, ref) <= FP32_REL, max_rel(out, ref)


# --- refusals, the supported list ------------------------------------------------------------


@pytest.mark.parametrize("names", [("Glm4vTextModel", "Glm4vTextConfig"),
                                   ("Glm4vMoeTextModel", "Glm4vMoeTextConfig")])
def test_glm4v_refused_naming_what_rome_cannot_express(names):
    cls, config = (getattr(transformers, n, None) for n in names)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {names[0]}")
    torch.manual_seed(0)
    kw = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=97, pad_token_id=0)
    if "Moe" in names[0]:
        kw.update(moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
                  topk_group=1, first_k_dense_replace=1)
    model = cls(config(**kw))
    with pytest.raises(ValueError, match=rf"{names[0]}.*'glm4v(_moe)?'.*adjacent column pairs"):
        patch(model)
    assert _patched(model) == []


def test_supported_lists_the_new_families():
    names = rome_tf.SUPPORTED
    new = [n for n in names if n.startswith(("Qwen2Moe", "Qwen3Moe", "Mixtral", "Gemma", "Phi3",
                                             "Qwen3VL", "Qwen3_5", "DeepseekV3", "Llama4", "GptOss",
                                             "Glm"))]
    assert len(new) >= 30
    for n in new:
        assert hasattr(transformers, n), n


# --- q/k norms fused into the rotation (rome.apply_qk_norm) ------------------------------------

NORMED = {  # family -> (model class, config class, config arguments, over)
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=16), "head"),
    "qwen3_moe": (*FAMILIES["qwen3_moe"], "head"),
    "gemma3": (*FAMILIES["gemma3"], "head"),  # Gemma3RMSNorm: x̂ * (1 + w)
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(), "heads"),  # over all heads, before the view
}


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("family", NORMED)
def test_norms_fused(family, backend, monkeypatch):
    """Qwen3, Qwen3-MoE, Gemma 3 and OLMo 2 patched: each layer's q/k norm modules pass their input
    through (their own computation never runs) and one rome.apply_qk_norm per layer normalises and
    rotates; logits within the fp32 tolerance (norm weights drawn away from 1, so that a norm left
    out or applied twice would show); state_dict unchanged; gradients of every parameter (the norm
    weights' too, torch backend); undo bitwise."""
    cls_name, config_name, kw, over = NORMED[family]
    cls, config = getattr(transformers, cls_name, None), getattr(transformers, config_name, None)
    if cls is None or config is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    torch.manual_seed(0)
    model = cls(config(**{**TEXT, **kw})).eval()
    norms = [m for n, m in model.named_modules() if n.endswith(("q_norm", "k_norm"))]
    with torch.no_grad():
        for m in norms:
            m.weight.uniform_(-0.5, 1.5)
    ran = []
    for norm_cls in {type(m) for m in norms}:
        real = norm_cls.forward
        monkeypatch.setattr(norm_cls, "forward", lambda self, x, _real=real: (
            any(self is m for m in norms) and ran.append(self)) or _real(self, x))
    ids = token_ids(1, 8)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    assert len(ran) == len(norms) > 0
    keys = list(model.state_dict())
    handle = patch(model, backend=backend)  # (it runs each norm once on a probe: their formula checked)
    count = RomeCalls(monkeypatch, rome_tf)  # (after patch: a discovered family's probe rotates once)
    ran.clear()
    try:
        assert list(model.state_dict()) == keys
        with torch.no_grad():
            out = model(input_ids=ids).logits
        assert ran == [] and count.by == {"apply_qk_norm": _rope_layers(model)}
        assert max_rel(out, ref) < 1e-5
        if backend == "torch":
            assert_gradients_match(model, handle, ids)
    finally:
        handle.undo()
    ran.clear()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)
    assert len(ran) == len(norms)  # the model's own norms again


def assert_gradients_match(model, handle, ids):
    """Every parameter's gradient of sum(logits²) patched against unpatched (the patch undone
    and redone around it): within 1e-4 relative of the largest."""
    def grads():
        model.zero_grad()
        model(input_ids=ids).logits.pow(2).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    patched = grads()
    handle.undo()
    plain = grads()
    assert patched.keys() == plain.keys()
    for n in plain:
        scale = max(plain[n].abs().max().item(), 1e-12)
        assert (patched[n] - plain[n]).abs().max().item() <= 1e-4 * scale + 1e-7, n
