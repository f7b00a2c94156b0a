"""rome.RoPE's cache is bounded by what the configuration allows (issue 21): a stray position
far past it is a ValueError naming the position and the bound, not gigabytes of cache; the
transformers integration's table cache stops at the same bound (past it: the call's own
float64 tables, as transformers computes them)."""

import pytest
import torch

import rome
from rome import module as rome_module
from rome.frequencies import rope_frequencies
from rome.layouts import cos_sin_for_positions, rope_layout
from rome.precision import ulp_error


def _qk(s=3, dtype=torch.float32):
    return torch.randn(1, 2, s, 8, dtype=dtype), torch.randn(1, 1, s, 8, dtype=dtype)


def _layout():
    return rope_layout(rope_frequencies(8), mode="half")


def _reference(rope, q, k, positions, wide=False):
    """rome.apply_qk on the call's own float64-angle tables (bitwise the cache's rows); wide: its
    float64 result on those tables, unrounded (what the kernel's bound is measured against)."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    cos, sin = cos_sin_for_positions(rope.layout, positions[:, None], axes_dim=-1, dtype=dtype)
    args = (q, k, cos, sin, rope.matrix(q.dtype))
    return rome.apply_qk(*(t.double() for t in args) if wide else args, backend="torch")


def _rows(rope):
    return rope.cache_bytes() // (8 * 4 * 2)


def test_a_stray_position_does_not_grow_the_cache():
    rope = rome.RoPE(_layout(), backend="torch")
    assert rope.cache_limit == rome_module.CACHE_POSITIONS == 1 << 18
    q, k = _qk()
    rope(q, k, torch.tensor([0, 1, 2]))
    stray = torch.tensor([0, 1, 300_000])  # before: a cache of 2**19 rows (the next power of two)
    out = rope(q, k, stray)
    assert _rows(rope) == 16
    assert all(torch.equal(a, b) for a, b in zip(out, _reference(rope, q, k, stray)))
    inside = torch.tensor([0, 1, (1 << 18) - 1])  # the last position the cache may hold
    assert all(torch.equal(a, b) for a, b in zip(rope(q, k, inside), _reference(rope, q, k, inside)))
    assert _rows(rope) == 1 << 18
    with pytest.raises(ValueError, match=r"position 262144 is past the bound of rome.RoPE's cache, "
                                         r"rome.module.CACHE_POSITIONS=262144 positions \(0 \.\. 262143\)"):
        rope.reserve((1 << 18) + 1)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cache_positions_bound_the_cache(backend):
    q, k = _qk()
    rope = rome.RoPE(_layout(), backend=backend, cache_positions=40)
    for positions, rows in (([0, 5, 39], 40), ([0, 5, 40], 40), ([7, 10**7, 3], 40)):
        positions = torch.tensor(positions)
        out = rope(q, k, positions)
        assert _rows(rope) == rows  # 40, not 64 (nor 2**24 for 10**7)
        if backend == "torch":
            assert all(torch.equal(a, b) for a, b in zip(out, _reference(rope, q, k, positions)))
        else:  # the kernel's fp32 sum: faithful (within 1 ulp), not always the correctly rounded one
            assert all(ulp_error(a, b, torch.float32).max() <= 1
                       for a, b in zip(out, _reference(rope, q, k, positions, wide=True)))
    if backend == "triton":
        return
    q64, k64 = _qk(dtype=torch.float64)  # float64 q (float64 tables): the same
    positions = torch.tensor([1, 2, 5000])
    a = rope(q64, k64, positions)
    assert all(torch.equal(x, y) for x, y in zip(a, _reference(rope, q64, k64, positions)))


def test_max_positions_is_a_hard_bound():
    q, k = _qk()
    small = rome.RoPE(_layout(), backend="torch", max_positions=20, cache_positions=40)
    assert small.cache_limit == 20
    with pytest.raises(ValueError, match=r"max_positions=20, got max 10000000"):
        small(q, k, torch.tensor([0, 5, 10**7]))
    assert small.cache_bytes() == 0
    with pytest.raises(ValueError, match=r"cache_positions must be a positive int"):
        rome.RoPE(_layout(), cache_positions=0)
    # no cache, no bound of the cache: angles in the kernel
    rome.RoPE(_layout(), backend="torch", cache_positions=40, angles="kernel")(q, k, torch.tensor([0, 5, 1000]))


transformers = pytest.importorskip("transformers")


def _llama_config(**kw):
    args = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=97, max_position_embeddings=48, **kw)
    return transformers.LlamaConfig(**args)


def test_from_hf_config_is_bounded_by_the_config():
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    rope = rome.RoPE.from_hf_config(_llama_config(), backend="torch")
    assert rope.cache_limit == 48
    rope(q, k, torch.tensor([0, 1, 47]))
    assert _rows(rope) == 48  # not 64 rows
    far = torch.tensor([0, 1, 100])  # past max_position_embeddings: computed, not cached
    assert all(torch.equal(a, b) for a, b in zip(rope(q, k, far), _reference(rope, q, k, far)))
    assert _rows(rope) == 48
    # a scaling factor allows factor x the original length
    linear = _llama_config(rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0})
    assert rome.module.config_positions(linear) == 192
    yarn = _llama_config(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                          "original_max_position_embeddings": 32})
    assert rome.module.config_positions(yarn) == 128
    assert rome.RoPE.from_hf_config(_llama_config(), cache_positions=1000).cache_limit == 1000
    with pytest.raises(ValueError, match=r"max_positions=48, got max 100"):
        rome.RoPE.from_hf_config(_llama_config(), max_positions=48)(q, k, far)


def test_transformers_table_cache_is_bounded(monkeypatch):
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_llama_config()).eval()
    ids = torch.randint(0, 97, (1, 6))
    far = torch.tensor([[0, 1, 2, 1000, 5000, 100_000]])  # past max_position_embeddings=48
    with torch.no_grad():
        ref = model(ids, position_ids=far).logits
        patch(model, backend="torch")
        got = model(ids, position_ids=far).logits
        near = model(ids, position_ids=torch.tensor([[0, 1, 2, 3, 4, 40]])).logits
    assert ((got - ref).abs().max() / ref.abs().max()).item() < 1e-5
    tables = next(m.forward.function.tables for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding"))
    assert isinstance(tables, rome_tf._Tables)
    assert all(c[0].shape[0] <= 48 for c in tables.caches.values())  # before: 2**17 rows
    assert near.isfinite().all()
