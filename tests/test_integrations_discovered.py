"""Issue 26 item 2: transformers families rome has no entry for, found from what their modeling
files do (``rome.integrations.transformers._discovered``: a text rotary module feeding attention
classes that call only their file's ``apply_rotary_pos_emb``, which rotates as one of rome's modes
— probed, not compared by code), and ``patch`` on a user's module holding models.

Each family: a tiny random model (fp32, eager attention), patched with the torch backend: logits
within 1e-5 of the unpatched model's, rome's apply_qk called once per layer, ``undo`` restores the
logits bit for bit."""

from __future__ import annotations

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from rome.integrations import patch  # noqa: E402
from rome.integrations import transformers as rome_tf  # noqa: E402
from helpers import RomeCalls  # noqa: E402

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=64, pad_token_id=0)
# Llama's rotation in their own files (OLMo 2 and Cohere compute in fp32, Cohere rotates pairs on
# rome's interleave tables, Ernie 4.5 and Helium repeat-interleave cat(f, f) tables: "pairs")
DISCOVERED = ("olmo2", "cohere", "granite", "starcoder2", "smollm3", "ernie4_5", "helium", "olmo",
              "phi", "persimmon", "stablelm")  # the last three: partial rotary, q sliced by the forward


def _model(kind):
    warnings.filterwarnings("ignore")
    config = transformers.AutoConfig.for_model(kind, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).float().eval()


@pytest.fixture
def rome_calls(monkeypatch):
    return RomeCalls(monkeypatch, rome_tf)  # the shared spy (tests/helpers.py): .n


IDS = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", DISCOVERED)
def test_discovered_family_patches_matches_and_undoes(kind, rome_calls):
    model = _model(kind)
    assert kind not in rome_tf._FAMILIES  # found from the code, not from the hand-kept table
    with torch.no_grad():
        want = model(IDS).logits
    handle = patch(model, backend="torch")
    before = rome_calls.n  # (the patch's own probes call it too)
    with torch.no_grad():
        got = model(IDS).logits
    assert rome_calls.n - before == TINY["num_hidden_layers"], rome_calls.n - before
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    handle.undo()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, want)


def test_table_convention_is_read_from_behaviour():
    from transformers.models.cohere import modeling_cohere
    from transformers.models.ernie4_5 import modeling_ernie4_5
    from transformers.models.llama import modeling_llama
    from transformers.models.nanochat import modeling_nanochat

    assert rome_tf._table_convention(modeling_llama.apply_rotary_pos_emb) == "half"
    assert rome_tf._table_convention(modeling_cohere.apply_rotary_pos_emb) == "half"  # pairs on rome's tables
    assert rome_tf._table_convention(modeling_ernie4_5.apply_rotary_pos_emb) == "pairs"
    assert rome_tf._table_convention(modeling_nanochat.apply_rotary_pos_emb) is None  # the other sign
    assert rome_tf._table_convention(lambda q, k, cos, sin: (q, k)) is None  # no rotation at all


def test_a_model_with_rope_rome_cannot_patch_is_refused_by_name(monkeypatch):
    """A model type with a rotary module and no attention rome can rebind raises, naming it,
    rather than reporting a patch or returning None."""
    model = _model("olmo2")
    monkeypatch.setattr(rome_tf, "_table_convention", lambda fn: None)  # as if its rotation were another
    with pytest.raises(ValueError, match=r"model_type 'olmo2' has Olmo2RotaryEmbedding"):
        patch(model, backend="torch")
    assert "forward" not in model.model.layers[0].self_attn.__dict__  # nothing left patched


class _Wrapper(torch.nn.Module):
    """A user's module holding two models and a head of its own."""

    def __init__(self):
        super().__init__()
        self.a, self.b = _model("llama"), _model("granite")
        self.head = torch.nn.Linear(4, 4)

    def forward(self, ids):
        return self.a(ids).logits + self.b(ids).logits


def test_patch_of_a_users_module_patches_every_model_inside(rome_calls):
    wrapper = _Wrapper()
    with torch.no_grad():
        want = wrapper(IDS)
    handle = patch(wrapper, backend="torch")
    before = rome_calls.n
    with torch.no_grad():
        got = wrapper(IDS)
    assert rome_calls.n - before == 2 * TINY["num_hidden_layers"]
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
    handle.undo()
    with torch.no_grad():
        assert torch.equal(wrapper(IDS), want)
    with pytest.raises(TypeError, match="holds none"):
        patch(torch.nn.Sequential(torch.nn.Linear(2, 2)))
