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

from test_integrations_diffusers import CASES, NAMES, build, run  # noqa: E402


class _Count:
    """Counts calls of rome.ops.apply_qk / rome.apply (what the patches call)."""

    def __init__(self, monkeypatch, module):
        self.n = 0
        for name in ("apply_qk", "apply"):
            if hasattr(module, name):
                orig = getattr(module, name)

                def counted(*a, _orig=orig, **k):
                    self.n += 1
                    return _orig(*a, **k)

                monkeypatch.setattr(module, name, counted)


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
        count = _Count(monkeypatch, rd)
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
    count = _Count(monkeypatch, rd)
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
