"""The report's model workload: one Wan block and one Llama layer, unpatched vs rome-patched.

Each model is built from its published config with one layer (random weights, fixed seed): on a
GPU at real sizes in bf16, on the CPU scaled down in fp32 (the same RoPE: head_dim 128, the
same sections and theta; fewer heads and tokens, so the CPU part ends in seconds). Timed with
``speed.bench`` (``do_bench`` on a GPU, wall clock on the CPU), per pass:

- ``fwd``: ``model(**inputs)`` under no_grad; ``fwd+bwd``: forward, then backward of a fixed
  random output gradient into every parameter (grads set to None first, no accumulation).
- unpatched, then patched with ``rome.integrations.patch`` (undone afterwards);
- the RoPE alone at the block's own q/k: the model's RoPE function (unpatched) and
  ``rome.apply_qk`` (patched) on the tensors and tables the layer passes it, captured from one
  forward. ``share = RoPE ms / model ms``, before and after.

Sizes (Wan2.1-T2V-14B: Wan-Video's ``t2v_14B`` config and diffusers' ``WanTransformer3DModel``
defaults; Llama-3-8B: its ``config.json``):

- Wan: dim 5120 = 40 heads x 128 (RoPE 44/42/42 interleave, theta 10000), ffn 13824, freq_dim 256,
  text_dim 4096, patch (1, 2, 2), qk_norm rms_norm_across_heads, cross_attn_norm, eps 1e-6; a
  480x832, 81-frame video's latent [1, 16, 21, 60, 104] (VAE stride 4, 8, 8) = 21x30x52 = 32760
  tokens; 512 text tokens. The whole one-block ``WanTransformer3DModel`` (patch and condition
  embedders, the block, the output head) is what is timed.
- Llama: one-layer ``LlamaModel`` (no lm_head: its 128256-wide logits would dwarf the layer),
  hidden 4096, 32 q / 8 kv heads of 128, intermediate 14336, rope_theta 5e5, rms eps 1e-5,
  vocab 128256 (the embedding is not used: the input is ``inputs_embeds``), 8192 tokens, batch 1.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

import rome
import rome.integrations

from . import speed
from .variants import Unavailable, wan_rotary


@dataclass(frozen=True)
class Built:
    model: torch.nn.Module
    inputs: dict
    description: str  # the sizes as built


@dataclass(frozen=True)
class ModelCase:
    name: str
    description: str
    build: Callable[[torch.device, torch.dtype, bool], Built]  # (device, dtype, full size?)
    output: Callable  # model output -> the tensor backward starts from
    own_rope: Callable  # (model, inputs) -> (run(q, k), q, k, what): the model's RoPE call
    rome_rope: Callable  # (patched model, inputs) -> (run(q, k), q, k, what): rome's call


# --- capturing a RoPE call's arguments ---------------------------------------------------------


@contextlib.contextmanager
def _spy(module, name: str, calls: list):
    """``module.name`` records each call's ``(args, kwargs)`` and calls through."""
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    setattr(module, name, spy)
    try:
        yield real
    finally:
        setattr(module, name, real)


def _first_call(model, inputs, module, name: str):
    """``(the real function, args, kwargs)`` of the first ``module.name`` call in one forward."""
    calls: list = []
    with _spy(module, name, calls) as real, torch.no_grad():
        model(**inputs)
    if not calls:
        raise RuntimeError(f"{module.__name__}.{name} was not called by {type(model).__name__}")
    args, kwargs = calls[0]
    return real, args, kwargs


def _shape(t: torch.Tensor) -> str:
    return f"[{', '.join(map(str, t.shape))}] {str(t.dtype).removeprefix('torch.')}"


def _rome_call(model, inputs, module):
    """rome's ``apply_qk`` as the patched layer calls it (``module`` is the integration), or its
    ``apply_qk_norm`` where the patch fuses the layer's q/k norms (Wan: norm and RoPE one call)."""
    try:
        real, args, kwargs = _first_call(model, inputs, module, "apply_qk")
        name = "rome.apply_qk"
    except RuntimeError:
        if not hasattr(module, "apply_qk_norm"):
            raise
        real, args, kwargs = _first_call(model, inputs, module, "apply_qk_norm")
        name = "rome.apply_qk_norm (the layer's q/k norm fused)"
    q, k, *rest = args
    what = f"{name}(q {_shape(q)}, k {_shape(k)}, cos/sin {_shape(rest[0])}, backend={kwargs.get('backend')})"
    return (lambda a, b: real(a, b, *rest, **kwargs)), q, k, what


def _cast(model, dtype):
    """``model`` in ``dtype`` except the modules its class keeps in float32, as diffusers'
    ``from_pretrained(torch_dtype=...)`` loads it (Wan: rope, time_embedder, norms, scale_shift_table)."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and not keep & set(name.split(".")):
            t.data = t.data.to(dtype)
    return model


# --- Wan ---------------------------------------------------------------------------------------


WAN_14B = dict(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
               out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=1,
               cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
WAN_LATENT = (1, 16, 21, 60, 104)  # 480x832, 81 frames through the VAE's (4, 8, 8) stride
WAN_TEXT = 512
# CPU: 2 heads of 128 (the same RoPE), ffn and text scaled by heads, a 3x8x8-token latent
WAN_CPU = dict(num_attention_heads=2, ffn_dim=13824 * 2 // 40, text_dim=256)
WAN_CPU_LATENT, WAN_CPU_TEXT = (1, 16, 3, 16, 16), 32


def _wan(device, dtype, full) -> Built:
    from diffusers import WanTransformer3DModel

    config = WAN_14B if full else {**WAN_14B, **WAN_CPU}
    latent, text = (WAN_LATENT, WAN_TEXT) if full else (WAN_CPU_LATENT, WAN_CPU_TEXT)
    torch.manual_seed(0)
    with torch.device(device):
        model = _cast(WanTransformer3DModel(**config), dtype).eval()
    g = torch.Generator(device="cpu").manual_seed(1)
    inputs = dict(
        hidden_states=torch.randn(latent, generator=g).to(device, dtype),
        timestep=torch.tensor([500], device=device),
        encoder_hidden_states=torch.randn(1, text, config["text_dim"], generator=g).to(device, dtype),
        return_dict=False,
    )
    p = config["patch_size"]
    grid = (latent[2] // p[0], latent[3] // p[1], latent[4] // p[2])
    heads, d = config["num_attention_heads"], config["attention_head_dim"]
    desc = (f"WanTransformer3DModel, 1 block: dim {heads * d} = {heads} heads x {d}, ffn {config['ffn_dim']}, "
            f"latent {list(latent)} -> {grid[0]}x{grid[1]}x{grid[2]} = {grid[0] * grid[1] * grid[2]} tokens, "
            f"text {text} x {config['text_dim']}")
    return Built(model, inputs, desc)


def _wan_own(model, inputs):
    """Wan's own rotary (nested in ``WanAttnProcessor.__call__``) on the self-attention's q and k:
    the block's normed q/k projections [B, S, N, D] and the rope module's tables [1, S, 1, D]."""
    f = wan_rotary()
    attn = model.blocks[0].attn1
    seen = {}
    hooks = [attn.norm_q.register_forward_hook(lambda m, a, out: seen.setdefault("q", out)),
             attn.norm_k.register_forward_hook(lambda m, a, out: seen.setdefault("k", out)),
             model.rope.register_forward_hook(lambda m, a, out: seen.setdefault("tables", out))]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for h in hooks:
            h.remove()
    q, k = (seen[n].unflatten(2, (attn.heads, -1)) for n in ("q", "k"))
    cos, sin = seen["tables"]
    what = f"Wan's apply_rotary_emb on q {_shape(q)}, then k {_shape(k)}, cos/sin {_shape(cos)}"
    return (lambda a, b: (f(a, cos, sin), f(b, cos, sin))), q, k, what


def _wan_rome(model, inputs):
    from rome.integrations import diffusers as integration

    return _rome_call(model, inputs, integration)


# --- Llama -------------------------------------------------------------------------------------


LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=8192,
                 rms_norm_eps=1e-5, rope_theta=500000.0)
LLAMA_TOKENS = 8192
# CPU: 4 q / 1 kv heads of 128 (the same RoPE and GQA ratio), intermediate scaled by heads
LLAMA_CPU = dict(hidden_size=512, intermediate_size=14336 // 8, num_attention_heads=4, num_key_value_heads=1,
                 vocab_size=256)
LLAMA_CPU_TOKENS = 256


def _llama_config(full):
    import transformers

    kw = LLAMA3_8B if full else {**LLAMA3_8B, **LLAMA_CPU}
    theta = kw["rope_theta"]
    kw = {k: v for k, v in kw.items() if k != "rope_theta"}
    try:  # transformers >= 5: rope_parameters; 4.x: rope_theta
        return transformers.LlamaConfig(**kw, rope_parameters={"rope_type": "default", "rope_theta": theta})
    except TypeError:
        return transformers.LlamaConfig(**kw, rope_theta=theta)


def _llama(device, dtype, full) -> Built:
    import transformers

    config = _llama_config(full)
    tokens = LLAMA_TOKENS if full else LLAMA_CPU_TOKENS
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaModel(config).to(dtype).eval()
    g = torch.Generator(device="cpu").manual_seed(1)
    inputs = dict(inputs_embeds=torch.randn(1, tokens, config.hidden_size, generator=g).to(device, dtype),
                  use_cache=False)
    desc = (f"LlamaModel, 1 layer: hidden {config.hidden_size}, {config.num_attention_heads} q / "
            f"{config.num_key_value_heads} kv heads x {config.head_dim}, intermediate {config.intermediate_size}, "
            f"{tokens} tokens, batch 1")
    return Built(model, inputs, desc)


def _llama_own(model, inputs):
    from transformers.models.llama import modeling_llama

    real, (q, k, cos, sin, *rest), kwargs = _first_call(model, inputs, modeling_llama, "apply_rotary_pos_emb")
    what = f"transformers' apply_rotary_pos_emb(q {_shape(q)}, k {_shape(k)}, cos/sin {_shape(cos)})"
    return (lambda a, b: real(a, b, cos, sin, *rest, **kwargs)), q, k, what


def _llama_rome(model, inputs):
    from rome.integrations import transformers as integration

    return _rome_call(model, inputs, integration)


MODELS = {
    c.name: c
    for c in [
        ModelCase("wan-14b-block", "Wan2.1-T2V-14B, one transformer block (480p, 81 frames)", _wan,
                  lambda out: out[0], _wan_own, _wan_rome),
        ModelCase("llama3-8b-layer", "Llama-3-8B, one decoder layer (8192-token prefill)", _llama,
                  lambda out: out.last_hidden_state, _llama_own, _llama_rome),
    ]
}


STEPS = 6  # on_step calls per case: 2 passes unpatched, 2 patched, 2 RoPE-alone timings


# --- timing -----------------------------------------------------------------------------------


def _model_passes(model, inputs, output, grad):
    params = [p for p in model.parameters() if p.requires_grad]

    def fwd():
        with torch.no_grad():
            model(**inputs)

    def fwd_bwd():
        for p in params:
            p.grad = None  # no accumulate op in what is timed
        torch.autograd.backward(output(model(**inputs)), grad)

    return {"fwd": fwd, "fwd+bwd": fwd_bwd}


def _time_rope(capture, device) -> tuple[dict, str]:
    run, q, k, what = capture
    p = speed.Passes(run, q.detach(), k.detach(), differentiable=True)
    return {name: speed.bench(p.passes[name], device)["median_ms"] for name in ("fwd", "fwd+bwd")}, what


def measure(case: ModelCase, device: torch.device, *, full: bool | None = None, on_step=None) -> dict:
    """One model case: timings unpatched and patched, the RoPE alone, and their ratios.

    ``full`` (default: on a GPU) builds the real sizes; otherwise the CPU-scaled ones."""
    full = device.type == "cuda" if full is None else full
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    backend = "triton" if device.type == "cuda" else "torch"
    try:
        built = case.build(device, dtype, full)
    except ImportError as e:
        raise Unavailable(f"{case.name}: {e}") from None
    model, inputs, built_as = built.model, built.inputs, built.description
    with torch.no_grad():
        ref = case.output(model(**inputs))
    grad = torch.randn(ref.shape, generator=torch.Generator(device="cpu").manual_seed(2)).to(device, ref.dtype)

    def step(text):
        if on_step:
            on_step(f"models {case.name} {text}")

    timings = {}
    for name, fn in _model_passes(model, inputs, case.output, grad).items():
        step(f"unpatched {name}")
        timings[("unpatched", name)] = speed.bench(fn, device)["median_ms"]
    step("model RoPE alone")
    own, own_what = _time_rope(case.own_rope(model, inputs), device)

    handle = rome.integrations.patch(model, backend=backend)
    try:
        with torch.no_grad():
            out = case.output(model(**inputs))
        rel = ((out.double() - ref.double()).abs().max() / ref.double().abs().max()).item()
        for name, fn in _model_passes(model, inputs, case.output, grad).items():
            step(f"patched {name}")
            timings[("patched", name)] = speed.bench(fn, device)["median_ms"]
        step("rome.apply_qk alone")
        mine, rome_what = _time_rope(case.rome_rope(model, inputs), device)
    finally:
        handle.undo()

    rows = []
    for name in ("fwd", "fwd+bwd"):
        before, after = timings[("unpatched", name)], timings[("patched", name)]
        rows.append({
            "model": case.name, "pass": name, "unpatched_ms": before, "patched_ms": after,
            "speedup": before / after, "rope_ms_before": own[name], "rope_ms_after": mine[name],
            "rope_share_before": own[name] / before, "rope_share_after": mine[name] / after,
        })
    del built, model, inputs, ref, out, grad
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "model": case.name, "description": case.description, "built": built_as,
        "full_size": full, "dtype": str(dtype).removeprefix("torch."), "rome_backend": backend,
        "patched_vs_unpatched_rel": rel, "rope_before": own_what, "rope_after": rome_what, "rows": rows,
    }


def run_models(device: torch.device, *, names=None, full: bool | None = None, on_step=None) -> dict:
    """Every case in ``MODELS`` (or ``names``): ``{"cases": [...], "skipped": [...], "method": str}``."""
    cases, skipped = [], []
    threads = torch.get_num_threads()
    if device.type == "cpu":  # on a shared machine, torch's threads spin against each other
        torch.set_num_threads(1)
    try:
        for name in names or MODELS:
            try:
                cases.append(measure(MODELS[name], device, full=full, on_step=on_step))
            except Unavailable as e:
                skipped.append({"model": name, "status": "unavailable", "reason": str(e)})
            except Exception as e:  # one broken case (out of memory, a library change) must not sink the report
                skipped.append({"model": name, "status": "error", "reason": f"{type(e).__name__}: {e}"})
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        torch.set_num_threads(threads)
    if device.type == "cuda":
        method = ("triton.testing.do_bench (CUDA events, L2 flushed), median ms; bf16 weights and "
                  "activations; rome on its Triton kernel.")
    else:
        method = ("CPU wall clock (speed.bench: perf_counter over repeated calls after warm-up), median ms, "
                  "one CPU thread; fp32, models scaled down (same RoPE, fewer heads and tokens); rome on its torch backend. "
                  "The ratios say nothing about a GPU.")
    return {"cases": cases, "skipped": skipped, "method": method}


def rows(models: dict) -> list[dict]:
    """The flat table rows of ``run_models``'s result."""
    return [r for c in models["cases"] for r in c["rows"]]


__all__ = ["MODELS", "ModelCase", "measure", "rows", "run_models"]
