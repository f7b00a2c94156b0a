"""Issue 21 item 4: ``RoPE.from_hf_config`` rotates as transformers' own code does for every
model type it accepts, and refuses (ValueError naming the model type) those it cannot read.

Each model type: a tiny config (``AutoConfig.for_model``, no hub), transformers' rotary module
and its modeling file's ``apply_rotary_pos_emb`` (on the rotated columns, the rest passed through,
as the partial-rotary attention layers do) against rome's module at positions up to 63."""

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
    ("nanochat", "rotates neither as rome's half nor interleave"),
])
def test_unreadable_model_types_refused(kind, why):
    warnings.filterwarnings("ignore")
    config = transformers.AutoConfig.for_model(kind, **TINY)
    with pytest.raises(ValueError, match=rf"model_type '{kind}' \(.*{why}"):
        RoPE.from_hf_config(config)


def test_dict_configs_unknown_or_without_model_type():
    with pytest.raises(ValueError, match="has no model_type: rome cannot tell"):
        RoPE.from_hf_config({"head_dim": 16, "rope_theta": 1e4})
    with pytest.raises(ValueError, match=r"model_type 'no_such_model' \(no transformers modeling module"):
        RoPE.from_hf_config({"model_type": "no_such_model", "head_dim": 16, "rope_theta": 1e4})
    rope = RoPE.from_hf_config({"model_type": "afmoe", **TINY})
    assert rope.layout.blocks == (("half", 16),)
