"""rome.integrations.diffusers on the families issue 19 adds (diffusers 0.42): Qwen-Image, FLUX.2,
Chroma, WanVACE, WanAnimate, ChronoEdit, SkyReels-V2, HunyuanVideo 1.5, HunyuanImage, LTX-2,
Z-Image, Cosmos, Mochi, Lumina2, CogView4, HiDream.

Each model is a tiny random transformer (one block of each kind, head dims 8-16, a few dozen
tokens), built from a fixed seed, as in tests/test_integrations_diffusers.py:

- forward, fp32: the patched output within 1e-5 of the output's scale (max |output|) of the
  unpatched one (rome rounds each rotated element once, the models round two or three fp32
  operations; the difference through one or two blocks measured at most 2.5e-7 of the scale); one rome
  launch per RoPE attention layer call (``apply_qk``, or one ``apply`` each for q and k where the
  keys have their own tables: LTX-2's audio/video cross attention); ``undo()`` gives the
  unpatched output back bit for bit and the original processors (``is``).
- bf16 (the model cast with ``.to``): q and k reach rome in bf16, the output within 2e-2 of its
  scale.
- backward: the gradient of every parameter within 1e-4 relative (1e-6 of the largest gradient
  absolute, for gradients that are rounding noise).
- rotation: where a family states its RoPE otherwise than rome (complex tables, half-width or 2x2
  per-pair tables, per-head split tables, ``rotate_half``), rome's rotation from the tables the
  model itself computed (captured from an unpatched forward) is checked against the model's own
  rotary function (or its formula, written here for the ones nested inside a processor) on random
  q: within 2 ulp of fp32 at the scale of q (2.4e-7 x max |q|).
- Triton: one model per rotation kind (complex, half, half-width pairs, 2x2 tables) with
  ``backend="triton"`` (interpreted on a CPU).
- ``torch.compile(fullgraph=True)`` of a patched Qwen-Image block (``aot_eager``).
- refusals: configurations rome cannot express, processors other than the default, a second patch.
"""

from __future__ import annotations

import functools
import inspect

import pytest
import torch

from conftest import optional

diffusers, needs_diffusers = optional("diffusers")
pytestmark = needs_diffusers

import rome  # noqa: E402
import rome.integrations  # noqa: E402
from test_integrations_diffusers import assert_patched_gradients_match  # noqa: E402

if diffusers is not None:
    from rome.integrations import diffusers as rd
    from diffusers.models import attention_processor as ap, embeddings
    from diffusers.models.transformers import (
        transformer_cogview4, transformer_cosmos, transformer_hidream_image, transformer_ltx2,
        transformer_lumina2, transformer_qwenimage, transformer_z_image,
    )

FP32_RTOL = 1e-5
BF16_RTOL = 2e-2
R = torch.randn


def _flux2_ids(h, w, s):
    img = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))[None]
    txt = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(s))[None]
    return img, txt


_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def _wan_inputs():
    return dict(hidden_states=R(1, 4, 2, 4, 4), encoder_hidden_states=R(1, 5, 16), timestep=torch.tensor([3]))


# name -> (diffusers class name, config, inputs())
CASES = {
    "qwenimage": ("QwenImageTransformer2DModel",
                  dict(patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
                       num_attention_heads=2, joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)),
                  lambda: dict(hidden_states=R(1, 4, 16), encoder_hidden_states=R(1, 5, 16),
                               encoder_hidden_states_mask=torch.tensor([[1, 1, 1, 1, 0]]), timestep=torch.tensor([1.0]),
                               img_shapes=[(1, 2, 2)])),
    "flux2": ("Flux2Transformer2DModel",
              dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=16, timestep_guidance_channels=16,
                   axes_dims_rope=[4, 4, 4, 4]),
              lambda: dict(hidden_states=R(1, 6, 4), encoder_hidden_states=R(1, 3, 16), img_ids=_flux2_ids(2, 3, 3)[0],
                           txt_ids=_flux2_ids(2, 3, 3)[1], timestep=torch.tensor([1.0]), guidance=torch.tensor([1.0]))),
    "chroma": ("ChromaTransformer2DModel",
               dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                    num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=[4, 4, 8],
                    approximator_num_channels=8,
                    approximator_hidden_dim=16, approximator_layers=1),
               lambda: dict(hidden_states=R(1, 6, 4), encoder_hidden_states=R(1, 3, 16), img_ids=R(6, 3) * 4,
                            txt_ids=R(3, 3), timestep=torch.tensor([1.0]))),
    "wanvace": ("WanVACETransformer3DModel", dict(_WAN, num_layers=2, vace_layers=[0], vace_in_channels=12),
                lambda: dict(_wan_inputs(), control_hidden_states=R(1, 12, 2, 4, 4))),
    "wananimate": ("WanAnimateTransformer3DModel",
                   dict(_WAN, in_channels=12, latent_channels=4, cross_attn_norm=True, image_dim=16,
                        motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16}, motion_encoder_size=16,
                        motion_style_dim=8, motion_dim=4, motion_encoder_dim=16, face_encoder_hidden_dim=16,
                        face_encoder_num_heads=2, inject_face_latents_blocks=1),
                   lambda: dict(_wan_inputs(), hidden_states=R(1, 12, 2, 4, 4), encoder_hidden_states_image=R(1, 3, 16),
                                pose_hidden_states=R(1, 4, 1, 4, 4), face_pixel_values=R(1, 3, 1, 16, 16))),
    "chronoedit": ("ChronoEditTransformer3DModel", dict(_WAN, attention_head_dim=8, rope_max_seq_len=64,
                                                        rope_temporal_skip_len=8),
                   lambda: dict(_wan_inputs(), encoder_hidden_states_image=None)),
    "skyreels": ("SkyReelsV2Transformer3DModel", _WAN, _wan_inputs),
    "hunyuan15": ("HunyuanVideo15Transformer3DModel",
                  dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                       num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1, text_embed_dim=16,
                       text_embed_2_dim=8, image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16,
                       task_type="t2v"),
                  lambda: dict(hidden_states=R(1, 4, 2, 2, 3), timestep=torch.tensor([1.0]),
                               encoder_hidden_states=R(1, 6, 16), encoder_hidden_states_2=R(1, 4, 8),
                               encoder_attention_mask=torch.ones(1, 6), encoder_attention_mask_2=torch.ones(1, 4),
                               image_embeds=torch.zeros(1, 3, 12))),
    "hunyuanimage": ("HunyuanImageTransformer2DModel",
                     dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=1,
                          num_single_layers=1, num_refiner_layers=1, patch_size=(1, 1), guidance_embeds=False,
                          text_embed_dim=16, text_embed_2_dim=16, rope_axes_dim=(4, 4)),
                     lambda: dict(hidden_states=R(1, 4, 2, 3), timestep=torch.tensor([1.0]),
                                  encoder_hidden_states=R(1, 5, 16), encoder_attention_mask=torch.ones(1, 5))),
    "ltx2": ("LTX2VideoTransformer3DModel",
             dict(in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2,
                  attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4,
                  audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=1,
                  qk_norm="rms_norm_across_heads", caption_channels=16, rope_double_precision=False),
             lambda: dict(hidden_states=R(1, 12, 4), audio_hidden_states=R(1, 5, 4), encoder_hidden_states=R(1, 4, 16),
                          audio_encoder_hidden_states=R(1, 4, 16), timestep=torch.tensor([300.0]),
                          encoder_attention_mask=torch.ones(1, 4).bool(), num_frames=2, height=2, width=3,
                          audio_num_frames=5, fps=25.0)),
    "zimage": ("ZImageTransformer2DModel",
               dict(all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=1, n_refiner_layers=1,
                    n_heads=2, n_kv_heads=2, qk_norm=True, cap_feat_dim=16, rope_theta=256.0, t_scale=1000.0,
                    axes_dims=[8, 4, 4], axes_lens=[64, 32, 32]),
               lambda: dict(x=[R(4, 1, 4, 6)], cap_feats=[R(5, 16)], t=torch.tensor([0.3]))),
    "cosmos": ("CosmosTransformer3DModel",
               dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=1,
                    mlp_ratio=2, text_embed_dim=16, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2),
                    rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=False, extra_pos_embed_type="learnable"),
               lambda: dict(hidden_states=R(1, 4, 2, 4, 6), timestep=torch.tensor([3]),
                            encoder_hidden_states=R(1, 5, 16),
                            attention_mask=torch.ones(1, 5), fps=30)),
    "mochi": ("MochiTransformer3DModel",
              dict(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1, pooled_projection_dim=16,
                   in_channels=4, out_channels=None, qk_norm="rms_norm", text_embed_dim=16, time_embed_dim=4,
                   activation_fn="swiglu", max_sequence_length=16),
              lambda: dict(hidden_states=R(1, 4, 2, 4, 6), encoder_hidden_states=R(1, 5, 16),
                           timestep=torch.tensor([3]),
                           encoder_attention_mask=torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool))),
    "lumina2": ("Lumina2Transformer2DModel",
                dict(sample_size=16, patch_size=2, in_channels=4, hidden_size=24, num_layers=1, num_refiner_layers=1,
                     num_attention_heads=3, num_kv_heads=1, multiple_of=2, ffn_dim_multiplier=None, norm_eps=1e-5,
                     scaling_factor=1.0, axes_dim_rope=(4, 2, 2), axes_lens=(128, 128, 128), cap_feat_dim=16),
                lambda: dict(hidden_states=R(1, 4, 4, 6), encoder_hidden_states=R(1, 5, 16),
                             timestep=torch.tensor([0.4]),
                             encoder_attention_mask=torch.ones(1, 5, dtype=torch.bool))),
    "cogview4": ("CogView4Transformer2DModel",
                 dict(patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=2,
                      out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=4),
                 lambda: dict(hidden_states=R(1, 4, 4, 6), encoder_hidden_states=R(1, 5, 8), timestep=torch.tensor([3]),
                              original_size=torch.tensor([[32, 48]]), target_size=torch.tensor([[32, 48]]),
                              crop_coords=torch.tensor([[0, 0]]))),
    "hidream": ("HiDreamImageTransformer2DModel",
                dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
                     attention_head_dim=8, num_attention_heads=2, caption_channels=[8, 4], text_emb_dim=8,
                     num_routed_experts=2, num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(32, 32),
                     llama_layers=(0, 1), force_inference_output=True),
                lambda: dict(hidden_states=R(1, 4, 4, 6), encoder_hidden_states_t5=R(1, 5, 8),
                             encoder_hidden_states_llama3=R(2, 1, 5, 4), pooled_embeds=R(1, 8),
                             timesteps=torch.tensor([3]))),
    # issue 26: FramePack (HunyuanVideo's blocks; clean latents and 2x/4x histories packed before
    # the noisy ones, each with its own tables) and ConsisID (CogVideoX's attention)
    "framepack": ("HunyuanVideoFramepackTransformer3DModel",
                  dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16, num_layers=1,
                       num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1,
                       guidance_embeds=False, text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(4, 6, 6),
                       image_proj_dim=8, has_image_proj=True, has_clean_x_embedder=True),
                  lambda: dict(hidden_states=R(1, 4, 2, 8, 8), timestep=torch.tensor([3]),
                               encoder_hidden_states=R(1, 4, 16), encoder_attention_mask=torch.ones(1, 4),
                               pooled_projections=R(1, 8), image_embeds=R(1, 3, 8), indices_latents=torch.arange(2),
                               latents_clean=R(1, 4, 1, 8, 8), indices_latents_clean=torch.arange(2, 3),
                               latents_history_2x=R(1, 4, 2, 8, 8), indices_latents_history_2x=torch.arange(3, 5),
                               latents_history_4x=R(1, 4, 4, 8, 8), indices_latents_history_4x=torch.arange(5, 9))),
    "consisid": ("ConsisIDTransformer3DModel",
                 dict(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4, time_embed_dim=8,
                      text_embed_dim=16, num_layers=1, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
                      temporal_compression_ratio=4, max_text_seq_length=4, use_rotary_positional_embeddings=True,
                      is_train_face=False),
                 lambda: dict(hidden_states=R(1, 2, 4, 8, 8), encoder_hidden_states=R(1, 4, 16),
                              timestep=torch.tensor([3]),
                              image_rotary_emb=embeddings.get_3d_rotary_pos_embed(16, ((0, 0), (4, 4)), (4, 4), 2))),
}
NAMES = tuple(CASES)


def build(name, **change):
    cls, config, inputs = CASES[name]
    torch.manual_seed(0)
    model = getattr(diffusers, cls)(**{**config, **change}).eval()
    torch.manual_seed(1)
    return model, inputs()


def _flat(out):
    """The model's first output as one tensor (Z-Image returns a list, one per image)."""
    out = out[0]
    return torch.cat([t.flatten() for t in out]) if isinstance(out, list) else out


def run(model, inp):
    with torch.no_grad():
        return _flat(model(**inp, return_dict=False))


def _close(actual, expected, rtol):
    scale = expected.abs().max().item()
    err = (actual - expected).abs().max().item()
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol} * max|expected| = {rtol * scale:.3g}"


def _processors(model):
    return {n: m.processor for n, m in model.named_modules() if hasattr(m, "processor")}


def _count_launches(monkeypatch):
    calls = {"apply_qk": 0, "apply": 0}
    for fn in calls:
        real = getattr(rd, fn)

        def counted(*a, _fn=fn, _real=real, **k):
            calls[_fn] += 1
            return _real(*a, **k)

        monkeypatch.setattr(rd, fn, counted)
    return calls


def test_every_family_is_supported():
    assert set(rome.integrations.supported()["diffusers"]) >= {cls for cls, _, _ in CASES.values()}


def _patched_matches(model, inp, monkeypatch):
    """Patch (torch backend), check the output against the unpatched one and the launches, undo;
    the unpatched output."""
    ref = run(model, inp)
    calls = _count_launches(monkeypatch)
    handle = rome.integrations.patch(model, backend="torch")
    assert handle.family == type(model).__name__
    layers = rd._attention_layers(model, handle.family)
    assert layers and all(isinstance(a.processor, rd._RomeProcessor) for _, a in layers)
    out = run(model, inp)
    assert out.shape == ref.shape
    _close(out, ref, FP32_RTOL)
    # one launch per RoPE layer: apply_qk, or apply for q and apply for k (LTX-2's cross attention)
    assert calls["apply"] % 2 == 0 and calls["apply_qk"] + calls["apply"] // 2 == len(layers), calls
    handle.undo()
    return ref


@pytest.mark.parametrize("name", NAMES)
def test_fp32_matches_and_undo_restores(name, monkeypatch):
    model, inp = build(name)
    before = _processors(model)
    ref = _patched_matches(model, inp, monkeypatch)
    assert torch.equal(run(model, inp), ref)
    after = _processors(model)
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)


def _bf16(value):
    if isinstance(value, list):
        return [_bf16(v) for v in value]
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(torch.bfloat16)
    return value


@pytest.mark.parametrize("name", NAMES)
def test_bf16(name, monkeypatch):
    """A bf16 model (cast with ``.to``): q and k reach rome in bf16, the output within 2e-2 of
    its scale (measured: bitwise the unpatched output but for Wan's copies, ~5e-3, whose tables are
    cast to bf16 with the model and multiplied in bf16)."""
    model, inp = build(name)
    model, inp = model.to(torch.bfloat16), {k: _bf16(v) for k, v in inp.items()}
    ref = run(model, inp)
    dtypes = []
    for fn in ("apply_qk", "apply"):
        real = getattr(rd, fn)
        monkeypatch.setattr(rd, fn, lambda *a, _real=real, **k: dtypes.append(a[0].dtype) or _real(*a, **k))
    with rome.integrations.patch(model, backend="torch"):
        out = run(model, inp)
    assert dtypes and set(dtypes) == {torch.bfloat16}
    assert out.dtype == torch.bfloat16
    _close(out.float(), ref.float(), BF16_RTOL)


@pytest.mark.parametrize("name", NAMES)
def test_backward(name):
    assert_patched_gradients_match(*build(name))


@pytest.mark.parametrize("name", ["qwenimage", "cosmos", "mochi", "hidream"])
def test_triton_interpreter(name):
    """One model per rotation kind: complex tables (Qwen-Image), rotate_half (Cosmos), half-width
    per-head pairs (Mochi), 2x2 per-pair tables (HiDream)."""
    model, inp = build(name)
    ref = run(model, inp)
    with rome.integrations.patch(model, backend="triton"):
        out = run(model, inp)
    _close(out, ref, FP32_RTOL)


@pytest.mark.parametrize("name, change", [("ltx2", dict(rope_type="split")), ("hidream", dict(attention_head_dim=16))])
def test_other_rope_layouts(name, change, monkeypatch):
    """LTX-2's ``split`` RoPE (per-head ``rotate_half`` tables ``[B, N, S, D/2]``) and HiDream
    rotating the first half of each head only (axes 4/2/2 of a head dim of 16)."""
    model, inp = build(name, **change)
    _patched_matches(model, inp, monkeypatch)


def test_compile_patched_block_fullgraph():
    """A patched Qwen-Image block (its complex tables converted inside the graph) traces with
    ``torch.compile(fullgraph=True)`` (``aot_eager``) and gives the eager output."""
    model, inp = build("qwenimage")
    with rome.integrations.patch(model, backend="torch"):
        block = model.transformer_blocks[0]
        seen = {}
        hook = block.register_forward_pre_hook(lambda m, a, k: seen.setdefault("call", (a, k)), with_kwargs=True)
        try:
            run(model, inp)
        finally:
            hook.remove()
        args, kwargs = seen["call"]
        with torch.no_grad():
            eager = block(*args, **kwargs)
            torch._dynamo.reset()
            compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(*args, **kwargs)
    for e, c in zip(eager, compiled, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-6, atol=1e-6)


# --- the rotation against the model's own rotary function, on the model's own tables ----------


def _capture(model, inp, proc_cls, arg):
    """The tables (processor argument ``arg``) of the first call of ``proc_cls`` in an
    unpatched forward that had tables."""
    seen = []
    real = proc_cls.__call__
    sig = inspect.signature(real)

    @functools.wraps(real)  # diffusers reads the processor's parameters from its signature
    def record(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        if bound.arguments.get(arg) is not None:
            seen.append(bound.arguments[arg])
        return real(self, *args, **kwargs)

    proc_cls.__call__ = record
    try:
        run(model, inp)
    finally:
        proc_cls.__call__ = real
    assert seen, f"{proc_cls.__name__} got no {arg}"
    return seen[0]


def _mochi_formula(x, cos, sin):
    """MochiAttnProcessor2_0's nested ``apply_rotary_emb`` (diffusers 0.42), written out."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([x_even * cos - x_odd * sin, x_even * sin + x_odd * cos], -1).flatten(-2).to(x.dtype)


def _z_image_formula(x, freqs_cis):
    """ZSingleStreamAttnProcessor's nested ``apply_rotary_emb`` (diffusers 0.42), written out."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs_cis.unsqueeze(2)).flatten(3).type_as(x)


def _rotation_cases():
    """name -> (processor class, its RoPE argument, q's shape from the tables,
    model's rotation(x, tables), rome's (cos, sin, mode) from the tables (the patch's helpers))."""
    return {
        "qwenimage": (transformer_qwenimage.QwenDoubleStreamAttnProcessor2_0, "image_rotary_emb",
                      lambda t: (1, t[0].shape[0], 2, 2 * t[0].shape[-1]),
                      lambda x, t: transformer_qwenimage.apply_rotary_emb_qwen(x, t[0], use_real=False),
                      lambda t: (*(c[:, None] for c in rd._complex_tables(t[0])), "interleave")),
        "zimage": (transformer_z_image.ZSingleStreamAttnProcessor, "freqs_cis",
                   lambda t: (t.shape[0], t.shape[1], 2, 2 * t.shape[-1]), _z_image_formula,
                   lambda t: (*(c[:, :, None] for c in rd._complex_tables(t)), "interleave")),
        "lumina2": (transformer_lumina2.Lumina2AttnProcessor2_0, "image_rotary_emb",
                    lambda t: (t.shape[0], t.shape[1], 3, 2 * t.shape[-1]),
                    lambda x, t: embeddings.apply_rotary_emb(x, t, use_real=False),
                    lambda t: (*(c[:, :, None] for c in rd._complex_tables(t)), "interleave")),
        "mochi": (ap.MochiAttnProcessor2_0, "image_rotary_emb",
                  lambda t: (1, *t[0].shape[:2], 2 * t[0].shape[-1]),
                  lambda x, t: _mochi_formula(x, *t), lambda t: (*rd._pair_tables(*t), "interleave")),
        "hidream": (transformer_hidream_image.HiDreamAttnProcessor, "image_rotary_emb",
                    lambda t: (t.shape[0], t.shape[1], 2, 2 * t.shape[-3]),
                    lambda x, t: transformer_hidream_image.apply_rope(x, x, t)[0],
                    lambda t: (*rd._hidream_tables(t, 2 * t.shape[-3]), "interleave")),
        "cosmos": (transformer_cosmos.CosmosAttnProcessor2_0, "image_rotary_emb",
                   lambda t: (1, 2, *t[0].shape),
                   lambda x, t: embeddings.apply_rotary_emb(x, t, use_real=True, use_real_unbind_dim=-2),
                   lambda t: (*t, "half")),
        "cogview4": (transformer_cogview4.CogView4AttnProcessor, "image_rotary_emb",
                     lambda t: (1, 2, *t[0].shape),
                     lambda x, t: embeddings.apply_rotary_emb(x, t, use_real_unbind_dim=-2),
                     lambda t: (*t, "half")),
    }


def _ltx2_case(rope_type):
    attn = type("Attn", (), {"heads": 2, "rope_type": rope_type})  # what _ltx2_tables reads
    rotate = (transformer_ltx2.apply_interleaved_rotary_emb if rope_type == "interleaved"
              else transformer_ltx2.apply_split_rotary_emb)
    return (transformer_ltx2.LTX2AudioVideoAttnProcessor, "query_rotary_emb",
            lambda t: (t[0].shape[0], t[0].shape[1] if rope_type == "interleaved" else t[0].shape[2], 2,
                       t[0].shape[-1] // 2 if rope_type == "interleaved" else 2 * t[0].shape[-1]),
            lambda x, t: rotate(x.flatten(2), t).unflatten(2, (2, -1)),
            lambda t: rd._ltx2_tables(attn, t))


@pytest.mark.parametrize("name", ["qwenimage", "zimage", "lumina2", "mochi", "hidream", "hidream-half", "cosmos",
                                  "cogview4", "ltx2", "ltx2-split"])
def test_rotation_matches_model_tables(name):
    """rome's rotation (the patch's table conversion + ``apply`` on the torch backend) vs the
    model's own rotary function, both on the tables the unpatched model computed, random q."""
    family = name.split("-")[0]
    change = {"hidream-half": dict(attention_head_dim=16), "ltx2-split": dict(rope_type="split")}.get(name, {})
    model, inp = build(family, **change)
    if family == "ltx2":
        proc, arg, shape, model_rotate, rome_tables = _ltx2_case(change.get("rope_type", "interleaved"))
    else:
        proc, arg, shape, model_rotate, rome_tables = _rotation_cases()[family]
    tables = _capture(model, inp, proc, arg)
    x = torch.randn(shape(tables))
    if family == "hidream" and change:
        x = torch.randn(*x.shape[:-1], 2 * x.shape[-1])  # the rotated half and the rest
        expected = transformer_hidream_image.apply_rope(x[..., :x.shape[-1] // 2], x[..., :x.shape[-1] // 2], tables)[0]
        expected = torch.cat([expected, x[..., x.shape[-1] // 2:]], -1)
        cos, sin = rd._hidream_tables(tables, x.shape[-1])
        mode = "interleave"
    else:
        expected = model_rotate(x, tables)
        cos, sin, mode = rome_tables(tables)
    got = rd._Rotate("torch").one(x, cos, sin, mode)
    assert got.shape == expected.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=2**-22 * x.abs().max().item())  # 2 ulp at max|x|


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("chroma", dict(axes_dims_rope=(4, 4, 4)), r"ChromaTransformer2DModel: axes_dims_rope=\[4, 4, 4\] must be"),
        ("hidream", dict(axes_dims_rope=(2, 2, 2)), r"HiDreamImageTransformer2DModel: axes_dims_rope=\[2, 2, 2\].*"
                                                    r"attention_head_dim=8 \(or its first half, 4\)"),
    ],
)
def test_config_rome_cannot_express_raises(name, change, message):
    model, _ = build(name, **change)
    with pytest.raises(ValueError, match=message):
        rome.integrations.patch(model)


@pytest.mark.parametrize(
    "name, path, processor",
    [
        ("ltx2", "transformer_blocks.0.audio_to_video_attn", lambda: transformer_ltx2.LTX2PerturbedAttnProcessor()),
        ("cosmos", "transformer_blocks.0.attn1", lambda: transformer_cosmos.CosmosAttnProcessor2_5()),
        ("flux2", "single_transformer_blocks.0.attn",
         lambda: diffusers.models.transformers.transformer_flux2.Flux2KVParallelSelfAttnProcessor()),
    ],
)
def test_other_processor_raises(name, path, processor):
    model, _ = build(name)
    before = _processors(model)
    model.get_submodule(path).set_processor(processor())
    with pytest.raises(ValueError, match=rf"{type(model).__name__}: {path} has processor"):
        rome.integrations.patch(model)
    after = _processors(model)  # nothing changed by the refused patch but the test's own swap
    assert all(after[k] is before[k] for k in before if k != path)


def test_patch_twice_raises():
    model, _ = build("qwenimage")
    with rome.integrations.patch(model, backend="torch"):
        with pytest.raises(ValueError, match="QwenImageTransformer2DModel is already patched by rome"):
            rome.integrations.patch(model)
    rome.integrations.patch(model).undo()  # patchable again after undo
