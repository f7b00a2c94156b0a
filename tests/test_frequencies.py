"""rome.frequencies against transformers' ROPE_INIT_FUNCTIONS and against float64 formulas.

transformers computes inverse frequencies in float32 (``base ** (arange / dim)`` in fp32), rome in
float64. Against transformers: rtol 4.8e-7 (4 fp32 ulps; measured max 3.2e-7, llama3/longrope).
Against the independent float64 formulas below (plain ``math`` per element): rtol 1e-14
(measured max 3.6e-16).
Attention factors are Python floats in both: rel 1e-14.
"""

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

from rome.frequencies import ROPE_TYPES, Frequencies, frequencies_from_hf, rope_frequencies

HF_RTOL = 4 * 2.0**-23
F64_RTOL = 1e-14

PHI3_SHORT = [1.0 + 0.02 * i for i in range(48)]
PHI3_LONG = [1.0 + 0.9 * i**1.3 for i in range(48)]
# name: (rope_parameters, head_dim, max_position_embeddings)
CASES = {
    "default": ({"rope_type": "default", "rope_theta": 10000.0}, 128, 2048),
    "default-partial": ({"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}, 128, 2048),
    "linear": ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}, 128, 2048),
    "dynamic": ({"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}, 128, 2048),
    "yarn": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
              "original_max_position_embeddings": 4096}, 128, 32768),
    # gpt-oss: truncate=False
    "yarn-gpt-oss": ({"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                      "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
                     64, 131072),
    # DeepSeek-style mscale / mscale_all_dim
    "yarn-mscale": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0,
                     "mscale_all_dim": 0.8, "beta_fast": 16, "beta_slow": 2,
                     "original_max_position_embeddings": 4096}, 64, 163840),
    "yarn-attention-factor": ({"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0, "attention_factor": 0.9,
                               "original_max_position_embeddings": 8192}, 128, 32768),
    "yarn-partial": ({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "partial_rotary_factor": 0.5,
                      "original_max_position_embeddings": 2048}, 128, 8192),
    "llama3": ({"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}, 128, 131072),
    # Phi-3: no factor, derived from max_position_embeddings / original
    "longrope": ({"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": PHI3_SHORT,
                  "long_factor": PHI3_LONG, "original_max_position_embeddings": 4096}, 96, 131072),
    "longrope-explicit": ({"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": PHI3_SHORT,
                           "long_factor": PHI3_LONG, "factor": 8.0, "attention_factor": 1.1,
                           "original_max_position_embeddings": 4096}, 96, 131072),
    # Phi-4-mini: partial rotary 0.75 of 128
    "longrope-partial": ({"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                          "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG,
                          "original_max_position_embeddings": 4096}, 128, 131072),
    "proportional": ({"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}, 128, 2048),
}


def llama_config(params, head_dim, max_pos):
    return LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                       max_position_embeddings=max_pos, rope_parameters=dict(params))


def hf_frequencies(params, head_dim, max_pos, seq_len):
    config = llama_config(params, head_dim, max_pos)
    if params["rope_type"] == "default":  # Llama's default ignores partial rotary; GPT-NeoX's reads it
        return GPTNeoXRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](config, None, seq_len=seq_len)


def by_formula(params, head_dim, max_pos, seq_len):
    """(inv_freq, attention) in float64 from each method's definition, element by element."""
    t, theta = params["rope_type"], params["rope_theta"]
    d = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if t == "proportional":
        d = head_dim
    base = [1.0 / math.pow(theta, 2 * k / d) for k in range(d // 2)]
    if t == "default":
        return base, 1.0
    if t == "linear":
        return [f / params["factor"] for f in base], 1.0
    if t == "dynamic":
        length = max(seq_len or 0, max_pos)
        b = theta * (params["factor"] * length / max_pos - params["factor"] + 1) ** (d / (d - 2))
        return [1.0 / math.pow(b, 2 * k / d) for k in range(d // 2)], 1.0
    if t == "proportional":
        n = int(params["partial_rotary_factor"] * head_dim / 2)
        return [f if k < n else 0.0 for k, f in enumerate(base)], 1.0
    orig = params["original_max_position_embeddings"]
    if t == "llama3":
        s, lo, hi = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        out = []
        for f in base:
            wavelength = 2 * math.pi / f
            if wavelength < orig / hi:
                out.append(f)
            elif wavelength > orig / lo:
                out.append(f / s)
            else:
                mix = (orig / wavelength - lo) / (hi - lo)
                out.append((1 - mix) * f / s + mix * f)
        return out, 1.0
    if t == "longrope":
        s = params.get("factor") or max_pos / orig
        att = params.get("attention_factor") or math.sqrt(1 + math.log(s) / math.log(orig))
        ext = params["long_factor"] if seq_len and seq_len > orig else params["short_factor"]
        return [f / e for f, e in zip(base, ext)], att
    # yarn: the dimension index that makes r rotations over `orig` tokens
    s = params["factor"]
    fast, slow = params.get("beta_fast", 32), params.get("beta_slow", 1)
    lo = d * math.log(orig / (fast * 2 * math.pi)) / (2 * math.log(theta))
    hi = d * math.log(orig / (slow * 2 * math.pi)) / (2 * math.log(theta))
    if params.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    out = []
    for k, f in enumerate(base):
        ramp = min(max((k - lo) / (hi - lo), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
        out.append(f * (1 - ramp) + f / s * ramp)

    def mscale(m):
        return 0.1 * m * math.log(s) + 1

    att = params.get("attention_factor")
    if att is None:
        att = mscale(params["mscale"]) / mscale(params["mscale_all_dim"]) if "mscale" in params else mscale(1)
    return out, att


@pytest.mark.parametrize("seq_len", [None, 40000, 200000])
@pytest.mark.parametrize("name", list(CASES))
def test_against_transformers_and_formula(name, seq_len):
    params, head_dim, max_pos = CASES[name]
    f = frequencies_from_hf(llama_config(params, head_dim, max_pos), seq_len=seq_len)
    assert f.inv_freq.dtype == torch.float64 and f.head_dim == head_dim
    inv, att = hf_frequencies(params, head_dim, max_pos, seq_len)
    torch.testing.assert_close(f.inv_freq, inv.double(), rtol=HF_RTOL, atol=0)
    assert math.isclose(f.attention_scaling, att, rel_tol=1e-14)

    want, want_att = by_formula(params, head_dim, max_pos, seq_len)
    torch.testing.assert_close(f.inv_freq, torch.tensor(want, dtype=torch.float64), rtol=F64_RTOL, atol=0)
    assert math.isclose(f.attention_scaling, want_att, rel_tol=1e-14)

    # the plain constructor gives the same numbers
    g = rope_frequencies(head_dim, scaling=params, max_position_embeddings=max_pos, seq_len=seq_len)
    assert torch.equal(g.inv_freq, f.inv_freq) and g.attention_scaling == f.attention_scaling


def test_cases_cover_every_type():
    assert {p["rope_type"] for p, _, _ in CASES.values()} | {"ntk_alpha"} == set(ROPE_TYPES)


def test_dynamic_and_longrope_follow_seq_len():
    params, head_dim, max_pos = CASES["dynamic"]
    short = rope_frequencies(head_dim, scaling=params, max_position_embeddings=max_pos, seq_len=max_pos)
    plain = rope_frequencies(head_dim, theta=10000.0)
    assert torch.equal(short.inv_freq, plain.inv_freq)
    longer = rope_frequencies(head_dim, scaling=params, max_position_embeddings=max_pos, seq_len=4 * max_pos)
    assert (longer.inv_freq[1:] < plain.inv_freq[1:]).all()
    params, head_dim, max_pos = CASES["longrope"]
    edge = rope_frequencies(head_dim, scaling=params, max_position_embeddings=max_pos, seq_len=4096)
    past = rope_frequencies(head_dim, scaling=params, max_position_embeddings=max_pos, seq_len=4097)
    base = rope_frequencies(head_dim)
    torch.testing.assert_close(edge.inv_freq, base.inv_freq / torch.tensor(PHI3_SHORT, dtype=torch.float64))
    torch.testing.assert_close(past.inv_freq, base.inv_freq / torch.tensor(PHI3_LONG, dtype=torch.float64))


def test_ntk_alpha_against_hunyuan():
    """HunYuan's checkpoints say rope_type 'dynamic' with a fixed alpha: a static theta stretch."""
    params = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0}
    config = llama_config(params, 128, 32768)
    inv, att = HunYuanDenseV1RotaryEmbedding.compute_ntk_alpha_rope_parameters(config)
    f = frequencies_from_hf(config, seq_len=100000)  # alpha: no dependence on the length
    assert f.rope_type == "ntk_alpha" and att == f.attention_scaling == 1.0
    torch.testing.assert_close(f.inv_freq, inv.double(), rtol=HF_RTOL, atol=0)
    b = 10000.0 * 1000.0 ** (128 / 126)
    want = torch.tensor([1.0 / math.pow(b, 2 * k / 128) for k in range(64)], dtype=torch.float64)
    torch.testing.assert_close(f.inv_freq, want, rtol=F64_RTOL, atol=0)


def test_freq_factors_divide_pairwise():
    factors = [1.0 + k for k in range(16)]
    f = rope_frequencies(32, theta=500000.0, freq_factors=factors)
    want = [1.0 / math.pow(500000.0, 2 * k / 32) / factors[k] for k in range(16)]
    torch.testing.assert_close(f.inv_freq, torch.tensor(want, dtype=torch.float64), rtol=F64_RTOL, atol=0)
    # llama.cpp stores Phi-3's longrope factors as rope_freqs: the same frequencies
    params, head_dim, max_pos = CASES["longrope"]
    lr = rope_frequencies(head_dim, scaling=params, max_position_embeddings=max_pos)
    assert torch.equal(rope_frequencies(head_dim, freq_factors=torch.tensor(PHI3_SHORT, dtype=torch.float64)).inv_freq, lr.inv_freq)


def test_from_hf_old_style_dicts():
    """config.json contents: rope_scaling + rope_theta (Llama 3.1), rotary_pct + rotary_emb_base
    (GPT-NeoX), rotary_dim (GPT-J), a top-level original_max_position_embeddings (Phi-3),
    type 'mrope' (Qwen2-VL), per-layer-type parameters (Gemma)."""
    llama31 = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072,
               "rope_theta": 500000.0,
               "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    f = frequencies_from_hf(llama31)
    params = dict(llama31["rope_scaling"], rope_theta=500000.0)
    want, _ = by_formula(params, 128, 131072, None)
    torch.testing.assert_close(f.inv_freq, torch.tensor(want, dtype=torch.float64), rtol=F64_RTOL, atol=0)

    neox = {"hidden_size": 512, "num_attention_heads": 8, "rotary_pct": 0.25, "rotary_emb_base": 10000,
            "max_position_embeddings": 2048}
    f = frequencies_from_hf(neox)
    assert (f.head_dim, f.rotary_dim) == (64, 16)
    assert torch.equal(f.inv_freq, rope_frequencies(16, theta=10000.0).inv_freq)

    gptj = {"n_embd": 4096, "n_head": 16, "rotary_dim": 64, "n_positions": 2048}
    f = frequencies_from_hf(gptj)
    assert (f.head_dim, f.rotary_dim) == (256, 64)

    phi3 = {"hidden_size": 3072, "num_attention_heads": 32, "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
            "rope_scaling": {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG}}
    f = frequencies_from_hf(phi3)
    assert math.isclose(f.attention_scaling, math.sqrt(1 + math.log(32) / math.log(4096)), rel_tol=1e-15)

    qwen2vl = {"hidden_size": 1536, "num_attention_heads": 12, "rope_theta": 1e6,
               "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    f = frequencies_from_hf(qwen2vl)
    assert f.rope_type == "default" and torch.equal(f.inv_freq, rope_frequencies(128, theta=1e6).inv_freq)

    gemma = {"head_dim": 256, "hidden_size": 1024, "num_attention_heads": 4,
             "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}
    f = frequencies_from_hf(gemma, layer_type="full_attention")
    assert f.rope_type == "linear"
    assert torch.equal(f.inv_freq, rope_frequencies(256, theta=1e6).inv_freq / 8.0)
    with pytest.raises(ValueError, match=r"per layer type .*full_attention.*got None"):
        frequencies_from_hf(gemma)
    with pytest.raises(ValueError, match="not per layer type"):
        frequencies_from_hf(llama31, layer_type="full_attention")


def test_frequencies_dataclass():
    f = rope_frequencies(64, theta=10000.0, rotary_dim=32)
    assert (f.head_dim, f.rotary_dim, f.attention_scaling, f.rope_type) == (64, 32, 1.0, "default")
    with pytest.raises(AttributeError):
        f.head_dim = 128
    src = torch.ones(4, dtype=torch.float64)
    g = Frequencies(src, 8)
    src.zero_()
    assert bool((g.inv_freq == 1).all())  # a copy, not a view of the caller's tensor
    with pytest.raises(TypeError, match="float64"):
        Frequencies(torch.ones(4), 8)
    with pytest.raises(ValueError, match=r"more than head_dim=6"):
        Frequencies(torch.ones(4, dtype=torch.float64), 6)
    with pytest.raises(ValueError, match=r"inv_freq must be .* >= 0"):
        Frequencies(torch.tensor([1.0, -1.0], dtype=torch.float64), 4)
    with pytest.raises(ValueError, match="attention_scaling must be > 0, got 0"):
        Frequencies(torch.ones(2, dtype=torch.float64), 4, attention_scaling=0)


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 512}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8, "factor": 4.0,
            "original_max_position_embeddings": 512}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(scaling={"rope_type": "ntk-by-parts"}), r"unknown rope_type 'ntk-by-parts'; known types"),
        (dict(scaling={"rope_type": ["yarn"]}), r"rope_type must be a string, got \['yarn'\]"),
        (dict(scaling={"rope_type": "yarn", "original_max_position_embeddings": 512}),
         r"rope_type='yarn' needs scaling\['factor'\]"),
        (dict(scaling={k: v for k, v in LLAMA3.items() if k != "low_freq_factor"}),
         r"rope_type='llama3' needs scaling\['low_freq_factor'\]"),
        (dict(scaling={**LLAMA3, "high_freq_factor": 0.5}), r"high_freq_factor >= low_freq_factor, got high_freq_factor=0.5"),
        (dict(scaling={k: v for k, v in YARN.items() if k != "original_max_position_embeddings"}),
         r"needs scaling\['original_max_position_embeddings'\] \(or max_position_embeddings\)"),
        (dict(scaling={**YARN, "beta_fast": 1.0, "beta_slow": 2.0}), r"beta_fast > beta_slow, got beta_fast=1.0"),
        (dict(scaling={**YARN, "truncate": "yes"}), r"truncate must be a bool, got 'yes'"),
        (dict(scaling={**YARN, "factor": 0.0}), r"factor must be > 0, got 0.0"),
        (dict(scaling={**YARN, "factor": -2}), r"factor must be > 0, got -2"),
        (dict(scaling={"rope_type": "linear", "factor": float("nan")}), r"factor must be a finite number, got nan"),
        (dict(scaling={"rope_type": "linear", "factor": True}), r"factor must be a finite number, got True"),
        (dict(scaling={"rope_type": "linear", "factor": "4"}), r"factor must be a finite number, got '4'"),
        (dict(scaling={"rope_type": "dynamic", "factor": 2.0}), r"'dynamic' needs max_position_embeddings, got None"),
        (dict(scaling={"rope_type": "dynamic", "factor": 2.0}, rotary_dim=2, max_position_embeddings=8),
         r"needs rotary_dim > 2"),
        (dict(scaling={**LONGROPE, "long_factor": [2.0] * 7}),
         r"long_factor must have one entry per rotated pair \(rotary_dim // 2 = 8\), got length 7"),
        (dict(scaling={**LONGROPE, "short_factor": [1.0] * 7 + [0.0]}), r"short_factor must be finite and > 0, got short_factor\[7\] = 0.0"),
        (dict(scaling={k: v for k, v in LONGROPE.items() if k != "factor"}),
         r"'longrope' needs scaling\['factor'\] or max_position_embeddings"),
        (dict(scaling={k: v for k, v in LONGROPE.items() if k != "long_factor"}), r"needs scaling\['long_factor'\]"),
        (dict(rotary_dim=7), r"rotary_dim must be a positive even int <= head_dim=16, got 7"),
        (dict(rotary_dim=18), r"rotary_dim must be a positive even int <= head_dim=16, got 18"),
        (dict(rotary_dim=0), r"rotary_dim must be a positive int, got 0"),
        (dict(partial_rotary_factor=0.3125), r"int\(head_dim \* partial_rotary_factor\) = int\(16 \* 0.3125\) .* got 5"),
        (dict(partial_rotary_factor=1.5), r"partial_rotary_factor must be in \(0, 1\], got 1.5"),
        (dict(partial_rotary_factor=0.5, rotary_dim=8), r"rotary_dim or partial_rotary_factor, not both"),
        (dict(theta=0.0), r"theta must be > 0, got 0.0"),
        (dict(theta=1e4, scaling={"rope_theta": 5e5}), r"theta=10000.0 disagrees with scaling\['rope_theta'\]=500000.0"),
        (dict(freq_factors=[1.0] * 3), r"freq_factors must have one entry per rotated pair \(rotary_dim // 2 = 8\), got length 3"),
        (dict(freq_factors=[1.0] * 7 + [-1.0]), r"freq_factors must be finite and > 0, got freq_factors\[7\] = -1.0"),
        (dict(freq_factors=torch.ones(2, 4)), r"freq_factors must be a 1-D real sequence of length 8"),
        (dict(scaling=[("rope_type", "linear")]), r"scaling must be a dict of rope parameters or None"),
        (dict(seq_len=0), r"seq_len must be a positive int, got 0"),
        (dict(scaling={"rope_type": "proportional"}, rotary_dim=8), r"takes partial_rotary_factor, not rotary_dim=8"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rope_frequencies(16, **kwargs)


def test_bad_head_dim_and_config():
    with pytest.raises(ValueError, match="head_dim must be a positive int, got 0"):
        rope_frequencies(0)
    with pytest.raises(ValueError, match=r"head_dim must be a positive int, got 64.0"):
        rope_frequencies(64.0)
    with pytest.raises(ValueError, match="no head_dim and no hidden_size/num_attention_heads"):
        frequencies_from_hf({"rope_theta": 10000.0})
    with pytest.raises(ValueError, match="rope_parameters must be a dict, got 'yarn'"):
        frequencies_from_hf({"rope_parameters": "yarn", "head_dim": 64})
    with pytest.raises(ValueError, match="axial rope needs head_dim divisible by 4, got 18"):
        frequencies_from_hf({"head_dim": 18, "rope_parameters": {"rope_type": "axial"}})


@pytest.mark.parametrize("dim, theta", [(20, 10000.0), (128, 500000.0), (44, 10000.0), (96, 1e6), (2, 7.0)])
def test_base_frequencies_are_the_c_librarys_pow_on_every_cpu(dim, theta):
    """Each inverse frequency is Python's float power of theta, element by element (the C library's
    pow), so the bits do not depend on which of torch's vectorised float64 pow kernels this CPU
    takes: AVX2 and AVX-512 (or a vector lane and the loop's scalar tail) differed by an ulp, which
    the committed matrices/ records showed (CogView4's 10000 ** -0.1); the tables read the same."""
    from rome.frequencies import base_inv_freq
    from rome.tables import rope_angles

    want = [float.hex(theta ** (-2.0 * k / dim)) for k in range(dim // 2)]
    assert [float.hex(v) for v in base_inv_freq(dim, theta).tolist()] == want
    assert [float.hex(v) for v in rope_frequencies(dim, theta=theta).inv_freq.tolist()] == want
    angles = rope_angles(torch.tensor([1]), [dim], mode="interleave", theta=theta)
    assert [float.hex(v) for v in angles[0, ::2].tolist()] == want


def test_llama3_with_equal_band_factors_keeps_or_divides_each_frequency():
    """low_freq_factor == high_freq_factor (vLLM and transformers take it: their smoothing divides
    by zero only where a wavelength lies exactly on the edge): no band between, each frequency
    kept (wavelength <= original / low) or divided by the factor. Against transformers' own where
    it is installed, and the formula."""
    scaling = {**LLAMA3, "low_freq_factor": 2.0, "high_freq_factor": 2.0}
    got = rope_frequencies(128, theta=500000.0, scaling=scaling).inv_freq
    inv = 1.0 / 500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    wavelen = 2 * math.pi / inv
    want = torch.where(wavelen > scaling["original_max_position_embeddings"] / 2.0, inv / 8.0, inv)
    torch.testing.assert_close(got.double(), want, rtol=1e-15, atol=0)
    assert 0 < int((wavelen > 256.0).sum()) < 64  # both kinds of frequency are there
