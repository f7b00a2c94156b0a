"""``python -m profiling families [--out PATH]``: docs/families.md, generated from rome's own tables.

Which families ``rome.integrations.patch`` patches, how, and which it refuses and why, read from
the code that decides it:

- transformers (``rome/integrations/transformers.py``): ``_FAMILIES`` (per ``model_type``: the
  rotary module, the attention classes, the rotary function rebound, the tables a patched layer
  reads), ``_CLASSES`` (the model classes), ``_REFUSED`` (model types refused, with the reason),
  and the rule of ``_discovered`` (every other model type, read from its modeling file);
- diffusers (``rome/integrations/diffusers.py``): ``_FAMILIES`` (per class: the processors
  replaced, restated or rebound, the layers, the rotary module's float64 forward, the
  ``rounding="native"`` rule), the rotary functions of the rebound processors
  (``_diffusers_rope``: what they read and rotate, whether q and k go in one launch), ``REFUSED``
  (with the reason) and ``NO_ROPE``.

What the code cannot say in words, this file does: each family's display name and, for the
families whose rotation rome reads from the model's config or restates in a processor, a short
description of that rotation (``TRANSFORMERS`` and ``DIFFUSERS`` below; a family missing there
is listed under its key, and tests/test_families_doc.py fails), and the ``rounding="native"``
section's lists (the transformers families tests/test_native_rounding.py runs bitwise, and why a
restated diffusers family has no native rule). The page's prose is the header
and the notes below. Nothing of the installed transformers or diffusers is read: the page is the
same whichever versions are installed, or none (tests/test_families_doc.py holds the committed
page to it).
"""

from __future__ import annotations

import argparse
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "families.md"

# --- what the code does not say in words ---------------------------------------------------------

# model_type -> (family name, rotation rome applies, where rome's computation differs from transformers' code)
TRANSFORMERS = {
    "llama": ("Llama", "half (`rotate_half`), every `rope_type`", ""),
    "mistral": ("Mistral", "half, every `rope_type`", ""),
    "qwen2": ("Qwen2", "half, every `rope_type`", ""),
    "qwen3": ("Qwen3", "half, every `rope_type`", ""),
    "gpt_neox": ("GPT-NeoX", "half, partial (`rotary_pct`)", ""),
    "qwen2_vl": ("Qwen2-VL", "mRoPE (contiguous t, h, w sections); 2D axial vision tower", ""),
    "qwen2_5_vl": ("Qwen2.5-VL", "mRoPE (contiguous sections); 2D axial vision tower", ""),
    "qwen2_moe": ("Qwen2-MoE", "half", ""),
    "qwen3_moe": ("Qwen3-MoE", "half", ""),
    "mixtral": ("Mixtral", "half", ""),
    "gemma2": ("Gemma 2", "half", ""),
    "gemma3": ("Gemma 3", "half; one RoPE per layer type (local base 1e4, global base 1e6 with its scaling) "
                          "from the one rotary module", "per-layer-type tables"),
    "phi3": ("Phi-3, Phi-4", "half, partial (Phi-4-mini's 0.75), LongRoPE: short factors up to "
                             "`original_max_position_embeddings`, long past it, per call", "long/short factors"),
    "qwen3_vl": ("Qwen3-VL", "interleaved mRoPE (t, h, w frequencies interleaved); 2D axial vision tower",
                 "interleaved mRoPE"),
    "qwen3_vl_moe": ("Qwen3-VL-MoE", "as Qwen3-VL", "interleaved mRoPE"),
    "qwen3_5": ("Qwen3.5", "interleaved mRoPE, partial rotary 0.25 (the full-attention layers; the "
                           "linear-attention layers have no RoPE); 2D axial vision tower", "interleaved mRoPE"),
    "qwen3_5_moe": ("Qwen3.5-MoE", "as Qwen3.5", "interleaved mRoPE"),
    "deepseek_v3": ("DeepSeek-V3", "MLA: the `qk_rope_head_dim` block only; with `rope_interleave` (the default) "
                                   "adjacent pairs, written in place",
                    "interleaved pairs: transformers writes them de-interleaved, rome in place (below)"),
    "llama4": ("Llama 4", "interleave (the complex product of adjacent pairs), Llama 3 scaling; NoPE layers "
                          "still rotate nothing; the text model (the vision tower keeps transformers' RoPE)",
               "complex `freqs_cis` tables"),
    "gpt_oss": ("GPT-OSS", "half, YaRN", "half-width tables (one column per frequency)"),
    "glm": ("GLM", "interleave (adjacent pairs), partial 0.5", "pairs read from `cat(f, f)` tables"),
    "glm4": ("GLM-4", "interleave (adjacent pairs), partial 0.5", "pairs read from `cat(f, f)` tables"),
    "glm4_moe": ("GLM-4.5 (MoE)", "half, partial 0.5", ""),
    "glm4_moe_lite": ("GLM-4.7-Flash", "as DeepSeek-V3 (MLA, `rope_interleave`)", "as DeepSeek-V3"),
}
TRANSFORMERS_REFUSED = {"glm4v": "GLM-4.1V", "glm4v_moe": "GLM-4.5V", "glm46v": "GLM-4.6V"}
# the classes of ``SUPPORTED`` that ``_CLASSES`` does not make, and their model type
TRANSFORMERS_CLASSES = {"Qwen2VisionTransformerPretrainedModel": "qwen2_vl",
                        "Qwen2_5_VisionTransformerPretrainedModel": "qwen2_5_vl"}

# class -> (family name, rotation rome applies, where the model states its RoPE otherwise than rome);
# the rotation of a rebound family is its rotary function's (``_diffusers_rope``) unless given here
DIFFUSERS = {
    "WanTransformer3DModel": ("Wan", "interleave, 3 axes", ""),
    "HunyuanVideoTransformer3DModel": ("HunyuanVideo", "interleave, 3 axes; appended text tokens unrotated", ""),
    "CogVideoXTransformer3DModel": ("CogVideoX", "interleave, the pipeline's tables as given; leading text "
                                                 "unrotated (RoPE configs; without RoPE refused)", ""),
    "ConsisIDTransformer3DModel": ("ConsisID", "as CogVideoX (its attention and processor; RoPE configs)", ""),
    "HunyuanVideoFramepackTransformer3DModel": (
        "HunyuanVideo FramePack", "interleave, 3 axes, as HunyuanVideo (its rotary module kept: it builds the "
                                  "tables of the clean latents and the 2x/4x histories)", ""),
    "FluxTransformer2DModel": ("Flux", "interleave, 3 axes", ""),
    "LTXVideoTransformer3DModel": ("LTX-Video", "interleave over the whole inner dim, per head", ""),
    "QwenImageTransformer2DModel": ("Qwen-Image", "interleave; text and image tables joined, one launch",
                                    "complex tables `e^{iθ}` `[S, D/2]`"),
    "Flux2Transformer2DModel": ("FLUX.2", "interleave, 4 axes; double- and single-stream blocks", ""),
    "ChromaTransformer2DModel": ("Chroma", "as Flux (Flux's processor)", ""),
    "WanVACETransformer3DModel": ("WanVACE", "as Wan (Wan's processor; main and VACE blocks)", ""),
    "WanAnimateTransformer3DModel": ("WanAnimate", "as Wan (its copy of Wan's processor; the face adapter's "
                                                   "attention has no RoPE)", ""),
    "ChronoEditTransformer3DModel": ("ChronoEdit", "as Wan (its copy of Wan's processor)", ""),
    "SkyReelsV2Transformer3DModel": ("SkyReels-V2", "as Wan (`SkyReelsV2AttnProcessor`)", ""),
    "HunyuanVideo15Transformer3DModel": ("HunyuanVideo 1.5", "interleave; the text tokens it appends unrotated", ""),
    "HunyuanImageTransformer2DModel": ("HunyuanImage", "interleave, 2 axes (HunyuanVideo's processor body)", ""),
    "LTX2VideoTransformer3DModel": (
        "LTX-2", "`rope_type=\"interleaved\"`: interleave over the inner dim, per head; `\"split\"`: half per "
                 "head. Video and audio self attention in one `apply_qk`; audio-to-video and video-to-audio "
                 "cross attention q and k by one `rome.apply` each (their tables differ)",
        "split tables `[B, N, S, D/2]` (each column for both halves)"),
    "ZImageTransformer2DModel": ("Z-Image", "interleave (refiners and main layers)",
                                 "complex tables `[B, S, D/2]` (its rotary function is nested in the processor)"),
    "CosmosTransformer3DModel": ("Cosmos", "half (`rotate_half`); self attention (its cross attention has no "
                                           "RoPE)", "`use_real_unbind_dim=-2`"),
    "MochiTransformer3DModel": ("Mochi", "interleave, per-head tables",
                                "half-width per-head `(cos, sin)` `[S, N, D/2]` (nested function)"),
    "Lumina2Transformer2DModel": ("Lumina2", "interleave (refiners and main layers), GQA",
                                  "complex tables `[B, S, D/2]`"),
    "CogView4Transformer2DModel": ("CogView4", "half; leading text tokens unrotated", "`use_real_unbind_dim=-2`"),
    "HiDreamImageTransformer2DModel": (
        "HiDream", "interleave, double- and single-stream blocks; where the RoPE spans half the head "
                   "(`sum(axes_dims_rope) = head_dim / 2`) the rest is `cos = 1, sin = 0`",
        "a 2x2 rotation per pair, `[B, S, 1, D/2, 2, 2]`"),
    # rebound
    "AllegroTransformer3DModel": ("Allegro", "", ""),
    "HunyuanDiT2DModel": ("HunyuanDiT", "interleave, 2D (self attention q and k; cross attention q)", ""),
    "LuminaNextDiT2DModel": ("Lumina-Next", "interleave (complex tables; self attention q and k, cross "
                                            "attention q)", ""),
    "StableAudioDiTModel": ("Stable Audio", "half over the leading half of each head (the processor slices it)",
                            ""),
    "EasyAnimateTransformer3DModel": ("EasyAnimate", "interleave, 3 axes (the video tokens; the text tokens "
                                                     "before them unrotated)", ""),
    "OmniGenTransformer2DModel": ("OmniGen", "half (`use_real_unbind_dim=-2`), its LongRoPE-scaled tables", ""),
    "GlmImageTransformer2DModel": ("GLM-Image", "interleave, 2 axes (the image tokens)", ""),
    "AceStepTransformer1DModel": ("ACE-Step", "half (Qwen3's layout), self attention", ""),
    "BriaTransformer2DModel": ("Bria", "interleave, 3 axes (Flux-style)", ""),
    "BriaFiboTransformer2DModel": ("Bria-FIBO", "interleave, 3 axes (Flux-style)", ""),
    "Flux3Transformer2DModel": ("FLUX.3", "interleave, 4 axes", ""),
    "Krea2Transformer2DModel": ("Krea 2", "interleave, 3 axes, GQA", ""),
    "LongCatImageTransformer2DModel": ("LongCat-Image", "interleave, 3 axes (Flux-style)", ""),
    "OvisImageTransformer2DModel": ("Ovis-Image", "interleave, 3 axes (Flux-style)", ""),
    "MotifVideoTransformer3DModel": ("Motif-Video", "interleave, 3 axes (self attention; the cross attention "
                                                    "rotates q)", ""),
    "NucleusMoEImageTransformer2DModel": ("NucleusMoE-Image", "interleave (Qwen-Image's complex tables)", ""),
    "QwenImage21Transformer2DModel": ("Qwen-Image 2.1", "interleave (Qwen-Image's complex tables)", ""),
    "AnyFlowTransformer3DModel": ("AnyFlow", "interleave, 3 axes (diffusers multiplies in float64, rome in "
                                             "float32)", ""),
    "AnyFlowFARTransformer3DModel": ("AnyFlow-FAR", "as AnyFlow (its causal processor)", ""),
    "HeliosTransformer3DModel": ("Helios", "interleave, 3 axes", ""),
    "JoyImageEditTransformer3DModel": ("JoyImage-Edit", "interleave, 3 axes", ""),
    "JoyImageEditPlusTransformer3DModel": ("JoyImage-Edit-Plus", "interleave, per-sample tables", ""),
    "PRXTransformer2DModel": ("PRX", "interleave, 2 axes", ""),
    "Kandinsky6Transformer3DModel": ("Kandinsky 6", "interleave; video 3 axes, text and audio 1", ""),
    "Kandinsky6SRTransformer3DModel": ("Kandinsky 6 SR", "interleave, 3 axes", ""),
    "LongCatAudioDiTTransformer": ("LongCat-AudioDiT", "half; self attention, and cross attention with the "
                                                       "prompt's own tables for k", ""),
    "MiniMaxH3Transformer3DModel": ("MiniMax-H3", "half over the leading `2 * 3 * rope_freq_dim` columns", ""),
    "MiniMaxMusic3Transformer1DModel": ("MiniMax-Music3", "half over the leading `rotary_dim` columns", ""),
    "StableAudio3DiTModel": ("Stable Audio 3", "half over the leading columns (self attention)", ""),
}
DIFFUSERS_REFUSED = {
    "Kandinsky5Transformer3DModel": "Kandinsky 5", "BriaFibo2Transformer2DModel": "Bria-FIBO 2",
    "ErnieImageTransformer2DModel": "ERNIE-Image", "SanaVideoTransformer3DModel": "SANA-Video",
    "Cosmos3OmniTransformer": "Cosmos 3", "Ideogram4Transformer2DModel": "Ideogram 4",
    "WanAnimate2Transformer3DModel": "WanAnimate 2", "SanaWMTransformer3DModel": "SANA-WM",
    "SanaWMLTX2RefinerTransformer3DModel": "SANA-WM refiner",
}

# --- prose -----------------------------------------------------------------------------------------

HEADER = """\
<!-- Generated by `python -m profiling families` (make families) from rome/integrations/transformers.py,
rome/integrations/diffusers.py and profiling/families.py: edit those, not this file. -->

# Model families

Which model families `rome.integrations.patch(model)` patches, which it refuses and why, and
how each is tested. The mechanism (the rotary module's `forward` and each attention layer's
rotary function replaced on the model's own instances, `undo()` restoring them) is in
[integrations.md](integrations.md). This page is generated from the tables in
`rome/integrations/transformers.py` and `rome/integrations/diffusers.py`
(`python -m profiling families`, or `make families`); `tests/test_families_doc.py` fails when it
is not what the command writes.
"""

TRANSFORMERS_INTRO = """\
## transformers

For transformers 5.17–5.25 (`docs/compatibility.md`: both ends run in CI). A model is matched by its
config's `model_type` (a `<type>_text` config as `<type>`). Every family below is tested in
`tests/test_integrations_transformers.py` or `tests/test_integrations_transformers_families.py` on a
tiny random model (1–2 layers, hidden 64) against the same model unpatched: fp32 logits within 1e-5
of their largest value with one rome launch per RoPE layer, every parameter's gradient within rtol
1e-4 / atol 1e-5 × its largest value, greedy `generate` with a KV cache giving the same tokens with
each step's logits within 1e-5, `undo()` giving back the original logits bitwise. Where rome computes
the RoPE differently from the modeling file (last column), the patched rotation is also compared, on
random q and k, with the modeling file's own function on the unpatched rotary module's own tables
(within 2e-5 absolute), and at least one model of that kind runs rome's Triton kernel (under the
interpreter without a GPU).

Patched (`_FAMILIES`): the rotary module's `forward` returns rome's tables, and each attention
class's `forward` runs with its rotary function bound to rome's: one `apply_qk` launch for q and k
per layer. The classes column lists the usual model classes; any model built of a family's rotary and
attention modules is patched the same way.
"""

TABLE_CONVENTIONS = {
    "half": "rome's `[..., D]`",
    "narrow": "rome's, as wide as the rotated columns",
    "pairs": "`cat(f, f)` over the rotated width (the layer repeat-interleaves it)",
    "freqs": "one column per frequency `[..., D/2]`",
    "complex": "complex `freqs_cis` `[..., D/2]`",
}

TRANSFORMERS_NOTES = """\
**Any other `model_type` is read from its modeling file** (`_discovered` in
`rome/integrations/transformers.py`): where the model's modules include attention classes of a
`transformers.models.<m>.modeling_<m>` whose `forward` (through any `functools.wraps` decorators)
calls that file's `apply_rotary_pos_emb` and no other rotary function, the file has one text
`...RotaryEmbedding` class, and that `apply_rotary_pos_emb` rotates as one of rome's modes — probed
on float64 values against rome's torch backend, so files with their own copies count by what they
compute (OLMo 2's and Cohere's float32 casts, Cohere's adjacent pairs on repeat-interleaved
tables, Ernie 4.5's and Helium's pairs read from `cat(f, f)` tables) — the model is patched as the
families above, with the same frequency check against the rotary module at patch time. Tested
on a tiny model each (`tests/test_integrations_discovered.py`, also at both ends of the version
range): OLMo, OLMo 2, Cohere, Granite, Starcoder2, SmolLM3, Ernie 4.5, Helium, and the partial-rotary
Phi, Persimmon and StableLM, whose forwards slice q to the rotated columns themselves (the patched
rotary module returns tables as wide as transformers' own, the rotation then takes M's rotated
block). A model with a `...RotaryEmbedding` module that none of this matches (GPT-J's rotary,
inlined in its attention's `forward`; an MLA model whose forward may call
`apply_rotary_pos_emb_interleave`) raises ValueError naming its model type and rotary class, never a
silent no-op; a model without RoPE (GPT-2, BLOOM) raises "does not support". Phi-4-multimodal
(`phi4_multimodal`) is not added: it has no tiny-model test (it needs its audio and vision configs).
`patch` on a module of the user's own patches every transformers/diffusers model it holds (one
`undo()` for all). Each must be one `patch` takes: one without RoPE beside them (a CLIP or T5
text encoder, a VAE) raises "does not support" as it does alone, so patch the transformer itself
there. A model that holds a part rome does not patch beside one it does (Mistral 3's Pixtral
vision tower beside its Mistral text model) raises ValueError naming that part's rotary class,
rather than patching the rest under a patch that says the model is patched; patch the part rome
takes (`model.model.language_model`) on its own. Llama 4's vision tower is the one part kept as
transformers runs it (its table row above).

**MLA's interleaved pairs (DeepSeek-V3, GLM-4.7-Flash).** With `rope_interleave=True`
transformers rotates the pairs `(x0, x1), (x2, x3), ...` and returns
`cat(first members, second members)`. rome's op writes `x*cos + (x@M)*sin` in x's own column
order, so it returns the same rotated pairs in place. The two differ by one permutation of the
`qk_rope_head_dim` columns, applied to q and k alike, and `q·k` (the attention scores) is the
same; the test checks both (the de-interleaved patched result equals transformers', the scores
equal without any permutation). The KV cache then holds k in rome's order, so a cache filled by
the patched model must not be continued by the unpatched one (or the reverse).

**Tables handed to a patched layer.** The patched rotary module returns rome's tables (float32
from float64 angles; `[..., D]` with pass-through columns `cos = 1, sin = 0`), except where the
modeling file reads another format (the "Tables" column): GLM's and MLA's `cat(f, f)` over the
rotated width, and Llama 4's complex `freqs_cis`, which the patched module returns in that format.
A patched attention layer reads transformers' own tables as its modeling file does (partial width,
GPT-OSS's half width, GLM's and MLA's pairs, complex), so code that computes the tables with an
unpatched rotary module still gets the model's RoPE.
"""

DIFFUSERS_INTRO = """\
## diffusers

For diffusers 0.39–0.42 (`docs/compatibility.md`). A model is matched by its class
(`rome.integrations.supported()["diffusers"]`, a class derived from one of them too); the patch
replaces the default attention processor of every attention layer that applies RoPE, on the
model's own instances, in one of two ways (the "How" column):

- **restated**: a subclass of the library's processor whose `__call__` is the processor body
  restated with diffusers' own projection and attention helpers, q and k rotated in one rome launch
  (`apply_qk`); the model's rotary module and its tables are kept, except HunyuanVideo's and
  LTX-Video's, whose `forward` gets float64 angles ([integrations.md](integrations.md)).
- **rebound**: a subclass whose `__call__` runs the library's own `__call__` code with the rotary
  function it calls (a global of its module, a helper of that module that calls it, or
  `from ..embeddings import apply_rotary_emb` inside `__call__`) bound to rome's version of that
  function (`rome/integrations/_diffusers_rope.py`: same arguments, the same tables read the same
  way, one rome launch). The rest of the processor — projections, norms, masks, the attention
  backend — is the library's code as installed; nothing of diffusers is modified. At patch time the
  processor's `__call__` must still call that function and no other rotary function, or the patch
  is refused (a diffusers version rome's patch does not know).

Every family below is tested in `tests/test_integrations_diffusers.py` or
`tests/test_integrations_diffusers_families.py` on a tiny random transformer (one block of each
kind, head dim 8–16) against the same model unpatched: fp32 output within 1e-5 of its largest value
(measured: at most 4e-7), every parameter's gradient within rtol 1e-4 / atol 1e-6 × the largest
gradient (not AnyFlow-FAR's and Kandinsky 6 SR's: FlexAttention has no backward on a CPU), bf16
output within 2e-2 of its largest value, and `undo()` giving back the original output bitwise and
the original processors. Restated families: one rome launch per RoPE attention layer; where the
model states its RoPE otherwise than rome (last column), rome's rotation is also compared, on random
q, with the model's own rotary function (or its formula, for the functions nested inside a
processor) on the tables the unpatched model computed (within 2 ulp of fp32 at the scale of q).
Rebound families: one rome launch per call the unpatched model makes to the library's rotary
function and none of those calls left once patched, rome's function against the library's on the
arguments of the model's own first call (2 ulp), their zero-initialised parameters drawn at random
so the output depends on every attention layer. One model per kind runs rome's Triton kernel (under
the interpreter without a GPU); diffusers 0.39 runs the classes it has.
"""

DIFFUSERS_NOTES = """\
What is refused besides (ValueError naming the class and the reason, nothing changed): a second
patch; a processor other than the default on a RoPE layer (IP-adapter, fused, FLUX.2's KV-cache
processors, LTX-2's perturbed processor, CogView4's training processor, custom ones), naming the
layer and the class; a rebound processor whose `__call__` no longer calls the function rome rebinds,
calls another rotary function, or imports another module than `embeddings` relatively; per-axis
sections rome's interleave layout cannot hold (Flux, Chroma, HunyuanVideo, FramePack:
`axes_dims_rope` / `rope_axes_dim` not positive even sizes summing to the head dim; HiDream: summing
to neither the head dim nor its half); CogVideoX and ConsisID without RoPE. A call the patch does
not cover goes to the model's own processor unchanged: no RoPE tables given, Wan's image-context
(I2V) branch, LTX-Video's and Cosmos's cross attention, LTX-2 `split` tables that are not per head
(the model's rotary module always makes them per head).
"""

# patch(model, rounding="native"): the transformers families tested bitwise (the probe of
# ``_native_rule`` decides at patch time, so this is what tests/test_native_rounding.py runs), the
# ones refused, and why diffusers families without a ``_Family.native`` rule are refused
TRANSFORMERS_NATIVE = (
    "Llama (bf16, fp16, fp32; the kernel too), Mistral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, Mixtral, Gemma 2, "
    "Gemma 3, Phi-3, DeepSeek-V3 with `rope_interleave=False`, GPT-OSS, GLM, GLM-4, GLM-4.5, Qwen3.5, "
    "Qwen3.5-MoE (bf16), GPT-NeoX partial (bf16), Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE with their "
    "vision towers (bf16)")
TRANSFORMERS_NATIVE_REFUSED = (
    "DeepSeek-V3 and GLM-4.7-Flash with `rope_interleave` (transformers writes the pairs de-interleaved, "
    "rome in place), Llama 4 (complex products)")
DIFFUSERS_NATIVE_REFUSED = {
    "QwenImageTransformer2DModel": "complex products", "ZImageTransformer2DModel": "complex products",
    "Lumina2Transformer2DModel": "complex products", "MochiTransformer3DModel": "their own per-pair formulas",
    "HiDreamImageTransformer2DModel": "their own per-pair formulas",
}
DIFFUSERS_NATIVE_REBOUND = "rebound processors: rome's rotary functions round exactly only"

NATIVE_INTRO = """\
## Rounding: native

`rome.integrations.patch(model, rounding="native")` gives outputs bit for bit the unpatched
model's ([precision.md](precision.md#rounding-exact-and-native)). The model's rotary modules are
left as they are (their tables, in the dtype they return them, are what the model multiplies by;
HunyuanVideo's and LTX-Video's float32-angle modules included) and only the rotation is
replaced, by rome with `rounding="native"` in the dtype the model's code computes it in:

- transformers: found at patch time by probing the modeling file's function on bf16 values with
  bf16 and float32 tables: `q * cos + rotate_half(q) * sin` in q's dtype promoted with the
  tables' (Llama's `apply_rotary_pos_emb` and its copies), or float32 then cast back to q's dtype
  (Qwen's `apply_rotary_pos_emb_vision`); a function that rounds as neither is refused.
- diffusers: per family (`_Family.native`, from `rome.integrations.diffusers._NATIVE`): Wan's
  nested `apply_rotary_emb` (`x1 * cos - x2 * sin` in x's dtype promoted with the tables': bf16
  after `model.to(bf16)`, which casts its tables too) or diffusers' `apply_rotary_emb` and LTX's
  copies (float32, one rounding to x's dtype).

No q/k norm is fused with `rounding="native"`: the fused norm (`rome.apply_qk_norm`) keeps the
normalised values in float32, which is not the model's norm rounded to its dtype, so the model's
own norm modules run as it runs them (transformers' Qwen3, Qwen3-MoE, Gemma 3; the diffusers
processors that fuse them) and only the rotation is rome's. (OLMo 2, whose norms an exact patch
fuses too, is refused by the probe: its function computes in the promoted dtype and casts back
to q's, neither rule above.)

Tested in `tests/test_native_rounding.py` on the tiny models above, each against itself
unpatched with `torch.equal` (rome called), undone bitwise:
"""

NATIVE_NOTES = """\
A refused family still patches with `rounding="exact"`. Families found from their modeling files
(not in the table above) get the same probe: patched if it matches, refused otherwise.
"""

# --- the page ----------------------------------------------------------------------------------------


def _integrations():
    """rome's transformers and diffusers integration modules, imported where the page is made, not
    when this module is: rome's diffusers module imports diffusers' modeling files (seconds), which
    ``python -m profiling`` needs for this command alone."""
    from rome.integrations import diffusers as rd
    from rome.integrations import transformers as rt

    return rd, rt


def _code(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _row(cells) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") if c else "–" for c in cells) + " |"


def _transformers() -> list[str]:
    _, rt = _integrations()
    lines = [TRANSFORMERS_INTRO, "| Family | `model_type` | Classes | What is patched | Tables a patched layer "
                                 "reads | Rotation rome applies | Differs from transformers' code in |",
             "|---|---|---|---|---|---|---|"]
    for kind, families in rt._FAMILIES.items():
        name, rotation, differs = TRANSFORMERS.get(kind, (kind, "", ""))
        prefix, suffixes = rt._CLASSES[kind]
        classes = [f"{prefix}{s}" for s in suffixes] + [c for c, k in TRANSFORMERS_CLASSES.items() if k == kind]
        patched, tables = [], []
        for f in families:
            function = f"`{f.function}`"
            if f.interleave_function:
                function += f", `{f.interleave_function}` with `rope_interleave`"
            patched.append(f"`{f.rotary}.forward`, {_code(a + '.forward' for a in f.attention)} ({function})")
            table = TABLE_CONVENTIONS.get(f.tables, f.tables)
            if f.interleave_function:
                table += "; with `rope_interleave`: " + TABLE_CONVENTIONS["pairs"]
            tables.append("`[T, D]` (vision)" if f.kind == "vision" else table)
        lines.append(_row([name, f"`{kind}`", _code(classes), "; ".join(patched), "; ".join(dict.fromkeys(tables)),
                           rotation, differs]))
    lines += ["", "Refused (`_REFUSED`: ValueError with the reason):", "", "| Family | `model_type` | Why |",
              "|---|---|---|"]
    for kind, reason in rt._REFUSED.items():
        lines.append(_row([TRANSFORMERS_REFUSED.get(kind, kind), f"`{kind}`", reason]))
    return [*lines, "", TRANSFORMERS_NOTES]


def _layers(spec) -> str:
    parts = [f"`{group}.*.{attr}`" for group, attr in spec.layers]
    parts += [f"every `{a}`" for a in spec.attention]
    return ", ".join(parts)


def _diffusers() -> list[str]:
    rd, _ = _integrations()
    lines = [DIFFUSERS_INTRO, "| Family | Class | How | Layers | Rotation rome applies | Launches | Differs from "
                              "diffusers' code in |", "|---|---|---|---|---|---|---|"]
    for cls, spec in rd._FAMILIES.items():
        name, rotation, differs = DIFFUSERS.get(cls, (cls, "", ""))
        how, launches, modes = [], set(), []
        for _, proc, rome_cls, _ in spec.processors:
            if not issubclass(rome_cls, rd._ReboundProcessor):
                how.append(f"restated `{proc}`")
                launches.add("one `apply_qk` per layer" if cls != "LTX2VideoTransformer3DModel"
                             else "one `apply_qk` (self) or two `apply` (cross) per layer")
                continue
            helpers = "".join(f" (in its helper `{h}`)" for h in rome_cls._rome_helpers)
            for fname, f in rome_cls._rome_functions.items():
                how.append(f"rebound `{proc}`: `{fname}`{helpers}, reading {f.tables}")
                modes.append(f.mode)
                launches.add("one `apply_qk` per call (q and k)" if f.fused else "one `apply` per rotated tensor")
        if spec.rope_forward is not None:
            how.append("rotary module: float64 angles")
        rotation = rotation or "; ".join(dict.fromkeys(modes))
        lines.append(_row([name, f"`{cls}`", "; ".join(dict.fromkeys(how)), _layers(spec), rotation,
                           "; ".join(sorted(launches)), differs]))
    lines += ["", "Refused (`REFUSED`: ValueError naming the class and the reason):", "", "| Family | Class | Why |",
              "|---|---|---|"]
    for cls, reason in rd.REFUSED.items():
        lines.append(_row([DIFFUSERS_REFUSED.get(cls, cls), f"`{cls}`", reason]))
    lines += ["", "Without RoPE (`NO_ROPE`: ValueError \"applies no rotary position embedding (RoPE): nothing "
                  "for rome to patch\"): " + _code(rd.NO_ROPE) + ". Any other class (one a newer diffusers adds) "
                  "is not patched: `rome.integrations.patch` raises ValueError \"does not support\", listing "
                  "`rome.integrations.supported()[\"diffusers\"]`; `tests/test_integrations_diffusers_families.py` "
                  "fails on a diffusers that ships a transformer class none of the three lists names.", "",
              DIFFUSERS_NOTES]
    return lines


def _native() -> list[str]:
    rd, _ = _integrations()
    patched = [DIFFUSERS.get(c, (c,))[0] for c, spec in rd._FAMILIES.items() if spec.native]
    refused, rebound = {}, []
    for cls, spec in rd._FAMILIES.items():
        if spec.native:
            continue
        name = DIFFUSERS.get(cls, (cls,))[0]
        if all(issubclass(r, rd._ReboundProcessor) for _, _, r, _ in spec.processors):
            rebound.append(name)
        else:
            refused.setdefault(DIFFUSERS_NATIVE_REFUSED.get(cls, "its rotation"), []).append(name)
    why = [f"{', '.join(names)} ({reason})" for reason, names in refused.items()]
    if rebound:
        why.append(f"{', '.join(rebound)} ({DIFFUSERS_NATIVE_REBOUND})")
    return [NATIVE_INTRO,
            "| Library | Bitwise with `rounding=\"native\"` (dtypes tested) | Refused (ValueError) |", "|---|---|---|",
            _row(["transformers", TRANSFORMERS_NATIVE, TRANSFORMERS_NATIVE_REFUSED]),
            _row(["diffusers", ", ".join(patched) + " (bf16 and fp32)", "; ".join(why)]), "", NATIVE_NOTES]


def generate() -> str:
    """The text of docs/families.md."""
    text = "\n".join([HEADER, *_transformers(), *_diffusers(), *_native()])
    return text.rstrip("\n") + "\n"


def missing_names() -> list[str]:
    """The families (and model classes) of rome's tables that this file has no words for."""
    rd, rt = _integrations()
    made = {f"{prefix}{s}" for prefix, suffixes in rt._CLASSES.values() for s in suffixes}
    return ([k for k in rt._FAMILIES if k not in TRANSFORMERS]
            + [k for k in rt._REFUSED if k not in TRANSFORMERS_REFUSED]
            + [c for c in rt.SUPPORTED if c not in made and c not in TRANSFORMERS_CLASSES]
            + [k for k in rd._FAMILIES if k not in DIFFUSERS]
            + [k for k in rd.REFUSED if k not in DIFFUSERS_REFUSED]
            + [k for k, f in rd._FAMILIES.items() if not f.native and k not in DIFFUSERS_NATIVE_REFUSED
               and not all(issubclass(r, rd._ReboundProcessor) for _, _, r, _ in f.processors)])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=str(OUT), help=f"the page to write (default {OUT.relative_to(ROOT)})")


def main(args) -> None:
    out = Path(args.out)
    out.write_text(generate(), encoding="utf-8")
    missing = missing_names()
    print(f"{out} written" + (f"; no display name for {', '.join(missing)} (profiling/families.py)" if missing
                              else ""))

