"""rome.layouts: column layouts, caches and gathers, against rome.tables and transformers' models.

Rotations against transformers: x (fp32) rotated by rome (``rome.apply``, torch backend, tables
gathered from ``cos_sin_cache``) and by the model's own rotary embedding + apply function, both
compared with the float64 truth ``x*cos + (x@M)*sin`` of float64 angles. transformers builds its
angles in fp32 (``fp32(pos) * fp32(inv_freq)``, inv_freq itself within ~3 fp32 ulps), so its
angles are off by up to ~pos * inv_freq * 4e-7; rome's tables are float64 angles rounded once,
so rome is the nearer one (checked): within ``ROME_ATOL`` of the truth, transformers within
``HF_ATOL`` at positions < 256 (measured maxima in the comments at the constants).
"""

import math

import pytest
import torch
from transformers import GPTNeoXConfig, LlamaConfig, Phi3Config
from transformers.models.gpt_neox import modeling_gpt_neox as neox
from transformers.models.gptj import modeling_gptj as gptj
from transformers.models.llama import modeling_llama as llama
from transformers.models.phi3 import modeling_phi3 as phi3
from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig

import rome
from rome.frequencies import frequencies_from_hf, rope_frequencies
from rome.layouts import (
    RopeLayout,
    angles_for_positions,
    axial_layout,
    cos_sin_cache,
    cos_sin_for_positions,
    mrope_axes,
    mrope_layout,
    rope_layout,
    section_layout,
    tables_for_positions,
)

P = 256  # positions drawn from [0, P)
ROME_ATOL = 1e-6  # fp32 tables and fp32 arithmetic on |x| <~ 5 (measured max 3.6e-7)
HF_ATOL = 1e-4  # transformers' fp32 angles at positions < 256 (measured max 3.5e-5)


def truth(layout, x, positions, axes_dim=None):
    """float64 ``x*cos + (x@M)*sin`` with tables from float64 angles; x is [B, N, S, D] or [S, N, D]."""
    angles = angles_for_positions(layout, positions, axes_dim=axes_dim)
    rotated = ~layout.passthrough
    s = layout.attention_scaling
    cos = torch.where(rotated, angles.cos() * s, 1.0)
    sin = torch.where(rotated, angles.sin() * s, 0.0)
    xd = x.double()  # the tables [B, S, D] / [S, D] broadcast over x's head dimension N
    return xd * cos[:, None] + (xd @ layout.matrix(torch.float64)) * sin[:, None]


def rome_rotate(layout, x, positions, axes_dim=None):
    cache = cos_sin_cache(layout, P)
    cos, sin = tables_for_positions(layout, cache, positions, axes_dim=axes_dim)
    return rome.apply(x, cos[:, None], sin[:, None], layout.matrix(), backend="torch")


def check_against(layout, x, positions, hf_out, axes_dim=None):
    want = truth(layout, x, positions, axes_dim)
    ours = rome_rotate(layout, x, positions, axes_dim)
    ours_err = (ours.double() - want).abs().max().item()
    hf_err = (hf_out.double() - want).abs().max().item()
    assert ours_err <= ROME_ATOL, f"rome off the float64 truth by {ours_err:.3g}"
    assert hf_err <= HF_ATOL, f"transformers off the float64 truth by {hf_err:.3g}"
    assert ours_err <= hf_err, f"rome ({ours_err:.3g}) farther from the float64 truth than transformers ({hf_err:.3g})"
    torch.testing.assert_close(ours, hf_out, rtol=0, atol=HF_ATOL + ROME_ATOL)
    return ours_err, hf_err


# --- layouts against rome.tables -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("sections,theta", [((44, 44, 40), 10000.0), ((16, 56, 56), 256.0),
                                            ((16, 24, 24), [256.0, 1e4, 1e4]), ((64,), 5e5)])
def test_section_layout_matches_tables(sections, theta, mode):
    layout = section_layout(sections, mode=mode, theta=theta)
    pos = rome.grid_positions([3, 4, 5][: len(sections)]) * 7
    if len(sections) == 1:
        pos = pos[:, 0]
    assert torch.equal(angles_for_positions(layout, pos), rome.rope_angles(pos, sections, mode=mode, theta=theta))
    cos, sin = tables_for_positions(layout, cos_sin_cache(layout, int(pos.max()) + 1), pos)
    want_cos, want_sin = rome.rope_cos_sin(pos, sections, mode=mode, theta=theta)
    assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    assert torch.equal(layout.matrix(), rome.rotation_matrix(sections, mode))
    assert layout.n_axes == len(sections) and layout.head_dim == sum(sections)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_one_axis_rope_is_a_one_section_layout(mode):
    a = rope_layout(rope_frequencies(64, theta=5e5), mode=mode)
    b = section_layout([64], mode=mode, theta=5e5)
    assert torch.equal(a.inv_freq, b.inv_freq) and torch.equal(a.axis, b.axis) and a.blocks == b.blocks
    assert torch.equal(a.matrix(torch.bfloat16), b.matrix(torch.bfloat16))


def test_matrix_is_a_signed_permutation_zero_on_passthrough():
    for layout in (
        rope_layout(rope_frequencies(96, rotary_dim=32)),
        rope_layout(rope_frequencies(64, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.25})),
        mrope_layout(rope_frequencies(256, partial_rotary_factor=0.25), [11, 11, 10], interleaved=True),
        axial_layout(rope_frequencies(32)),
    ):
        m = layout.matrix(torch.float64)
        rotated = ~layout.passthrough
        assert rotated.any()
        assert set(m.unique().tolist()) <= {-1.0, 0.0, 1.0}
        assert torch.equal(m.abs().sum(0), rotated.double()) and torch.equal(m.abs().sum(1), rotated.double())
        assert torch.equal(m @ m, -torch.diag(rotated.double()))


def test_proportional_layout():
    """Gemma 4: exponents over the whole head, the last pairs of each half unrotated."""
    f = rope_frequencies(16, theta=1e6, scaling={"rope_type": "proportional", "partial_rotary_factor": 0.5})
    layout = rope_layout(f)
    assert layout.passthrough.tolist() == ([False] * 4 + [True] * 4) * 2
    assert torch.equal(layout.inv_freq[:4], torch.tensor(1e6, dtype=torch.float64) ** (-2.0 * torch.arange(4.0, dtype=torch.float64) / 16))


# --- caches and gathers ----------------------------------------------------------------------


def test_gather_equals_direct_tables_for_every_position_shape():
    torch.manual_seed(1)
    yarn = frequencies_from_hf(LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=256,
                                           rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                                            "partial_rotary_factor": 0.5,
                                                            "original_max_position_embeddings": 64}))
    one = rope_layout(yarn)
    three = mrope_layout(rope_frequencies(64), [8, 12, 12])
    cache1, cache3 = cos_sin_cache(one, P), cos_sin_cache(three, P)
    cases = [
        (one, cache1, torch.randint(0, P, (9,)), None, (9, 64)),
        (one, cache1, torch.randint(0, P, (2, 9)), None, (2, 9, 64)),
        (one, cache1, torch.randint(0, P, (9, 1)), -1, (9, 64)),
        (three, cache3, torch.randint(0, P, (9, 3)), None, (9, 64)),
        (three, cache3, torch.randint(0, P, (2, 9, 3)), None, (2, 9, 64)),
        (three, cache3, torch.randint(0, P, (3, 2, 9)), 0, (2, 9, 64)),  # transformers' mRoPE
        (three, cache3, torch.randint(0, P, (3, 9), dtype=torch.int32), 0, (9, 64)),
        (three, cache3, torch.zeros(0, 3, dtype=torch.int64), None, (0, 64)),
    ]
    for layout, cache, pos, axes_dim, shape in cases:
        cos, sin = tables_for_positions(layout, cache, pos, axes_dim=axes_dim)
        want_cos, want_sin = cos_sin_for_positions(layout, pos, axes_dim=axes_dim)
        assert cos.shape == shape and cos.dtype == torch.float32
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    # each column reads its own axis: move one axis only, only that axis' columns change
    pos = torch.randint(0, P - 1, (5, 3))
    moved = pos.clone()
    moved[:, 1] += 1
    a, _ = tables_for_positions(three, cache3, pos)
    b, _ = tables_for_positions(three, cache3, moved)
    assert torch.equal((a != b).any(0), three.axis == 1)


def test_cache_values_and_passthrough_exact():
    """Rotated columns: s*cos(p*f) from float64, rounded once; pass-through: exactly 1 and 0."""
    f = rope_frequencies(48, rotary_dim=32, scaling={"rope_type": "yarn", "factor": 8.0,
                                                     "original_max_position_embeddings": 32})
    layout = rope_layout(f)
    assert f.attention_scaling > 1
    cos, sin = cos_sin_cache(layout, 300)
    p = torch.arange(300, dtype=torch.float64)[:, None]
    inv = layout.inv_freq[:32]
    assert torch.equal(cos[:, :32], (torch.cos(p * inv) * f.attention_scaling).float())
    assert torch.equal(sin[:, :32], (torch.sin(p * inv) * f.attention_scaling).float())
    assert bool((cos[:, 32:] == 1).all()) and bool((sin[:, 32:] == 0).all())
    c64, _ = cos_sin_cache(layout, 3, dtype=torch.float64)
    assert c64.dtype == torch.float64 and c64[2, 1].item() == math.cos(2 * inv[1].item()) * f.attention_scaling
    x = torch.randn(2, 3, 300, 48)
    out = rome.apply(x, cos, sin, layout.matrix(), backend="torch")
    assert torch.equal(out[..., 32:], x[..., 32:])


def test_angles_oracle_takes_float_positions():
    layout = mrope_layout(rope_frequencies(16), [2, 3, 3])
    pos = torch.tensor([[0.5, 1.25, 2.0]])
    got = angles_for_positions(layout, pos)
    want = [pos[0, int(layout.axis[j])].item() * layout.inv_freq[j].item() for j in range(16)]
    assert got.dtype == torch.float64 and got[0].tolist() == want


# --- mRoPE axes --------------------------------------------------------------------------------


def test_mrope_axes():
    assert mrope_axes([16, 24, 24]).tolist() == [0] * 16 + [1] * 24 + [2] * 24
    # Qwen3-VL: t, h, w, t, h, w, ... while each axis has frequencies left, then t
    assert mrope_axes([3, 2, 2], interleaved=True).tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert mrope_axes([24, 20, 20], interleaved=True).tolist() == [0, 1, 2] * 20 + [0] * 4
    layout = mrope_layout(rope_frequencies(128), [16, 24, 24])
    assert torch.equal(layout.axis[:64], layout.axis[64:]) and torch.equal(layout.inv_freq[:64], layout.inv_freq[64:])


# --- against transformers ----------------------------------------------------------------------


LLAMA = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0, "original_max_position_embeddings": 64},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "rope_theta": 500000.0, "original_max_position_embeddings": 64},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
                 "short_factor": [1.0 + 0.03 * i for i in range(32)],
                 "long_factor": [1.0 + 0.7 * i for i in range(32)]},
}


@pytest.mark.parametrize("top", [60, P])  # 60: longrope's short factors, dynamic unscaled
@pytest.mark.parametrize("name", list(LLAMA))
def test_llama_rotations(name, top):
    config = LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=128,
                         rope_parameters=dict(LLAMA[name]))
    pos = torch.randint(0, top, (2, 12))
    pos[0, -1] = top - 1
    q = torch.randn(2, 2, 12, 64)
    k = torch.randn(2, 1, 12, 64)
    cos, sin = llama.LlamaRotaryEmbedding(config)(q, pos)
    hq, hk = llama.apply_rotary_pos_emb(q, k, cos, sin)
    layout = rope_layout(frequencies_from_hf(config, seq_len=int(pos.max()) + 1))
    check_against(layout, q, pos, hq)
    check_against(layout, k, pos, hk)


def test_gpt_neox_partial_rotary():
    config = GPTNeoXConfig(hidden_size=128, num_attention_heads=2, rotary_pct=0.25, max_position_embeddings=P)
    pos = torch.randint(0, P, (2, 12))
    q, k = torch.randn(2, 2, 12, 64), torch.randn(2, 2, 12, 64)
    cos, sin = neox.GPTNeoXRotaryEmbedding(config)(q, pos)
    hq, hk = neox.apply_rotary_pos_emb(q, k, cos, sin)
    layout = rope_layout(frequencies_from_hf(config))
    assert layout.passthrough.sum() == 48
    check_against(layout, q, pos, hq)
    check_against(layout, k, pos, hk)
    assert torch.equal(rome_rotate(layout, q, pos)[..., 16:], q[..., 16:])


@pytest.mark.parametrize("top", [60, P])  # short and long factors
def test_phi3_longrope_partial_rotary(top):
    """Phi-3/Phi-4-mini: longrope with partial rotary and a top-level original_max_position_embeddings."""
    config = Phi3Config(hidden_size=128, num_attention_heads=2, max_position_embeddings=P,
                        original_max_position_embeddings=64, partial_rotary_factor=0.5,
                        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(16)],
                                      "long_factor": [1.0 + 0.8 * i for i in range(16)]})
    pos = torch.randint(0, top, (2, 12))
    pos[0, -1] = top - 1
    q, k = torch.randn(2, 2, 12, 64), torch.randn(2, 1, 12, 64)
    cos, sin = phi3.Phi3RotaryEmbedding(config)(q, pos)
    hq, hk = phi3.apply_rotary_pos_emb(q, k, cos, sin)
    f = frequencies_from_hf(config, seq_len=int(pos.max()) + 1)
    assert (f.rotary_dim, f.attention_scaling) == (32, math.sqrt(1 + math.log(P / 64) / math.log(64)))
    layout = rope_layout(f)
    check_against(layout, q, pos, hq)
    check_against(layout, k, pos, hk)


def test_gptj_interleave_partial_rotary():
    rot, d = 16, 64
    pos = torch.randint(0, P, (2, 12))
    x = torch.randn(2, 12, 3, d)  # GPT-J rotates [B, S, N, D]
    sincos = gptj.create_sinusoidal_positions(P, rot)[pos]
    sin, cos = sincos.split(rot // 2, dim=-1)
    hf = torch.cat([gptj.apply_rotary_pos_emb(x[..., :rot], sin, cos), x[..., rot:]], dim=-1)
    layout = rope_layout(rope_frequencies(d, rotary_dim=rot), mode="interleave")
    c, s = tables_for_positions(layout, cos_sin_cache(layout, P), pos)
    ours = rome.apply(x, c[:, :, None], s[:, :, None], layout.matrix(), backend="torch")
    want = truth(layout, x.transpose(1, 2), pos).transpose(1, 2)
    ours_err, hf_err = (ours.double() - want).abs().max(), (hf.double() - want).abs().max()
    assert ours_err <= ROME_ATOL and hf_err <= HF_ATOL and ours_err <= hf_err, (ours_err, hf_err)


def mrope_positions(b, s):
    """[3, B, S] t/h/w ids like Qwen2-VL's: a text run, then an image grid, then text again."""
    pos = torch.randint(0, P, (3, b, s))
    pos[:, :, :4] = torch.arange(4)  # text: all three axes equal
    return pos


def test_qwen2_vl_mrope():
    config = Qwen2VLTextConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=P,
                               rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24],
                                                "rope_theta": 1e6})
    pos = mrope_positions(2, 10)
    q, k = torch.randn(2, 2, 10, 128), torch.randn(2, 1, 10, 128)
    cos, sin = qwen2_vl.Qwen2VLRotaryEmbedding(config)(q, pos)
    hq, hk = qwen2_vl.apply_rotary_pos_emb(q, k, cos, sin)
    layout = mrope_layout(frequencies_from_hf(config), config.rope_parameters["mrope_section"])
    check_against(layout, q, pos, hq, axes_dim=0)
    check_against(layout, k, pos, hk, axes_dim=0)


def test_qwen3_vl_interleaved_mrope():
    config = Qwen3VLTextConfig(hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=P,
                               rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20],
                                                "mrope_interleaved": True, "rope_theta": 5e6})
    pos = mrope_positions(2, 10)
    q, k = torch.randn(2, 2, 10, 128), torch.randn(2, 1, 10, 128)
    cos, sin = qwen3_vl.Qwen3VLTextRotaryEmbedding(config)(q, pos)
    hq, hk = qwen3_vl.apply_rotary_pos_emb(q, k, cos, sin)
    layout = mrope_layout(frequencies_from_hf(config), [24, 20, 20], interleaved=True)
    check_against(layout, q, pos, hq, axes_dim=0)
    check_against(layout, k, pos, hk, axes_dim=0)


def test_qwen3_5_interleaved_mrope_partial_rotary():
    config = Qwen3_5TextConfig(hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=P,
                               rope_parameters={"rope_type": "default", "mrope_section": [6, 5, 5],
                                                "mrope_interleaved": True, "rope_theta": 1e7,
                                                "partial_rotary_factor": 0.25})
    pos = mrope_positions(1, 10)
    q, k = torch.randn(1, 2, 10, 128), torch.randn(1, 2, 10, 128)
    cos, sin = qwen3_5.Qwen3_5TextRotaryEmbedding(config)(q, pos)
    hq, hk = qwen3_5.apply_rotary_pos_emb(q, k, cos, sin)
    f = frequencies_from_hf(config)
    assert (f.head_dim, f.rotary_dim) == (128, 32)
    layout = mrope_layout(f, [6, 5, 5], interleaved=True)
    check_against(layout, q, pos, hq, axes_dim=0)
    check_against(layout, k, pos, hk, axes_dim=0)


def test_qwen2_vl_vision_axial():
    config = Qwen2VLVisionConfig(embed_dim=128, num_heads=2)
    pos = torch.randint(0, 40, (30, 2))  # (h, w) of 30 patches
    q, k = torch.randn(30, 2, 64), torch.randn(30, 2, 64)  # the vision tower's [S, N, D]
    cos, sin = qwen2_vl.Qwen2VLVisionRotaryEmbedding(config)(q, pos)
    hq, hk = qwen2_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)
    f = frequencies_from_hf(config)
    assert (f.rope_type, f.head_dim) == ("axial", 32)
    layout = axial_layout(f)
    assert layout.axis.tolist() == ([0] * 16 + [1] * 16) * 2
    check_against(layout, q, pos, hq)
    check_against(layout, k, pos, hk)


# --- bad input -------------------------------------------------------------------------------


def _layout(**kw):
    args = dict(inv_freq=torch.ones(4, dtype=torch.float64), axis=torch.zeros(4, dtype=torch.int64),
                n_axes=1, blocks=(("half", 4),))
    args.update(kw)
    return RopeLayout(**args)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: mrope_layout(rope_frequencies(128), [16, 24, 16]), ValueError,
         r"mrope_section=\[16, 24, 16\] must sum to rotary_dim/2 = 64 \(sum is 56\)"),
        (lambda: mrope_layout(rope_frequencies(128, rotary_dim=64), [16, 24, 24]), ValueError,
         r"must sum to rotary_dim/2 = 32 \(sum is 64\)"),
        (lambda: mrope_axes([4, -1, 1]), ValueError, r"mrope_section\[1\] must be a non-negative int, got -1"),
        (lambda: mrope_axes([]), ValueError, r"mrope_section must be a non-empty sequence"),
        (lambda: mrope_layout(torch.ones(4), [2]), TypeError, r"freqs must be rome.frequencies.Frequencies"),
        (lambda: section_layout([44, 43, 41], mode="half"), ValueError, r"sections\[1\] must be a positive even integer, got 43"),
        (lambda: section_layout([8, 8], mode="rotate"), ValueError, r"mode must be one of"),
        (lambda: section_layout([8, 8], mode="half", theta=[1e4]), ValueError, r"theta must be one float or one per section \(2\)"),
        (lambda: rope_layout(rope_frequencies(8), mode="whole"), ValueError, r"mode must be one of"),
        (lambda: axial_layout(rope_frequencies(32, rotary_dim=16)), ValueError,
         r"axial_layout needs frequencies without pass-through columns, got rotary_dim=16 of head_dim=32"),
        (lambda: axial_layout(rope_frequencies(32), n_axes=0), ValueError, r"n_axes must be a positive int, got 0"),
        (lambda: _layout(inv_freq=torch.tensor([1.0, 0.5, 1.0, 1.0], dtype=torch.float64)), ValueError,
         r"columns 1 and 3 rotate together but have inv_freq 0.5 vs 1.0"),
        (lambda: _layout(n_axes=2, axis=torch.tensor([0, 1, 0, 0])), ValueError,
         r"columns 1 and 3 rotate together but have .* axis 1 vs 0"),
        (lambda: _layout(axis=torch.tensor([0, 1, 0, 1])), ValueError, r"axis values must be in \[0, 1\), got \[0, 1\]"),
        (lambda: _layout(blocks=(("half", 2),)), ValueError, r"block sizes \[2\] must sum to D = 4"),
        (lambda: _layout(blocks=(("none", 4),)), ValueError, r"columns of a 'none' block must have inv_freq 0"),
        (lambda: _layout(blocks=(("half", 3), ("none", 1))), ValueError, r"blocks\[0\] must be .*got \('half', 3\)"),
        (lambda: _layout(blocks="half"), ValueError, r"blocks must be \(mode, size\) pairs"),
        (lambda: _layout(inv_freq=torch.ones(4)), TypeError, r"inv_freq must be a 1-D float64 tensor"),
        (lambda: _layout(axis=torch.zeros(4, dtype=torch.int32)), TypeError, r"axis must be an int64 tensor"),
        (lambda: _layout(attention_scaling=float("inf")), ValueError, r"attention_scaling must be a finite number, got inf"),
        (lambda: cos_sin_cache(_layout(), 0), ValueError, r"max_positions must be a positive int, got 0"),
        (lambda: cos_sin_cache("layout", 4), TypeError, r"layout must be a RopeLayout"),
    ],
)
def test_bad_layouts(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_bad_positions():
    one = rope_layout(rope_frequencies(8))
    three = mrope_layout(rope_frequencies(8), [2, 1, 1])
    c1, c3 = cos_sin_cache(one, 16), cos_sin_cache(three, 16)
    cases = [
        (one, c1, torch.tensor([3, -1, 2]), None, ValueError, r"positions must be >= 0, got min -1"),
        (one, c1, torch.tensor([3, 16]), None, ValueError, r"positions must be < 16 \(the cache's rows\), got max 16"),
        (one, c1, torch.zeros(2, 3, 4, dtype=torch.int64), None, ValueError, r"1-axis layout must be \[S\] or \[B, S\], got \[2, 3, 4\]"),
        (three, c3, torch.zeros(5, 2, dtype=torch.int64), None, ValueError,
         r"positions for a 3-axis layout must be \[S, 3\] or \[B, S, 3\] \(or pass axes_dim\), got \[5, 2\]"),
        (three, c3, torch.zeros(5, dtype=torch.int64), None, ValueError, r"3-axis layout must be \[S, 3\]"),
        (three, c3, torch.zeros(2, 5, 3, dtype=torch.int64), 0, ValueError, r"must have 3 axes .* at axes_dim=0"),
        (three, c3, torch.zeros(3, 5, dtype=torch.int64), 2, ValueError, r"axes_dim must be a dimension of positions \[3, 5\], got 2"),
        (three, c3, torch.zeros(3, 1, 2, 5, dtype=torch.int64), 0, ValueError, r"must be \[S, A\] or \[B, S, A\] once axes_dim"),
        (three, c3, torch.zeros(5, 3), None, TypeError, r"positions must be an integer tensor, got torch.float32"),
        (three, c3, torch.zeros(5, 3, dtype=torch.bool), None, TypeError, r"positions must be an integer tensor, got torch.bool"),
        (three, c3, [[0, 0, 0]], None, TypeError, r"positions must be a tensor, got list"),
        (three, c1[0], torch.zeros(5, 3, dtype=torch.int64), None, TypeError, r"cache must be a \(cos, sin\) pair"),
        (three, (c3[0][:, :4], c3[1][:, :4]), torch.zeros(5, 3, dtype=torch.int64), None, ValueError,
         r"cache must be \(cos, sin\) of shape \[P, 8\] on one device, got \[16, 4\] and \[16, 4\]"),
    ]
    for layout, cache, pos, axes_dim, error, match in cases:
        with pytest.raises(error, match=match):
            tables_for_positions(layout, cache, pos, axes_dim=axes_dim)
    with pytest.raises(TypeError, match="positions must be integer or floating, got torch.bool"):
        angles_for_positions(three, torch.zeros(5, 3, dtype=torch.bool))


@pytest.mark.parametrize("section", [[1, 3, 0], [2, 3, 3], [24, 20, 20], [16, 24, 24], [4, 2, 2]])
def test_interleaved_mrope_axes_follow_transformers_rule_for_any_sections(section):
    """Issue 26 item 5: transformers' interleaved mRoPE (Qwen3-VL) overwrites the t frequencies at
    slice(offset, 3 * section[axis], 3) with that axis's, whatever the sections' counts come to
    ([2, 3, 3] over 8 frequencies gives the axes 3, 3, 2); rome lays them out the same way."""
    n = sum(section)
    want = torch.zeros(n, dtype=torch.int64)
    for axis in range(1, len(section)):  # the rule written as transformers writes it: slices
        want[axis: len(section) * section[axis]: len(section)] = axis
    assert torch.equal(mrope_axes(section, interleaved=True), want)
