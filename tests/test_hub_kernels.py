"""Issue 19 item 3: rome as transformers' ``rotary_pos_emb`` kernel (rome/integrations/hub_kernels.py).

Tiny random models of several families, each a copy of the unpatched one: logits and every
parameter's gradient after a backward of the same loss, with rome in place of the standard
``apply_rotary_pos_emb`` (``kernelize`` without the kernels package; ``register`` + transformers'
``kernelize`` where a compatible kernels is installed). Tolerances: float32 models; rome rounds
``q*cos + rotate_half(q)*sin`` once where torch rounds each product and the sum, so each rotated
value differs by <= 2 ulp; through two layers and the LM head that stays below 1e-5 absolute
(logits and gradients of order 1)."""

import copy
import os
import pickle
import warnings

import pytest
import torch

from conftest import optional

transformers, needs_transformers = optional("transformers")
pytestmark = needs_transformers

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, vocab_size=64, max_position_embeddings=64)
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "starcoder2")
ATOL = 1e-5


def _model(kind):
    warnings.filterwarnings("ignore")
    config = transformers.AutoConfig.for_model(kind, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).float().train()


def _run(model, ids):
    model.zero_grad()
    logits = model(input_ids=ids).logits
    (logits.square().mean() + logits[..., 0].sum()).backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _compare(kind, got, want):
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=ATOL, msg=lambda m: f"{kind} logits: {m}")
    assert got[1].keys() == want[1].keys()
    for name in want[1]:
        torch.testing.assert_close(got[1][name], want[1][name], rtol=0, atol=ATOL,
                                   msg=lambda m, n=name: f"{kind} grad {n}: {m}")


@pytest.fixture
def calls(monkeypatch):
    """Counts rome.apply_qk calls made through the hub-kernels layer."""
    from rome.integrations import hub_kernels

    count = [0]
    original = hub_kernels.apply_qk

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(hub_kernels, "apply_qk", counting)
    return count


def test_kernelize_families_output_and_gradients(calls):
    """Six families in one test (~3 s): every attention layer runs rome (2 calls a forward), the
    logits and all gradients match the unpatched copy, undo restores transformers' own."""
    from rome.integrations import hub_kernels

    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    for kind in FAMILIES:
        model = _model(kind)
        reference = copy.deepcopy(model)
        handle = hub_kernels.kernelize(model, backend="torch")
        assert handle is not None, kind
        before = calls[0]
        got = _run(model, ids)
        assert calls[0] - before == TINY["num_hidden_layers"], kind
        _compare(kind, got, _run(reference, ids))
        handle.undo()
        before = calls[0]
        _compare(kind, _run(model, ids), _run(reference, ids))
        assert calls[0] == before, f"{kind}: rome still called after undo"


def test_kernelize_pickles_refuses_twice_and_skips_other_functions(calls):
    from rome.integrations import hub_kernels, patch

    model = _model("llama")
    hub_kernels.kernelize(model, backend="torch")
    with pytest.raises(ValueError, match="already patched by rome"):
        hub_kernels.kernelize(model)
    with pytest.raises(ValueError, match="already patched by rome"):
        patch(model)
    try:  # with the kernels package active no model pickles (its function modules are local classes)
        pickle.dumps(_model("llama"))
    except (AttributeError, pickle.PicklingError):
        pass
    else:
        again = pickle.loads(pickle.dumps(model))
        before = calls[0]
        again(input_ids=torch.zeros(1, 4, dtype=torch.long))
        assert calls[0] - before == TINY["num_hidden_layers"], "an unpickled model runs rome"
    # nanochat's rotate_half has the other sign, OLMo's apply casts: not the standard function
    nanochat = pytest.importorskip("transformers.models.nanochat.modeling_nanochat")
    olmo = pytest.importorskip("transformers.models.olmo.modeling_olmo")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    assert hub_kernels.is_standard(llama.apply_rotary_pos_emb)
    assert not hub_kernels.is_standard(nanochat.apply_rotary_pos_emb)
    assert not hub_kernels.is_standard(olmo.apply_rotary_pos_emb)
    # OLMo has RoPE this route cannot swap: refused by name, not a silent None (patch takes it)
    with pytest.raises(ValueError, match=r"kernelize\(OlmoForCausalLM\): it has OlmoRotaryEmbedding"):
        hub_kernels.kernelize(_model("olmo"))
    assert hub_kernels.kernelize(torch.nn.Linear(2, 2)) is None  # no RoPE at all


def test_apply_rotary_transformers_is_the_standard_function():
    """Against transformers' own function on random tables (float64: within 1e-12), both
    backends; bad arguments are refused by name."""
    from rome.integrations.hub_kernels import apply_rotary_transformers

    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 2, 5, 8, generator=g)
    angles = torch.rand(2, 5, 4, generator=g) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    want = llama.apply_rotary_pos_emb(q.double(), k.double(), cos.double(), sin.double())
    for backend in ("torch", "triton"):
        got = apply_rotary_transformers(q, k, cos, sin, backend=backend)
        for a, b in zip(got, want):
            torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-6)
    got = apply_rotary_transformers(q.transpose(1, 2), k.transpose(1, 2), cos, sin, unsqueeze_dim=2, backend="torch")
    for a, b in zip(got, want):
        torch.testing.assert_close(a.transpose(1, 2).double(), b, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="backend must be one of"):
        apply_rotary_transformers(q, k, cos, sin, backend="cuda")
    with pytest.raises(TypeError, match="cos must be a tensor"):
        apply_rotary_transformers(q, k, [1.0], sin)


def _kernels_active():
    from transformers.utils.import_utils import is_kernels_available

    return is_kernels_available()


def test_register_without_kernels_says_what_is_missing(monkeypatch):
    """Where transformers' kernels support is not active, register() and mapping() say what is
    missing. (Where a compatible kernels is installed, as in CI, transformers is told it is not:
    the refusal runs everywhere.)"""
    from transformers.utils import import_utils

    from rome.integrations import hub_kernels

    monkeypatch.setattr(import_utils, "is_kernels_available", lambda: False)
    for fn in (hub_kernels.register, hub_kernels.mapping):
        with pytest.raises(RuntimeError, match=r"transformers needs kernels >= [0-9.]+, < [0-9.]+ .*kernelize\(model\)"):
            fn()


def test_register_and_transformers_kernelize(calls):
    """The kernels route: rome registered for ``rotary_pos_emb``, transformers' ``kernelize``
    (mode TRAINING on the CPU) on three families; nanochat's function (the other sign) is
    decorated too: rome's layer leaves it to its own code."""
    if not _kernels_active():
        pytest.skip("needs kernels in transformers' supported range (transformers 5.23: >= 0.18.2, < 0.19), "
                    "not installed: the decorators are no-ops")
    from kernels import Mode

    from rome.integrations import hub_kernels
    from transformers.integrations.hub_kernels import kernelize

    hub_kernels.register(backend="torch")
    ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
    kept = {}
    for kind in ("llama", "qwen3", "mistral"):
        model = _model(kind)
        # before kernelize: kernels swaps the forward of the modeling file's one function module,
        # which every model of the family (a deep copy too) calls
        want = _run(model, ids)
        kernelize(model, mode=Mode.TRAINING)
        before = calls[0]
        got = _run(model, ids)
        assert calls[0] - before == TINY["num_hidden_layers"], kind
        _compare(kind, got, want)
        kept[kind] = (model, want)
    model = _model("nanochat")
    want = _run(model, ids)
    kernelize(model, mode=Mode.TRAINING)
    before = calls[0]
    _compare("nanochat", _run(model, ids), want)
    assert calls[0] == before, "rome ran nanochat's rotation"
    assert hub_kernels.unregister(), "register() left nothing to undo"
    assert hub_kernels.unregister() is False
    for kind, (model, want) in kept.items():  # no mapping now: a second kernelize puts transformers' function back
        kernelize(model, mode=Mode.TRAINING)
        before = calls[0]
        _compare(kind, _run(model, ids), want)
        assert calls[0] == before, f"{kind}: rome still called after unregister + kernelize"


STUB_CHILD = r'''
import sys, warnings
warnings.filterwarnings("ignore")
import torch
import kernels
assert getattr(kernels, "STUB", False), kernels.__file__  # the stand-in, not a real kernels
from kernels import Mode
import transformers
from transformers.integrations import hub_kernels as transformers_hub
from transformers.integrations.hub_kernels import kernelize
from transformers.utils.import_utils import is_kernels_available
from rome.integrations import hub_kernels
from test_hub_kernels import TINY, ATOL, _compare, _run

assert is_kernels_available() and transformers_hub._kernels_enabled, "transformers' kernels branch is not taken"
count = [0]
apply_qk = hub_kernels.apply_qk
def counting(*args, **kwargs):
    count[0] += 1
    return apply_qk(*args, **kwargs)
hub_kernels.apply_qk = counting

def model(kind):
    config = transformers.AutoConfig.for_model(kind, **TINY)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config).float().train()

assert kernels._KERNEL_MAPPING.get().get("rotary_pos_emb") is None
hub_kernels.register(backend="torch")
assert kernels._KERNEL_MAPPING.get()["rotary_pos_emb"]["cpu"][Mode.TRAINING] == hub_kernels.RomeRepository("torch")
rome_forward = hub_kernels.layer("torch").forward
ids = torch.randint(0, TINY["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(1))
kept = {}
for kind in ("llama", "qwen2", "mistral", "nanochat"):
    m = model(kind)
    modeling = sys.modules[type(m).__module__]
    fn = modeling.apply_rotary_pos_emb
    if kind == "nanochat" and not isinstance(fn, torch.nn.Module):
        # transformers >= 5.24 no longer decorates nanochat's function: kernelize has nothing of
        # it to swap, and rome must not run (its rotate_half has the other sign)
        want = _run(m, ids)
        kernelize(m, mode=Mode.TRAINING)
        before = count[0]
        _compare(kind, _run(m, ids), want)
        assert count[0] == before, "rome ran nanochat's rotation"
        print("rome via kernelize:", kind)
        continue
    # the decorator is active: the modeling file's function is kernels' function module, which
    # every attention layer holds in its _kernel_funcs, and rome finds the function behind it
    assert isinstance(fn, torch.nn.Module) and fn.kernel_layer_name == "rotary_pos_emb", (kind, fn)
    attention = [a for a in m.modules() if any(f is fn for f in a.__dict__.get("_kernel_funcs", {}).values())]
    assert len(attention) == TINY["num_hidden_layers"], (kind, len(attention))
    original = hub_kernels._original(fn)
    assert original is not None and original.__name__ == "apply_rotary_pos_emb", (kind, original)
    assert hub_kernels.is_standard(fn) == (kind != "nanochat"), kind
    want = _run(m, ids)  # before kernelize: it swaps the forward of the family's one function module
    kernelize(m, mode=Mode.TRAINING)
    assert fn.forward.__func__ is rome_forward, (kind, fn.forward)
    before = count[0]
    got = _run(m, ids)
    # nanochat's function (rotate_half of the other sign) is decorated too: rome's layer runs its own code
    assert count[0] - before == (0 if kind == "nanochat" else TINY["num_hidden_layers"]), (kind, count[0] - before)
    _compare(kind, got, want)
    kept[kind] = (m, fn, want)
    print("rome via kernelize:", kind)

assert hub_kernels.unregister() is True
assert kernels._KERNEL_MAPPING.get().get("rotary_pos_emb") is None, kernels._KERNEL_MAPPING.get()
assert hub_kernels.unregister() is False
for kind, (m, fn, want) in kept.items():
    kernelize(m, mode=Mode.TRAINING)  # no mapping now: kernels puts the function's own forward back
    assert fn.forward.__func__ is type(fn).forward, (kind, fn.forward)
    before = count[0]
    _compare(kind, _run(m, ids), want)
    assert count[0] == before, f"{kind}: rome still called after unregister + kernelize"
print("unregistered")
'''


def test_register_and_transformers_kernelize_with_stub_kernels(tmp_path):
    """The kernels route with tests/kernels_stub.py standing in for the kernels package (see its
    doc for what it models, from kernels' own source): in a child python where transformers sees
    kernels 0.18.2 installed, its modeling files' ``apply_rotary_pos_emb`` are kernels function
    modules; ``register()`` + transformers' own ``kernelize(model, mode=TRAINING)`` swap rome's
    layer in for Llama, Qwen2 and Mistral (logits and all gradients vs the same model before
    kernelize, within ATOL), nanochat's non-standard function keeps its code; ``unregister()``
    restores kernels' mapping and a second kernelize puts transformers' function back."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from packaging.version import Version
    from transformers.utils import import_utils

    low, high = (Version(getattr(import_utils, n, "0")) for n in ("KERNELS_MIN_VERSION", "KERNELS_MAX_VERSION"))
    if not low <= Version("0.18.2") < high:  # the stub models kernels 0.18.2's API only
        pytest.skip(f"this transformers wants kernels >= {low}, < {high}; tests/kernels_stub.py models 0.18.2")

    tests = Path(__file__).resolve().parent
    stub = tmp_path / "kernels"
    (stub / "layer").mkdir(parents=True)
    shutil.copy(tests / "kernels_stub.py", stub / "__init__.py")
    (stub / "layer" / "__init__.py").write_text("")
    (stub / "layer" / "mode.py").write_text("from kernels import Mode\n")  # transformers' modeling_utils
    info = tmp_path / "kernels-0.18.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.18.2\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(tests.parent), str(tests)])
    env.pop("USE_HUB_KERNELS", None)
    r = subprocess.run([sys.executable, "-c", STUB_CHILD], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    for kind in ("llama", "qwen2", "mistral", "nanochat"):
        assert f"rome via kernelize: {kind}" in r.stdout, out[-4000:]
    assert "unregistered" in r.stdout, out[-4000:]
