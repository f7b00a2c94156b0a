"""Every way of applying RoPE to q and k that the report compares, in one registry.

A variant is built for a ``Setup`` (tables, matrix, workload) and returns ``run(q, k) ->
(q_out, k_out)``. ``prepare`` puts q/k in the layout the variant wants (outside the timed
region): the seed's BNSD for rome and the references, BSND storage for kernels written for it.
Outputs are always BNSD-shaped (views are fine). A variant that cannot express a workload
raises ``Unsupported`` with the reason; one that is not installed here raises ``Unavailable``.
The ``model`` variants are the RoPE functions diffusers and transformers models call today.
The seed's v4 (``per_section``) runs an anchor's 1D kernel once per section and concatenates.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch

import rome
from rome.layouts import cos_sin_cache
from rome.positions import angle_frequencies
from rome.reference import merged_matrix, per_section_matrices, slice_concat

from .workloads import Workload, norm_weights


class Unsupported(Exception):
    """The variant cannot express this workload (the message says why)."""


class Unavailable(Exception):
    """The variant's library is not installed, or needs a device this run does not have."""


@dataclass
class Setup:
    workload: Workload
    mode: str
    cos: torch.Tensor
    sin: torch.Tensor
    angles: torch.Tensor  # float64, shape of cos
    matrix: torch.Tensor  # rotation_matrix in q's dtype
    backend: str  # rome's backend: "triton" (CUDA or interpreter) or "torch"
    positions: torch.Tensor | None = None  # int64 positions the tables are at (Tables.positions)

    @property
    def sections(self):
        return self.workload.sections


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    kind: str  # reference | compiled | rome | anchor | model
    build: Callable[[Setup], Callable]
    layout: str = "bnsd"  # what prepare() hands to run()
    differentiable: bool = True
    normed: bool = False  # q and k RMS-normalised first (a qk_norm workload's norm, then RoPE)

    def prepare(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).contiguous() if self.layout == "bsnd" else x


def _pair(f):
    return lambda q, k: (f(q), f(k))


def _v1(s: Setup):
    return _pair(lambda x: slice_concat(x, s.cos, s.sin, s.sections, s.mode))


def _v2(s: Setup):
    return _pair(lambda x: per_section_matrices(x, s.cos, s.sin, s.sections, s.mode))


def _v3(s: Setup):
    return _pair(lambda x: merged_matrix(x, s.cos, s.sin, s.matrix))


def _v1_pair(q, k, cos, sin, sections, mode):
    return slice_concat(q, cos, sin, sections, mode), slice_concat(k, cos, sin, sections, mode)


COMPILE_BACKEND = "inductor"  # torch.compile's backend for the compiled variants (what users run;
# a test of the report's plumbing alone may name "aot_eager": the same graphs without inductor's codegen)


def _compiled_per_setup(fn):
    """``torch.compile`` of a copy of ``fn`` with a code object of its own (one per grad mode: the
    fwd and fwd+bwd passes need a graph each), every call with recompiles made errors. dynamo
    keeps its compiled graphs per code object: one ``torch.compile(fn)`` per set-up still shared
    them, so the report's dtype and layout set-ups piled recompiles onto one code object until
    ``recompile_limit`` (8), after which dynamo ran the function eagerly and the "compiled" rows
    timed (and measured the precision of) eager code."""
    compiled = {}

    def call(*args):
        grad = torch.is_grad_enabled()
        if grad not in compiled:
            _compiled_per_setup.count += 1
            code = fn.__code__.replace(co_name=f"{fn.__name__}_setup{_compiled_per_setup.count}")
            compiled[grad] = torch.compile(types.FunctionType(code, fn.__globals__, code.co_name), dynamic=False,
                                           backend=COMPILE_BACKEND)
        with torch._dynamo.config.patch(error_on_recompile=True):
            return compiled[grad](*args)

    return call


_compiled_per_setup.count = 0


def _v1_compiled(s: Setup):
    f = _compiled_per_setup(_v1_pair)
    return lambda q, k: f(q, k, s.cos, s.sin, s.sections, s.mode)


def _v3_pair(q, k, cos, sin, m):
    return merged_matrix(q, cos, sin, m), merged_matrix(k, cos, sin, m)


def _v3_compiled(s: Setup):
    f = _compiled_per_setup(_v3_pair)
    return lambda q, k: f(q, k, s.cos, s.sin, s.matrix)


def _rome_apply(s: Setup):
    return _pair(lambda x: rome.apply(x, s.cos, s.sin, s.matrix, backend=s.backend))


def _rome_apply_qk(s: Setup):
    return lambda q, k: rome.apply_qk(q, k, s.cos, s.sin, s.matrix, backend=s.backend)


def _rome_apply_qk_native(s: Setup):
    """rome.apply_qk with rounding="native": the eager chain's bits (tables in q's dtype, each
    product and the sum rounded to it), beside the default exact rounding and the float64 oracle."""
    return lambda q, k: rome.apply_qk(q, k, s.cos, s.sin, s.matrix, backend=s.backend, rounding="native")


def _rome_apply_qk_partner(s: Setup):
    """rome.apply_qk with the whole head's half rotation, or sections' pairs, in the gather kernel's
    partner form (x and x[:, src] a head, ``rome.launch.partner_form``), not as its two halves
    (``HALVES``, the pairs' ``HALVES_RUN``): the same bits, the A/B of ``launch.halves_config``
    (another rotation's launch: apply_qk's own)."""
    if s.backend != "triton":
        raise Unsupported("the partner form is the Triton backend's (this run uses the torch backend)")
    from rome import launch

    def run(q, k):
        with launch.partner_form():
            return rome.apply_qk(q, k, s.cos, s.sin, s.matrix, backend=s.backend)

    return run


def _rome_apply_qk_dot(s: Setup):
    """rome.apply_qk with x @ M on the tensor cores (the seed's matmul formulation), not the gather."""
    if s.backend != "triton":
        raise Unsupported("the dot kernel is the Triton backend's (this run uses the torch backend)")
    from rome.launch import product

    def run(q, k):
        with product("dot"):
            return rome.apply_qk(q, k, s.cos, s.sin, s.matrix, backend=s.backend)

    return run


# --- rome with positions: a cache read in the kernel, angles in the kernel, the module -------


def _positions(s: Setup) -> torch.Tensor:
    if s.positions is None:
        raise Unsupported("this setup has no positions")
    return s.positions.to(s.cos.device)


def _op_positions(s: Setup) -> torch.Tensor:
    """The positions as rome's positions ops take them, broadcasting over BNSD q's rows
    ``[B, N, S]``, axes last: ``[B, 1, 1, 1]`` for decode, ``[S, A]`` otherwise."""
    p = _positions(s)
    if s.workload.decode:
        return p.reshape(-1, 1, 1, 1)
    return p if p.ndim == 2 else p[:, None]


def _fp32_tables(s: Setup, who: str):
    if s.cos.dtype != torch.float32:
        raise Unsupported(f"{who} keeps float32 tables (asked for {str(s.cos.dtype).removeprefix('torch.')})")


def _positions_op(s: Setup, op, tables):
    """``op(q, k, *tables(layout), M, positions, axis=...)`` for the workload's layout: the
    positions ops' common arguments, built once outside the timed call."""
    layout = s.workload.rope_layout(s.mode)
    pos = _op_positions(s)
    cos, sin = tables(layout, pos)
    m = layout.matrix(s.matrix.dtype, s.matrix.device)
    axis = layout.axis.to(s.cos.device) if layout.n_axes > 1 else None
    return lambda q, k: op(q, k, cos, sin, m, pos, axis=axis, backend=s.backend)


def _rome_apply_qk_at(s: Setup):
    """A cos/sin cache of rows 0..max position (the setup's table dtype, float64 angles rounded
    once, so the rows are bitwise the setup's tables), read by the kernel at the positions."""
    return _positions_op(s, rome.apply_qk_at, lambda layout, pos: cos_sin_cache(
        layout, int(pos.max()) + 1, dtype=s.cos.dtype, device=s.cos.device))


def _rome_apply_qk_angles(s: Setup):
    _fp32_tables(s, "apply_qk_angles")
    return _positions_op(s, rome.apply_qk_angles, lambda layout, pos: tuple(
        t.to(s.cos.device) for t in angle_frequencies(layout.inv_freq, layout.attention_scaling)))


def _rome_module(s: Setup):
    """``rome.RoPE(layout)(q, k, positions)`` as a model calls it: HF-style positions (``[B, 1]``
    for decode, ``[S]`` or ``[S, A]``), packed THD with ``cu_seqlens`` for varlen; the module's
    host-side position check (one sync) and shared cache included."""
    _fp32_tables(s, "rome.RoPE")
    rope = rome.RoPE(s.workload.rope_layout(s.mode), backend=s.backend)
    pos = _positions(s)
    cu = s.workload.cu_seqlens()
    if s.workload.decode:
        return lambda q, k: rope(q, k, pos[:, None])
    if cu is not None and len(pos) == s.workload.seq:  # every token: the packed sequences
        cu = cu.to(pos.device)

        def run(q, k):  # BNSD [1, N, T, D] viewed as THD [T, N, D]
            qo, ko = rope(q[0].transpose(0, 1), k[0].transpose(0, 1), cu_seqlens=cu)
            return qo.transpose(0, 1)[None], ko.transpose(0, 1)[None]

        return run
    return lambda q, k: rope(q, k, pos)


# --- kernels users would otherwise pick (GPU only, when installed) ------------------------


def _anchor(s: Setup, package: str, attr: str, *modules: str):
    """``attr`` from the first of ``modules`` that imports (CUDA tensors only), else Unavailable."""
    if not s.cos.is_cuda:
        raise Unavailable("needs CUDA tensors")
    errors = []
    for module in modules:
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            errors.append(str(e))
    raise Unavailable(f"{package} not installed ({'; '.join(errors)})")


def _one_rotation_over_head(s: Setup, who: str):
    """Interleave pairs never cross a section, so multi-axis interleave RoPE is 1D interleave
    RoPE with per-token tables; half-mode sections rotate (j, j + d_i/2), which a kernel that
    rotates the halves of the whole head (j, j + D/2) cannot express."""
    if s.mode == "half" and len(s.sections) > 1:
        raise Unsupported(f"{who} rotates the halves of the whole head; per-section half "
                          f"rotation ({'/'.join(map(str, s.sections))}) needs a split per section")


def _half_table(t: torch.Tensor, mode: str) -> torch.Tensor:
    """[..., D] table -> the [..., D/2] angle-per-pair table kernels like flash-attn take."""
    return t[..., ::2] if mode == "interleave" else t[..., : t.shape[-1] // 2]


def _liger(s: Setup):
    if s.mode != "half" or len(s.sections) > 1:
        raise Unsupported("liger-kernel implements 1D half (NeoX/Llama) RoPE only")
    rope = _anchor(s, "liger-kernel", "liger_rotary_pos_emb", "liger_kernel.transformers.rope")
    # liger takes BNSD views of BSND storage and rotates them in place; tables [1|B, S, D]
    cos, sin = (t[None] if t.ndim == 2 else t[:, 0] for t in (s.cos, s.sin))
    return lambda q, k: rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)


def _flash_attn(s: Setup):
    _one_rotation_over_head(s, "flash-attn's rotary")
    apply_rotary_emb = _anchor(s, "flash-attn", "apply_rotary_emb", "flash_attn.layers.rotary")
    cos, sin = _half_table(s.cos, s.mode), _half_table(s.sin, s.mode)
    offsets = 0
    if cos.ndim == 4:  # decode: a [B, D/2] table used as a cache, batch b reads row b
        cos, sin = cos[:, 0, 0].contiguous(), sin[:, 0, 0].contiguous()
        offsets = torch.arange(cos.shape[0], device=cos.device, dtype=torch.int32)
    inter = s.mode == "interleave"

    def run(q, k):  # q, k: [B, S, N, D]
        f = lambda x: apply_rotary_emb(x, cos, sin, interleaved=inter, seqlen_offsets=offsets)  # noqa: E731
        return f(q).transpose(1, 2), f(k).transpose(1, 2)

    return run


def _flashinfer(s: Setup):
    _one_rotation_over_head(s, "flashinfer's rope")
    apply_rope_with_cos_sin_cache = _anchor(s, "flashinfer", "apply_rope_with_cos_sin_cache", "flashinfer.rope")
    # a cos|sin cache with one row per token (per batch for decode), indexed by token number
    cos, sin = _half_table(s.cos, s.mode), _half_table(s.sin, s.mode)
    cache = torch.cat([cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1])], -1).float()

    def run(q, k):  # q, k: [B, S, N, D]
        b, sq, n, d = q.shape
        pos = torch.arange(cache.shape[0], device=q.device).repeat(b * sq // cache.shape[0])
        qo, ko = apply_rope_with_cos_sin_cache(pos, q.reshape(b * sq, -1), k.reshape(b * sq, -1), d,
                                               cache, is_neox=s.mode == "half")
        return qo.view(b, sq, n, d).transpose(1, 2), ko.view(b, sq, -1, d).transpose(1, 2)

    return run


def _transformer_engine(s: Setup):
    _one_rotation_over_head(s, "TransformerEngine's fused rope")
    if s.angles.ndim == 4:
        raise Unsupported("TransformerEngine's rope takes one angle row per position, not per batch")
    apply_rotary_pos_emb = _anchor(s, "transformer-engine", "apply_rotary_pos_emb",
                                   "transformer_engine.pytorch.attention.rope", "transformer_engine.pytorch.attention")
    freqs = s.angles.float()[:, None, None, :]  # [S, 1, 1, D], laid out as our tables
    inter = s.mode == "interleave"

    def run(q, k):  # q, k: [B, S, N, D]
        f = lambda x: apply_rotary_pos_emb(x, freqs, tensor_format="bshd", interleaved=inter, fused=True)  # noqa: E731
        return f(q).transpose(1, 2), f(k).transpose(1, 2)

    return run


# --- the models' own RoPE functions (what users run today) ------------------------------------


def _library(package: str, module: str, attr: str):
    """``module.attr`` of an installed model library (any device), else Unavailable."""
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise Unavailable(f"{package} not installed ({e})") from None


def _one_table(s: Setup, who: str):
    if s.cos.ndim != 2:
        raise Unsupported(f"{who} takes one [S, D] table shared by the batch, not one row per sequence (decode)")


def _diffusers_apply_rotary_emb(s: Setup):
    """diffusers.models.embeddings.apply_rotary_emb(x, (cos, sin), use_real=True): x [B, N, S, D],
    tables [S, D] as rome's; ``use_real_unbind_dim=-1`` pairs (x0, x1) (Flux, CogVideoX,
    HunyuanVideo), ``-2`` the halves of the whole head (Cosmos, CogView4). fp32 math, x's dtype out."""
    _one_rotation_over_head(s, "diffusers' apply_rotary_emb")
    _one_table(s, "diffusers' apply_rotary_emb")
    f = _library("diffusers", "diffusers.models.embeddings", "apply_rotary_emb")
    tables, unbind = (s.cos, s.sin), (-1 if s.mode == "interleave" else -2)
    return _pair(lambda x: f(x, tables, use_real=True, use_real_unbind_dim=unbind))


def wan_rotary():
    """diffusers' Wan RoPE: the function nested in ``WanAttnProcessor.__call__`` (not importable),
    rebuilt from its code object with the Wan module's globals, so it is the library's own code.
    ``f(x, cos, sin)``: x [B, S, N, D], tables [1, S, 1, D] (interleave layout); Unavailable
    where diffusers or that nested function is missing."""
    import types

    wan = _library("diffusers", "diffusers.models.transformers", "transformer_wan")
    code = getattr(getattr(wan, "WanAttnProcessor", None), "__call__", None)
    consts = getattr(getattr(code, "__code__", None), "co_consts", ())
    found = [c for c in consts if getattr(c, "co_name", None) == "apply_rotary_emb" and not c.co_freevars]
    if len(found) != 1:
        raise Unavailable("this diffusers' WanAttnProcessor.__call__ has no nested apply_rotary_emb")
    return types.FunctionType(found[0], vars(wan), "apply_rotary_emb")


def _diffusers_wan(s: Setup):
    if s.mode != "interleave":
        raise Unsupported("Wan's rotary rotates pairs (x0, x1): interleave only")
    f = wan_rotary()
    cos, sin = ((t[None, :, None] if t.ndim == 2 else t) for t in (s.cos, s.sin))  # [1, S, 1, D] / [B, 1, 1, D]

    def run(q, k):  # q, k: [B, S, N, D]
        return f(q, cos, sin).transpose(1, 2), f(k, cos, sin).transpose(1, 2)

    return run


def _transformers_apply_rotary_pos_emb(s: Setup):
    """transformers' Llama ``apply_rotary_pos_emb(q, k, cos, sin)``: rotate_half of the whole
    head, tables [B|1, S, D] unsqueezed at dim 1, cast to q's dtype as ``LlamaRotaryEmbedding``
    returns them (so q's-dtype math; fp32 tables are rounded to q's dtype first)."""
    if s.mode != "half" or len(s.sections) > 1:
        raise Unsupported("transformers' apply_rotary_pos_emb rotates the halves of the whole head: 1D half only")
    f = _library("transformers", "transformers.models.llama.modeling_llama", "apply_rotary_pos_emb")
    dtype = s.matrix.dtype  # q's
    cos, sin = ((t[None] if t.ndim == 2 else t[:, 0]).to(dtype) for t in (s.cos, s.sin))  # [1|B, S, D]
    return lambda q, k: f(q, k, cos, sin)


# --- seed v4: a fused 1D RoPE kernel per section, outputs concatenated -----------------------


# --- q/k norm then RoPE (the *-qknorm workloads) ---------------------------------------------


def _norm_spec(s: Setup):
    w = s.workload
    if w.qk_norm is None:
        raise Unsupported("the workload has no q/k norm (the *-qknorm workloads have one)")
    qw, kw = norm_weights(w, s.cos.device)
    return qw, kw, w.qk_norm, w.norm_eps


def _eager_rms(x, w, over: str, eps: float):
    """The models' eager RMSNorm (Qwen3, Flux, Wan): statistics in fp32, the weight applied, the
    result in x's dtype."""
    xf = x.float()
    dims = (-1,) if over == "head" else (1, -1)
    y = xf * torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
    return (y * (w if over == "head" else w.view(x.shape[1], 1, x.shape[-1]))).to(x.dtype)


def _norm_chain(q, k, qw, kw, over, eps, cos, sin, sections, mode):
    return _v1_pair(_eager_rms(q, qw, over, eps), _eager_rms(k, kw, over, eps), cos, sin, sections, mode)


def _rome_qk_norm(s: Setup):
    qw, kw, over, eps = _norm_spec(s)
    return lambda q, k: rome.apply_qk_norm(q, k, s.cos, s.sin, s.matrix, qw, kw, eps=eps, over=over,
                                           backend=s.backend)


def _norm_then_rome(s: Setup):
    qw, kw, over, eps = _norm_spec(s)
    return lambda q, k: rome.apply_qk(_eager_rms(q, qw, over, eps), _eager_rms(k, kw, over, eps), s.cos, s.sin,
                                      s.matrix, backend=s.backend)


def _norm_eager_chain(s: Setup):
    qw, kw, over, eps = _norm_spec(s)
    return lambda q, k: _norm_chain(q, k, qw, kw, over, eps, s.cos, s.sin, s.sections, s.mode)


def _norm_compiled_chain(s: Setup):
    qw, kw, over, eps = _norm_spec(s)
    f = _compiled_per_setup(_norm_chain)
    return lambda q, k: f(q, k, qw, kw, over, eps, s.cos, s.sin, s.sections, s.mode)


def section_setups(s: Setup) -> list[tuple[slice, Setup]]:
    """seed v4's split: ``(columns, one-section Setup)`` per section for half mode; for interleave
    one for the whole head (pairs never cross a section, so multi-axis interleave RoPE is 1D
    interleave RoPE of the whole head with the concatenated tables, as the seed's v4 calls it).
    Each Setup has that section's contiguous tables and its own rotation matrix."""
    sizes = (s.workload.head_dim,) if s.mode == "interleave" else s.sections
    parts, start = [], 0
    for d in sizes:
        cols = slice(start, start + d)
        cos, sin, angles = (t[..., cols].contiguous() for t in (s.cos, s.sin, s.angles))
        matrix = rome.rotation_matrix(d, s.mode, dtype=s.matrix.dtype, device=s.matrix.device)
        parts.append((cols, Setup(s.workload.replace(sections=(d,)), s.mode, cos, sin, angles, matrix, s.backend,
                                  s.positions)))
        start += d
    return parts


def per_section(build: Callable[[Setup], Callable]) -> Callable[[Setup], Callable]:
    """seed v4 from a one-section variant ``build``: each section's slice of q and k is copied
    contiguous (as the seed does, and timed), rotated by ``build``'s run, and the BNSD outputs are
    concatenated along head_dim. Works in whatever layout ``build``'s variant prepares."""

    def build_v4(s: Setup):
        parts = [(cols, build(sub)) for cols, sub in section_setups(s)]
        if len(parts) == 1:
            return parts[0][1]

        def run(q, k):
            outs = [f(q[..., cols].contiguous(), k[..., cols].contiguous()) for cols, f in parts]
            return torch.cat([o[0] for o in outs], -1), torch.cat([o[1] for o in outs], -1)

        return run

    return build_v4


VARIANTS = {
    v.name: v
    for v in [
        Variant("v1 slice+concat", "seed v1: split per section, rotate_half / rotate_every_two, concat", "reference", _v1),
        Variant("v1 torch.compile", "seed v1 under torch.compile (a user compiling the model's own RoPE code)", "compiled", _v1_compiled),
        Variant("v2 per-section matrix", "seed v2: one matrix per section, then concat", "reference", _v2),
        Variant("v3 merged matrix", "seed v3: x*cos + (x@M)*sin with one matrix, eager torch", "reference", _v3),
        Variant("v3 torch.compile", "seed v3 under torch.compile (what a user would do instead)", "compiled", _v3_compiled),
        Variant("rome.apply", "seed v5 (its fused op, rope_matrix, once per tensor): rome.apply on q, then on k", "rome", _rome_apply),
        Variant("rome.apply_qk", "rome.apply_qk: q and k in one launch (x @ M as the signed column gather)", "rome", _rome_apply_qk),
        Variant("rome.apply_qk (native)", "rome.apply_qk with rounding=\"native\": bit for bit the eager chain it replaces (each op rounded to q's dtype)", "rome", _rome_apply_qk_native),
        Variant("rome.apply_qk (dot)", "rome.apply_qk with x @ M on the tensor cores: the seed's matmul formulation, same bits", "rome", _rome_apply_qk_dot),
        Variant("rome.apply_qk (partner form)", "rome.apply_qk with the whole head's half rotation (or sections' pairs) read as x and x[:, src] a head, not as its two halves: same bits", "rome", _rome_apply_qk_partner),
        Variant("rome.apply_qk_at", "rome.apply_qk_at: positions into a cos/sin cache, rows gathered in the kernel", "rome", _rome_apply_qk_at),
        Variant("rome.apply_qk_angles", "rome.apply_qk_angles: cos/sin computed in the kernel from positions (no cache)", "rome", _rome_apply_qk_angles),
        Variant("rome.RoPE", "rome.RoPE module with positions (varlen: cu_seqlens; decode: [B, 1]), host check included", "rome", _rome_module),
        Variant("rome.apply_qk_norm", "rome.apply_qk_norm: the q/k RMSNorm as the gather kernel's prologue, one launch "
                "(qk_norm workloads)", "rome", _rome_qk_norm, normed=True),
        Variant("q/k norm, then rome.apply_qk", "the model's eager RMSNorm of q and k, then rome.apply_qk: the unfused pair",
                "reference", _norm_then_rome, normed=True),
        Variant("q/k norm + v1 chain", "the model's eager RMSNorm of q and k, then the v1 slice+concat chain",
                "model", _norm_eager_chain, normed=True),
        Variant("q/k norm + v1 torch.compile", "the eager norm + v1 chain under torch.compile", "compiled",
                _norm_compiled_chain, normed=True),
        Variant("diffusers apply_rotary_emb", "diffusers.models.embeddings.apply_rotary_emb (Flux, CogVideoX, HunyuanVideo), on q then k", "model", _diffusers_apply_rotary_emb),
        Variant("diffusers Wan rotary", "diffusers' Wan RoPE (nested in WanAttnProcessor.__call__), on q then k, BSND", "model", _diffusers_wan, "bsnd"),
        Variant("transformers apply_rotary_pos_emb", "transformers' Llama apply_rotary_pos_emb (rotate_half), tables in q's dtype", "model", _transformers_apply_rotary_pos_emb),
        Variant("liger-kernel", "liger_kernel.transformers.rope.liger_rotary_pos_emb (in place)", "anchor", _liger, "bsnd"),
        Variant("flash-attn", "flash_attn.layers.rotary.apply_rotary_emb on q and k", "anchor", _flash_attn, "bsnd"),
        Variant("flashinfer", "flashinfer.rope.apply_rope_with_cos_sin_cache (inference only)", "anchor", _flashinfer, "bsnd", False),
        Variant("transformer-engine", "transformer_engine apply_rotary_pos_emb(fused=True, bshd)", "anchor", _transformer_engine, "bsnd"),
        Variant("v4 liger per section", "seed v4: liger-kernel's rope on each section, concatenated", "anchor", per_section(_liger), "bsnd"),
        Variant("v4 flash-attn per section", "seed v4: flash-attn's rotary on each section (interleave: one call), concatenated", "anchor", per_section(_flash_attn), "bsnd"),
        Variant("v4 flashinfer per section", "seed v4: flashinfer's rope on each section (interleave: one call), concatenated", "anchor", per_section(_flashinfer), "bsnd", False),
        Variant("v4 transformer-engine per section", "seed v4: TransformerEngine's fused rope on each section (interleave: one call), concatenated", "anchor", per_section(_transformer_engine), "bsnd"),
    ]
}
