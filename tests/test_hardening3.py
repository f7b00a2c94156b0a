"""A review pass over the public API and the transformers patch (2026-12-05): the cases it found
wrong, each against an independent reference or the exception the standards ask for."""

from __future__ import annotations

import pytest
import torch

import rome
from conftest import BACKENDS

D = 8


def _case(seed=0, s=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 2, s, D, generator=g)
    cos, sin = rome.rope_cos_sin(torch.arange(s), [D], mode="half")
    return x, cos, sin


def _negated(t):
    """t's values as a lazily negated view (is_neg(), unit strides): its storage holds -t."""
    v = torch._neg_view(-t)
    assert v.is_neg() and v.is_contiguous() and torch.equal(v, t)
    return v


# --- lazily negated views (is_neg): read by value, never written raw ---------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["x", "cos", "sin", "matrix", "dense matrix"])
def test_negated_views_are_read_by_value(backend, which):
    x, cos, sin = _case()
    m = rome.half_matrix(D)
    if which == "dense matrix":  # not a signed permutation: the kernel reads the matrix's storage
        m = torch.randn(D, D, generator=torch.Generator().manual_seed(1)).round()
    want = rome.apply(x, cos, sin, m, backend=backend)
    args = dict(x=x, cos=cos, sin=sin, matrix=m)
    key = "matrix" if which == "dense matrix" else which
    args[key] = _negated(args[key])
    got = rome.apply(args["x"], args["cos"], args["sin"], args["matrix"], backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # a second call of the same signature (the lean path) too
    got = rome.apply(args["x"], args["cos"], args["sin"], args["matrix"], backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_negated_views_are_not_written_in_place(backend):
    x, cos, sin = _case()
    m = rome.half_matrix(D)
    with pytest.raises(TypeError, match=r"x is a lazily negated view.*resolve_neg"):
        rome.apply_(_negated(x.clone()), cos, sin, m, backend=backend)
    with pytest.raises(TypeError, match=r"out is a lazily negated view"):
        rome.apply_out(x, cos, sin, m, out=_negated(torch.zeros_like(x)), backend=backend)
    # read-only negated arguments of an out= op are read by value
    out = torch.empty_like(x)
    rome.apply_out(_negated(x), _negated(cos), sin, m, out=out, backend=backend)
    torch.testing.assert_close(out, rome.apply(x, cos, sin, m, backend=backend), rtol=0, atol=0)


# --- out= and in place: memory shared through two storage objects -----------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_out_overlapping_x_through_another_storage_is_refused(backend):
    rows = 6
    buf = bytearray(4 * D * (rows + 1))
    x = torch.frombuffer(buf, dtype=torch.float32, count=rows * D).view(rows, D)
    out = torch.frombuffer(buf, dtype=torch.float32, count=rows * D, offset=4 * D).view(rows, D)
    assert x.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()  # two storages
    x.copy_(torch.randn(rows, D))
    cos, sin = rome.rope_cos_sin(torch.arange(rows), [D], mode="half")
    before = x.clone()
    with pytest.raises(ValueError, match="out partially overlaps x"):
        rome.apply_out(x, cos, sin, rome.half_matrix(D), out=out, backend=backend)
    assert torch.equal(x, before)
    # disjoint memory of one buffer is taken
    x2 = torch.frombuffer(buf, dtype=torch.float32, count=3 * D).view(3, D)
    out2 = torch.frombuffer(buf, dtype=torch.float32, count=3 * D, offset=4 * 3 * D).view(3, D)
    rome.apply_out(x2, cos[:3], sin[:3], rome.half_matrix(D), out=out2, backend=backend)
    torch.testing.assert_close(out2, rome.apply(x2.clone(), cos[:3], sin[:3], rome.half_matrix(D), backend=backend),
                               rtol=0, atol=0)


# --- a CPU matrix written through .data (no version bump), as gradcheck does -------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_a_matrix_written_through_data_is_seen_by_the_next_call(backend):
    x, cos, sin = _case(s=3)
    m = rome.rotation_matrix((D,), "interleave")
    for _ in range(2):  # learned, then the lean path
        rome.apply(x, cos, sin, m, backend=backend)
    version = m._version
    m.data.copy_(rome.rotation_matrix((D,), "half"))
    assert m._version == version
    want = rome.apply(x, cos, sin, rome.rotation_matrix((D,), "half"), backend=backend)
    torch.testing.assert_close(rome.apply(x, cos, sin, m, backend=backend), want, rtol=0, atol=0)
    # a call of another signature re-reads the matrix first; the first signature still sees it
    m.data.copy_(rome.rotation_matrix((D,), "interleave"))
    rome.apply(torch.randn(1, 3, 3, D), cos, sin, m, backend=backend)
    want = rome.apply(x, cos, sin, rome.rotation_matrix((D,), "interleave"), backend=backend)
    torch.testing.assert_close(rome.apply(x, cos, sin, m, backend=backend), want, rtol=0, atol=0)


# --- apply_qk_norm checks its tables and matrix as apply_qk does -------------------------------

def _bad_tables():
    x, cos, sin = _case()
    m = rome.half_matrix(D)
    return {
        "complex cos": (cos.to(torch.complex64), sin, m, TypeError, "cos must be a float16/bfloat16/float32/float64"),
        "int64 sin": (cos, sin.to(torch.int64), m, TypeError, "sin must be a float16/bfloat16/float32/float64"),
        "int64 matrix": (cos, sin, m.to(torch.int64), TypeError, "matrix must be a float16/bfloat16/float32/float64"),
        "float64 tables, float32 q": (cos.double(), sin.double(), m, TypeError, "cos must be float32 or q's dtype"),
    }


@pytest.mark.parametrize("case", list(_bad_tables()))
def test_apply_qk_norm_rejects_what_apply_qk_rejects(case):
    x, _, _ = _case()
    cos, sin, m, exc, message = _bad_tables()[case]
    with pytest.raises(exc, match=message):
        rome.apply_qk(x, x, cos, sin, m)
    with pytest.raises(exc, match=message):
        rome.apply_qk_norm(x, x, cos, sin, m, None, None)


def test_apply_qk_norm_of_float64_q_on_the_triton_backend_is_refused_as_apply_qk():
    x, cos, sin = _case()
    x = x.double()
    m = rome.half_matrix(D)
    with pytest.raises(TypeError, match="backend='triton' takes float32/float16/bfloat16 q, got float64"):
        rome.apply_qk_norm(x, x, cos.double(), sin.double(), m, None, None, backend="triton")


# --- small validations ---------------------------------------------------------------------

@pytest.mark.parametrize("n_axes", [0, -1, 1.5, True])
def test_rope_vision_names_a_bad_n_axes(n_axes):
    with pytest.raises(ValueError, match=r"n_axes must be a positive int"):
        rome.RoPE.vision(16, n_axes=n_axes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_qknorm_from_an_rmsnorm_of_eps_none_normalises_as_torch(dtype):
    q_norm, k_norm = (torch.nn.RMSNorm(D, dtype=dtype) for _ in range(2))
    assert q_norm.eps is None
    spec = rome.QKNorm.from_modules(q_norm, k_norm)
    assert spec.eps == torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    # small values, where eps decides the result
    x = (torch.randn(1, 2, 3, D, dtype=torch.float64) * 1e-4).to(dtype)
    cos, sin = torch.ones(3, D, dtype=dtype), torch.zeros(3, D, dtype=dtype)  # the identity rotation
    q, _ = rome.apply_qk_norm(x, x, cos, sin, rome.half_matrix(D), q_norm.weight, k_norm.weight, **spec.kwargs(),
                              backend="torch")
    torch.testing.assert_close(q, q_norm(x))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_table_builders_refuse_non_finite_positions(bad):
    pos = torch.tensor([0.0, 1.0, bad])
    with pytest.raises(ValueError, match="positions must be finite"):
        rome.rope_cos_sin(pos, [D], mode="half")
    with pytest.raises(ValueError, match="positions must be finite"):
        rome.rope_angles(pos, [D], mode="half")
    layout = rome.RoPE.sections([D]).layout
    from rome.layouts import cos_sin_for_positions

    with pytest.raises(ValueError, match="positions must be finite"):
        cos_sin_for_positions(layout, pos)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64, "float32"])
def test_table_builders_refuse_a_dtype_tables_cannot_have(dtype):
    with pytest.raises(TypeError, match="dtype must be one of"):
        rome.rope_cos_sin(torch.arange(3), [D], mode="half", dtype=dtype)
    with pytest.raises(TypeError, match="dtype must be one of"):
        rome.cos_sin_cache(rome.RoPE.sections([D]).layout, 4, dtype=dtype)


# --- the transformers patch ----------------------------------------------------------------

def _tiny(kind="Llama", *, ids=(1, 8), seed=2, **config):
    """A tiny random transformers causal LM (``kind``: its class prefix) and token ids."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{kind}Config")(**{
        **dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=97), **config})
    model = getattr(transformers, f"{kind}ForCausalLM")(cfg).eval()
    return model, torch.randint(0, 97, ids, generator=torch.Generator().manual_seed(seed))


def _tiny_llama():
    return _tiny()


def test_a_model_holding_a_part_rome_does_not_patch_is_not_patched():
    """Mistral 3: a Mistral text model (patched) beside a Pixtral vision tower (not): patch
    raises, naming the rotary class it would have left eager, and changes nothing."""
    transformers = pytest.importorskip("transformers")
    from rome.integrations import patch

    text = dict(model_type="mistral", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=128,
                max_position_embeddings=64, pad_token_id=0)
    vision = dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, image_size=32, patch_size=8, head_dim=8)
    cfg = transformers.AutoConfig.for_model("mistral3", text_config=text, vision_config=vision,
                                            image_token_id=100, spatial_merge_size=2)
    torch.manual_seed(0)
    model = transformers.AutoModelForImageTextToText.from_config(cfg).eval()
    with pytest.raises(ValueError, match=r"Mistral3ForConditionalGeneration.*PixtralVisionRotaryEmbedding.*not patched"):
        patch(model, backend="torch")
    assert not any("forward" in m.__dict__ for m in model.modules())  # nothing left patched
    # its language model alone is one rome patches
    handle = patch(model.model.language_model, backend="torch")
    handle.undo()


def test_negative_position_ids_rotate_as_transformers_does():
    """Left padding's position_ids as cumsum(mask) - 1, unfilled: -1 on the pads. transformers
    rotates by -1 there; the patched model too (float64 angles, not the cache), whatever the
    batch's largest position."""
    from rome.integrations import patch

    model, ids = _tiny(ids=(2, 6), seed=1, num_hidden_layers=2, max_position_embeddings=64)
    for positions in ([[-1, -1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]], [[-1, 0, 1, 2, 3, 40], [0, 1, 2, 3, 4, 5]]):
        pos = torch.tensor(positions)
        with torch.no_grad():
            want = model(input_ids=ids, position_ids=pos).logits
        handle = patch(model, backend="torch")
        try:
            with torch.no_grad():
                got = model(input_ids=ids, position_ids=pos).logits
        finally:
            handle.undo()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _hook(module, calls):
    """An accelerate-style hook (``add_hook_to_module``): the instance's forward wrapped, what it
    wraps kept as ``_old_forward``; counts its calls."""
    import functools

    old = module.forward

    def new_forward(mod, *args, **kwargs):
        calls[mod] = calls.get(mod, 0) + 1
        return mod._old_forward(*args, **kwargs)

    module._old_forward = old
    module.forward = functools.update_wrapper(functools.partial(new_forward, module), old)


def test_hooks_on_the_instances_keep_running_around_romes_forward(monkeypatch):
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf
    from helpers import RomeCalls

    model, ids = _tiny_llama()
    with torch.no_grad():
        want = model(ids).logits
    attn, rotary = model.model.layers[0].self_attn, model.model.rotary_emb
    calls = {}
    for m in (attn, rotary):
        _hook(m, calls)
    count = RomeCalls(monkeypatch, rome_tf)
    handle = patch(model, backend="torch")
    with torch.no_grad():
        got = model(ids).logits
    assert calls == {attn: 1, rotary: 1} and count.n == 1  # the hooks ran, and rome inside them
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    handle.undo()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    assert calls == {attn: 2, rotary: 2} and count.n == 1


def test_a_hook_added_after_the_patch_survives_its_undo(monkeypatch):
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf
    from helpers import RomeCalls

    model, ids = _tiny_llama()
    with torch.no_grad():
        want = model(ids).logits
    attn = model.model.layers[0].self_attn
    handle = patch(model, backend="torch")
    calls = {}
    _hook(attn, calls)
    handle.undo()
    count = RomeCalls(monkeypatch, rome_tf)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    assert calls == {attn: 1} and count.n == 0  # the hook stays; rome no longer runs


def test_an_unknown_instance_forward_is_not_bypassed():
    from rome.integrations import patch

    model, ids = _tiny_llama()
    attn = model.model.layers[0].self_attn
    attn.forward = lambda *a, **k: type(attn).forward(attn, *a, **k)
    with pytest.raises(ValueError, match=r"LlamaAttention.forward is replaced on this instance"):
        patch(model, backend="torch")
    assert "forward" not in model.model.rotary_emb.__dict__  # nothing left patched
    del attn.forward
    patch(model, backend="torch").undo()  # and nothing recorded as patched


# --- rome.RoPE and the angles in the kernel (the second review pass) -----------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_one_positions_tensor_read_along_another_axes_dim_is_checked_again(backend):
    """The range memo of a positions tensor is per reading: [A, B, S] then [B, S, A] add the
    offsets to other rows, so the second reading's max (150) is checked against max_positions."""
    rope = rome.RoPE.sections((2, 2, 2), mode="half", max_positions=120, backend=backend)
    q, k = torch.randn(3, 1, 3, 6), torch.randn(3, 1, 3, 6)
    p = torch.zeros(3, 3, 3, dtype=torch.long)
    p[2, 0, 0] = 50
    offsets = torch.tensor([0, 0, 100])
    rope(q, k, p, offsets=offsets, axes_dim=0)  # max 100
    with pytest.raises(ValueError, match=r"positions must be < max_positions=120, got max 150"):
        rope(q, k, p, offsets=offsets, axes_dim=-1)


def test_kernel_angles_refuse_frequencies_above_one():
    """The kernel's angle reduction is exact below 2**24 radians: frequencies above 1 (a linear
    scaling's factor below 1) are refused where they are given (the module, angle_frequencies;
    apply_qk_angles reads no value on the host), not computed wrong."""
    from rome.frequencies import rope_frequencies
    from rome.layouts import rope_layout
    from rome.positions import angle_frequencies

    layout = rope_layout(rope_frequencies(8, scaling={"rope_type": "linear", "factor": 1 / 16}))
    assert float(layout.inv_freq.max()) == 16.0
    with pytest.raises(ValueError, match=r"inverse frequencies in \[0, 1\], got min .* max 16.0"):
        rome.RoPE(layout, angles="kernel")
    with pytest.raises(ValueError, match=r"inverse frequencies in \[0, 1\]"):
        angle_frequencies(layout.inv_freq)
    rome.RoPE(layout, angles="cache")  # the cache takes them (float64 angles)


def test_a_copy_of_a_reserved_module_compiles_and_a_missing_cache_is_named():
    import copy

    rope = rome.RoPE.sections((16,), mode="half", backend="torch")
    rope.reserve(64)
    q, k, pos = torch.randn(1, 2, 3, 16), torch.randn(1, 1, 3, 16), torch.arange(3)
    want = rope(q, k, pos)
    twin = copy.deepcopy(rope)
    torch._dynamo.reset()
    got = torch.compile(lambda a, b, p: twin(a, b, p), fullgraph=True, backend="eager")(q, k, pos)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"rome.RoPE has no torch.float64 cache on cpu yet: call rope.reserve"):
        torch.compile(lambda a, b, p: rope(a, b, p), fullgraph=True, backend="eager")(q.double(), k.double(), pos)


def test_kernel_angles_check_the_norms_weights():
    rope = rome.RoPE.sections((8,), mode="half", angles="kernel", backend="torch")
    q, k, pos = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8), torch.arange(3)
    for weight, exc, message in ((torch.ones(4), ValueError, r"q_weight must have shape \[8\]"),
                                 (torch.ones(8, dtype=torch.int64), TypeError, "q_weight must be floating point")):
        with pytest.raises(exc, match=message):
            rope(q, k, pos, norm=rome.QKNorm(weight, torch.ones(8)))


@pytest.mark.parametrize("offsets", [2**63, 2**63 - 2, 2**53 + 1, -(2**60)])
def test_int_offsets_past_float64s_integers_are_named(offsets):
    rope = rome.RoPE.sections((8,), mode="half", backend="torch")
    q, k = torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8)
    with pytest.raises(ValueError, match=r"offsets must be within \+-2\*\*53|positions must be >= 0"):
        rope(q, k, None, offsets=offsets)
    with pytest.raises(ValueError, match=r"offsets must be within \+-2\*\*53"):
        rope(q, k, torch.arange(3), offsets=offsets)


def test_theta_as_a_string_or_a_tensor():
    with pytest.raises(ValueError, match=r"theta must be a number or one per section, got '1e4'"):
        rome.RoPE.sections((8, 8), theta="1e4")
    by_tensor = rome.RoPE.sections((8, 8), theta=torch.tensor([1e4, 1e3])).layout.inv_freq
    torch.testing.assert_close(by_tensor, rome.RoPE.sections((8, 8), theta=[1e4, 1e3]).layout.inv_freq, rtol=0, atol=0)


def test_a_hook_removed_between_patch_and_undo_leaves_the_modules_own_forward(monkeypatch):
    """accelerate's remove_hook_from_module after rome patched under the hook (forward =
    _old_forward, which is rome's; _old_forward deleted): undo() puts the module's own forward back."""
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf
    from helpers import RomeCalls

    model, ids = _tiny_llama()
    with torch.no_grad():
        want = model(ids).logits
    attn = model.model.layers[0].self_attn
    _hook(attn, {})
    handle = patch(model, backend="torch")
    attn.forward = attn._old_forward  # remove_hook_from_module
    del attn._old_forward
    handle.undo()
    assert "forward" not in attn.__dict__
    count = RomeCalls(monkeypatch, rome_tf)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    assert count.n == 0
    patch(model, backend="torch").undo()  # and it patches again


def test_fused_norms_replace_a_kernels_hub_forward_on_the_norms():
    """The kernels package replaces a hub layer's forward on the instance (a method bound to the
    module: `from_pretrained(use_kernels=True)` on Qwen3's RMSNorm). rome's fused q/k norm takes
    the norms over whatever their forward is, as before."""
    import types

    from rome.integrations import patch

    model, ids = _tiny("Qwen3", ids=(1, 6), seed=3, head_dim=16)
    with torch.no_grad():
        want = model(ids).logits
    attn = model.model.layers[0].self_attn
    for norm in (attn.q_norm, attn.k_norm):  # as kernels' _replace_forward does
        norm.forward = types.MethodType(type(norm).forward, norm)
    handle = patch(model, backend="torch")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)
    handle.undo()
    assert isinstance(attn.q_norm.__dict__.get("forward"), types.MethodType)  # theirs back
