"""rome.integrations.patch on transformers models: outputs, gradients, compile, generation, undo.

Every model is built from a tiny random config with a fixed seed (no weights). The reference is
the same model unpatched. rome's tables come from float64 angles rounded once; transformers'
from float32 angles (``position * inv_freq`` rounded in fp32), so the two differ by ~1e-7
relative and ``test_rome_tables_nearer_float64_truth`` measures which is nearer the truth.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

import rome  # noqa: E402
from rome.integrations import patch  # noqa: E402
from rome.integrations import transformers as rome_tf  # noqa: E402
from helpers import RomeCalls, max_rel, token_ids  # noqa: E402

FP32_REL = 1e-5  # the brief's bound for fp32 outputs, relative to the output's largest value

TEXT = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=97, max_position_embeddings=64)


def _llama(rope=None, *, cls=transformers.LlamaForCausalLM, config=transformers.LlamaConfig, **kw):
    torch.manual_seed(0)
    args = {**TEXT, **kw}
    if rope is not None:
        args["rope_parameters"] = rope
    return cls(config(**args)).eval()




def _n_attention(model):
    return sum(type(m).__name__.endswith("Attention") for m in model.modules())


def _check_patch(model, inputs, monkeypatch, *, backend="torch", rel=FP32_REL):
    """Unpatched vs patched vs undone: patched within ``rel`` with one rome launch per attention
    layer, undone bitwise equal."""
    count = RomeCalls(monkeypatch, rome_tf)
    with torch.no_grad():
        ref = model(**inputs).logits
    assert count.n == 0
    handle = patch(model, backend=backend)
    try:
        with torch.no_grad():
            out = model(**inputs).logits
    finally:
        handle.undo()
    assert count.n == _n_attention(model)
    with torch.no_grad():
        back = model(**inputs).logits
    assert count.n == _n_attention(model)
    assert torch.equal(back, ref)
    assert max_rel(out, ref) <= rel, max_rel(out, ref)
    return out, ref


# --- outputs ---------------------------------------------------------------------------------


FAMILIES = {
    "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
    "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig),
    "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
    "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_llama_family_fp32(family, monkeypatch):
    cls, config = FAMILIES[family]
    model = _llama(cls=cls, config=config)
    _check_patch(model, {"input_ids": token_ids()}, monkeypatch)


def test_llama_triton_backend(monkeypatch):
    """The Triton kernel (under the interpreter without a GPU) in a patched model."""
    model = _llama(num_hidden_layers=1)
    _check_patch(model, {"input_ids": token_ids(1, 8)}, monkeypatch, backend="triton")


SCALINGS = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 16},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "factor": 4.0,
                 "original_max_position_embeddings": 16,
                 "short_factor": [1.0 + i / 16 for i in range(8)],
                 "long_factor": [2.0 + i / 4 for i in range(8)]},
}


@pytest.mark.parametrize("scaling", SCALINGS)
def test_llama_rope_scaling(scaling, monkeypatch):
    """Every rope_type; 80 positions pass max_position_embeddings (64) and the original 16, so
    dynamic NTK and LongRoPE use their long-sequence frequencies."""
    params = SCALINGS[scaling]
    model = _llama(dict(params), max_position_embeddings=64)
    _check_patch(model, {"input_ids": token_ids(1, 80)}, monkeypatch)


def test_gpt_neox_partial_rotary(monkeypatch):
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=2, vocab_size=97, rotary_pct=0.25,
                                     max_position_embeddings=64)
    model = transformers.GPTNeoXForCausalLM(cfg).eval()
    assert model.gpt_neox.layers[0].attention.rotary_ndims == 8  # of head_dim 32
    _check_patch(model, {"input_ids": token_ids()}, monkeypatch)


def test_patched_attention_takes_transformers_tables():
    """A patched layer handed transformers' own tables (rotary width 8 of 32, in x's dtype) pads
    them with the pass-through cos = 1, sin = 0 and rotates as transformers does."""
    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                     num_attention_heads=2, vocab_size=97, rotary_pct=0.25)
    model = transformers.GPTNeoXModel(cfg).eval()
    attention = model.layers[0].attention
    hidden = torch.randn(2, 12, 64)
    emb = model.rotary_emb(hidden, torch.arange(12)[None].expand(2, 12))
    assert emb[0].shape == (2, 12, 8)
    with torch.no_grad():
        ref = attention(hidden, attention_mask=None, position_embeddings=emb)[0]
        with patch(model, backend="torch"):
            got = attention(hidden, attention_mask=None, position_embeddings=emb)[0]
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def _qwen_vl(kind):
    """A tiny Qwen2-VL / Qwen2.5-VL and an input with one 4x4-patch image (4 merged tokens)."""
    torch.manual_seed(0)
    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64, max_position_embeddings=128,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [4, 6, 6]})
    vision = dict(depth=2, num_heads=2, in_channels=3, patch_size=2, temporal_patch_size=2,
                  spatial_merge_size=2)
    if kind == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=64, mlp_ratio=2)
        cls, config = transformers.Qwen2VLForConditionalGeneration, transformers.Qwen2VLConfig
    else:
        vision.update(hidden_size=32, intermediate_size=48, out_hidden_size=64, window_size=8,
                      fullatt_block_indexes=[1])
        cls, config = transformers.Qwen2_5_VLForConditionalGeneration, transformers.Qwen2_5_VLConfig
    cfg = config(text_config=text, vision_config=vision, image_token_id=60, video_token_id=61,
                 vision_start_token_id=62, vision_end_token_id=63)
    model = cls(cfg).eval()
    grid = torch.tensor([[1, 4, 8]])  # t, h, w patches -> 32 patches, 8 tokens after 2x2 merge
    ids = torch.cat([torch.tensor([[5, 6, 7, 62]]), torch.full((1, 8), 60),
                     torch.tensor([[63, 8, 9, 10]])], dim=1)
    types = (ids == 60).int()
    pixels = torch.randn(32, 3 * 2 * 2 * 2, generator=torch.Generator().manual_seed(2))
    return model, {"input_ids": ids, "pixel_values": pixels, "image_grid_thw": grid,
                   "mm_token_type_ids": types}


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen_vl_text_and_vision(kind, monkeypatch):
    """mRoPE text positions (t, h, w of the image tokens) and the 2D axial vision tower."""
    model, inputs = _qwen_vl(kind)
    handle = patch(model, backend="torch")
    patched = {type(m).__name__ for m in model.modules() if "forward" in m.__dict__}
    handle.undo()
    assert any("VisionRotary" in n for n in patched)
    assert any("VisionAttention" in n for n in patched)
    assert sum("Rotary" in n for n in patched) == 2
    _check_patch(model, inputs, monkeypatch)


# --- precision: which reference is nearer the float64 truth ------------------------------------


def test_rome_tables_nearer_float64_truth():
    """Positions 0..4095, D=16: transformers' fp32 angle ``p * inv_freq`` (fp32 ``inv_freq``
    and product) puts its cos/sin up to 6.8e-5 from the float64 truth (measured); rome's tables
    are the float64 angle's cos/sin rounded once: 3.0e-8 (half an fp32 ulp of 1). So the patched
    model's RoPE is the nearer one; rotated fp32 q/k measured 2.6e-7 (rome) vs 2.1e-4."""
    model = _llama(max_position_embeddings=4096)
    rotary = model.model.rotary_emb
    pos = torch.arange(4096)[None]
    x = torch.zeros(1, 1, 4096, 16)
    hf_cos, hf_sin = rotary(x, pos)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))
    angles = pos[0, :, None].double() * torch.cat([inv, inv])
    handle = patch(model, backend="torch")
    try:
        rome_cos, rome_sin = rotary(x, pos)
    finally:
        handle.undo()
    def err(cos, sin):
        return max((cos[0].double() - angles.cos()).abs().max(), (sin[0].double() - angles.sin()).abs().max())

    err_hf, err_rome = err(hf_cos, hf_sin), err(rome_cos, rome_sin)
    assert rome_cos.dtype == torch.float32
    assert err_rome <= 2**-24
    assert err_hf > 100 * err_rome


@pytest.mark.parametrize("how", ["default_dtype", "to"])
def test_bf16_within_bf16_tolerance(how, monkeypatch):
    """bf16 logits within torch's bf16 tolerance (1.6e-2, relative to the logits' scale) of the
    unpatched model's, and as far from the fp32 model's as transformers' own are (bf16 matmuls
    dominate: measured 0.0071 vs 0.0062 relative). ``default_dtype``: built as from_pretrained
    with a bf16 dtype builds it (fp32 inv_freq); ``to``: ``model.to(bf16)`` also rounds the
    rotary module's inv_freq to bf16, which transformers then uses and rome does not."""
    ids = {"input_ids": token_ids(2, 40)}
    with torch.no_grad():
        ref32 = _llama()(**ids).logits
    if how == "to":
        model = _llama().to(torch.bfloat16)
    else:
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = _llama()
        finally:
            torch.set_default_dtype(default)
    assert model.lm_head.weight.dtype == torch.bfloat16
    out, ref = _check_patch(model, ids, monkeypatch, rel=1.6e-2)
    assert out.dtype == torch.bfloat16
    assert max_rel(out, ref32) <= 2 * max_rel(ref, ref32)


# --- autograd, compile, generation -----------------------------------------------------------


def test_backward_grads_close():
    model = _llama()
    model.train()
    ids = token_ids()

    def grads():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = grads()
    with patch(model, backend="torch"):
        got = grads()
    assert ref.keys() == got.keys()
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-4, atol=1e-5 * ref[n].abs().max().item(),
                                   msg=n)


def test_compile_patched_block_fullgraph():
    """A patched decoder layer compiles with fullgraph=True (no graph break), its graph calls
    rome's op (not transformers' rotate_half), and it matches eager."""
    model = _llama()
    layer = model.model.layers[0]
    hidden = torch.randn(2, 12, 64)
    pos = torch.arange(12)[None].expand(2, 12)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    with patch(model, backend="torch"):
        emb = model.model.rotary_emb(hidden, pos)
        eager = layer(hidden, position_embeddings=emb, attention_mask=None)
        torch._dynamo.reset()
        try:
            out = torch.compile(layer, fullgraph=True, backend=backend)(
                hidden, position_embeddings=emb, attention_mask=None)
        finally:
            torch._dynamo.reset()
    assert len(graphs) == 1 and "rome.apply_qk" in graphs[0]
    torch.testing.assert_close(out, eager, rtol=1e-6, atol=1e-6)


def test_compile_patched_rotary_tables():
    """The patched rotary module compiles too (float64 angles in the graph, no host-side cache
    growth), to the tables the eager cache gives."""
    model = _llama()
    rotary = model.model.rotary_emb
    x, pos = torch.zeros(1, 1, 1), torch.tensor([[0, 5, 63, 200]])
    with patch(model, backend="torch"):
        eager = rotary(x, pos)
        torch._dynamo.reset()
        try:
            compiled = torch.compile(rotary, fullgraph=True, backend="aot_eager")(x, pos)
        finally:
            torch._dynamo.reset()
    for a, b in zip(compiled, eager):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=0, atol=2**-24)


def test_greedy_generation_same_tokens(monkeypatch):
    """Greedy decoding with a KV cache: prefill then 9 single-token steps, each through rome."""
    model = _llama(max_position_embeddings=64)
    ids = token_ids(1, 6)
    kw = dict(max_new_tokens=10, do_sample=False, use_cache=True, pad_token_id=0)
    ref = model.generate(ids, **kw)
    count = RomeCalls(monkeypatch, rome_tf)
    with patch(model, backend="torch"):
        got = model.generate(ids, **kw)
    assert torch.equal(got, ref)
    assert ref.shape[1] == 16
    assert count.n == 10 * TEXT["num_hidden_layers"]


# --- undo, isolation, errors -----------------------------------------------------------------


def test_undo_restores_attributes_and_leaves_other_models_alone():
    model, other = _llama(), _llama()
    rotary = model.model.rotary_emb
    attn = model.model.layers[0].self_attn
    original_fn = modeling_llama.apply_rotary_pos_emb
    ids = {"input_ids": token_ids()}
    with torch.no_grad():
        ref_other = other(**ids).logits
    handle = rome.integrations.patch(model)
    assert attn.forward.__func__ is not modeling_llama.LlamaAttention.forward
    assert attn.forward.__func__.__code__ is modeling_llama.LlamaAttention.forward.__code__
    assert modeling_llama.apply_rotary_pos_emb is original_fn  # nothing process-wide
    with torch.no_grad():
        assert torch.equal(other(**ids).logits, ref_other)  # an unpatched model is untouched
    handle.undo()
    handle.undo()  # a no-op
    assert "forward" not in attn.__dict__ and "forward" not in rotary.__dict__
    assert attn.forward.__func__ is modeling_llama.LlamaAttention.forward
    assert rotary.forward.__func__ is modeling_llama.LlamaRotaryEmbedding.forward
    assert modeling_llama.apply_rotary_pos_emb is original_fn
    patch(model).undo()  # patchable again after undo


def test_patch_twice_raises():
    model = _llama()
    with patch(model):
        with pytest.raises(ValueError, match="LlamaForCausalLM is already patched"):
            patch(model)
        with pytest.raises(ValueError, match="already patched"):
            patch(model.model)  # a part of a patched model


def test_unsupported_model_raises():
    torch.manual_seed(0)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2,
                                                               vocab_size=50))
    with pytest.raises(ValueError, match="does not support GPT2LMHeadModel"):
        patch(gpt2)
    gptj = transformers.GPTJModel(transformers.GPTJConfig(n_embd=32, n_layer=1, n_head=2,
                                                          rotary_dim=8, vocab_size=50))
    # GPT-J has RoPE (inlined in its attention): refused with what rome found where transformers
    # gives it a rotary module (5.24), "does not support" where it has none to find (5.17)
    with pytest.raises(ValueError, match="model_type 'gptj' has GPTJRotaryEmbedding but no attention class"
                                         "|does not support GPTJModel"):
        patch(gptj)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        patch("llama")
    with pytest.raises(ValueError, match="backend"):
        patch(_llama(), backend="cuda")


def test_rope_rome_cannot_express_raises():
    # an mrope_section on a Llama config: rome does not know an mRoPE layout for model_type llama
    model = _llama({"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    with pytest.raises(ValueError, match="LlamaRotaryEmbedding.*LlamaConfig.*mrope_section"):
        patch(model)
    # frequencies changed on the module (remote code, a hand edit): rome's would differ
    model = _llama()
    model.model.rotary_emb.original_inv_freq.mul_(2)
    with pytest.raises(ValueError, match="LlamaRotaryEmbedding.*differently"):
        patch(model)
    assert "forward" not in model.model.rotary_emb.__dict__  # nothing left half-patched


def test_supported_lists_the_families():
    names = rome.integrations.supported()["transformers"]
    assert names == rome_tf.SUPPORTED
    for n in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
              "GPTNeoXForCausalLM", "Qwen2VLForConditionalGeneration",
              "Qwen2_5_VLForConditionalGeneration"):
        assert n in names
        assert hasattr(transformers, n)
