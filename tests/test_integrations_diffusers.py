"""rome.integrations.diffusers: tiny random diffusers transformers, patched vs unpatched.

Each model is built from a tiny config with a fixed seed (no weights) and run on the same inputs
before the patch, patched, and after ``undo()``:

- fp32: patched output within 1e-5 of the output's scale (max |output|) of the unpatched one;
  bf16 within 2e-2 of it (bf16 q/k rounded once by rome vs twice by the model, through a few
  layers); undo restores the outputs bit for bit and the original processors and forwards (``is``).
- Tables: HunyuanVideo and LTX-Video compute their angles in float32, the patch in float64. The
  oracle is each model's own formula evaluated in float64; ``test_tables_nearer_float64_truth``
  measures that rome's tables are the nearer ones (LTX's angles reach ~1e4 rad, where float32
  angles are off by ~1e-3). Wan and Flux already build theirs from float64 angles; CogVideoX's
  come from the caller.
- One ``apply_qk`` per RoPE attention layer, backward (grads of every parameter), and
  ``torch.compile(fullgraph=True)`` of a patched block (``aot_eager``: no graph break, same
  output). Most runs use ``backend="torch"``; one runs the Triton kernel under the interpreter.
"""

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers  # noqa: E402
from diffusers.models.embeddings import get_1d_rotary_pos_embed, get_3d_rotary_pos_embed  # noqa: E402

import rome  # noqa: E402
import rome.integrations  # noqa: E402
from rome.integrations import diffusers as rd  # noqa: E402

FP32_RTOL = 1e-5
BF16_RTOL = 2e-2


def _flux_ids():
    img = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(2.0), torch.arange(3.0), indexing="ij"), -1)
    return img.reshape(-1, 3), torch.zeros(3, 3)


def _cog_tables():
    # CogVideoX 1.0's crop-and-interpolate grid: fractional positions (float32 angles)
    return get_3d_rotary_pos_embed(16, ((0, 0), (3.3, 3.7)), (4, 4), 2)


# name -> (model class, config, inputs() with float tensors, the first RoPE block's path)
CASES = {
    "wan": (
        diffusers.WanTransformer3DModel,
        dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
             out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32),
        lambda: dict(hidden_states=torch.randn(1, 4, 2, 4, 4), timestep=torch.tensor([3]),
                     encoder_hidden_states=torch.randn(1, 5, 16)),
        "blocks.0",
    ),
    "hunyuan": (
        diffusers.HunyuanVideoTransformer3DModel,
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
             num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1,
             guidance_embeds=False, text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(4, 6, 6)),
        lambda: dict(hidden_states=torch.randn(1, 4, 2, 3, 3), timestep=torch.tensor([3]),
                     encoder_hidden_states=torch.randn(1, 4, 16), encoder_attention_mask=torch.ones(1, 4),
                     pooled_projections=torch.randn(1, 8)),
        "single_transformer_blocks.0",
    ),
    "cogvideox": (
        diffusers.CogVideoXTransformer3DModel,
        dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=8,
             text_embed_dim=16, num_layers=1, sample_width=8, sample_height=8, sample_frames=5,
             patch_size=2, temporal_compression_ratio=4, max_text_seq_length=4,
             use_rotary_positional_embeddings=True),
        lambda: dict(hidden_states=torch.randn(1, 2, 4, 8, 8), encoder_hidden_states=torch.randn(1, 4, 16),
                     timestep=torch.tensor([3]), image_rotary_emb=_cog_tables()),
        "transformer_blocks.0",
    ),
    "flux": (
        diffusers.FluxTransformer2DModel,
        dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
             num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8,
             guidance_embeds=False, axes_dims_rope=(4, 6, 6)),
        lambda: dict(hidden_states=torch.randn(1, 6, 4), encoder_hidden_states=torch.randn(1, 3, 16),
                     pooled_projections=torch.randn(1, 8), timestep=torch.tensor([0.5]),
                     img_ids=_flux_ids()[0], txt_ids=_flux_ids()[1]),
        "transformer_blocks.0",
    ),
    "ltx": (
        diffusers.LTXVideoTransformer3DModel,
        dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
             cross_attention_dim=16, num_layers=1, caption_channels=16),
        lambda: dict(hidden_states=torch.randn(1, 8, 4), encoder_hidden_states=torch.randn(1, 4, 16),
                     timestep=torch.tensor([3]), encoder_attention_mask=torch.ones(1, 4), num_frames=2,
                     height=2, width=2, rope_interpolation_scale=(0.32, 32, 32)),
        "transformer_blocks.0",
    ),
}
NAMES = tuple(CASES)


# the models whose q/k norms the patch fuses into the rotation (rome.apply_qk_norm): Wan's RMSNorm
# over a token's heads, Flux's per head (and its text tokens' own)
FUSED = {"wan": "heads", "flux": "head", "hunyuan": "head", "cogvideox": "head", "ltx": "heads"}


def _spy_rome(monkeypatch, what=None):
    """The rome calls the patched processors make (``what(args)`` of each, or its name)."""
    calls = []
    for fn in ("apply_qk", "apply_qk_norm"):
        real = getattr(rd, fn)
        monkeypatch.setattr(rd, fn, lambda *a, _real=real, _fn=fn, **k: calls.append(
            _fn if what is None else what(a)) or _real(*a, **k))
    return calls


def build(name, dtype=torch.float32):
    cls, config, inputs, _ = CASES[name]
    torch.manual_seed(0)
    model = cls(**config).eval().to(dtype)
    torch.manual_seed(1)
    inp = {k: _cast(v, dtype) for k, v in inputs().items()}
    return model, inp


def _cast(v, dtype):
    if isinstance(v, torch.Tensor) and v.is_floating_point() and v.ndim > 1:
        return v.to(dtype)
    return v


def run(model, inp):
    with torch.no_grad():
        return model(**inp, return_dict=False)[0]


def _close(actual, expected, rtol):
    scale = expected.abs().max().item()
    err = (actual.float() - expected.float()).abs().max().item()
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol} * max|expected| = {rtol * scale:.3g}"


def _state(model):
    """Every attribute the patch may change: processors of every attention layer, rotary forward."""
    procs = {n: m.processor for n, m in model.named_modules() if hasattr(m, "processor")}
    rope = getattr(model, "rope", None)
    return procs, (None if rope is None else rope.__dict__.get("forward", "absent"))


@pytest.mark.parametrize("name", NAMES)
def test_fp32_matches_and_undo_restores(name, monkeypatch):
    model, inp = build(name)
    ref = run(model, inp)
    procs, rope_forward = _state(model)
    calls = _spy_rome(monkeypatch)
    handle = rome.integrations.patch(model, backend="torch")
    assert handle.family == type(model).__name__ and handle.active
    out = run(model, inp)
    assert out.shape == ref.shape
    _close(out, ref, FP32_RTOL)
    layers = rd._attention_layers(model, handle.family)
    # one launch per RoPE attention layer (Flux's double-stream layers with their norms fused: two,
    # the text tokens' norms and the image tokens' each their own)
    assert len(calls) == len(layers) + sum(1 for _, a in layers if name == "flux" and
                                           getattr(a, "added_kv_proj_dim", None) is not None) > 0
    assert set(calls) == {"apply_qk_norm" if FUSED.get(name) else "apply_qk"}
    handle.undo()
    assert not handle.active
    again = run(model, inp)
    assert torch.equal(again, ref)
    procs2, rope_forward2 = _state(model)
    assert procs2.keys() == procs.keys() and all(procs2[k] is procs[k] for k in procs)
    assert rope_forward2 is rope_forward
    handle.undo()  # a no-op


@pytest.mark.parametrize("name", NAMES)
def test_bf16(name, monkeypatch):
    """Often bitwise: the models rotate in fp32 and round once to bf16 too (Wan's tables are cast
    to bf16 with the model, and it multiplies in bf16 then)."""
    model, inp = build(name, torch.bfloat16)
    ref = run(model, inp)
    calls = _spy_rome(monkeypatch, lambda a: a[0].dtype)
    with rome.integrations.patch(model, backend="torch"):
        out = run(model, inp)
    assert calls and set(calls) == {torch.bfloat16}
    assert out.dtype == torch.bfloat16
    _close(out, ref, BF16_RTOL)


def assert_patched_gradients_match(model, inp):
    """Every parameter's gradient of sum(out**2) with the model patched (torch backend) against
    unpatched: within 1e-4 relative; parameters whose gradient is rounding noise (~1e-10, e.g. a
    bias before a norm) against 1e-6 of the largest gradient."""

    def grads():
        model.zero_grad()
        out = model(**inp, return_dict=False)[0]
        sum(t.square().sum() for t in (out if isinstance(out, list) else [out])).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref = grads()
    with rome.integrations.patch(model, backend="torch"):
        got = grads()
    assert got.keys() == ref.keys() and len(ref) > 10
    floor = 1e-6 * max(g.abs().max().item() for g in ref.values() if g.numel())  # (empty: NucleusMoE's)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-4, atol=floor, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("name", ["wan", "hunyuan"])
def test_backward(name):
    assert_patched_gradients_match(*build(name))


def _block_call(model, path, inp):
    """The (args, kwargs) the model passes to its block at ``path``."""
    block = model.get_submodule(path)
    seen = {}
    hook = block.register_forward_pre_hook(
        lambda m, a, k: seen.setdefault("call", (a, k)), with_kwargs=True
    )
    try:
        run(model, inp)
    finally:
        hook.remove()
    return block, seen["call"]


@pytest.mark.parametrize("name", ["wan", "hunyuan", "flux", "cogvideox", "ltx"])
def test_compile_patched_block_fullgraph(name):
    model, inp = build(name)
    with rome.integrations.patch(model, backend="torch"):
        block, (args, kwargs) = _block_call(model, CASES[name][3], inp)
        with torch.no_grad():
            eager = block(*args, **kwargs)
            torch._dynamo.reset()
            compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(*args, **kwargs)
    eager = eager if isinstance(eager, tuple) else (eager,)
    compiled = compiled if isinstance(compiled, tuple) else (compiled,)
    for e, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["wan", "flux"])
def test_triton_interpreter(name):
    """The Triton kernel (interpreted on CPU without a GPU) in a whole model: Wan's and Flux's q/k
    norms fused into the rotation (one launch with the norm prologue per norm pair)."""
    model, inp = build(name)
    ref = run(model, inp)
    with rome.integrations.patch(model, backend="triton"):
        out = run(model, inp)
    _close(out, ref, FP32_RTOL)


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_norms_fused(name, backend, monkeypatch):
    """With these models patched, the q/k norm modules of their RoPE attention layers are no longer
    called (Flux's text tokens' too: they are rotated; HunyuanVideo's are not) (rome.apply_qk_norm normalises and rotates in one call; cross attention, unrotated,
    keeps its own); outputs within the tolerances, bf16 too; undo calls them again, bitwise as
    before."""
    for dtype, rtol in ((torch.float32, FP32_RTOL), (torch.bfloat16, BF16_RTOL)):
        model, inp = build(name, dtype)
        ref = run(model, inp)
        layers = rd._attention_layers(model, type(model).__name__)  # the RoPE (self-attention) layers
        rotated = ("norm_q", "norm_k") + (("norm_added_q", "norm_added_k") if name == "flux" else ())
        norms = [getattr(a, n) for _, a in layers for n in rotated if isinstance(getattr(a, n, None), torch.nn.Module)]
        ran = []
        for m in norms:
            m.register_forward_hook(lambda mod, i, o: ran.append(mod))
        with rome.integrations.patch(model, backend=backend):
            out = run(model, inp)
        assert norms and ran == []
        _close(out, ref, rtol)
        assert torch.equal(run(model, inp), ref) and len(ran) > 0


# --- tables: which is nearer the float64 truth -------------------------------------------------


def _hunyuan_truth(rope, sizes):
    """float64 cos/sin of HunyuanVideoRotaryPosEmbed's formula (diffusers' code, in float64)."""
    grid = rome.grid_positions(sizes).to(torch.float64)
    cos, sin = [], []
    for i, d in enumerate(rope.rope_dim):
        freqs = 1.0 / (rope.theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        angles = torch.outer(grid[:, i], freqs)
        cos.append(angles.cos().repeat_interleave(2, 1))
        sin.append(angles.sin().repeat_interleave(2, 1))
    return torch.cat(cos, 1), torch.cat(sin, 1)


def _ltx_truth(rope, grid):
    """float64 cos/sin of LTXVideoRotaryPosEmbed.forward's formula (diffusers' code, in float64)."""
    import math

    freqs = rope.theta ** torch.linspace(0, 1, rope.dim // 6, dtype=torch.float64) * math.pi / 2
    angles = (freqs * (grid.unsqueeze(-1) * 2 - 1)).transpose(-1, -2).flatten(2)
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    pad = rope.dim % 6
    if pad:
        cos = torch.cat([torch.ones_like(cos[..., :pad]), cos], -1)
        sin = torch.cat([torch.zeros_like(sin[..., :pad]), sin], -1)
    return cos, sin


def _errors(tables, truth):
    return max((t.double() - r).abs().max().item() for t, r in zip(tables, truth))


def test_tables_nearer_float64_truth():
    """HunyuanVideo (θ=256, large grid) and LTX-Video (its real 2048-wide config): the patched
    rotary modules' tables are within float32 rounding (2**-24) of the float64 truth and nearer it
    than the models' own float32-angle tables."""
    hy = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=1, attention_head_dim=128, num_layers=0,
        num_single_layers=0, num_refiner_layers=0, text_embed_dim=16, pooled_projection_dim=8,
    )  # rope_axes_dim (16, 56, 56), θ = 256
    latents = torch.empty(1, 1, 4, 40, 80)  # patch size 2: grid 4 x 20 x 40
    truth = _hunyuan_truth(hy.rope, [4, 20, 40])
    model_tables = hy.rope(latents)
    with rome.integrations.patch(hy):
        rome_tables = hy.rope(latents)
    model_err, rome_err = _errors(model_tables, truth), _errors(rome_tables, truth)
    assert rome_err <= 2**-24 < model_err, (rome_err, model_err)

    ltx_rope = diffusers.models.transformers.transformer_ltx.LTXVideoRotaryPosEmbed(dim=2048)
    frames, height, width, scale = 4, 8, 8, (0.32, 32, 32)
    h = torch.empty(1, 1)
    model_tables = ltx_rope(h, frames, height, width, scale)
    grid = rome.grid_positions([frames, height, width]).to(torch.float64)
    grid = grid * torch.tensor([s * p / b for s, p, b in zip(scale, (1, 1, 1), (20, 2048, 2048))],
                               dtype=torch.float64)
    truth = _ltx_truth(ltx_rope, grid[None])
    rome_tables = rd._ltx_rope_forward(ltx_rope)(h, frames, height, width, scale)
    model_err, rome_err = _errors(model_tables, truth), _errors(rome_tables, truth)
    assert rome_err <= 2**-24 < model_err, (rome_err, model_err)


def test_wan_and_flux_tables_are_rome_tables():
    """Wan and Flux keep their rotary modules: their tables are rome's interleave tables of the
    same sections (float64 angles, rounded once), so the patch changes only the rotation."""
    model, inp = build("wan")
    cos, sin = model.rope(inp["hidden_states"])  # grid 2 x 2 x 2, sections 4/4/4
    rcos, rsin = rome.rope_cos_sin(rome.grid_positions([2, 2, 2]), (4, 4, 4), mode="interleave")
    torch.testing.assert_close(cos[0, :, 0], rcos, rtol=0, atol=2**-24)
    torch.testing.assert_close(sin[0, :, 0], rsin, rtol=0, atol=2**-24)
    model, inp = build("flux")
    ids = torch.cat([inp["txt_ids"], inp["img_ids"]])
    cos, sin = model.pos_embed(ids)
    rcos, rsin = rome.rope_cos_sin(ids, (4, 6, 6), mode="interleave")
    torch.testing.assert_close(cos, rcos, rtol=0, atol=2**-24)
    torch.testing.assert_close(sin, rsin, rtol=0, atol=2**-24)


# --- errors ------------------------------------------------------------------------------------


def test_patch_twice_raises():
    model, _ = build("flux")
    handle = rome.integrations.patch(model, backend="torch")
    with pytest.raises(ValueError, match="FluxTransformer2DModel is already patched by rome"):
        rome.integrations.patch(model)
    handle.undo()
    rome.integrations.patch(model).undo()  # patchable again after undo
    hy = diffusers.HunyuanVideoTransformer3DModel(  # no layers: only its rotary module is patched
        in_channels=4, out_channels=4, num_attention_heads=1, attention_head_dim=16, num_layers=0,
        num_single_layers=0, num_refiner_layers=0, text_embed_dim=16, pooled_projection_dim=8,
        rope_axes_dim=(4, 6, 6),
    )
    with rome.integrations.patch(hy):
        with pytest.raises(ValueError, match="HunyuanVideoTransformer3DModel is already patched"):
            rome.integrations.patch(hy)


def test_unsupported_model_raises():
    emb = diffusers.models.embeddings.TimestepEmbedding(4, 8)
    with pytest.raises(ValueError, match="does not support TimestepEmbedding.*WanTransformer3DModel"):
        rome.integrations.patch(emb)
    assert "FluxTransformer2DModel" in rome.integrations.supported()["diffusers"]


def test_other_processor_raises():
    model, _ = build("flux")

    class MyProcessor(diffusers.models.transformers.transformer_flux.FluxAttnProcessor):
        pass

    before = _state(model)[0]
    model.single_transformer_blocks[0].attn.set_processor(MyProcessor())
    with pytest.raises(ValueError, match=r"single_transformer_blocks\.0\.attn has processor MyProcessor"):
        rome.integrations.patch(model)
    # nothing was changed by the refused patch
    assert model.transformer_blocks[0].attn.processor is before["transformer_blocks.0.attn"]


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("hunyuan", dict(rope_axes_dim=(4, 6, 5)), r"HunyuanVideoTransformer3DModel: rope_axes_dim=\[4, 6, 5\]"),
        ("hunyuan", dict(rope_axes_dim=(4, 6, 4)), r"summing to attention_head_dim=16"),
        ("flux", dict(axes_dims_rope=(4, 4, 4)), r"FluxTransformer2DModel: axes_dims_rope=\[4, 4, 4\]"),
        ("cogvideox", dict(use_rotary_positional_embeddings=False), r"CogVideoXTransformer3DModel: use_rotary"),
    ],
)
def test_config_rome_cannot_express_raises(name, change, message):
    cls, config, _, _ = CASES[name]
    model = cls(**{**config, **change})
    with pytest.raises(ValueError, match=message):
        rome.integrations.patch(model)


def test_bad_backend_raises():
    model, _ = build("wan")
    with pytest.raises(ValueError, match="backend must be one of"):
        rome.integrations.patch(model, backend="cuda")


def test_other_diffusers_version_raises(monkeypatch):
    """A diffusers without the helpers a rome processor calls: refused before any change."""
    from diffusers.models.transformers import transformer_wan

    model, _ = build("wan")
    monkeypatch.delattr(transformer_wan, "_get_qkv_projections")
    with pytest.raises(ValueError, match=r"WanTransformer3DModel: diffusers .* has no .*_get_qkv_projections"):
        rome.integrations.patch(model)
    assert type(model.blocks[0].attn1.processor) is transformer_wan.WanAttnProcessor
