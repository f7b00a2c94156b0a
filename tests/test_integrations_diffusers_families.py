"""rome.integrations.diffusers on the families issue 19 adds (diffusers 0.42): Qwen-Image, FLUX.2,
Chroma, WanVACE, WanAnimate, ChronoEdit, SkyReels-V2, HunyuanVideo 1.5, HunyuanImage, LTX-2,
Z-Image, Cosmos, Mochi, Lumina2, CogView4, HiDream; and those issue 26 adds: HunyuanVideo FramePack,
ConsisID, and the 29 whose processor rome rebinds (``REBOUND``: Allegro, HunyuanDiT, Lumina-Next,
Stable Audio, EasyAnimate, OmniGen, GLM-Image, ACE-Step, Bria, Bria-FIBO, FLUX.3, Krea 2,
LongCat-Image, Ovis-Image, Motif-Video, NucleusMoE-Image, Qwen-Image 2.1, AnyFlow, AnyFlow-FAR,
Helios, JoyImage-Edit, JoyImage-Edit-Plus, PRX, Kandinsky 6, Kandinsky 6 SR, LongCat-AudioDiT,
MiniMax-H3, MiniMax-Music3, Stable Audio 3).

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
- rebound families: the launches are counted against the unpatched model's calls of the library's
  rotary function (one rome launch per call, none of those calls left once patched); rome's
  version of each function against the library's on the arguments of the model's own first call
  (2 ulp); the Triton kernel, ``torch.compile(fullgraph=True)`` of a block, pickling; every class
  of ``diffusers.models.transformers`` classified (patched, refused with its reason, or without
  RoPE), a refused class's ValueError naming the class and the reason; a processor that no longer
  calls the rebound function refused. Their zero-initialised parameters are drawn at random so
  the output depends on every attention layer.
"""

from __future__ import annotations

import functools
import inspect
import re

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


# issue 26: the families patched by rebinding the rotary function their processor calls
# (rome.integrations.diffusers._rebound); configs after diffusers' own model tests, shrunk.


def _flux_like(c=4, d=32, **extra):
    """Flux-style inputs: 2x3 image tokens with (0, h, w) ids, 3 text tokens with zero ids."""
    grid = torch.meshgrid(torch.zeros(1), torch.arange(2.0), torch.arange(3.0), indexing="ij")
    return dict(hidden_states=R(1, 6, c), encoder_hidden_states=R(1, 3, d),
                img_ids=torch.stack(grid, -1).reshape(-1, 3), txt_ids=torch.zeros(3, 3), timestep=torch.tensor([1.0]),
                **extra)


def _bria_fibo_inputs():
    text = R(1, 3, 16)
    return dict(_flux_like(c=8, d=16), encoder_hidden_states=text, text_encoder_layers=[text[..., :8], text[..., :8]])


def _flux3_ids(t, h, w, s):
    return torch.cartesian_prod(torch.arange(t), torch.arange(h), torch.arange(w), torch.arange(s)).float()


def _krea2_inputs():
    pos = torch.zeros(4 + 4, 3)  # 4 text tokens at 0, then a 2x2 image grid
    pos[4:, 1] = torch.arange(2).repeat_interleave(2)
    pos[4:, 2] = torch.arange(2).repeat(2)
    mask = torch.tensor([[True, True, True, False]])
    return dict(hidden_states=R(1, 4, 16), encoder_hidden_states=R(1, 4, 3, 16), timestep=torch.tensor([0.5]),
                position_ids=pos, encoder_attention_mask=mask)


def _allegro_tables(frames, h, w, head_dim):
    """AllegroPipeline's tables: per axis ``(cos, sin)`` and the token positions ``[3, 1, S]``."""
    ft, fh, fw, gt, gh, gw = embeddings.get_3d_rotary_pos_embed_allegro(head_dim, ((0, 0), (h, w)), (h, w), frames)
    pos = torch.cartesian_prod(gt.long(), gh.long(), gw.long()).reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1)
    return (ft, fh, fw), tuple(pos)


def _hunyuandit_tables(h, w, head_dim):
    """HunyuanDiTPipeline's tables for an h x w token grid."""
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    return embeddings.get_2d_rotary_pos_embed(head_dim, get_resize_crop_region_for_grid((h, w), 8), (h, w),
                                              output_type="pt")


def _minimax_h3_inputs(video=8, text=4, audio=6):
    """One packed sequence: text, audio, then video rows, as MiniMax-H3's pipelines pack it."""
    n = text + audio + video
    ti, ai, vi = torch.arange(text), torch.arange(text, text + audio), torch.arange(text + audio, n)
    tags = torch.zeros(n, dtype=torch.long)  # 0 video, 1 text, 2 audio
    tags[ti], tags[ai] = 1, 2
    steps = torch.zeros(n, dtype=torch.long)
    steps[ai] = 1
    pos = torch.zeros(n, 3)
    pos[:, 0] = torch.arange(n, dtype=torch.float32)
    pos[vi, 1] = torch.arange(video, dtype=torch.float32) % 4
    pos[vi, 2] = torch.arange(video, dtype=torch.float32) % 2
    return dict(hidden_states=R(1, video, 16), audio_hidden_states=R(1, audio, 6), encoder_hidden_states=R(1, text, 8),
                timestep=torch.tensor([0.7, 0.3]), timestep_indices=steps, token_tags=tags, position_ids=pos,
                video_indices=vi, audio_indices=ai, text_indices=ti)


def _helios_inputs():
    return dict(hidden_states=R(1, 4, 2, 4, 4), timestep=torch.tensor([3]), encoder_hidden_states=R(1, 5, 16),
                indices_hidden_states=torch.ones(1, 2), indices_latents_history_short=torch.ones(1, 1),
                indices_latents_history_mid=torch.ones(1, 1), indices_latents_history_long=torch.ones(1, 4),
                latents_history_short=R(1, 4, 1, 4, 4), latents_history_mid=R(1, 4, 1, 4, 4),
                latents_history_long=R(1, 4, 4, 4, 4))


_FLUX_LIKE = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, num_attention_heads=2)
_ANYFLOW = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, cross_attn_norm=True, rope_max_seq_len=32,
                gate_value=0.25, deltatime_type="r")
_JOY = dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=1,
            rope_dim_list=[4, 6, 6], theta=256)
_MASK5 = torch.tensor([[1, 1, 1, 1, 0]])

# name -> (diffusers class name, config, inputs())
REBOUND = {
    # embeddings.apply_rotary_emb, a global of the processor's module
    "bria": ("BriaTransformer2DModel",
             dict(_FLUX_LIKE, attention_head_dim=8, joint_attention_dim=32, pooled_projection_dim=None,
                  axes_dims_rope=[0, 4, 4]),
             _flux_like),
    "briafibo": ("BriaFiboTransformer2DModel",
                 dict(_FLUX_LIKE, in_channels=8, attention_head_dim=8, joint_attention_dim=16, text_encoder_dim=8,
                      pooled_projection_dim=None, axes_dims_rope=[0, 4, 4]),
                 _bria_fibo_inputs),
    "longcatimage": ("LongCatImageTransformer2DModel",
                     dict(_FLUX_LIKE, attention_head_dim=16, joint_attention_dim=32, pooled_projection_dim=32,
                          axes_dims_rope=[4, 4, 8]),
                     lambda: _flux_like(guidance=torch.tensor([3.5]))),
    "ovisimage": ("OvisImageTransformer2DModel",
                  dict(_FLUX_LIKE, out_channels=4, attention_head_dim=16, joint_attention_dim=32,
                       axes_dims_rope=[4, 4, 8]),
                  _flux_like),
    "flux3": ("Flux3Transformer2DModel",
              dict(in_channels=4, cond_in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, timestep_channels=16, axes_dims_rope=(4, 4, 4, 4)),
              lambda: dict(hidden_states=R(1, 6, 4), encoder_hidden_states=R(1, 3, 32), timestep=torch.tensor([1.0]),
                           img_ids=_flux3_ids(1, 2, 3, 1), txt_ids=_flux3_ids(1, 1, 1, 3))),
    "krea2": ("Krea2Transformer2DModel",
              dict(in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=32, timestep_embed_dim=8, text_hidden_dim=16, num_text_layers=3,
                   text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=16,
                   num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 2, 2), rope_theta=1000.0),
              _krea2_inputs),
    "acestep": ("AceStepTransformer1DModel",
                dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=8, in_channels=24, audio_acoustic_hidden_dim=8, patch_size=2,
                     rope_theta=10000.0, sliding_window=16),
                lambda: dict(hidden_states=R(1, 8, 8), timestep=torch.tensor([0.4]), timestep_r=torch.tensor([0.2]),
                             encoder_hidden_states=R(1, 10, 32), context_latents=R(1, 8, 16))),
    "motif": ("MotifVideoTransformer3DModel",
              dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12, num_layers=1,
                   num_single_layers=1, num_decoder_layers=0, patch_size=1, patch_size_t=1, text_embed_dim=16,
                   image_embed_dim=4, rope_axes_dim=(4, 4, 4)),
              lambda: dict(hidden_states=R(1, 4, 2, 2, 3), encoder_hidden_states=R(1, 5, 16),
                           timestep=torch.tensor([3]))),
    # imported inside __call__ (from .embeddings import ...): resolved to rome's
    "allegro": ("AllegroTransformer3DModel",
                dict(num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, num_layers=1,
                     cross_attention_dim=24, sample_width=8, sample_height=8, sample_frames=8, caption_channels=8),
                lambda: dict(hidden_states=R(1, 4, 2, 4, 6), encoder_hidden_states=R(1, 5, 8),
                             timestep=torch.tensor([3]), image_rotary_emb=_allegro_tables(2, 2, 3, 12))),
    "hunyuandit": ("HunyuanDiT2DModel",
                   dict(sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
                        num_attention_heads=2, cross_attention_dim=8, cross_attention_dim_t5=8, pooled_projection_dim=4,
                        hidden_size=16, text_len=4, text_len_t5=4, activation_fn="gelu-approximate"),
                   lambda: dict(hidden_states=R(1, 4, 4, 6), timestep=torch.tensor([3.0]),
                                encoder_hidden_states=R(1, 4, 8), text_embedding_mask=torch.ones(1, 4),
                                encoder_hidden_states_t5=R(1, 4, 8), text_embedding_mask_t5=torch.ones(1, 4),
                                image_meta_size=torch.tensor([[1024.0, 1024, 16, 16, 0, 0]]),
                                style=torch.zeros(1, dtype=torch.long), image_rotary_emb=_hunyuandit_tables(2, 3, 8))),
    "luminanext": ("LuminaNextDiT2DModel",
                   dict(sample_size=16, patch_size=2, in_channels=4, hidden_size=24, num_layers=1,
                        num_attention_heads=3, num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5,
                        learn_sigma=False, qk_norm=True, cross_attention_dim=32, scaling_factor=1.0),
                   lambda: dict(hidden_states=R(1, 4, 4, 6), timestep=torch.tensor([0.4]),
                                encoder_hidden_states=R(1, 5, 32), encoder_mask=_MASK5,
                                image_rotary_emb=embeddings.get_2d_rotary_pos_embed_lumina(8, 16, 16),
                                cross_attention_kwargs={})),
    "stableaudio": ("StableAudioDiTModel",
                    dict(sample_size=4, in_channels=3, num_layers=1, attention_head_dim=8,
                         num_key_value_attention_heads=1, out_channels=3, cross_attention_dim=4, time_proj_dim=8,
                         global_states_input_dim=8, cross_attention_input_dim=4),
                    lambda: dict(hidden_states=R(1, 3, 6), timestep=torch.tensor([3.0]),
                                 encoder_hidden_states=R(1, 5, 4), global_hidden_states=R(1, 1, 8),
                                 rotary_embedding=embeddings.get_1d_rotary_pos_embed(
                                     4, 7, use_real=True, repeat_interleave_real=False))),
    "easyanimate": ("EasyAnimateTransformer3DModel",
                    dict(attention_head_dim=16, num_attention_heads=2, in_channels=4, mmdit_layers=1, num_layers=1,
                         out_channels=4, patch_size=2, sample_height=60, sample_width=90, text_embed_dim=16,
                         time_embed_dim=8, time_position_encoding_type="3d_rope", timestep_activation_fn="silu"),
                    lambda: dict(hidden_states=R(1, 4, 2, 4, 6), timestep=torch.tensor([3]), timestep_cond=None,
                                 encoder_hidden_states=R(1, 5, 16), encoder_hidden_states_t5=None,
                                 inpaint_latents=None, control_latents=None)),
    "glmimage": ("GlmImageTransformer2DModel",
                 dict(patch_size=2, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8,
                      num_attention_heads=2, text_embed_dim=32, time_embed_dim=16, condition_dim=8,
                      prior_vq_quantizer_codebook_size=64),
                 lambda: dict(hidden_states=R(1, 4, 4, 6), encoder_hidden_states=R(1, 5, 32),
                              prior_token_id=torch.randint(0, 64, (1, 6)),
                              prior_token_drop=torch.zeros(1, dtype=torch.bool), timestep=torch.tensor([3]),
                              target_size=torch.tensor([[4.0, 6.0]]), crop_coords=torch.tensor([[0.0, 0.0]]))),
    "omnigen": ("OmniGenTransformer2DModel",
                dict(hidden_size=16, num_attention_heads=4, num_key_value_heads=4, intermediate_size=32, num_layers=1,
                     pad_token_id=0, vocab_size=1000, in_channels=4, time_step_dim=4,
                     rope_scaling={"long_factor": [1, 2], "short_factor": [1, 2]}),
                lambda: dict(hidden_states=R(1, 4, 8, 8), timestep=torch.tensor([0.4]),
                             input_ids=torch.randint(0, 10, (1, 20)), input_img_latents=[R(1, 4, 8, 8)],
                             input_image_sizes={0: [[0, 16]]}, attention_mask=torch.ones(1, 37, 37),
                             position_ids=torch.arange(37)[None])),
    # the model's own rotary function (or a copy of one), a global of its module
    "nucleus": ("NucleusMoEImageTransformer2DModel",
                dict(patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16,
                     num_attention_heads=2, joint_attention_dim=16, axes_dims_rope=(8, 4, 4), moe_enabled=False,
                     capacity_factors=[8.0]),
                lambda: dict(hidden_states=R(1, 6, 16), encoder_hidden_states=R(1, 5, 16),
                             encoder_hidden_states_mask=_MASK5, timestep=torch.tensor([1.0]), img_shapes=[(1, 2, 3)])),
    "qwenimage21": ("QwenImage21Transformer2DModel",  # through its helper _qwenimage21_prepare_qkv
                    dict(patch_size=1, in_channels=8, out_channels=8, num_layers=1, attention_head_dim=16,
                         num_attention_heads=2, context_in_dim=16, mlp_ratio=2, axes_dims_rope=(8, 4, 4)),
                    lambda: dict(hidden_states=R(1, 4, 8), encoder_hidden_states=R(1, 5, 16),
                                 timestep=torch.tensor([0.5]), img_shapes=[[(1, 2, 2)]],
                                 img_mask=torch.tensor([[False] * 5 + [True]]),
                                 encoder_hidden_states_mask=_MASK5.bool())),
    "anyflow": ("AnyFlowTransformer3DModel", _ANYFLOW,
                lambda: dict(hidden_states=R(1, 2, 4, 4, 6), timestep=torch.full((1, 2), 500.0),
                             r_timestep=torch.full((1, 2), 250.0), encoder_hidden_states=R(1, 5, 16))),
    "anyflowfar": ("AnyFlowFARTransformer3DModel", dict(_ANYFLOW, compressed_patch_size=(1, 4, 4), full_chunk_limit=3),
                   lambda: dict(hidden_states=R(1, 2, 4, 4, 8), timestep=torch.full((1, 2), 500.0),
                                r_timestep=torch.full((1, 2), 250.0), encoder_hidden_states=R(1, 5, 16),
                                chunk_partition=[1, 1])),
    "helios": ("HeliosTransformer3DModel",
               dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                    text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, cross_attn_norm=True,
                    qk_norm="rms_norm_across_heads", rope_dim=(4, 4, 4), has_multi_term_memory_patch=True,
                    guidance_cross_attn=True, zero_history_timestep=True, is_amplify_history=False),
               _helios_inputs),
    "joyimage": ("JoyImageEditTransformer3DModel", _JOY,
                 lambda: dict(hidden_states=R(1, 16, 1, 4, 4), encoder_hidden_states=R(1, 5, 16),
                              timestep=torch.tensor([1.0]))),
    "joyimageplus": ("JoyImageEditPlusTransformer3DModel", _JOY,
                     lambda: dict(hidden_states=R(1, 2, 16, 1, 2, 2), encoder_hidden_states=R(1, 5, 16),
                                  timestep=torch.tensor([1.0]), shape_list=[[(1, 1, 1), (1, 1, 1)]])),
    "prx": ("PRXTransformer2DModel",
            dict(in_channels=4, patch_size=2, context_in_dim=16, hidden_size=32, mlp_ratio=2.0, num_heads=2, depth=1,
                 axes_dim=[8, 8], theta=10_000),
            lambda: dict(hidden_states=R(1, 4, 4, 6), encoder_hidden_states=R(1, 5, 16), timestep=torch.tensor([1.0]))),
    "kandinsky6": ("Kandinsky6Transformer3DModel",
                   dict(in_visual_dim=4, out_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16,
                        patch_size=(1, 2, 2), model_dim=32, ff_dim=32, num_text_blocks=1, num_visual_blocks=1,
                        axes_dims=(4, 6, 6), visual_cond=False, in_audio_dim=4, out_audio_dim=4),
                   lambda: dict(hidden_states=R(1, 2, 4, 6, 4), encoder_hidden_states=R(1, 5, 16),
                                pooled_projections=R(1, 8), timestep=torch.tensor([3.0]),
                                audio_hidden_states=R(1, 6, 4))),
    "kandinsky6sr": ("Kandinsky6SRTransformer3DModel",
                     dict(in_visual_dim=4, out_visual_dim=8, time_dim=16, patch_size=(1, 1, 1), model_dim=32,
                          ff_dim=32, num_visual_blocks=1, axes_dims=(4, 6, 6)),
                     lambda: dict(hidden_states=R(1, 1, 8, 8, 9), timestep=torch.tensor([3.0]))),
    "longcataudio": ("LongCatAudioDiTTransformer",
                     dict(dit_dim=32, dit_depth=1, dit_heads=4, dit_text_dim=16, latent_dim=8, text_conv=False),
                     lambda: dict(hidden_states=R(1, 8, 8), encoder_hidden_states=R(1, 5, 16),
                                  encoder_attention_mask=torch.ones(1, 5, dtype=torch.bool),
                                  attention_mask=torch.ones(1, 8, dtype=torch.bool), timestep=torch.ones(1))),
    "minimaxh3": ("MiniMaxH3Transformer3DModel",
                  dict(num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=1,
                       num_refiner_layers=1, ffn_dim=32, in_channels=4, audio_in_channels=6, patch_size=(1, 2, 2),
                       text_dim=8, freq_dim=8, time_embed_hidden_dim=24, time_embed_dim=16, rope_freq_dim=2),
                  _minimax_h3_inputs),
    "minimaxmusic3": ("MiniMaxMusic3Transformer1DModel",
                      dict(in_channels=8, condition_dim=16, num_layers=1, num_attention_heads=2, attention_head_dim=8,
                           ff_inner_dim=32, rotary_dim=4, fourier_embedding_dim=8),
                      lambda: dict(hidden_states=R(1, 8, 12), encoder_hidden_states=R(1, 12, 16),
                                   timestep=torch.tensor([0.5]))),
    "stableaudio3": ("StableAudio3DiTModel",
                     dict(io_channels=8, patch_size=1, embed_dim=32, depth=1, num_heads=4, cond_token_dim=16,
                          global_cond_dim=12, local_add_cond_dim=5, timestep_features_dim=16, ff_mult=2,
                          num_memory_tokens=3, use_differential_attention=False),
                     lambda: dict(hidden_states=R(1, 8, 10), timestep=torch.tensor([0.3]),
                                  encoder_hidden_states=R(1, 4, 16), global_hidden_states=R(1, 12))),
}
CASES.update(REBOUND)
NAMES = tuple(CASES)


# families whose rotation the model initialises to the identity (Mochi's learned pos_frequencies
# start at zero: every angle 0, cos 1, sin 0): drawn at random as the rebound families' zeros,
# or no test of theirs could see a wrong rotation
ZERO_ROTATION = {"mochi"}


def build(name, **change):
    """The tiny model and its inputs. A rebound family's parameters that the model initialises to
    zero (output projections, gates) are drawn at random, so that its output depends on every
    attention layer (and on the rotation); a class this diffusers lacks is skipped."""
    cls, config, inputs = CASES[name]
    if not hasattr(diffusers, cls):
        pytest.skip(f"diffusers {diffusers.__version__} has no {cls}")
    torch.manual_seed(0)
    model = getattr(diffusers, cls)(**{**config, **change}).eval()
    if name in REBOUND or name in ZERO_ROTATION:
        with torch.no_grad():
            for p in model.parameters():
                if p.is_floating_point() and not p.any():
                    p.normal_(std=0.5)
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
    calls = {"apply_qk": 0, "apply": 0, "apply_qk_norm": 0}
    for fn in calls:
        real = getattr(rd, fn)

        def counted(*a, _fn=fn, _real=real, **k):
            calls[_fn] += 1
            return _real(*a, **k)

        monkeypatch.setattr(rd, fn, counted)
    return calls


def test_every_family_is_supported():
    assert set(rome.integrations.supported()["diffusers"]) >= {cls for cls, _, _ in CASES.values()}


def _rebound_classes(model):
    """The rome processor classes of the model's family that rebind a library function (none for
    the families whose processor rome restates)."""
    return [c for _, _, c, _ in rd._FAMILIES[rd._family(model)].processors if issubclass(c, rd._ReboundProcessor)]


def _library_functions(classes):
    """``(namespace, name)`` of every library function the rebound processors stand in for: the
    processor module's global, and diffusers' ``embeddings`` attribute for a name ``__call__``
    imports from there."""
    out = {}
    for cls in classes:
        scope = cls._rome_base.__call__.__globals__
        for name in cls._rome_functions:
            for where in (scope, vars(embeddings)):
                if name in where:
                    out[id(where), name] = (where, name)
    return list(out.values())


def _spy_library_functions(monkeypatch, classes, record=None):
    """Counts (and, ``record``: keeps the arguments of) the calls of the library functions the
    rebound processors stand in for: ``{"n": calls}``."""
    calls = {"n": 0}
    for scope, name in _library_functions(classes):
        real = scope[name]

        def spy(*a, _real=real, _name=name, **k):
            calls["n"] += 1
            if record is not None:
                record.setdefault(_name, (_real, a, k))
            return _real(*a, **k)

        monkeypatch.setitem(scope, name, spy)
    return calls


def _patched_matches(model, inp, monkeypatch):
    """Patch (torch backend), check the output against the unpatched one and the launches, undo;
    the unpatched output. A rebound family: one rome launch per call the unpatched model made to
    the library's rotary function (each rotated tensor, or each q and k pair where the function
    takes both), and none of those calls left in the patched model."""
    rebound = _rebound_classes(model)
    with monkeypatch.context() as m:
        library = _spy_library_functions(m, rebound)
        ref = run(model, inp)
    assert not rebound or library["n"] > 0
    calls = _count_launches(monkeypatch)
    handle = rome.integrations.patch(model, backend="torch")
    assert handle.family == type(model).__name__
    layers = rd._attention_layers(model, handle.family)
    assert layers and all(isinstance(a.processor, rd._RomeProcessor) for _, a in layers)
    with monkeypatch.context() as m:
        left = _spy_library_functions(m, rebound)
        out = run(model, inp)
    assert out.shape == ref.shape
    _close(out, ref, FP32_RTOL)
    if rebound:
        assert left["n"] == 0 and calls["apply"] + calls["apply_qk"] == library["n"], (calls, library)
    else:
        # one launch per RoPE layer: apply_qk, or apply for q and apply for k (LTX-2's cross attention),
        # or with the layer's q/k norms fused apply_qk_norm (two in Flux-like double-stream layers: the
        # text tokens' norms and the image tokens' each their own)
        double = sum(1 for _, a in layers if getattr(a, "added_kv_proj_dim", None) is not None
                     and isinstance(getattr(a, "norm_added_q", None), torch.nn.Module))
        assert calls["apply"] % 2 == 0, calls
        assert calls["apply_qk"] + calls["apply"] // 2 + calls["apply_qk_norm"] in (len(layers), len(layers) + double), calls
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
    """A bf16 model (cast with ``.to``): q and k reach rome in bf16 (a rebound family: in the dtype
    the library's function got, float32 where the processor casts q and k up first: Stable Audio,
    FLUX.3), the output within 2e-2 of its scale (measured: bitwise the unpatched output but for
    Wan's copies, ~5e-3, whose tables are cast to bf16 with the model and multiplied in bf16)."""
    model, inp = build(name)
    model, inp = model.to(torch.bfloat16), {k: _bf16(v) for k, v in inp.items()}
    seen = {}
    with monkeypatch.context() as m:
        _spy_library_functions(m, _rebound_classes(model), record=seen)
        ref = run(model, inp)
    expected = {args[0].dtype for _, args, _ in seen.values()} or {torch.bfloat16}
    dtypes = []
    for fn in ("apply_qk", "apply", "apply_qk_norm"):
        real = getattr(rd, fn)
        monkeypatch.setattr(rd, fn, lambda *a, _real=real, **k: dtypes.append(a[0].dtype) or _real(*a, **k))
    with rome.integrations.patch(model, backend="torch"):
        out = run(model, inp)
    assert dtypes and set(dtypes) == expected
    assert out.dtype == torch.bfloat16
    _close(out.float(), ref.float(), BF16_RTOL)


# FlexAttention (AnyFlow-FAR's causal blocks, Kandinsky 6 SR's NABLA attention) has no backward on a CPU
_FLEX = {"anyflowfar", "kandinsky6sr"}


@pytest.mark.parametrize("name", NAMES)
def test_backward(name):
    if name in _FLEX and not torch.cuda.is_available():
        pytest.skip(f"{name}: its attention is FlexAttention, which has no backward on a CPU")
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


@pytest.mark.parametrize("name, path", [("qwenimage", "transformer_blocks.0"), ("hunyuandit", "blocks.0"),
                                        ("bria", "transformer_blocks.0")])
def test_compile_patched_block_fullgraph(name, path, monkeypatch):
    """A patched block traces with ``torch.compile(fullgraph=True)`` (``aot_eager``) and gives the
    eager output: Qwen-Image's (its complex tables converted inside the graph), HunyuanDiT's (its
    processor rebound, ``apply_rotary_emb`` imported inside ``__call__`` from rome's package) and
    Bria's (its processor rebound, the module's global); rome's op is in the graph."""
    model, inp = build(name)
    with rome.integrations.patch(model, backend="torch"):
        block = model.get_submodule(path)
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
            calls = _count_launches(monkeypatch)
            compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(*args, **kwargs)
            assert calls["apply"] + calls["apply_qk"] + calls["apply_qk_norm"] > 0  # traced through rome's op
    eager, compiled = (out if isinstance(out, tuple) else (out,) for out in (eager, compiled))
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


# --- the rebound families (issue 26) ---------------------------------------------------------------


@pytest.mark.parametrize("name", tuple(REBOUND))
def test_rebound_function_matches_library(name, monkeypatch):
    """rome's version of each library rotary function the model calls (torch backend) against the
    library's function, both on the arguments of the model's first call of it (its own q or k and
    tables, from an unpatched forward): within 2 ulp of fp32 at the scale of x."""
    model, inp = build(name)
    classes = _rebound_classes(model)
    seen = {}
    with monkeypatch.context() as m:
        _spy_library_functions(m, classes, record=seen)
        run(model, inp)
    functions = {n: f for cls in classes for n, f in cls._rome_functions.items()}
    assert seen and set(seen) <= set(functions)
    for fname, (real, args, kwargs) in seen.items():
        expected = real(*args, **kwargs)
        got = functions[fname](rd._Rotate("torch"))(*args, **kwargs)
        expected, got = (t if isinstance(t, tuple) else (t,) for t in (expected, got))
        for e, g, x in zip(expected, got, args, strict=False):
            assert g.shape == e.shape and g.dtype == e.dtype, fname
            torch.testing.assert_close(g, e, rtol=0, atol=2**-22 * x.abs().max().item(), msg=lambda m: f"{fname}: {m}")


@pytest.mark.parametrize("name", ["allegro", "minimaxh3", "joyimage", "hunyuandit"])
def test_rebound_triton_interpreter(name):
    """The Triton kernel (interpreted on a CPU) on rebound families: Allegro's three half blocks,
    MiniMax-H3's leading columns, JoyImage's q and k in one launch, HunyuanDiT's imported function."""
    model, inp = build(name)
    ref = run(model, inp)
    with rome.integrations.patch(model, backend="triton"):
        out = run(model, inp)
    _close(out, ref, FP32_RTOL)


@pytest.mark.parametrize("name", ["hunyuandit", "kandinsky6"])
def test_rebound_patched_model_pickles_and_copies(name, monkeypatch):
    """A patched model with rebound processors pickles and deep-copies (the processor classes are
    module-level names of rome.integrations.diffusers): the copies call rome and give the
    patched output; the library's processor ``type(p)()`` builds a working rome processor."""
    import copy
    import pickle

    model, inp = build(name)
    with rome.integrations.patch(model, backend="torch"):
        out = run(model, inp)
        copies = (pickle.loads(pickle.dumps(model)), copy.deepcopy(model))
    calls = _count_launches(monkeypatch)
    for other in copies:
        assert torch.equal(run(other, inp), out)
    assert calls["apply"] + calls["apply_qk"] + calls["apply_qk_norm"] > 0
    proc = next(p for p in _processors(copies[0]).values() if isinstance(p, rd._RomeProcessor))
    assert type(proc)()._rome.backend == "auto"


def _installed_transformer_classes():
    import importlib
    import pkgutil

    from diffusers.models import transformers

    names = set()
    for info in pkgutil.iter_modules(transformers.__path__):
        module = importlib.import_module(f"{transformers.__name__}.{info.name}")
        names |= {n for n, c in vars(module).items() if isinstance(c, type) and c.__module__ == module.__name__
                  and issubclass(c, diffusers.ModelMixin)}
    return sorted(names)


def test_every_transformer_class_is_classified():
    """Every model class of the installed diffusers' ``diffusers.models.transformers`` is patched
    (``SUPPORTED``), refused with a reason (``REFUSED``) or without RoPE (``NO_ROPE``): a diffusers
    that ships a new transformer fails here until rome says which."""
    known = set(rd.SUPPORTED) | set(rd.REFUSED) | set(rd.NO_ROPE)
    assert not (set(rd.SUPPORTED) & set(rd.REFUSED)) and not (set(rd.REFUSED) & set(rd.NO_ROPE))
    new = [n for n in _installed_transformer_classes() if n not in known]
    pin = _pinned("diffusers")
    if new and pin is not None and diffusers.__version__ != pin:
        # a release past the suite's pin (the newest end of .ci/ends): CI cannot be broken from
        # outside; patch refuses such a class (test_unknown_class_is_refused_not_patched)
        pytest.skip(f"diffusers {diffusers.__version__} (the suite pins {pin}) ships classes rome has not "
                    f"classified yet: {new}; classify them when the pin moves")
    assert new == []


def _pinned(package: str) -> str | None:
    """The version constraints/ci.txt pins ``package`` to (None without a pin)."""
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "constraints" / "ci.txt"
    for line in path.read_text().splitlines() if path.exists() else ():
        name, _, version = line.split("#")[0].strip().partition("==")
        if name.strip().lower() == package:
            return version.strip()
    return None


@pytest.mark.parametrize("cls", [*sorted(rd.REFUSED), *rd.NO_ROPE] if diffusers is not None else [])
def test_refused_class_raises_with_the_reason(cls):
    """A class rome does not patch raises ValueError naming it and why (its reason in ``REFUSED``,
    or that it has no RoPE), never "not supported" alone; nothing of the model is read."""
    model_cls = getattr(diffusers, cls, None)
    if model_cls is None:
        pytest.skip(f"diffusers {diffusers.__version__} has no {cls}")
    model = model_cls.__new__(model_cls)  # patch refuses by class, before reading the model
    reason = rd.REFUSED.get(cls, "applies no rotary position embedding")
    with pytest.raises(ValueError, match=rf"patch\({cls}\): {cls} .*{re.escape(reason[:40])}"):
        rome.integrations.patch(model)


def _renamed(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
    return apply_rotary_emb_v2(hidden_states, image_rotary_emb)  # noqa: F821 - a global name, never run


def _other_rotary(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
    from diffusers.models.embeddings import apply_rotary_emb, apply_rotary_emb_allegro  # never run

    return apply_rotary_emb_allegro(apply_rotary_emb(hidden_states, image_rotary_emb), None, None)


def _relative_import(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     image_rotary_emb=None):
    from ..attention_dispatch import dispatch_attention_fn  # never run
    from ..embeddings import apply_rotary_emb

    return dispatch_attention_fn(apply_rotary_emb(hidden_states, image_rotary_emb))


@pytest.mark.parametrize("call, message", [
    (_renamed, r"calls none of \['apply_rotary_emb'\]"),
    (_other_rotary, r"calls \['apply_rotary_emb_allegro'\]"),
    (_relative_import, r"imports \['attention_dispatch'\] relatively"),
])
def test_rebound_processor_rome_does_not_know_is_refused(call, message, monkeypatch):
    """A diffusers whose processor no longer calls the function rome rebinds, calls another rotary
    function, or imports another module relatively inside ``__call__`` is refused, naming the
    processor: the patch never leaves a rotation of the library's in place, nor an import that
    rome's package cannot resolve. Nothing is changed."""
    from diffusers.models.transformers import transformer_bria

    model, _ = build("bria")
    before = _processors(model)
    monkeypatch.setattr(transformer_bria.BriaAttnProcessor, "__call__", call)
    with pytest.raises(ValueError, match=r"BriaTransformer2DModel: BriaAttnProcessor.__call__ " + message):
        rome.integrations.patch(model)
    assert all(_processors(model)[k] is before[k] for k in before)


@pytest.mark.skipif(diffusers is None, reason="diffusers is not installed")
def test_unknown_class_is_refused_not_patched():
    """A transformer class rome has not classified (what a newer diffusers may ship) is refused
    with a ValueError naming it, never patched silently or returned as None."""

    class NewTransformer3DModel(diffusers.ModelMixin):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(2, 2)

    with pytest.raises(ValueError, match="does not support NewTransformer3DModel"):
        rome.integrations.patch(NewTransformer3DModel())
