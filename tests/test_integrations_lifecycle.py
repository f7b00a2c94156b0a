"""Issue 21 items 6-10: patched models live like unpatched ones. They pickle, ``torch.save`` and
deepcopy (and keep running rome afterwards), survive processors rebuilt as ``type(p)()``, patch
inside ``with torch.device("meta")``, and ``torch.compile(fullgraph=True)`` compiles them once
(no recompilation on the second identical call). Tiny models, CPU, the torch backend."""

import copy
import io
import pickle

import pytest
import torch

import rome
import rome.integrations

from helpers import RomeCalls  # noqa: E402
from test_integrations_diffusers import CASES, NAMES, build, run  # noqa: E402


def _roundtrips(model):
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    return {
        "pickle": pickle.loads(pickle.dumps(model)),
        "torch.save": torch.load(buf, weights_only=False),
        "deepcopy": copy.deepcopy(model),
    }


# --- diffusers -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_diffusers_patched_model_pickles_and_keeps_rome(name, monkeypatch):
    from rome.integrations import diffusers as rd

    model, inp = build(name)
    rome.integrations.patch(model, backend="torch")
    ref = run(model, inp)
    for how, clone in _roundtrips(model).items():
        count = RomeCalls(monkeypatch, rd)
        out = run(clone, inp)
        assert count.n > 0, f"{how}: the copy no longer runs rome"
        monkeypatch.undo()
        torch.testing.assert_close(out, ref, rtol=0, atol=0, msg=f"{how}")


@pytest.mark.parametrize("name", NAMES)
def test_diffusers_processor_rebuilt_by_type_works(name, monkeypatch):
    """diffusers' IP-adapter load/unload rebuilds processors as ``type(p)()``."""
    from rome.integrations import diffusers as rd

    model, inp = build(name)
    rome.integrations.patch(model, backend="torch")
    ref = run(model, inp)
    for _, m in model.named_modules():
        if hasattr(m, "processor") and type(m.processor).__name__.startswith("Rome"):
            m.set_processor(type(m.processor)())
    count = RomeCalls(monkeypatch, rd)
    out = run(model, inp)
    assert count.n > 0
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_diffusers_patch_on_meta_device(name):
    cls, config, _, _ = CASES[name]
    with torch.device("meta"):
        model = cls(**config)
        handle = rome.integrations.patch(model, backend="torch")
    assert handle.active
    assert all(p.device.type == "meta" for p in model.parameters())
    handle.undo()
    model, inp = build(name)  # the same on a real device still works
    ref = run(model, inp)
    rome.integrations.patch(model, backend="torch")
    torch.testing.assert_close(run(model, inp), ref, rtol=1e-5, atol=1e-5)


def _compiled_twice(model, call):
    """``call(compiled model)`` twice on a fresh compile: (first, second, frames compiled), with
    any recompilation an error (``error_on_recompile``)."""
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    try:
        with torch._dynamo.config.patch(error_on_recompile=True), torch.no_grad():
            first = call(compiled)  # the first call traces: caches filled here fail a guard later
            second = call(compiled)
    finally:
        torch._dynamo.reset()
    return first, second, counter.frame_count


@pytest.mark.parametrize("name", NAMES)
def test_diffusers_compile_fullgraph_no_recompile(name):
    model, inp = build(name)
    ref = run(model, inp)
    rome.integrations.patch(model, backend="torch")
    first, second, frames = _compiled_twice(model, lambda m: m(**inp, return_dict=False)[0])
    assert frames == 1
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(first, ref, rtol=1e-5, atol=1e-5)


# --- transformers ----------------------------------------------------------------------------

transformers = pytest.importorskip("transformers")

TEXT = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=61, max_position_embeddings=64)
TF_MODELS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**TEXT)),
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=61, max_position_embeddings=64, rotary_pct=0.5)),
    "qwen2_vl_text": lambda: transformers.Qwen2VLTextModel(transformers.Qwen2VLTextConfig(
        **TEXT, rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2]})),
}


def _tf_model(name):
    torch.manual_seed(0)
    return TF_MODELS[name]().eval()


def _tf_run(model):
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("name", TF_MODELS)
def test_transformers_patched_model_pickles_and_keeps_rome(name, monkeypatch):
    model = _tf_model(name)
    rome.integrations.patch(model, backend="torch")
    ref = _tf_run(model)
    for how, clone in _roundtrips(model).items():
        count = RomeCalls(monkeypatch, rome.integrations.transformers)
        out = _tf_run(clone)
        assert count.n == 2, f"{how}: the copy ran rome {count.n} times, not once per layer"
        monkeypatch.undo()
        torch.testing.assert_close(out, ref, rtol=0, atol=0, msg=how)
        with pytest.raises(ValueError, match="already patched by rome"):
            rome.integrations.patch(clone)


@pytest.mark.parametrize("name", TF_MODELS)
def test_transformers_patch_on_meta_device(name):
    with torch.device("meta"):
        model = TF_MODELS[name]()
        handle = rome.integrations.patch(model, backend="torch")
    assert handle.active
    assert all(p.device.type == "meta" for p in model.parameters())
    handle.undo()


def test_transformers_compile_fullgraph_no_recompile():
    """A patched Llama decoder stack (rotary module and layers) compiles once: the first traced
    call must not fill a cache (RoPE.matrix's, the tables') that a guard then fails on."""
    model = _tf_model("llama")
    rome.integrations.patch(model, backend="torch")
    ids = torch.randint(0, 61, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    model = _tf_model("llama")  # fresh: nothing cached by an eager call
    rome.integrations.patch(model, backend="torch")
    first, second, frames = _compiled_twice(model, lambda m: m(input_ids=ids).logits)
    assert frames == 1
    torch.testing.assert_close(second, first, rtol=0, atol=0)
    torch.testing.assert_close(first, ref, rtol=1e-5, atol=1e-5)
