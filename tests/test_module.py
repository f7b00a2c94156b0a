"""rome.RoPE: against transformers' models, against the layout-level path (bitwise), offsets,
varlen, the shared cache registry, growth, autograd, torch.compile and bad input.

Accuracy against transformers follows tests/test_layouts.py: rome's output within ROME_ATOL of
the float64 truth (and no farther than transformers'), transformers' within HF_ATOL of it. Besides
that, the module's output is bitwise the layout-level computation ``tables_for_positions`` +
``rome.apply`` with a separately built cache, so every check of the layouts carries over.
"""

import gc
import math

import pytest
import torch
from transformers import (
    DeepseekV3Config,
    GlmConfig,
    GPTJConfig,
    GPTNeoXConfig,
    LlamaConfig,
    Qwen2VLConfig,
)
from transformers.models.glm import modeling_glm as glm
from transformers.models.gpt_neox import modeling_gpt_neox as neox
from transformers.models.gptj import modeling_gptj as gptj
from transformers.models.llama import modeling_llama as llama
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

import rome
from rome.frequencies import frequencies_from_hf, rope_frequencies
from rome.layouts import (
    cos_sin_cache,
    cos_sin_for_positions,
    mrope_layout,
    rope_layout,
    section_layout,
    tables_for_positions,
)
from rome.module import RoPE, registry_bytes
from rome.precision import ulp_error
from test_layouts import HF_ATOL, LLAMA, ROME_ATOL, P, truth


def layout_level(layout, q, k, pos, axes_dim=None):
    """The same rotation without the module: a fresh cache, a gather, rome.apply per tensor."""
    cos, sin = tables_for_positions(layout, cos_sin_cache(layout, P, dtype=torch.float64 if q.dtype == torch.float64
                                                           else torch.float32), pos, axes_dim=axes_dim)
    cos, sin = (cos[:, None], sin[:, None]) if cos.ndim == 3 else (cos, sin)
    m = layout.matrix(q.dtype)
    return rome.apply(q, cos, sin, m, backend="torch"), rome.apply(k, cos, sin, m, backend="torch")


def check(rope, layout, q, k, pos, hf, axes_dim=None):
    """rope(q, k, pos) bitwise the layout-level path, nearer the truth than transformers."""
    ours = rope(q, k, pos)
    for got, want in zip(ours, layout_level(layout, q, k, pos, axes_dim)):
        assert torch.equal(got, want)
    for x, got, hf_out in zip((q, k), ours, hf):
        exact = truth(layout, x, pos, axes_dim)
        ours_err = (got.double() - exact).abs().max().item()
        hf_err = (hf_out.double() - exact).abs().max().item()
        assert ours_err <= ROME_ATOL and hf_err <= HF_ATOL and ours_err <= hf_err, (ours_err, hf_err)
        torch.testing.assert_close(got, hf_out, rtol=0, atol=HF_ATOL + ROME_ATOL)


def llama_config(name, max_pos=128):
    return LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=max_pos,
                       rope_parameters=dict(LLAMA[name]))


# --- against transformers --------------------------------------------------------------------


@pytest.mark.parametrize("top", [60, P])  # 60: longrope's short factors and dynamic unscaled
@pytest.mark.parametrize("name", list(LLAMA))
def test_llama(name, top):
    config = llama_config(name)
    rope = RoPE.from_hf_config(config, backend="torch")
    assert (rope.dynamic is not None) == (name in ("dynamic", "longrope"))
    pos = torch.randint(0, top, (2, 12))
    pos[0, -1] = top - 1
    q, k = torch.randn(2, 2, 12, 64), torch.randn(2, 1, 12, 64)
    hf = llama.apply_rotary_pos_emb(q, k, *llama.LlamaRotaryEmbedding(config)(q, pos))
    layout = rope_layout(frequencies_from_hf(config, seq_len=top))
    check(rope, layout, q, k, pos, hf)


def test_yarn_attention_scaling_is_in_the_tables():
    """YaRN's factor multiplies cos and sin (transformers' convention): |out| grows by it."""
    config = llama_config("yarn")
    rope = RoPE.from_hf_config(config, backend="torch")
    s = rope.layout.attention_scaling
    assert s == pytest.approx(0.1 * math.log(4.0) + 1)
    q = torch.randn(1, 1, 5, 64, dtype=torch.float64)
    out, _ = rope(q, q, torch.arange(5))
    torch.testing.assert_close(out.norm(dim=-1), q.norm(dim=-1) * s, rtol=1e-12, atol=0)


def test_dynamic_follows_transformers_through_prefill_and_decode():
    """A growing sequence of calls (prefill past max_position_embeddings, then decode steps):
    transformers' stateful module and rome's per-call frequencies agree at every step."""
    config = llama_config("dynamic", max_pos=32)
    rope = RoPE.from_hf_config(config, backend="torch")
    hf_rope = llama.LlamaRotaryEmbedding(config)
    q, k = torch.randn(1, 2, 40, 64), torch.randn(1, 1, 40, 64)
    pos = torch.arange(40)[None]
    layout = rope_layout(frequencies_from_hf(config, seq_len=40))
    check(rope, layout, q, k, pos, llama.apply_rotary_pos_emb(q, k, *hf_rope(q, pos)))
    for p in (40, 41, 45):
        qd, kd = torch.randn(1, 2, 1, 64), torch.randn(1, 1, 1, 64)
        hf = llama.apply_rotary_pos_emb(qd, kd, *hf_rope(qd, torch.tensor([[p]])))
        ours = rope(qd, kd, offsets=p)
        for got, want in zip(ours, hf):
            torch.testing.assert_close(got, want, rtol=0, atol=HF_ATOL)
        layout = rope_layout(frequencies_from_hf(config, seq_len=p + 1))
        assert torch.equal(ours[0], layout_level(layout, qd, kd, torch.tensor([p]))[0])
    # below max_position_embeddings: the base frequencies, from the shared cache
    assert rope._layout_for(20) is None and rope._layout_for(33) is not None


def test_qwen2_vl_mrope_from_composite_config():
    config = Qwen2VLConfig(text_config={"hidden_size": 256, "num_attention_heads": 2, "max_position_embeddings": P,
                                        "rope_parameters": {"rope_type": "default", "mrope_section": [16, 24, 24],
                                                            "rope_theta": 1e6}})
    text = config.get_text_config()
    rope = RoPE.from_hf_config(config, backend="torch")
    assert rope.n_axes == 3 and rope.head_dim == 128
    pos = torch.randint(0, P, (3, 2, 10))
    pos[:, :, :4] = torch.arange(4)
    q, k = torch.randn(2, 2, 10, 128), torch.randn(2, 1, 10, 128)
    hf_rope = qwen2_vl.Qwen2VLRotaryEmbedding(text)
    layout = mrope_layout(frequencies_from_hf(text), [16, 24, 24])
    check(rope, layout, q, k, pos, qwen2_vl.apply_rotary_pos_emb(q, k, *hf_rope(q, pos)), axes_dim=0)
    # text-only [B, S] ids: transformers expands them to every axis, so does rome
    text_pos = torch.randint(0, P, (2, 10))
    hf = qwen2_vl.apply_rotary_pos_emb(q, k, *hf_rope(q, text_pos))
    for got, want in zip(rope(q, k, text_pos), hf):
        torch.testing.assert_close(got, want, rtol=0, atol=HF_ATOL)


def test_qwen2_vl_default_mrope_section():
    """A config without mrope_section gets transformers' default [16, 24, 24]."""
    config = Qwen2VLTextConfig(hidden_size=256, num_attention_heads=2, rope_parameters={"rope_type": "default",
                                                                                        "rope_theta": 1e6})
    rope = RoPE.from_hf_config(config)
    assert rope.layout.axis[:64].tolist() == [0] * 16 + [1] * 24 + [2] * 24


def test_qwen3_vl_interleaved_mrope():
    config = Qwen3VLTextConfig(hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=P,
                               rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20],
                                                "mrope_interleaved": True, "rope_theta": 5e6})
    rope = RoPE.from_hf_config(config, backend="torch")
    pos = torch.randint(0, P, (3, 2, 10))
    q, k = torch.randn(2, 2, 10, 128), torch.randn(2, 1, 10, 128)
    hf = qwen3_vl.apply_rotary_pos_emb(q, k, *qwen3_vl.Qwen3VLTextRotaryEmbedding(config)(q, pos))
    check(rope, mrope_layout(frequencies_from_hf(config), [24, 20, 20], interleaved=True), q, k, pos, hf, axes_dim=0)


def test_qwen2_vl_vision_tower():
    config = Qwen2VLVisionConfig(embed_dim=128, num_heads=2)
    rope = RoPE.from_hf_config(config, backend="torch")
    assert _same_layout(rope.layout, RoPE.vision(64).layout)
    pos = torch.randint(0, 40, (30, 2))  # (h, w) of 30 patches
    q, k = torch.randn(30, 2, 64), torch.randn(30, 2, 64)  # the vision tower's [S, N, D]
    hq, hk = qwen2_vl.apply_rotary_pos_emb_vision(q, k, *qwen2_vl.Qwen2VLVisionRotaryEmbedding(config)(q, pos))
    bnsd = [x.transpose(0, 1)[None] for x in (q, k, hq, hk)]
    check(rope, rope.layout, bnsd[0], bnsd[1], pos[None], bnsd[2:])


def _same_layout(a, b):
    return (torch.equal(a.inv_freq, b.inv_freq) and torch.equal(a.axis, b.axis) and a.blocks == b.blocks
            and a.n_axes == b.n_axes and a.attention_scaling == b.attention_scaling)


def test_gpt_neox_partial_rotary():
    config = GPTNeoXConfig(hidden_size=128, num_attention_heads=2, rotary_pct=0.25, max_position_embeddings=P)
    rope = RoPE.from_hf_config(config, backend="torch")
    assert rope.layout.blocks == (("half", 16), ("none", 48))
    pos = torch.randint(0, P, (2, 12))
    q, k = torch.randn(2, 2, 12, 64), torch.randn(2, 2, 12, 64)
    hf = neox.apply_rotary_pos_emb(q, k, *neox.GPTNeoXRotaryEmbedding(config)(q, pos))
    check(rope, rope_layout(frequencies_from_hf(config)), q, k, pos, hf)
    assert torch.equal(rope(q, k, pos)[0][..., 16:], q[..., 16:])


def test_gptj_interleave():
    config = GPTJConfig(n_embd=128, n_head=2, rotary_dim=16, n_positions=P)
    rope = RoPE.from_hf_config(config, backend="torch")
    assert rope.layout.blocks == (("interleave", 16), ("none", 48))
    pos = torch.randint(0, P, (2, 12))
    x = torch.randn(2, 12, 3, 64)  # GPT-J rotates [B, S, N, D]
    sin, cos = gptj.create_sinusoidal_positions(P, 16)[pos].split(8, dim=-1)
    hf = torch.cat([gptj.apply_rotary_pos_emb(x[..., :16], sin, cos), x[..., 16:]], dim=-1).transpose(1, 2)
    q = x.transpose(1, 2)
    check(rope, rope_layout(rope_frequencies(64, rotary_dim=16), mode="interleave"), q, q, pos, (hf, hf))


def test_glm_partial_interleave():
    config = GlmConfig(hidden_size=128, num_attention_heads=2, head_dim=64, max_position_embeddings=P)
    rope = RoPE.from_hf_config(config, backend="torch")
    assert rope.layout.blocks == (("interleave", 32), ("none", 32))
    pos = torch.randint(0, P, (2, 12))
    q, k = torch.randn(2, 2, 12, 64), torch.randn(2, 1, 12, 64)
    hf = glm.apply_rotary_pos_emb(q, k, *glm.GlmRotaryEmbedding(config)(q, pos))
    check(rope, rope_layout(frequencies_from_hf(config), mode="interleave"), q, k, pos, hf)


@pytest.mark.parametrize(
    "config,match",
    [
        ({"model_type": "glm4v_text", "head_dim": 16,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}},
         r"dict \(model_type 'glm4v_text'\): rope_parameters\['mrope_section'\]=\[2, 3, 3\] of a model type rome does not know"),
        ({"model_type": "llama", "head_dim": 16, "rope_parameters": {"rope_type": "ntk2", "rope_theta": 1e4}},
         r"unknown rope_type 'ntk2'"),
        ({"model_type": "llama", "head_dim": 16, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
         r"rope_type='yarn' needs scaling\['factor'\]"),
        ({"model_type": "gptj", "head_dim": 16, "rotary_dim": 15}, r"rotary_dim must be a positive even int <= head_dim=16, got 15"),
        ({"model_type": "gptj", "head_dim": 16, "rotary_dim": 18}, r"rotary_dim must be a positive even int <= head_dim=16, got 18"),
        ({"model_type": "qwen2_vl_text", "head_dim": 128,
          "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [16, 24, 16]}},
         r"mrope_section=\[16, 24, 16\] must sum to rotary_dim/2 = 64 \(sum is 56\)"),
    ],
)
def test_from_hf_config_rejects(config, match):
    with pytest.raises(ValueError, match=match):
        RoPE.from_hf_config(config)


def test_from_hf_config_device_reserves_the_cache():
    config = llama_config("default", max_pos=100)
    rope = RoPE.from_hf_config(config, device="cpu")
    # max_position_embeddings rows (the next power of two above 100 capped at the config's
    # bound, cache_limit), fp32 cos and sin
    assert rope.cache_limit == 100
    assert rope.cache_bytes() == 100 * 64 * 4 * 2
    assert RoPE.from_hf_config(config, device="cpu", max_positions=100).max_positions == 100


# --- positions, offsets, varlen, unrotated -------------------------------------------------


def test_decode_with_offsets_equals_prefill_rows_bitwise():
    rope = RoPE.from_hf_config(llama_config("yarn"), backend="torch")
    q, k = torch.randn(2, 4, 20, 64), torch.randn(2, 2, 20, 64)
    full_q, full_k = rope(q, k)  # positions 0..19
    steps = torch.tensor([7, 19])
    rows = torch.arange(2)
    dq, dk = rope(q[rows, :, steps][:, :, None], k[rows, :, steps][:, :, None], offsets=steps)
    assert torch.equal(dq[:, :, 0], full_q[rows, :, steps]) and torch.equal(dk[:, :, 0], full_k[rows, :, steps])
    # chunked prefill: two chunks with offsets == one call
    a = rope(q[:, :, :12], k[:, :, :12])
    b = rope(q[:, :, 12:], k[:, :, 12:], offsets=12)
    assert torch.equal(torch.cat([a[0], b[0]], 2), full_q) and torch.equal(torch.cat([a[1], b[1]], 2), full_k)


@pytest.mark.parametrize("multi", [False, True])
def test_varlen_equals_per_sequence_calls_bitwise(multi):
    rope = RoPE.sections([8, 12, 12], backend="torch") if multi else RoPE.from_hf_config(llama_config("llama3"),
                                                                                       backend="torch")
    d, a = rope.head_dim, rope.n_axes
    lengths = [3, 0, 5, 2]
    cu = torch.tensor([0, 3, 3, 8, 10], dtype=torch.int32)
    q, k = torch.randn(10, 4, d), torch.randn(10, 2, d)
    offsets = torch.tensor([4, 9, 0, 30])
    pos = torch.randint(0, 50, (10, a)) if multi else None
    got_q, got_k = rope(q, k, pos, cu_seqlens=cu, offsets=offsets)
    start = 0
    for i, n in enumerate(lengths):
        sl = slice(start, start + n)
        p = None if pos is None else pos[sl]
        want_q, want_k = rope(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None], p, offsets=int(offsets[i]))
        assert torch.equal(got_q[sl], want_q[0].transpose(0, 1)) and torch.equal(got_k[sl], want_k[0].transpose(0, 1))
        start += n


def test_unrotated_tokens_pass_through():
    rope = RoPE.from_hf_config(llama_config("yarn"), backend="torch")  # attention scaling != 1
    q, k = torch.randn(2, 2, 9, 64), torch.randn(2, 1, 9, 64)
    pos = torch.randint(0, 100, (2, 9))
    plain = rope(q, k, pos)
    for unrotated, mask in [
        (slice(0, 3), torch.arange(9) < 3),
        ([slice(0, 2), slice(7, None)], (torch.arange(9) < 2) | (torch.arange(9) >= 7)),
        (torch.arange(9) % 2 == 0, torch.arange(9) % 2 == 0),
    ]:
        out = rope(q, k, pos, unrotated=unrotated)
        for x, o, p in zip((q, k), out, plain):
            assert torch.equal(o[:, :, mask], x[:, :, mask]) and torch.equal(o[:, :, ~mask], p[:, :, ~mask])
    per_batch = torch.zeros(2, 9, dtype=torch.bool)
    per_batch[1, 4:] = True
    out = rope(q, k, pos, unrotated=per_batch)
    assert torch.equal(out[0][1, :, 4:], q[1, :, 4:]) and torch.equal(out[0][0], plain[0][0])


def test_fractional_positions_use_float64_angles():
    rope = RoPE.sections([8, 12, 12], backend="torch")
    grid = rome.grid_positions([2, 3, 4]).double() * torch.tensor([1.0, 0.75, 1.5])  # a crop-and-resize grid
    q, k = torch.randn(1, 2, 24, 32), torch.randn(1, 2, 24, 32)
    out = rope(q, k, grid)
    cos, sin = cos_sin_for_positions(rope.layout, grid)
    m = rope.layout.matrix()
    assert torch.equal(out[0], rome.apply(q, cos, sin, m, backend="torch"))
    exact = truth(rope.layout, q, grid[None])
    assert (out[0].double() - exact).abs().max() <= ROME_ATOL
    # integer-valued floats give the cache's rows bitwise
    ints = rome.grid_positions([2, 3, 4])
    assert all(torch.equal(a, b) for a, b in zip(rope(q, k, ints.double()), rope(q, k, ints)))
    assert rope.cache_bytes() > 0


def test_position_layouts_agree():
    rope = RoPE.sections([8, 12, 12], backend="torch")
    q, k = torch.randn(2, 2, 6, 32), torch.randn(2, 1, 6, 32)
    pos = torch.randint(0, 40, (2, 6, 3))
    want = rope(q, k, pos)
    for p in (pos.movedim(-1, 0), pos.int()):
        assert all(torch.equal(a, b) for a, b in zip(rope(q, k, p), want))
    shared = rope(q, k, pos[0])
    assert all(torch.equal(a, b) for a, b in zip(shared, rope(q, k, pos[:1].expand(2, 6, 3))))


def test_output_dtype_and_inputs_untouched():
    rope = RoPE.from_hf_config(llama_config("default"), backend="torch")
    q, k = torch.randn(1, 2, 5, 64, dtype=torch.bfloat16), torch.randn(1, 1, 5, 64, dtype=torch.bfloat16)
    q0, k0 = q.clone(), k.clone()
    out = rope(q, k, torch.arange(5))
    assert out[0].dtype == out[1].dtype == torch.bfloat16
    assert torch.equal(q, q0) and torch.equal(k, k0)
    assert rope.matrix(torch.bfloat16) is rope.matrix(torch.bfloat16)


# --- the shared cache ------------------------------------------------------------------------


def test_equal_configs_share_one_cache_and_it_grows():
    config = llama_config("llama3")
    a, b = RoPE.from_hf_config(config, backend="torch"), RoPE.from_hf_config(llama_config("llama3"), backend="torch")
    other = RoPE.from_hf_config(llama_config("default"), backend="torch")
    q, k = torch.randn(1, 2, 4, 64), torch.randn(1, 1, 4, 64)
    before = registry_bytes()
    a(q, k, torch.tensor([0, 1, 2, 9]))
    b(q, k, torch.tensor([0, 1, 2, 3]))
    other(q, k, torch.tensor([0, 1, 2, 3]))
    ca, cb = a._cache(torch.device("cpu"), torch.float32), b._cache(torch.device("cpu"), torch.float32)
    assert ca is cb and ca.cos is cb.cos and other._cache(torch.device("cpu"), torch.float32) is not ca
    assert ca.rows == 16 and a.cache_bytes() == b.cache_bytes() == 16 * 64 * 4 * 2
    assert registry_bytes() - before == 2 * 16 * 64 * 4 * 2  # a/b's cache once, other's once
    old = ca.cos
    out = b(q, k, torch.tensor([0, 100, 2, 3]))  # grows to 128 rows, seen by both modules
    assert ca.rows == 128 and a.cache_bytes() == 128 * 64 * 4 * 2
    assert torch.equal(ca.cos[:16], old)
    want = cos_sin_cache(a.layout, 128)
    assert torch.equal(ca.cos, want[0]) and torch.equal(ca.sin, want[1])
    assert torch.equal(out[0], layout_level(a.layout, q, k, torch.tensor([0, 100, 2, 3]))[0])
    # float64 q gets its own float64 cache
    a(q.double(), k.double(), torch.arange(4))
    assert a._cache(torch.device("cpu"), torch.float64).cos.dtype == torch.float64
    # the registry holds caches weakly: gone with the last module that uses them
    del a, b, ca, cb, old
    gc.collect()
    assert registry_bytes() - before == 16 * 64 * 4 * 2


def test_max_positions_caps_the_cache():
    rope = RoPE(section_layout([16], mode="half"), max_positions=100, backend="torch")
    q = torch.randn(1, 1, 2, 16)
    rope(q, q, torch.tensor([0, 99]))
    assert rope._cache(torch.device("cpu"), torch.float32).rows == 100
    with pytest.raises(ValueError, match=r"positions must be < max_positions=100, got max 100"):
        rope(q, q, torch.tensor([0, 100]))
    with pytest.raises(ValueError, match=r"positions=200 is more than max_positions=100"):
        rope.reserve(200)


# --- autograd, compile, the Triton backend -------------------------------------------------


def test_gradcheck_float64():
    rope = RoPE.sections([4, 4], backend="torch")
    pos = torch.randint(0, 30, (2, 3, 2))
    q = torch.randn(2, 2, 3, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 1, 3, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k: rope(q, k, pos), (q, k))
    assert torch.autograd.gradgradcheck(lambda q, k: rope(q, k, pos, unrotated=slice(0, 1)), (q, k))


def test_compile_fullgraph_bitwise():
    rope = RoPE.from_hf_config(llama_config("yarn"), backend="torch")
    mrope = RoPE.sections([8, 12, 12], backend="torch")
    rope.reserve(64)
    mrope.reserve(64)
    f = torch.compile(lambda q, k, p, qm, km, pm: (rope(q, k, p, offsets=3), mrope(qm, km, pm, unrotated=slice(0, 2))),
                      fullgraph=True)
    q, k = torch.randn(2, 2, 5, 64), torch.randn(2, 1, 5, 64)
    qm, km = torch.randn(1, 2, 6, 32), torch.randn(1, 2, 6, 32)
    p, pm = torch.randint(0, 60, (2, 5)), torch.randint(0, 60, (3, 1, 6))
    got = f(q, k, p, qm, km, pm)
    want = (rope(q, k, p, offsets=3), mrope(qm, km, pm, unrotated=slice(0, 2)))
    for g, w in zip(got, want):
        assert torch.equal(g[0], w[0]) and torch.equal(g[1], w[1])


def test_ambiguous_positions_need_axes_dim():
    """B = S = A: [3, 3, 3] reads as [A, B, S] and as [B, S, A] (and [3, 3] as [S, A] and [B, S]):
    a ValueError naming both readings, never a guess; axes_dim picks one, each as the table path.
    (Found by the module fuzz: the old rule read such a [B, S, A] tensor axes first.)"""
    rope = RoPE.sections([4, 4, 4], backend="torch")
    q, k = torch.randn(3, 2, 3, 12), torch.randn(3, 1, 3, 12)
    pos = torch.randint(0, 20, (3, 3, 3))
    with pytest.raises(ValueError, match=r"positions \[3, 3, 3\] are ambiguous with B=3, S=3 and A=3: "
                                         r"they read as \[A, B, S\] and as \[B, S, A\]; pass axes_dim"):
        rope(q, k, pos)
    with pytest.raises(ValueError, match=r"read as \[S, A\] and as \[B, S\]"):
        rope(q, k, pos[0])
    layout = rope.layout
    for axes_dim, bsa in ((-1, pos), (0, pos.movedim(0, -1)), (2, pos)):
        got = rope(q, k, pos, axes_dim=axes_dim)
        for g, w in zip(got, layout_level(layout, q, k, bsa)):
            assert torch.equal(g, w), axes_dim
    got = rope(q, k, pos[0], axes_dim=1)  # [S, A]
    for g, w in zip(got, layout_level(layout, q, k, pos[0])):
        assert torch.equal(g, w)
    with pytest.raises(ValueError, match=r"positions \[2, 3, 3\] must have 3 axes \(the layout's n_axes\) at axes_dim=0"):
        rope(q, k, pos[:2], axes_dim=0)
    with pytest.raises(ValueError, match=r"axes_dim must be a dimension of positions \[3, 3, 3\], got 3"):
        rope(q, k, pos, axes_dim=3)


@pytest.mark.parametrize("angles", ["cache", "kernel"])
def test_graph_capture_skips_host_checks(monkeypatch, angles):
    """Under CUDA graph capture (simulated: rome.module._capturing true) forward reads no position
    on the host and grows nothing: bitwise the eager result from the reserved cache; with no cache
    yet, a RuntimeError saying to reserve one; dynamic layouts refuse. (tests/test_gpu.py captures
    a real graph when a GPU is present.)"""
    from rome import module, positions

    rope = RoPE.from_hf_config(llama_config("yarn"), backend="torch", angles=angles)
    q, k, pos = torch.randn(2, 2, 5, 64), torch.randn(2, 1, 5, 64), torch.randint(0, 60, (2, 5))
    rope.reserve(64)
    want = rope(q, k, pos, offsets=3)

    def no_sync(*args, **kwargs):
        raise AssertionError("check_range (a host sync) ran under capture")

    monkeypatch.setattr(module, "_capturing", lambda t: True)
    monkeypatch.setattr(module, "check_range", no_sync)
    monkeypatch.setattr(positions, "check_range", no_sync)
    got = rope(q, k, pos, offsets=3)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if angles == "cache":
        fresh = RoPE.sections([8, 8], backend="torch")
        with pytest.raises(RuntimeError, match=r"no torch.float32 cache on cpu yet: call rope.reserve"):
            fresh(torch.randn(1, 1, 3, 16), torch.randn(1, 1, 3, 16), torch.randint(0, 9, (3, 2)))
    dyn = RoPE.from_hf_config(llama_config("dynamic"), backend="torch")
    with pytest.raises(NotImplementedError, match="CUDA graph capture"):
        dyn(q, k, pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_backend_matches_torch(dtype):
    rope_t = RoPE.sections([8, 8], mode="interleave", backend="triton")
    rope_p = RoPE.sections([8, 8], mode="interleave", backend="torch")
    q, k = torch.randn(2, 2, 3, 16, dtype=dtype), torch.randn(2, 1, 3, 16, dtype=dtype)
    pos = torch.randint(0, 20, (2, 3, 2))
    cu = torch.tensor([0, 2, 5])
    qp, kp = torch.randn(5, 2, 16, dtype=dtype), torch.randn(5, 1, 16, dtype=dtype)
    pairs = [*zip(rope_t(q, k, pos), rope_p(q, k, pos), (q, k), (pos, pos)),
             *zip(rope_t(qp, kp, cu_seqlens=cu), rope_p(qp, kp, cu_seqlens=cu), (qp, kp),
                  (torch.tensor([[0, 0], [1, 1], [0, 0], [1, 1], [2, 2]]),) * 2)]
    for a, b, x, p in pairs:
        if dtype == torch.bfloat16:  # the kernel's bf16 sum is within 2**-6 ulp before its rounding
            cos, sin = tables_for_positions(rope_t.layout, cos_sin_cache(rope_t.layout, P), p)
            want = rome.apply(x.double(), cos[:, None].double(), sin[:, None].double(),
                              rope_t.layout.matrix(torch.float64), backend="torch")  # on the fp32 tables
            assert ulp_error(a, want, dtype).max() <= 0.5 + 2.0**-6 and ulp_error(b, want, dtype).max() <= 0.5
        else:  # the kernel's fp32 x*cos + r*sin is error-free, the torch backend rounds each product
            exact = truth(rope_t.layout, x, p)
            for out in (a, b):
                assert (out.double() - exact).abs().max() <= ROME_ATOL


# --- bad input -------------------------------------------------------------------------------


def _rope(**kw):
    return RoPE(mrope_layout(rope_frequencies(16), [2, 3, 3]), backend="triton", **kw)


Q, K = torch.randn(2, 2, 4, 16), torch.randn(2, 1, 4, 16)
I64 = dict(dtype=torch.int64)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: _rope()(Q, K, torch.tensor([[0, 1, -2, 3]] * 2)), ValueError, r"positions must be >= 0, got min -2"),
        (lambda: _rope(max_positions=8)(Q, K, torch.full((2, 4, 3), 8)), ValueError,
         r"positions must be < max_positions=8, got max 8"),
        (lambda: _rope()(Q, K, offsets=torch.tensor([1, 2, 3])), ValueError,
         r"offsets must be an int or one per sequence \(\[2\], the batch size of q\), got shape \[3\]"),
        (lambda: _rope()(Q, K, torch.zeros(2, 4, 2, **I64)), ValueError,
         r"positions must be \[S\], .* with S=4 and A=3 \(the layout's n_axes\), got \[2, 4, 2\]"),
        (lambda: _rope()(Q, K, torch.zeros(2, 2, 4, 3, **I64)), ValueError, r"got \[2, 2, 4, 3\]"),
        (lambda: _rope()(Q[0], K[0]), ValueError, r"q and k must be \[B, N, S, D\] \(BNSD\), got q \[2, 4, 16\]"),
        (lambda: _rope()(Q, K[..., :8]), ValueError, r"q and k must have head_dim D=16 \(the layout's\), got .* k \[2, 1, 4, 8\]"),
        (lambda: _rope()(Q, K[:, :, :3]), ValueError, r"q and k must share B and S, got q \[2, 2, 4, 16\] and k \[2, 1, 3, 16\]"),
        (lambda: _rope()(Q, "k"), TypeError, r"k must be a torch.Tensor, got str"),
        (lambda: _rope()(Q, K.double()), TypeError, r"q and k must have one dtype"),
        (lambda: _rope()(Q[0].transpose(0, 1), K[0].transpose(0, 1), cu_seqlens=torch.tensor([0, 3, 2, 4])), ValueError,
         r"cu_seqlens must be non-decreasing"),
        (lambda: _rope()(Q[0].transpose(0, 1), K[0].transpose(0, 1), cu_seqlens=torch.tensor([1, 4])), ValueError,
         r"cu_seqlens must start at 0"),
        (lambda: _rope()(Q[0].transpose(0, 1), K[0].transpose(0, 1), cu_seqlens=torch.tensor([0, 2, 5])), ValueError,
         r"cu_seqlens must end at the number of packed tokens T = 4, got cu_seqlens\[-1\] = 5"),
        (lambda: _rope()(Q, K, cu_seqlens=torch.tensor([0, 4])), ValueError,
         r"q and k must be \[T, N, D\] \(packed, with cu_seqlens\)"),
        (lambda: _rope()(Q, K, torch.full((2, 4, 3), float("nan"))), ValueError, r"positions must be finite"),
        (lambda: _rope()(Q, K, torch.full((2, 4, 3), -0.5)), ValueError, r"positions must be >= 0, got min -0.5"),
        (lambda: _rope()(Q, K, unrotated=torch.ones(5, dtype=torch.bool)), ValueError, r"unrotated mask must be \[S\] or \[B, S\]"),
        (lambda: RoPE("layout"), TypeError, r"layout must be a rome.layouts.RopeLayout, got str"),
        (lambda: _rope(max_positions=0), ValueError, r"max_positions must be a positive int or None, got 0"),
        (lambda: RoPE(section_layout([8], mode="half"), backend="cuda"), ValueError, r"backend must be one of"),
        (lambda: _rope(dynamic=3), TypeError, r"dynamic must be a callable"),
        (lambda: RoPE.sections([8, 7]), ValueError, r"sections\[1\] must be a positive even integer, got 7"),
        (lambda: RoPE.vision(30), ValueError, r"head_dim must be a positive multiple of 2 \* n_axes = 4, got 30"),
        (lambda: RoPE(section_layout([8], mode="half"), dynamic=lambda n: section_layout([4, 4], mode="half"))(
            Q[..., :8], K[..., :8]), ValueError, r"dynamic\(4\) must return a RopeLayout with blocks \[\('half', 8\)\]"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_from_hf_config_checks_its_own_arguments_first():
    """A bad ``mode=``/``layer_type=`` is the caller's error, named as such (not a refusal of the
    config: no model type in the message); a layer type the config lacks stays the config's."""
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1)
    with pytest.raises(ValueError, match=r"^mode must be one of \('interleave', 'half'\), got 'neox'$"):
        RoPE.from_hf_config(config, mode="neox")
    with pytest.raises(TypeError, match=r"^layer_type must be a str \(a config's layer type\) or None, got int 3$"):
        RoPE.from_hf_config(config, layer_type=3)
    with pytest.raises(ValueError, match=r"model_type 'llama'.*layer_type='sliding'"):
        RoPE.from_hf_config(config, layer_type="sliding")


def test_rotary_dim_error_without_partial_rotary_factor():
    """An odd head_dim with neither rotary_dim nor partial_rotary_factor names head_dim (the
    message once printed ``int(7 * None)``); with a factor it shows the product."""
    with pytest.raises(ValueError, match=r"^head_dim \(no rotary_dim or partial_rotary_factor given\) must be "
                                         r"a positive even int <= head_dim=7, got 7$"):
        rope_frequencies(7)
    with pytest.raises(ValueError, match=r"^int\(head_dim \* partial_rotary_factor\) = int\(8 \* 0\.1\) must be "
                                         r"a positive even int <= head_dim=8, got 0$"):
        rope_frequencies(8, partial_rotary_factor=0.1)


def test_from_hf_config_deepseek_v3_rope_interleave_rotates_its_pairs():
    """Issue 26 item 5: DeepSeek-V3's MLA with ``rope_interleave=True`` (its default) reads as an
    interleave rotation of the rope block: transformers' ``apply_rotary_pos_emb_interleave`` gives
    the same rotated pairs de-interleaved (one column permutation of q and k alike, which q.k does
    not see). 2e-5: transformers' float32 inv_freq at positions < 16."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    config = DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, qk_rope_head_dim=8,
                              qk_nope_head_dim=8, v_head_dim=8, kv_lora_rank=16, q_lora_rank=16, vocab_size=64,
                              num_hidden_layers=1, intermediate_size=64, moe_intermediate_size=32)
    assert config.rope_interleave
    rope = RoPE.from_hf_config(config, backend="torch")
    assert rope.layout.blocks == (("interleave", 8),)
    gen = torch.Generator().manual_seed(0)
    pos = torch.arange(16)
    q = torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 16, 8, generator=gen, dtype=torch.float64)
    cos, sin = ds.DeepseekV3RotaryEmbedding(config).double()(q, pos[None])
    want = ds.apply_rotary_pos_emb_interleave(q, k, cos, sin)
    perm = torch.cat([torch.arange(0, 8, 2), torch.arange(1, 8, 2)])  # transformers' de-interleaving
    for got, ref in zip(rope(q, k, pos), want):
        torch.testing.assert_close(got[..., perm], ref, rtol=0, atol=2e-5)
        assert (got - ref).abs().max() > 1e-2  # in x's own column order, not transformers'


def test_from_hf_config_qwen3_vl_any_interleaved_sections_transformers_accepts():
    """Issue 26 item 5: a Qwen3-VL text config with mrope_section=[2, 3, 3] (8 frequencies:
    transformers' interleaving gives the axes 3, 3, 2 of them) rotates as transformers' rotary
    module and apply_rotary_pos_emb on (t, h, w) positions. 2e-5: float32 inv_freq."""
    from transformers.models.qwen3_vl import modeling_qwen3_vl as qv

    text = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3],
                                "mrope_interleaved": True}}
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen3_vl", text_config=text)
    rope = RoPE.from_hf_config(config, backend="torch")
    gen = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 30, (3, 1, 12), generator=gen)  # (t, h, w) per token
    q = torch.randn(1, 4, 12, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 12, 16, generator=gen, dtype=torch.float64)
    cos, sin = qv.Qwen3VLTextRotaryEmbedding(config.get_text_config()).double()(q, pos)
    want = qv.apply_rotary_pos_emb(q, k, cos, sin)
    got = rope(q, k, pos[:, 0].T)  # rome: positions [S, A]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)
