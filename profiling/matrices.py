"""``python -m profiling matrices [--out DIR] [--no-pictures]``: the catalogue ``matrices/`` of
every RoPE family rome supports, one record (JSON) and one picture (PNG) each, and its README.

A record holds the family, its source config (the transformers config class's defaults, the
diffusers class's ``__init__`` defaults, or the builder call), head_dim, mode, the blocks of M
and, per column j: ``src``/``sign`` (column j of ``x @ M`` is ``sign * x[:, src]``; ``src`` null,
``sign`` 0 for a pass-through column), the position ``axis`` and the inverse frequency
``inv_freq`` as ``float.hex`` of rome's float64 value. Every record is built from rome's public
builders (``RoPE.from_hf_config``, ``section_layout``, ``mrope_layout``, ``rope_layout``,
``rotation_matrix``, ...) and the layouts ``rome.integrations.diffusers`` builds; the text files
are deterministic (sorted keys, fixed formatting), so a regeneration that changes a committed
file means the code changed (tests/test_matrices_records.py holds the code to them).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

import rome
from rome.layouts import RopeLayout

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "matrices"
DPI = 100


# --- recipes: one per record ---------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """One record: ``build()`` returns ``(source, layout, matrix)``: the source config (a dict of
    JSON values), rome's layout of it (or None where the model's frequencies are not rome's to
    tell: Mochi's learned ones) and M (None: ``layout.matrix()``)."""

    name: str  # the file stem
    family: str  # what docs/families.md calls it
    library: str  # transformers, diffusers, seed, builder
    build: Callable[[], tuple[dict, RopeLayout | None, torch.Tensor | None]]
    note: str = ""


# transformers: (file stem, family, model_type, config overrides, from_hf_config keywords, part)
_HF = [
    ("llama", "Llama", "llama", {}, {}, "text"),
    ("mistral", "Mistral", "mistral", {}, {}, "text"),
    ("qwen2", "Qwen2", "qwen2", {}, {}, "text"),
    ("qwen3", "Qwen3", "qwen3", {}, {}, "text"),
    ("gpt_neox", "GPT-NeoX", "gpt_neox", {}, {}, "text"),
    ("qwen2_vl", "Qwen2-VL (text)", "qwen2_vl", {}, {}, "text"),
    ("qwen2_vl-vision", "Qwen2-VL (vision)", "qwen2_vl", {}, {}, "vision"),
    ("qwen2_5_vl", "Qwen2.5-VL (text)", "qwen2_5_vl", {}, {}, "text"),
    ("qwen2_5_vl-vision", "Qwen2.5-VL (vision)", "qwen2_5_vl", {}, {}, "vision"),
    ("qwen2_moe", "Qwen2-MoE", "qwen2_moe", {}, {}, "text"),
    ("qwen3_moe", "Qwen3-MoE", "qwen3_moe", {}, {}, "text"),
    ("mixtral", "Mixtral", "mixtral", {}, {}, "text"),
    ("gemma2", "Gemma 2", "gemma2", {}, {}, "text"),
    ("gemma3-sliding", "Gemma 3 (sliding_attention layers)", "gemma3", {},
     {"layer_type": "sliding_attention"}, "text"),
    ("gemma3-full", "Gemma 3 (full_attention layers)", "gemma3", {}, {"layer_type": "full_attention"}, "text"),
    ("phi3", "Phi-3", "phi3", {}, {}, "text"),
    ("qwen3_vl", "Qwen3-VL (text)", "qwen3_vl", {}, {}, "text"),
    ("qwen3_vl-vision", "Qwen3-VL (vision)", "qwen3_vl", {}, {}, "vision"),
    ("qwen3_vl_moe", "Qwen3-VL-MoE (text)", "qwen3_vl_moe", {}, {}, "text"),
    ("qwen3_vl_moe-vision", "Qwen3-VL-MoE (vision)", "qwen3_vl_moe", {}, {}, "vision"),
    ("qwen3_5", "Qwen3.5 (text)", "qwen3_5", {}, {}, "text"),
    ("qwen3_5-vision", "Qwen3.5 (vision)", "qwen3_5", {}, {}, "vision"),
    ("qwen3_5_moe", "Qwen3.5-MoE (text)", "qwen3_5_moe", {}, {}, "text"),
    ("qwen3_5_moe-vision", "Qwen3.5-MoE (vision)", "qwen3_5_moe", {}, {}, "vision"),
    ("deepseek_v3", "DeepSeek-V3 (MLA rope block)", "deepseek_v3", {}, {}, "text"),
    # the integration passes the rotation for Llama 4 (its complex pairs): mode="interleave"
    ("llama4", "Llama 4 (text)", "llama4", {}, {"mode": "interleave"}, "text"),
    ("gpt_oss", "GPT-OSS", "gpt_oss", {}, {}, "text"),
    ("glm", "GLM", "glm", {}, {}, "text"),
    ("glm4", "GLM-4", "glm4", {}, {}, "text"),
    # Glm4MoeConfig's defaults give head_dim 4096 / 96 = 42, whose half is odd; GLM-4.5's is 128
    ("glm4_moe", "GLM-4.5 (MoE)", "glm4_moe", {"head_dim": 128}, {}, "text"),
    ("glm4_moe_lite", "GLM-4.7-Flash (MLA rope block)", "glm4_moe_lite", {}, {}, "text"),
    # read from their modeling files (rome.integrations.transformers._discovered)
    ("olmo", "OLMo (discovered)", "olmo", {}, {}, "text"),
    ("olmo2", "OLMo 2 (discovered)", "olmo2", {}, {}, "text"),
    ("cohere", "Cohere (discovered)", "cohere", {}, {}, "text"),
    ("granite", "Granite (discovered)", "granite", {}, {}, "text"),
    ("starcoder2", "Starcoder2 (discovered)", "starcoder2", {}, {}, "text"),
    ("smollm3", "SmolLM3 (discovered)", "smollm3", {}, {}, "text"),
    ("ernie4_5", "Ernie 4.5 (discovered)", "ernie4_5", {}, {}, "text"),
    ("helium", "Helium (discovered)", "helium", {}, {}, "text"),
]

# the config values that matter for the RoPE, where the config has them
_HF_KEYS = ("model_type", "head_dim", "hidden_size", "num_attention_heads", "num_heads", "embed_dim",
            "rope_parameters", "rope_theta", "partial_rotary_factor", "rotary_pct", "rotary_dim",
            "qk_rope_head_dim", "rope_interleave", "max_position_embeddings")


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    return v


def hf_config(model_type: str, overrides: dict, part: str):
    """The transformers config of a record: the config class's defaults with ``overrides``; its
    vision config for a vision record."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **overrides)
    return config.vision_config if part == "vision" else config


def _hf_recipe(stem, family, model_type, overrides, kwargs, part) -> Recipe:
    def build():
        config = hf_config(model_type, overrides, part)
        used = config if part == "vision" else config.get_text_config()
        values = used.to_dict()
        rope = rome.RoPE.from_hf_config(config, **kwargs)
        source = {
            "model_type": model_type,
            "config_class": type(config).__name__,
            "config": "vision_config" if part == "vision" else (
                "text_config" if used is not config else "config"),
            "overrides": overrides,
            "values": {k: _jsonable(values[k]) for k in _HF_KEYS if values.get(k) is not None},
            "call": "rome.RoPE.from_hf_config(config" + "".join(
                f", {k}={v!r}" for k, v in sorted(kwargs.items())) + ")",
        }
        return source, rope.layout, None

    return Recipe(f"transformers-{stem}", family, "transformers", build)


# diffusers: (file stem, family, class, recipe(values) -> (derived, layout), note)


def _signature(cls_name: str) -> dict:
    import diffusers

    params = inspect.signature(getattr(diffusers, cls_name).__init__).parameters
    return {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}


def _sections(layout_sections, theta, mode="interleave"):
    return rome.section_layout(tuple(layout_sections), mode=mode, theta=theta)


def _pad(layout: RopeLayout, head_dim: int) -> RopeLayout:
    """``layout`` followed by pass-through columns up to ``head_dim`` (HiDream's half-head RoPE)."""
    rest = head_dim - layout.head_dim
    if not rest:
        return layout
    return RopeLayout(torch.cat([layout.inv_freq, torch.zeros(rest, dtype=torch.float64)]),
                      torch.cat([layout.axis, torch.zeros(rest, dtype=torch.int64)]),
                      layout.n_axes, (*layout.blocks, ("none", rest)))


def _wan(v):
    d = v["attention_head_dim"]
    h = w = 2 * (d // 6)  # WanRotaryPosEmbed: h_dim = w_dim = 2 * (head_dim // 6), t the rest
    dims = (d - h - w, h, w)
    return {"axes_dims (t, h, w)": list(dims), "theta": 10000.0}, _sections(dims, 10000.0)


def _axes(key, theta_key=None, theta=None, head_key="attention_head_dim"):
    def build(v):
        dims = tuple(v[key])
        t = float(v[theta_key]) if theta_key else theta
        layout = _sections(dims, t)
        return {"axes_dims": list(dims), "theta": t}, _pad(layout, v[head_key]) if head_key else layout
    return build


def _cogvideox(v):
    d = v["attention_head_dim"]  # the pipeline's get_3d_rotary_pos_embed(embed_dim=head_dim)
    dims = (d // 4, d // 8 * 3, d // 8 * 3)
    return {"axes_dims (t, h, w)": list(dims), "theta": 10000.0,
            "use_rotary_positional_embeddings": True}, _sections(dims, 10000.0)


def _lumina2(v):
    d = v["hidden_size"] // v["num_attention_heads"]
    dims = tuple(v["axes_dim_rope"])
    return {"head_dim": d, "axes_dims": list(dims), "theta": 10000.0}, _pad(_sections(dims, 10000.0), d)


def _zimage(v):
    d = v["dim"] // v["n_heads"]
    dims, t = tuple(v["axes_dims"]), float(v["rope_theta"])
    return {"head_dim": d, "axes_dims": list(dims), "theta": t}, _pad(_sections(dims, t), d)


def _cosmos(v):
    d = v["attention_head_dim"]  # CosmosRotaryPosEmbed(hidden_size=head_dim): per-axis NTK thetas
    h = w = d // 6 * 2
    t = d - h - w
    scale = v["rope_scale"]
    thetas = [10000.0 * s ** (n / (n - 2)) for s, n in zip(scale, (t, h, w))]
    inv = torch.cat([rome.rope_frequencies(n, theta=th).inv_freq for n, th in zip((t, h, w), thetas)])
    layout = rome.mrope_layout(rome.Frequencies(inv, d), [t // 2, h // 2, w // 2])
    return {"axes_dims (t, h, w)": [t, h, w], "thetas": thetas}, layout


def _cogview4(v):
    d = v["attention_head_dim"]  # CogView4RotaryPosEmbed: dim // 2 columns per axis (h, w)
    inv = torch.cat([rome.rope_frequencies(d // 2, theta=10000.0).inv_freq] * 2)
    layout = rome.mrope_layout(rome.Frequencies(inv, d), [d // 4, d // 4])
    return {"axes_dims (h, w)": [d // 2, d // 2], "theta": 10000.0}, layout


def _ltx(heads_key, head_key, heads, theta_key=None):
    def build(v):
        from rome.integrations.diffusers import _ltx_layout

        dim = heads * v[head_key]
        theta = float(v[theta_key]) if theta_key else 10000.0
        return {"recorded num_attention_heads": heads, "inner_dim": dim, "theta": theta}, _ltx_layout(dim, theta)
    return build


def _mochi(v):
    d = v["attention_head_dim"]
    return ({"frequencies": "learned (MochiRoPE.pos_frequencies [3, heads, head_dim / 2]), each "
                            "column's angle a sum over the three axes"},
            None, rome.rotation_matrix(d, "interleave", dtype=torch.float64))


_LTX_NOTE = ("LTX's RoPE spans the whole inner dim (heads x head_dim); recorded with fewer heads "
             "than the real config so the record stays small: the layout depends on the inner "
             "dim only through dim % 6 (leading pass-through columns) and dim // 6 (frequencies)")

_DIFFUSERS = [
    ("wan", "Wan", "WanTransformer3DModel", _wan, ""),
    ("wan_vace", "WanVACE", "WanVACETransformer3DModel", _wan, ""),
    ("wan_animate", "WanAnimate", "WanAnimateTransformer3DModel", _wan, ""),
    ("chronoedit", "ChronoEdit", "ChronoEditTransformer3DModel", _wan, ""),
    ("skyreels_v2", "SkyReels-V2", "SkyReelsV2Transformer3DModel", _wan, ""),
    ("hunyuan_video", "HunyuanVideo", "HunyuanVideoTransformer3DModel",
     _axes("rope_axes_dim", "rope_theta"), "the patch's own rotary forward: section_layout(rope_axes_dim)"),
    ("hunyuan_video_framepack", "HunyuanVideo FramePack", "HunyuanVideoFramepackTransformer3DModel",
     _axes("rope_axes_dim", "rope_theta"), ""),
    ("hunyuan_video15", "HunyuanVideo 1.5", "HunyuanVideo15Transformer3DModel",
     _axes("rope_axes_dim", "rope_theta"), ""),
    ("hunyuan_image", "HunyuanImage", "HunyuanImageTransformer2DModel", _axes("rope_axes_dim", "rope_theta"), ""),
    ("cogvideox", "CogVideoX", "CogVideoXTransformer3DModel", _cogvideox,
     "tables from the pipeline (fractional positions); frequencies as its get_3d_rotary_pos_embed"),
    ("consisid", "ConsisID", "ConsisIDTransformer3DModel", _cogvideox, "as CogVideoX"),
    ("flux", "Flux", "FluxTransformer2DModel", _axes("axes_dims_rope", theta=10000.0), ""),
    ("chroma", "Chroma", "ChromaTransformer2DModel", _axes("axes_dims_rope", theta=10000.0), ""),
    ("flux2", "FLUX.2", "Flux2Transformer2DModel", _axes("axes_dims_rope", "rope_theta"), ""),
    ("qwenimage", "Qwen-Image", "QwenImageTransformer2DModel", _axes("axes_dims_rope", theta=10000.0),
     "centred image positions (scale_rope); complex tables widened to rome's"),
    ("z_image", "Z-Image", "ZImageTransformer2DModel", _zimage, ""),
    ("lumina2", "Lumina2", "Lumina2Transformer2DModel", _lumina2, ""),
    ("hidream", "HiDream", "HiDreamImageTransformer2DModel", _axes("axes_dims_rope", theta=10000.0),
     "the class defaults' axes_dims_rope span half the head: the rest passes through"),
    ("ltx_video", "LTX-Video", "LTXVideoTransformer3DModel", _ltx("num_attention_heads", "attention_head_dim", 2),
     "the patch's own rotary forward (_ltx_layout); " + _LTX_NOTE),
    ("ltx2", "LTX-2 (rope_type interleaved, video)", "LTX2VideoTransformer3DModel",
     _ltx("num_attention_heads", "attention_head_dim", 1, "rope_theta"),
     "frequencies as LTX-Video's (the model rounds them to float32); " + _LTX_NOTE),
    ("cosmos", "Cosmos", "CosmosTransformer3DModel", _cosmos,
     "half rotation over the head, per-axis NTK thetas (the model computes them in float32)"),
    ("cogview4", "CogView4", "CogView4Transformer2DModel", _cogview4, "half rotation over the head"),
    ("mochi", "Mochi", "MochiTransformer3DModel", _mochi,
     "learned per-head frequencies mixing the three axes: the record holds M only"),
]

_DIFFUSERS_KEYS = ("attention_head_dim", "num_attention_heads", "hidden_size", "dim", "n_heads",
                   "axes_dims_rope", "axes_dim_rope", "axes_dims", "rope_axes_dim", "rope_theta",
                   "rope_scale", "rope_type", "patch_size", "patch_size_t")


def _diffusers_recipe(stem, family, cls_name, make, note) -> Recipe:
    def build():
        v = _signature(cls_name)
        derived, *rest = make(v)
        layout, matrix = (rest[0], rest[1]) if len(rest) == 2 else (rest[0], None)
        source = {
            "class": cls_name,
            "values": {k: _jsonable(v[k]) for k in _DIFFUSERS_KEYS if v.get(k) is not None},
            "values_from": f"{cls_name}.__init__ defaults",
            "derived": _jsonable(derived),
        }
        return source, layout, matrix

    return Recipe(f"diffusers-{stem}", family, "diffusers", build, note)


# the seed's 3D layouts and the generic builders' examples


def _builder(stem, family, library, call, make, note="") -> Recipe:
    def build():
        layout, matrix = make()
        return {"call": call}, layout, matrix

    return Recipe(f"{library}-{stem}", family, library, build, note)


def _seed(mode):
    return lambda: (rome.section_layout((44, 44, 40), mode=mode),
                    rome.rotation_matrix((44, 44, 40), mode, dtype=torch.float64))


_BUILDERS = [
    _builder("3d-half", "seed 3D video RoPE, half", "seed",
             "rome.rotation_matrix((44, 44, 40), 'half'); rome.section_layout((44, 44, 40), mode='half')",
             _seed("half"), "the seed's compose_3matrix of three half matrices"),
    _builder("3d-interleave", "seed 3D video RoPE, interleave", "seed",
             "rome.rotation_matrix((44, 44, 40), 'interleave'); "
             "rome.section_layout((44, 44, 40), mode='interleave')",
             _seed("interleave"), "the seed's compose_3matrix of three interleave matrices"),
    _builder("sections-interleave", "rotation_matrix, 3 interleave sections", "builder",
             "rome.rotation_matrix((16, 24, 24), 'interleave'); "
             "rome.section_layout((16, 24, 24), mode='interleave', theta=(10000.0, 256.0, 256.0))",
             lambda: (rome.section_layout((16, 24, 24), mode="interleave", theta=(10000.0, 256.0, 256.0)),
                      rome.rotation_matrix((16, 24, 24), "interleave", dtype=torch.float64))),
    _builder("sections-half", "rotation_matrix, 2 half sections", "builder",
             "rome.rotation_matrix((32, 32), 'half'); rome.section_layout((32, 32), mode='half')",
             lambda: (rome.section_layout((32, 32), mode="half"),
                      rome.rotation_matrix((32, 32), "half", dtype=torch.float64))),
    _builder("partial-half", "partial rotary, half (Llama-style, factor 0.5)", "builder",
             "rome.rope_layout(rome.rope_frequencies(64, theta=10000.0, partial_rotary_factor=0.5), mode='half')",
             lambda: (rome.rope_layout(rome.rope_frequencies(64, theta=10000.0, partial_rotary_factor=0.5),
                                       mode="half"), None)),
    _builder("partial-interleave", "partial rotary, interleave (GPT-J-style rotary_dim 16 of 64)", "builder",
             "rome.rope_layout(rome.rope_frequencies(64, theta=10000.0, rotary_dim=16), mode='interleave')",
             lambda: (rome.rope_layout(rome.rope_frequencies(64, theta=10000.0, rotary_dim=16),
                                       mode="interleave"), None)),
    _builder("axial-vision", "axial 2D vision RoPE (RoPE.vision)", "builder",
             "rome.RoPE.vision(64).layout", lambda: (rome.RoPE.vision(64).layout, None)),
    _builder("mrope", "mRoPE, contiguous sections (mrope_layout)", "builder",
             "rome.mrope_layout(rome.rope_frequencies(64, theta=10000.0), [8, 12, 12])",
             lambda: (rome.mrope_layout(rome.rope_frequencies(64, theta=10000.0), [8, 12, 12]), None)),
    _builder("mrope-interleaved", "mRoPE, interleaved (mrope_layout, interleaved=True)", "builder",
             "rome.mrope_layout(rome.rope_frequencies(64, theta=10000.0), [8, 12, 12], interleaved=True)",
             lambda: (rome.mrope_layout(rome.rope_frequencies(64, theta=10000.0), [8, 12, 12],
                                        interleaved=True), None)),
]

RECIPES: dict[str, Recipe] = {
    r.name: r for r in (
        *(_hf_recipe(*row) for row in _HF),
        *(_diffusers_recipe(*row) for row in _DIFFUSERS),
        *_BUILDERS,
    )
}


# --- records -------------------------------------------------------------------------------------


def columns_of(matrix: torch.Tensor) -> tuple[list, list]:
    """``(src, sign)`` per column of a signed permutation (zero columns: None, 0); ValueError for
    anything else."""
    m = matrix.to(torch.float64)
    src, sign = [], []
    for j in range(m.shape[1]):
        nz = m[:, j].nonzero().flatten().tolist()
        if not nz:
            src.append(None)
            sign.append(0)
            continue
        if len(nz) != 1 or abs(float(m[nz[0], j])) != 1.0:
            raise ValueError(f"column {j} of M is not a signed unit column: rows {nz}")
        src.append(nz[0])
        sign.append(int(m[nz[0], j]))
    return src, sign


def _mode(blocks) -> str:
    modes = sorted({m for m, _ in blocks if m != "none"})
    return modes[0] if len(modes) == 1 else "+".join(modes)


def build_record(recipe: Recipe) -> dict:
    source, layout, matrix = recipe.build()
    if matrix is None:
        matrix = layout.matrix(torch.float64)
    elif layout is not None:
        # a matrix of its own (rotation_matrix): it must be the layout's
        if not torch.equal(matrix.to(torch.float64), layout.matrix(torch.float64)):
            raise ValueError(f"{recipe.name}: rotation_matrix and the layout's matrix differ")
    src, sign = columns_of(matrix)
    d = matrix.shape[0]
    if layout is not None:
        blocks = [[m, s] for m, s in layout.blocks]
        axis = layout.axis.tolist()
        inv = [float(x).hex() for x in layout.inv_freq.tolist()]
        n_axes, scaling = layout.n_axes, float(layout.attention_scaling).hex()
    else:
        blocks = [["interleave", d]]
        axis, inv, n_axes, scaling = [None] * d, [None] * d, None, None
    return {
        "name": recipe.name,
        "family": recipe.family,
        "library": recipe.library,
        "note": recipe.note,
        "source": source,
        "head_dim": d,
        "mode": _mode(blocks),
        "blocks": blocks,
        "sections": [s for _, s in blocks],
        "n_axes": n_axes,
        "attention_scaling": scaling,
        "columns": [{"j": j, "src": src[j], "sign": sign[j], "axis": axis[j], "inv_freq": inv[j]}
                    for j in range(d)],
    }


def record_text(record: dict) -> str:
    """Deterministic JSON: sorted keys, the source indented, one column per line."""
    lines = []
    for key in sorted(record):
        value = record[key]
        if key == "columns":
            body = ",\n".join("    " + json.dumps(c, sort_keys=True) for c in value)
            text = "[\n" + body + "\n  ]"
        elif isinstance(value, dict):
            text = json.dumps(value, sort_keys=True, indent=2).replace("\n", "\n  ")
        else:
            text = json.dumps(value, sort_keys=True)
        lines.append(f"  {json.dumps(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def build_records(names=None) -> list[dict]:
    return [build_record(RECIPES[n]) for n in (names or RECIPES)]


# --- pictures ------------------------------------------------------------------------------------


def render_png(record: dict, path: Path) -> None:
    """M as a heatmap (+1 red, 0 white, -1 blue) with its blocks outlined, and under it two
    strips: each column's position axis and log10 of its inverse frequency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Rectangle

    cols = record["columns"]
    d = record["head_dim"]
    m = np.zeros((d, d))
    for c in cols:
        if c["src"] is not None:
            m[c["src"], c["j"]] = c["sign"]
    side = max(3.6, 2.0 * d / DPI + 1.2)
    fig = plt.figure(figsize=(side, side + 1.0), dpi=DPI)
    gs = fig.add_gridspec(3, 1, height_ratios=[side - 0.4, 0.22, 0.22], hspace=0.08,
                          left=0.16, right=0.97, top=1 - 0.45 / (side + 1.0), bottom=0.5 / (side + 1.0))
    ax = fig.add_subplot(gs[0])
    ax.imshow(m, cmap=ListedColormap(["#2166ac", "#ffffff", "#b2182b"]), vmin=-1, vmax=1,
              interpolation="nearest", aspect="equal", extent=(-0.5, d - 0.5, d - 0.5, -0.5))
    offset = 0
    for mode, size in record["blocks"]:  # the sections: shaded and outlined (pass-through dashed)
        if mode != "none":
            ax.add_patch(Rectangle((offset - 0.5, offset - 0.5), size, size, fc="#000000", alpha=0.06, lw=0))
        ax.add_patch(Rectangle((offset - 0.5, offset - 0.5), size, size, fill=False, lw=0.8,
                               ec="#999999" if mode == "none" else "black",
                               ls="--" if mode == "none" else "-"))
        offset += size
    ax.set_xticks([])
    ax.set_ylabel("row i", fontsize=7)
    ax.tick_params(labelsize=6)
    groups: list = []  # consecutive blocks of one mode: "interleave 44+42+42"
    for m_, s_ in record["blocks"]:
        if groups and groups[-1][0] == m_:
            groups[-1][1].append(s_)
        else:
            groups.append((m_, [s_]))
    modes = ", ".join(f"{m_} {'+'.join(map(str, s_))}" for m_, s_ in groups)
    ax.set_title(f"{record['family']}\nD={d}: {modes}", fontsize=7)
    # strips
    axis = np.array([np.nan if c["axis"] is None else c["axis"] for c in cols], dtype=float)
    inv = np.array([np.nan if c["inv_freq"] is None else float.fromhex(c["inv_freq"]) for c in cols])
    rotated = np.array([c["src"] is not None for c in cols])
    axis[~rotated] = np.nan
    with np.errstate(divide="ignore"):
        logf = np.where(rotated & (inv > 0), np.log10(np.where(inv > 0, inv, 1.0)), np.nan)
    sa = fig.add_subplot(gs[1], sharex=ax)
    sa.imshow(axis[None, :], cmap=ListedColormap(["#1b9e77", "#d95f02", "#7570b3", "#e7298a"]),
              vmin=-0.5, vmax=3.5, aspect="auto", interpolation="nearest",
              extent=(-0.5, d - 0.5, 0.5, -0.5))
    sa.set_yticks([0])
    n_axes = record["n_axes"]
    sa.set_yticklabels([f"axis ({n_axes})" if n_axes else "axis (n/a)"], fontsize=6)
    sa.set_xticks([])
    sf = fig.add_subplot(gs[2], sharex=ax)
    fin = logf[np.isfinite(logf)]
    lo, hi = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 1.0)
    sf.imshow(logf[None, :], cmap="viridis", vmin=lo, vmax=hi if hi > lo else lo + 1, aspect="auto",
              interpolation="nearest", extent=(-0.5, d - 0.5, 0.5, -0.5))
    sf.set_yticks([0])
    sf.set_yticklabels([f"log10 f\n{lo:.1f}..{hi:.1f}" if fin.size else "log10 f\n(n/a)"], fontsize=5)
    sf.tick_params(labelsize=6)
    sf.set_xlabel("column j of x @ M;  M: +1 red, -1 blue;  grey: passes through", fontsize=6)
    for s in (sa, sf):
        s.set_facecolor("#dddddd")
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    plt.close(fig)


# --- the README ----------------------------------------------------------------------------------

README_HEAD = """\
# matrices: every RoPE family's rotation matrix, pinned and pictured

Generated by `python -m profiling matrices` (or `make matrices`) from `profiling/matrices.py`; do
not edit by hand. `tests/test_matrices_records.py` holds rome's builders to these records: a
change that moves one column of M, one frequency bit or one axis fails it, and so does a
generator change that would rewrite a committed file. Not part of the wheel (which ships `rome`
only). What the catalogue is: [docs/matrices.md](../docs/matrices.md).

rome computes every RoPE as `out = x*cos + (x @ M)*sin`, M a D×D signed permutation,
block-diagonal with one `half` (`rotate_half`: pairs `(i, i + d/2)`) or `interleave` (GPT-J:
pairs `(2i, 2i+1)`) block per section, zero on the columns that pass through. Column j of the
head turns by `position[axis[j]] * inv_freq[j]`.

## A record (`<name>.json`)

| Field | Meaning |
|---|---|
| `name`, `family`, `library` | the file stem, the family as docs/families.md names it, and where it comes from: `transformers`, `diffusers`, `seed` (the seed's 3D layouts) or `builder` (rome's generic builders) |
| `source` | what the record is built from. transformers: `model_type`, the config class, its defaults with `overrides`, the `values` that matter for the RoPE (`head_dim`, `rope_parameters`, partial rotary, ...) and the `call` (`rome.RoPE.from_hf_config(config, ...)`); diffusers: the model class, the `values` of its `__init__` defaults and what the model's rotary module `derived` from them (per-axis sizes, theta); seed/builder: the `call` |
| `head_dim` | D, the columns of one head (LTX's RoPE spans the inner dim: see its note) |
| `mode` | the rotation of the rotated blocks: `half` or `interleave` |
| `blocks`, `sections` | M's diagonal blocks `[mode, size]` (`none`: pass-through columns) and their sizes |
| `n_axes` | the position axes (1 for text, 2 for images and vision towers, 3 for video, 4 for FLUX.2) |
| `attention_scaling` | the factor in cos and sin of the rotated columns (`float.hex`; YaRN's for GPT-OSS) |
| `columns[j].src`, `.sign` | column j of `x @ M` is `sign * x[:, src]` (M[src, j] = sign); `null`, 0: the column passes through |
| `columns[j].axis` | the position axis column j reads |
| `columns[j].inv_freq` | its inverse frequency, exactly: `float.hex` of rome's float64 value (`0x0.0p+0`: not rotated) |
| `note` | where the record departs from the model's real config or computation |

Frequencies are rome's float64 values. For diffusers families whose tables rome takes from the
model (all but HunyuanVideo's and LTX-Video's, whose rotary modules the patch replaces), they are
the model's RoPE as rome's layouts state it; the model may compute them in float32. Mochi's
frequencies are learned weights mixing the three axes: its record holds M only.

## A picture (`<name>.png`)

M as a heatmap (+1 red, 0 white, −1 blue; row i, column j), its blocks outlined (dashed grey:
pass-through), and under it two strips, one cell per column: the position axis (a colour per axis)
and log10 of the inverse frequency (viridis; grey where the column passes through).

## The families
"""


def readme_text(records: list[dict]) -> str:
    rows = ["| Family | Library | Source | Record | head_dim | Mode | Blocks | Axes | Picture |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        blocks = " ".join(f"{m}:{s}" for m, s in r["blocks"])
        src = r["source"]
        if r["library"] == "transformers":
            call = src["call"].removeprefix("rome.RoPE.from_hf_config(config").removesuffix(")")
            origin = f"`{src['model_type']}` {src['config']}{call}"
        elif r["library"] == "diffusers":
            origin = f"`{src['class']}`"
        else:
            origin = f"`{src['call']}`"
        rows.append(
            f"| {r['family']} | {r['library']} | {origin} | [{r['name']}.json]({r['name']}.json) | {r['head_dim']} | "
            f"{r['mode']} | {blocks} | {r['n_axes'] if r['n_axes'] is not None else 'n/a'} | "
            f"[<img src=\"{r['name']}.png\" width=\"120\" alt=\"{r['name']}\">]({r['name']}.png) |"
        )
    counts = {lib: sum(r["library"] == lib for r in records) for lib in ("transformers", "diffusers", "seed", "builder")}
    summary = (f"{len(records)} records: " + ", ".join(f"{n} {lib}" for lib, n in counts.items()) + ".\n\n")
    return README_HEAD + "\n" + summary + "\n".join(rows) + "\n"


# --- the command ---------------------------------------------------------------------------------


def generate(out: Path = OUT, *, pictures: bool = True, names=None) -> list[dict]:
    """Write every record (JSON), its picture and the README into ``out``; returns the records."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = build_records(names)
    for r in records:
        (out / f"{r['name']}.json").write_text(record_text(r), encoding="utf-8", newline="\n")
        if pictures:
            render_png(r, out / f"{r['name']}.png")
    (out / "README.md").write_text(readme_text(records), encoding="utf-8", newline="\n")
    return records


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default=str(OUT), help=f"output folder (default {OUT.relative_to(ROOT)}/)")
    p.add_argument("--no-pictures", action="store_true", help="write the records and README only")


def main(args) -> None:
    records = generate(Path(args.out), pictures=not args.no_pictures)
    print(f"{len(records)} records written to {args.out}")
