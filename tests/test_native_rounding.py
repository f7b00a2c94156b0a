"""``rounding="native"`` (issue 31): rome's result bit for bit what the eager chain it replaces
computes, ``x*cos + rotate(x)*sin`` in x's dtype with the tables cast to it (each product and the
sum rounded to x's dtype, as PyTorch's eager ops do: float32 arithmetic for half dtypes, no fma).

The references are those chains, written here in plain torch (rotate_half, GPT-J pairs, partial
rotary, vLLM's ``forward_native``, flash-attn's ``apply_rotary_emb_torch``, transformers'
``apply_rotary_pos_emb``), compared with ``torch.equal``. The torch backend is checked in bf16,
fp16, fp32 and fp64; the Triton kernel under the interpreter in fp16 and fp32 (the interpreter's
fp32 -> fp16 cast rounds to nearest even, checked below) and in bf16 through the kernel's raw-bits
path, which rounds by hand (the interpreter's own bf16 cast truncates, triton#11584); on a GPU
every test here runs on CUDA (DEVICE) and tests/test_gpu.py adds the kernel's own bf16 cast.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import rome
from rome import ops, torch_backend
from rome.matrices import rotation_matrix
from conftest import DEVICE, optional

HALF = (torch.bfloat16, torch.float16)
TORCH_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
KERNEL_DTYPES = (torch.float16, torch.float32, torch.bfloat16)


# --- the eager chains ----------------------------------------------------------------------------


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def rotate_pairs(x):
    return torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)


def chain(x, cos, sin, mode="half", rotary_dim=None):
    """``x*cos + rotate(x)*sin`` in x's dtype, tables cast to it; the first ``rotary_dim``
    columns rotate (tables of that width), the rest pass through (concatenated, as transformers'
    partial rotary)."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    rot, rest = x[..., :r], x[..., r:]
    turn = rotate_half if mode == "half" else rotate_pairs
    return torch.cat([rot * cos + turn(rot) * sin, rest], -1)


def _tables(s, d, dtype=torch.float32):
    """Real RoPE tables [S, D] (positions up to ~1000, so the angles wrap)."""
    return rome.rope_cos_sin(torch.arange(s, device=DEVICE)[:, None] * 37 % 997, (d,), mode="half",
                             dtype=dtype, device=DEVICE)


def _x(*shape, dtype):
    return (torch.randn(*shape, device=DEVICE) * 4).to(dtype)


def _matrix(d, mode, dtype, rotary_dim=None):
    r = d if rotary_dim is None else rotary_dim
    m = torch.zeros(d, d, dtype=dtype, device=DEVICE)
    m[:r, :r] = rotation_matrix([r], mode, dtype=dtype, device=DEVICE)
    return m


def _padded(cos, sin, d):
    """Tables of the first r columns padded to d with pass-through values (cos 1, sin 0)."""
    pad = (*cos.shape[:-1], d - cos.shape[-1])
    return torch.cat([cos, cos.new_ones(pad)], -1), torch.cat([sin, sin.new_zeros(pad)], -1)


# --- the op on both backends -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_torch_backend_is_the_eager_chain(dtype, mode):
    x = _x(2, 3, 40, 32, dtype=dtype)
    cos, sin = _tables(40, 32)
    out = rome.apply(x, cos, sin, mode=mode, backend="torch", rounding="native")
    assert torch.equal(out, chain(x, cos, sin, mode))
    if dtype != torch.float64:  # (float64: one rounding of exact products, the same bits)
        assert not torch.equal(out, rome.apply(x, cos, sin, mode=mode, backend="torch"))


@pytest.mark.parametrize("product", ["gather", "dot"])
@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_kernel_is_the_eager_chain(dtype, mode, product):
    """The Triton kernel (interpreted on a CPU): q and k of different head counts in one launch,
    a BSND view, tables in float32 and in x's dtype; the gather and the dot (``x @ M`` on the
    tensor cores, exact) end in the same epilogue."""
    from rome import launch

    q = _x(2, 40, 4, 32, dtype=dtype).transpose(1, 2)
    k = _x(2, 2, 40, 32, dtype=dtype)
    for cos, sin in (_tables(40, 32), tuple(t.to(dtype) for t in _tables(40, 32))):
        with launch.product(product):
            qo, ko = rome.apply_qk(q, k, cos, sin, mode=mode, backend="triton", rounding="native")
        assert torch.equal(qo, chain(q, cos, sin, mode)) and torch.equal(ko, chain(k, cos, sin, mode))
        tq, tk = rome.apply_qk(q, k, cos, sin, mode=mode, backend="torch", rounding="native")
        assert torch.equal(qo, tq) and torch.equal(ko, tk)


@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_row_tile_dot_kernel_native(dtype):
    """D > 128 under ``product("dot")``: the row-tile kernel (``_rome_kernel``) and its
    transposed launch (sin gathered at src) end in the same NATIVE epilogue."""
    from rome import launch

    x = _x(1, 2, 6, 160, dtype=dtype).requires_grad_()
    cos, sin = _tables(6, 160)
    g = _x(1, 2, 6, 160, dtype=dtype)
    with launch.product("dot"):
        out = rome.apply(x, cos, sin, mode="half", backend="triton", rounding="native")
        (dx,) = torch.autograd.grad(out, x, g)
    ref = x.detach().requires_grad_()
    want = chain(ref, cos, sin)
    (dref,) = torch.autograd.grad(want, ref, g)
    assert torch.equal(out, want) and torch.equal(dx, dref)


def test_interpreter_fp16_cast_rounds_to_nearest_even():
    """What the fp16 interpreter tests rest on: Triton's interpreter rounds fp32 -> fp16 as a GPU
    does (its bf16 cast does not; the kernel rounds bf16 by hand there)."""
    if DEVICE != "cpu":
        pytest.skip("the interpreter runs on the CPU only")
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x_ptr, y_ptr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(y_ptr + i, tl.load(x_ptr + i).to(tl.float16))

    # 8192 values: random magnitudes from fp16's subnormals to its overflow, and exact ties
    # (an fp16 value plus half its last place) that round to even
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(4096, generator=gen) * torch.exp2(torch.randint(-26, 16, (4096,), generator=gen).float())
    h = (torch.randn(4092, generator=gen) * 8).half().float()
    ties = h + torch.sign(h) * torch.exp2(torch.floor(torch.log2(h.abs())) - 11)
    x = torch.cat([base, ties, torch.tensor([65504.0, 65519.0, 2**-25, 3 * 2**-26])])
    y = torch.empty(8192, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # (numpy's overflow warning for inf)
        cast[(1,)](x, y, N=8192)
    assert torch.equal(y, x.half())


_SASS = """
import collections, json, re, sys, torch
from rome import launcher
from profiling.static import nvidia
from profiling.static.compile import compile_kernel
out = {}
for name in sys.argv[1:]:
    dtype, transpose = getattr(torch, name.split("-")[0]), name.endswith("bwd")
    kc = launcher._gather_configs(dtype, 128, transpose, torch.float32, 0, False, partner=True)[0]  # (native: no HALVES)
    k = compile_kernel(kc.fn, kc.signature, dict(kc.constexprs, NATIVE=True), kc.divisible_by_16,
                       cc=90, num_warps=kc.num_warps, num_stages=kc.num_stages, **kc.options)
    ops = collections.Counter(i.opcode.split(".")[0] for i in nvidia.parse_sass(nvidia.run_cuobjdump("-sass", k.asm["cubin"])))
    out[name] = dict(ops=ops, fma_ptx=len(re.findall(r"\\bfma\\.", k.asm["ptx"])), usage=nvidia.res_usage(k.asm["cubin"]))
print(json.dumps(out))
"""


def test_native_kernel_on_sm90_has_no_fma():
    """The GPU code of the NATIVE epilogue, compiled for sm_90 without a GPU (a process without
    the interpreter): no fma anywhere in fp32 (FMUL and FADD: the launch turns fp fusion off) nor
    in bf16, where LLVM narrows the float32 ops and their rounding to bf16 ``mul.rn``/``add.rn``
    (the same bits: float32 has 2p + 2 bits of a bf16/fp16 significand, so the double rounding
    is innocuous; ``.rn`` ops are never fused); no spill."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _SASS, "float32-fwd", "float32-bwd", "bfloat16-fwd"], env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    for name, r in got.items():
        assert r["ops"].get("FFMA", 0) == 0 and r["fma_ptx"] == 0, (name, r)
        assert r["usage"]["local"] == 0 and r["usage"]["stack"] == 0, (name, r)
    assert got["float32-fwd"]["ops"]["FMUL"] > 0 and got["float32-fwd"]["ops"]["FADD"] > 0


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_partial_rotary_and_sections(dtype, backend):
    """Partial rotary (a zero block: pass-through columns come back as they are) and 3D
    sections (a permutation whose pairs land anywhere: the kernel's one-load-per-element class)."""
    x = _x(1, 2, 24, 32, dtype=dtype)
    cos, sin = _tables(24, 16)
    c, s = _padded(cos, sin, 32)
    out = rome.apply(x, c, s, _matrix(32, "half", dtype, 16), backend=backend, rounding="native")
    assert torch.equal(out, chain(x, cos, sin, "half", rotary_dim=16))
    sections = (8, 12, 12)
    m = rotation_matrix(sections, "half", dtype=dtype, device=DEVICE)
    cos3, sin3 = rome.rope_cos_sin(torch.arange(72, device=DEVICE).reshape(24, 3) * 5, sections, mode="half",
                                   device=DEVICE)
    parts, start = [], 0
    for w in sections:  # rotate_half within each section
        sl = slice(start, start + w)
        parts.append(chain(x[..., sl], cos3[..., sl], sin3[..., sl], "half"))
        start += w
    assert torch.equal(rome.apply(x, cos3, sin3, m, backend=backend, rounding="native"), torch.cat(parts, -1))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", KERNEL_DTYPES, ids=str)
def test_backward_is_the_eager_backward(dtype, backend):
    """dx: the eager chain's autograd, ``grad*cos`` and ``rotate(x)``'s share ``grad*sin`` each
    rounded to x's dtype, moved back by Mᵀ, summed and rounded (the transposed op's native
    epilogue); double backward runs the forward's. Table grads are rome's exact ones."""
    q = _x(1, 4, 20, 16, dtype=dtype).requires_grad_()
    k = _x(1, 2, 20, 16, dtype=dtype).requires_grad_()
    cos, sin = (t.to(dtype) for t in _tables(20, 16))
    gq, gk = _x(1, 4, 20, 16, dtype=dtype), _x(1, 2, 20, 16, dtype=dtype)
    for mode in ("half", "interleave"):
        qo, ko = rome.apply_qk(q, k, cos, sin, mode=mode, backend=backend, rounding="native")
        dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
        q2, k2 = q.detach().requires_grad_(), k.detach().requires_grad_()
        rq, rk = chain(q2, cos, sin, mode), chain(k2, cos, sin, mode)
        eq, ek = torch.autograd.grad((rq, rk), (q2, k2), (gq, gk))
        assert torch.equal(dq, eq) and torch.equal(dk, ek)


def test_forward_mode_and_vmap():
    """torch.func: jvp's tangent in x is the native op of the tangent; vmap batches it."""
    x, t = _x(3, 10, 16, dtype=torch.bfloat16), _x(3, 10, 16, dtype=torch.bfloat16)
    cos, sin = _tables(10, 16)
    fn = lambda v: rome.apply(v, cos, sin, mode="half", backend="torch", rounding="native")  # noqa: E731
    out, tangent = torch.func.jvp(fn, (x,), (t,))
    assert torch.equal(out, chain(x, cos, sin)) and torch.equal(tangent, chain(t, cos, sin))
    assert torch.equal(torch.vmap(fn)(x), chain(x, cos, sin))


def test_compile_fullgraph_keeps_native():
    """torch.compile traces the op with its rounding argument: forward and backward bitwise the
    eager chain's."""
    x = _x(2, 10, 16, dtype=torch.float16).requires_grad_()
    cos, sin = _tables(10, 16)
    fn = torch.compile(lambda v: rome.apply(v, cos, sin, mode="interleave", backend="torch", rounding="native"),
                       fullgraph=True, backend="aot_eager")
    out = fn(x)
    g = _x(2, 10, 16, dtype=torch.float16)
    (dx,) = torch.autograd.grad(out, x, g)
    ref = x.detach().requires_grad_()
    want = chain(ref, cos, sin, "interleave")
    (dref,) = torch.autograd.grad(want, ref, g)
    assert torch.equal(out, want) and torch.equal(dx, dref)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_positions_and_in_place_forms(dtype, backend):
    """apply_at / apply_qk_at read the caches' rows (the chain's tables gathered); apply_,
    apply_qk_ and apply_out are bitwise apply's; a repeated call (the lean path) too."""
    cos, sin = _tables(64, 16)
    pos = torch.randint(0, 64, (2, 1, 12, 1), device=DEVICE)
    q, k = _x(2, 4, 12, 16, dtype=dtype), _x(2, 2, 12, 16, dtype=dtype)
    m = rotation_matrix([16], "half", dtype=dtype, device=DEVICE)
    rows_c, rows_s = cos[pos[..., 0]], sin[pos[..., 0]]
    for _ in range(2):
        qo, ko = rome.apply_qk_at(q, k, cos, sin, m, pos, backend=backend, rounding="native")
        assert torch.equal(qo, chain(q, rows_c, rows_s)) and torch.equal(ko, chain(k, rows_c, rows_s))
        xo = rome.apply_at(q, cos, sin, m, pos, backend=backend, rounding="native")
        assert torch.equal(xo, qo)
    c, s = rows_c[:, 0], rows_s[:, 0]
    want = rome.apply(q, c[:, None], s[:, None], m, backend=backend, rounding="native")
    a, b = q.clone(), k.clone()
    rome.apply_qk_(a, b, c[:, None], s[:, None], m, backend=backend, rounding="native")
    assert torch.equal(a, want) and torch.equal(b, chain(k, c[:, None], s[:, None]))
    a = q.clone()
    assert torch.equal(rome.apply_(a, c[:, None], s[:, None], m, backend=backend, rounding="native"), want)
    out = torch.empty_like(q)
    rome.apply_out(q, c[:, None], s[:, None], m, out=out, backend=backend, rounding="native")
    assert torch.equal(out, want)


def test_angles_form_rounds_its_tables_to_x():
    """apply_qk_angles (torch backend: float64 angles): the computed tables rounded to q's dtype,
    then the chain."""
    from rome.positions import angle_frequencies, angle_rows

    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    inv = torch.cat([inv, inv])
    freqs = [t.to(DEVICE) for t in angle_frequencies(inv, 1.0)]
    pos = torch.randint(0, 500, (1, 1, 10, 1), device=DEVICE)
    q, k = _x(1, 2, 10, 16, dtype=torch.bfloat16), _x(1, 1, 10, 16, dtype=torch.bfloat16)
    m = rotation_matrix([16], "half", dtype=torch.bfloat16, device=DEVICE)
    qo, ko = rome.apply_qk_angles(q, k, *freqs, m, pos, backend="torch", rounding="native")
    c, s = angle_rows(*freqs, pos, None)
    assert torch.equal(qo, chain(q, c, s)) and torch.equal(ko, chain(k, c, s))


def test_rope_module_option():
    layout = rome.rope_layout(rome.rope_frequencies(16))
    rope = rome.RoPE(layout, rounding="native", backend="torch")
    assert "rounding='native'" in repr(rope)
    q, k = _x(1, 2, 9, 16, dtype=torch.bfloat16), _x(1, 1, 9, 16, dtype=torch.bfloat16)
    cos, sin = rome.cos_sin_cache(layout, 9, device=DEVICE)
    for _ in range(2):  # the full path, then the remembered one
        qo, ko = rope(q, k)
        assert torch.equal(qo, chain(q, cos, sin)) and torch.equal(ko, chain(k, cos, sin))


# --- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["fast", "Native", None, 1])
def test_bad_rounding_names_argument_and_value(bad):
    x, m = _x(2, 8, dtype=torch.float32), rotation_matrix([8], "half", device=DEVICE)
    cos = sin = torch.ones(2, 8, device=DEVICE)
    pos = torch.zeros(2, 1, dtype=torch.int64, device=DEVICE)
    msg = rf"rounding must be one of \('exact', 'native'\), got {bad!r}"
    for call in (lambda: rome.apply(x, cos, sin, m, rounding=bad),
                 lambda: rome.apply_qk(x, x, cos, sin, m, rounding=bad),
                 lambda: rome.apply_at(x, cos, sin, m, pos, rounding=bad),
                 lambda: rome.apply_(x.clone(), cos, sin, m, rounding=bad),
                 lambda: rome.RoPE(rome.rope_layout(rome.rope_frequencies(8)), rounding=bad)):
        with pytest.raises(ValueError, match=msg):
            call()
    if isinstance(bad, str):  # (the raw op's schema takes a str: another type is torch's error)
        with pytest.raises(ValueError, match=msg):
            torch.ops.rome.apply(x, cos, sin, m, "auto", None, None, False, bad)


def test_native_needs_a_signed_permutation():
    x = _x(2, 8, dtype=torch.float32)
    cos = sin = torch.ones(2, 8, device=DEVICE)
    general = torch.randn(8, 8, device=DEVICE)
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match="rounding='native' needs a signed permutation matrix"):
            rome.apply(x, cos, sin, general, backend=backend, rounding="native")


# --- adapters --------------------------------------------------------------------------------------


def vllm_forward_native(positions, query, key, head_size, rotary_dim, cos_sin_cache, is_neox_style):
    """vLLM's ``RotaryEmbedding.forward_native`` as vLLM documents it: the cache cast to the
    query's dtype, the rows at the positions split into cos and sin, the first rotary_dim columns of
    each head rotated (``x1*cos - x2*sin``, ``x2*cos + x1*sin`` per op in that dtype), the rest
    passed through."""
    cache = cos_sin_cache.to(query.dtype)
    positions = positions.flatten()
    n = positions.shape[0]
    cos, sin = cache.index_select(0, positions).chunk(2, dim=-1)

    def rotate(x):
        shape = x.shape
        x = x.reshape(n, -1, head_size)
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        if is_neox_style:
            x1, x2 = torch.chunk(rot, 2, dim=-1)
        else:
            x1, x2 = rot[..., ::2], rot[..., 1::2]
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        rot = torch.cat((o1, o2), -1) if is_neox_style else torch.stack((o1, o2), -1).flatten(-2)
        return torch.cat((rot, rest), -1).reshape(shape)

    return rotate(query), None if key is None else rotate(key)


def vllm_cache(rotary_dim, max_position, base=10000.0):
    """vLLM's own ``_compute_cos_sin_cache``: float32 angles."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.einsum("i,j -> ij", torch.arange(max_position, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16])
def test_vllm_adapter_is_forward_native_bf16(rotary_dim, neox, backend):
    from rome.integrations import vllm

    head, tokens = 32, 23
    rope = vllm.RotaryEmbedding(head, rotary_dim, 512, 10000.0, neox, torch.float32, backend=backend,
                                rounding="native", device=DEVICE)
    positions = torch.randint(0, 512, (tokens,), device=DEVICE)
    query, key = _x(tokens, 4 * head, dtype=torch.bfloat16), _x(tokens, 2 * head, dtype=torch.bfloat16)
    for cache in (rope.cos_sin_cache, vllm_cache(rotary_dim, 512)):
        rope.cos_sin_cache = cache
        want_q, want_k = vllm_forward_native(positions, query, key, head, rotary_dim, cache, neox)
        for fwd in (rope.forward_native, rope.forward):
            q, k = fwd(positions, query, key)
            assert torch.equal(q, want_q) and torch.equal(k, want_k)
        q, none = rope.forward_native(positions, query)
        assert none is None and torch.equal(q, want_q)
        qi, ki = query.clone(), key.clone()
        rope.forward_cuda(positions, qi, ki)  # in place
        assert torch.equal(qi, want_q) and torch.equal(ki, want_k)
    exact = vllm.RotaryEmbedding(head, rotary_dim, 512, 10000.0, neox, torch.float32, backend=backend, device=DEVICE)
    exact.cos_sin_cache = rope.cos_sin_cache
    assert not torch.equal(exact(positions, query, key)[0], want_q)  # (exact: other bits)


def test_vllm_get_rope_and_mrope_native():
    from rome.integrations import vllm

    rope = vllm.get_rope(32, 256, True, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                         torch.float32, backend="torch", rounding="native")
    assert rope.rounding == "native" and vllm.get_rope(32, 256, True, None, torch.float32) is not rope
    positions = torch.randint(0, 256, (9,), device=DEVICE)
    query, key = _x(9, 64, dtype=torch.bfloat16), _x(9, 32, dtype=torch.bfloat16)
    cache = rope.cos_sin_cache.to(DEVICE)
    want = vllm_forward_native(positions, query, key, 32, 32, cache, True)
    got = rope(positions, query, key)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # mRoPE: each pair reads the row of its section's axis (vLLM's per-section cos/sin)
    mrope = vllm.get_rope(32, 64, True, {"mrope_section": [4, 6, 6]}, torch.float32, backend="torch",
                          rounding="native")
    pos3 = torch.randint(0, 64, (3, 9), device=DEVICE)
    cache = mrope.cos_sin_cache.to(DEVICE)
    axis = rome.layouts.mrope_axes([4, 6, 6]).to(DEVICE)
    rows = cache[pos3]  # [3, T, 32]
    per_token = torch.gather(rows.view(3, 9, 2, 16), 0, axis.view(1, 1, 1, 16).expand(1, 9, 2, 16))[0]
    want = vllm_forward_native(torch.arange(9, device=DEVICE), query, key, 32, 32, per_token.reshape(9, 32), True)
    got = mrope(pos3, query, key)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_vllm_registered_op():
    """``torch.ops.rome.vllm_rotary_embedding``: vLLM's ``_C.rotary_embedding`` schema (positions,
    query, key or None, head_size, cos_sin_cache, is_neox), in place, returning None; with
    "native" vLLM's bits; opcheck and a fullgraph compile."""
    from torch.library import opcheck

    cache = vllm_cache(16, 64)
    pos = torch.randint(0, 64, (7,), device=DEVICE)
    q, k = _x(7, 4 * 32, dtype=torch.bfloat16), _x(7, 2 * 32, dtype=torch.bfloat16)
    want = vllm_forward_native(pos, q, k, 32, 16, cache, True)
    a, b = q.clone(), k.clone()
    assert torch.ops.rome.vllm_rotary_embedding(pos, a, b, 32, cache, True, "native") is None
    assert torch.equal(a, want[0]) and torch.equal(b, want[1])
    from rome.integrations import vllm

    a = q.clone()
    torch.ops.rome.vllm_rotary_embedding(pos, a, None, 32, cache, False)  # (vLLM's arguments only)
    assert torch.equal(a, vllm.rotary_embedding(pos, q, None, head_size=32, cos_sin_cache=cache,
                                                is_neox_style=False)[0])
    opcheck(torch.ops.rome.vllm_rotary_embedding.default, (pos, q.clone(), k.clone(), 32, cache, True, "native"))
    fn = torch.compile(lambda p, x, y: torch.ops.rome.vllm_rotary_embedding(p, x, y, 32, cache, True, "native"),
                       fullgraph=True, backend="aot_eager")
    a, b = q.clone(), k.clone()
    fn(pos, a, b)
    assert torch.equal(a, want[0]) and torch.equal(b, want[1])
    with pytest.raises(ValueError, match=r"rounding must be one of \('exact', 'native'\), got 'x'"):
        torch.ops.rome.vllm_rotary_embedding(pos, q.clone(), None, 32, cache, True, "x")


def test_flashinfer_cache_forms_native():
    from rome.integrations import flashinfer

    cache = vllm_cache(16, 128)
    positions = torch.randint(0, 128, (11,), device=DEVICE)
    query, key = _x(11, 64, dtype=torch.float16), _x(11, 32, dtype=torch.float16)
    want = vllm_forward_native(positions, query, key, 32, 16, cache, False)
    q, k = flashinfer.apply_rope_with_cos_sin_cache(positions, query, key, 32, cache, False, backend="torch",
                                                    rounding="native")
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])
    flashinfer.apply_rope_with_cos_sin_cache_inplace(positions, query, key, 32, cache, is_neox=False,
                                                     backend="torch", rounding="native")
    assert torch.equal(query, want[0]) and torch.equal(key, want[1])


def flash_attn_torch(x, cos, sin, interleaved=False):
    """flash-attn's ``apply_rotary_emb_torch``: x ``[B, S, H, D]``, cos/sin ``[S, ro/2]`` in x's
    dtype, repeated to ``ro`` columns (``(2 d)`` halves, ``(d 2)`` pairs), the rest passed through."""
    ro = cos.shape[-1] * 2
    rep = (lambda t: t.repeat_interleave(2, -1)) if interleaved else (lambda t: torch.cat([t, t], -1))
    c, s = rep(cos)[:, None], rep(sin)[:, None]
    turn = rotate_pairs if interleaved else rotate_half
    return torch.cat([x[..., :ro] * c + turn(x[..., :ro]) * s, x[..., ro:]], -1)


@pytest.mark.parametrize("interleaved", [False, True])
def test_flash_attn_adapter_native(interleaved):
    from rome.integrations import flash_attn

    x = _x(2, 12, 3, 32, dtype=torch.bfloat16)
    angles = torch.rand(12, 12, device=DEVICE) * 50
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()  # rotary_dim 24 of 32
    want = flash_attn_torch(x, cos, sin, interleaved)
    out = flash_attn.apply_rotary_emb(x, cos, sin, interleaved, backend="torch", rounding="native")
    assert torch.equal(out, want)
    leaf = x.clone().requires_grad_()
    got = flash_attn.apply_rotary_emb(leaf, cos, sin, interleaved, True, backend="torch", rounding="native")
    assert torch.equal(got.detach(), want)
    g = _x(2, 12, 3, 32, dtype=torch.bfloat16)
    got.backward(g)
    ref = x.clone().requires_grad_()
    flash_attn_torch(ref, cos, sin, interleaved).backward(g)
    assert torch.equal(leaf.grad, ref.grad)


def test_liger_adapter_native():
    from rome.integrations import liger

    q, k = _x(2, 4, 10, 16, dtype=torch.bfloat16), _x(2, 2, 10, 16, dtype=torch.bfloat16)
    angles = torch.rand(2, 10, 8, device=DEVICE) * 30
    cos, sin = torch.cat([angles.cos()] * 2, -1).bfloat16(), torch.cat([angles.sin()] * 2, -1).bfloat16()
    qo, ko = liger.liger_rotary_pos_emb(q, k, cos, sin, backend="torch", rounding="native")
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # transformers' apply_rotary_pos_emb
    assert torch.equal(qo, q * c + rotate_half(q) * s) and torch.equal(ko, k * c + rotate_half(k) * s)
    # the vision form: Qwen's apply_rotary_pos_emb_vision (float32 chain, cast back)
    qv, kv = _x(10, 2, 16, dtype=torch.bfloat16), _x(10, 2, 16, dtype=torch.bfloat16)
    cv, sv = cos[0].float(), sin[0].float()
    qo, ko = liger.liger_rotary_pos_emb_vision(qv, kv, cv, sv, backend="torch", rounding="native")

    def vision(x):
        c, s = cv.unsqueeze(-2), sv.unsqueeze(-2)
        return (x.float() * c + rotate_half(x.float()) * s).to(x.dtype)

    assert torch.equal(qo, vision(qv)) and torch.equal(ko, vision(kv))


def test_adapters_refuse_bad_rounding():
    from rome.integrations import flash_attn, flashinfer, liger, vllm

    x = _x(1, 4, 2, 8, dtype=torch.float32)
    t = torch.ones(4, 4, device=DEVICE)
    pos = torch.arange(4, device=DEVICE)
    msg = r"rounding must be one of \('exact', 'native'\), got 'eager'"
    for call in (lambda: flash_attn.apply_rotary_emb(x, t, t, rounding="eager"),
                 lambda: vllm.rotary_embedding(pos, x.reshape(4, -1), None, head_size=8,
                                               cos_sin_cache=torch.ones(8, 8, device=DEVICE), rounding="eager"),
                 lambda: vllm.RotaryEmbedding(8, 8, 16, rounding="eager"),
                 lambda: vllm.get_rope(8, 16, rounding="eager"),
                 lambda: flashinfer.apply_rope_pos_ids(x[0], x[0], pos, rounding="eager"),
                 lambda: liger.liger_rotary_pos_emb(x, x, t[None], t[None], rounding="eager")):
        with pytest.raises(ValueError, match=msg):
            call()


# --- model patches -----------------------------------------------------------------------------------

transformers, needs_transformers = optional("transformers")
diffusers, needs_diffusers = optional("diffusers")


def _calls(monkeypatch, module):
    from helpers import RomeCalls

    return RomeCalls(monkeypatch, module)


def _patched_equal(model, inputs, run, monkeypatch, module, *, backend="torch"):
    """The unpatched output, then patched with rounding="native": bitwise, rome called; undo."""
    from rome.integrations import patch

    ref = run(model, inputs)
    count = _calls(monkeypatch, module)
    with patch(model, backend=backend, rounding="native"):
        out = run(model, inputs)
    assert count.n > 0
    assert out.dtype == ref.dtype and torch.equal(out, ref)
    assert torch.equal(run(model, inputs), ref)
    return ref


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


@needs_transformers
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_transformers_llama_native_is_unpatched(dtype, monkeypatch):
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf
    from test_integrations_transformers import _llama
    from helpers import token_ids

    model = _llama().to(dtype)
    ids = {"input_ids": token_ids(2, 40)}
    ref = _patched_equal(model, ids, _logits, monkeypatch, rome_tf)
    rotary = model.model.rotary_emb
    with patch(model, backend="torch", rounding="native"):
        assert "forward" not in rotary.__dict__  # transformers' own tables
    if dtype != torch.float32:
        with patch(model, backend="torch"):  # (exact: rome's tables, one rounding: other bits)
            assert not torch.equal(_logits(model, ids), ref)


@needs_transformers
def test_transformers_llama_native_on_the_kernel(monkeypatch):
    from rome.integrations import transformers as rome_tf
    from test_integrations_transformers import _llama
    from helpers import token_ids

    _patched_equal(_llama().to(torch.float16), {"input_ids": token_ids(1, 12)}, _logits, monkeypatch, rome_tf,
                   backend="triton")


@needs_transformers
def test_transformers_gpt_neox_partial_native(monkeypatch):
    from rome.integrations import transformers as rome_tf
    from helpers import token_ids

    torch.manual_seed(0)
    cfg = transformers.GPTNeoXConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=2, vocab_size=97, max_position_embeddings=64,
                                     rotary_pct=0.25)
    model = transformers.GPTNeoXForCausalLM(cfg).eval().to(torch.bfloat16)
    assert model.gpt_neox.layers[0].attention.rotary_ndims == 8
    _patched_equal(model, {"input_ids": token_ids(2, 30)}, _logits, monkeypatch, rome_tf)


@needs_transformers
@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl"])
def test_transformers_qwen_vl_native_is_unpatched(kind, monkeypatch):
    """mRoPE text (transformers' recomposed tables, ops in bf16) and the vision tower
    (``apply_rotary_pos_emb_vision``: a float32 chain cast back): both found by the probe."""
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf
    from test_integrations_transformers import _qwen_vl

    model, inputs = _qwen_vl(kind)
    model = model.to(torch.bfloat16)
    inputs["pixel_values"] = inputs["pixel_values"].bfloat16()
    _patched_equal(model, inputs, _logits, monkeypatch, rome_tf)
    with patch(model, backend="torch", rounding="native"):
        rules = {type(m.forward.how[2]).__name__: m.forward.how[2].native
                 for m in model.modules() if "forward" in m.__dict__ and len(m.forward.how) == 3}
    assert rules == {"_RotateText": "x", "_RotateVision": "float"}


_TF_REFUSED = {"deepseek_v3": "de-interleaved", "glm4_moe_lite": "de-interleaved", "llama4": "complex numbers"}


@needs_transformers
@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral", "gemma2",
                                    "gemma3", "phi3", "deepseek_v3", "deepseek_v3_half", "llama4", "gpt_oss", "glm",
                                    "glm4", "glm4_moe", "glm4_moe_lite", "qwen3_5", "qwen3_5_moe"])
def test_transformers_families_native(family, monkeypatch):
    """docs/families.md's native column: every family bitwise its unpatched bf16 self (Gemma 3's
    per-layer-type tables, Phi-3's LongRoPE, GPT-OSS's half-width tables, GLM's pairs, Qwen3.5's
    partial mRoPE), or refused with the reason (MLA's de-interleaving, Llama 4's complex product)."""
    import test_integrations_transformers as first
    import test_integrations_transformers_families as fams
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf
    from helpers import token_ids

    if family in first.FAMILIES:
        cls, config = first.FAMILIES[family]
        model = first._llama(cls=cls, config=config)
    else:
        model = fams._build(family)
    model = model.to(torch.bfloat16)
    if family in _TF_REFUSED:
        with pytest.raises(ValueError, match=rf"rounding='native'\): .*{_TF_REFUSED[family]}"):
            patch(model, rounding="native")
        return
    _patched_equal(model, {"input_ids": token_ids()}, _logits, monkeypatch, rome_tf)


@needs_transformers
@pytest.mark.parametrize("kind", ["qwen3_vl", "qwen3_vl_moe"])
def test_transformers_qwen3_vl_native(kind, monkeypatch):
    import test_integrations_transformers_families as fams
    from rome.integrations import transformers as rome_tf

    model, inputs = fams._qwen3_vl(kind)
    model = model.to(torch.bfloat16)
    inputs = {k: (v.bfloat16() if v.is_floating_point() else v) for k, v in inputs.items()}
    _patched_equal(model, inputs, _logits, monkeypatch, rome_tf)


@needs_transformers
def test_transformers_native_rule_probe():
    """The probe names the rounding of a modeling function, and refuses one it cannot match."""
    from rome.integrations import transformers as rome_tf
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2_vl import modeling_qwen2_vl

    rope = rome.RoPE(rome.rope_layout(rome.rope_frequencies(16)))
    text, vision = rome_tf._RotateText(rope, "torch"), rome_tf._RotateVision(rope, "torch")
    assert rome_tf._native_rule(modeling_llama.apply_rotary_pos_emb, text, "text") == "x"
    assert rome_tf._native_rule(modeling_qwen2_vl.apply_rotary_pos_emb_vision, vision, "vision") == "float"

    def fp16_chain(q, k, cos, sin, unsqueeze_dim=1):  # each op in fp16, cast back: rounds as neither
        c, s = cos.unsqueeze(unsqueeze_dim).half(), sin.unsqueeze(unsqueeze_dim).half()
        return ((q.half() * c + rotate_half(q.half()) * s).to(q.dtype),
                (k.half() * c + rotate_half(k.half()) * s).to(k.dtype))

    assert rome_tf._native_rule(fp16_chain, text, "text") is None


@needs_transformers
def test_transformers_native_refuses_mla_interleave():
    from rome.integrations import patch

    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, vocab_size=97, max_position_embeddings=64,
        q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        n_routed_experts=2, num_experts_per_tok=1, first_k_dense_replace=1, rope_interleave=True)
    model = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with pytest.raises(ValueError, match=r"rounding='native'.*de-interleaved"):
        patch(model, rounding="native")
    patch(model).undo()  # (exact patches it)


def _diffusers_case(name):
    import test_integrations_diffusers as a
    import test_integrations_diffusers_families as b

    mod = a if name in a.CASES else b
    return mod


@needs_diffusers
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("name", ["wan", "hunyuan", "cogvideox", "flux", "ltx", "flux2", "chroma", "wanvace",
                                  "wananimate", "chronoedit", "skyreels", "hunyuan15", "hunyuanimage", "ltx2",
                                  "cosmos", "cogview4", "framepack", "consisid"])
def test_diffusers_native_is_unpatched(name, dtype, monkeypatch):
    """The model's own tables (HunyuanVideo's and LTX's float32-angle rotary modules kept) and
    each family's rounding: Wan's ops in x's dtype (bf16 after ``.to``: its tables are cast
    too), diffusers' apply_rotary_emb in float32."""
    from rome.integrations import diffusers as rd

    mod = _diffusers_case(name)
    model, inputs = mod.build(name)
    if dtype != torch.float32:
        model = model.to(dtype)
        if hasattr(mod, "_cast"):  # (each module's own input cast)
            inputs = {k: mod._cast(v, dtype) for k, v in inputs.items()}
        else:
            inputs = {k: mod._bf16(v) for k, v in inputs.items()}
    _patched_equal(model, inputs, mod.run, monkeypatch, rd)


@needs_diffusers
def test_diffusers_native_rotations_match_the_libraries_functions():
    """Where exact and native differ (bf16 q, float32 tables, many elements): ``_Rotate``'s
    "float" is diffusers' ``apply_rotary_emb`` bit for bit, "x" Wan's nested formula."""
    from diffusers.models.embeddings import apply_rotary_emb
    from rome.integrations import diffusers as rd

    angles = (torch.rand(64, 16, device=DEVICE) * 60).repeat_interleave(2, -1)
    cos, sin = angles.cos(), angles.sin()
    for dtype in (torch.float32, torch.bfloat16):
        q, k = _x(1, 64, 4, 32, dtype=dtype), _x(1, 64, 2, 32, dtype=dtype)
        qo, ko = rd._Rotate("torch", "float")(q, k, cos[:, None], sin[:, None])
        assert torch.equal(qo, apply_rotary_emb(q, (cos, sin), sequence_dim=1))
        assert torch.equal(ko, apply_rotary_emb(k, (cos, sin), sequence_dim=1))
    # (exact differs in fp32; in bf16 it differs only where float32's rounding lands on a bf16 tie)
    q32 = _x(1, 64, 4, 32, dtype=torch.float32)
    assert not torch.equal(rd._Rotate("torch")(q32, q32, cos[:, None], sin[:, None])[0],
                           apply_rotary_emb(q32, (cos, sin), sequence_dim=1))
    q, k = _x(1, 64, 4, 32, dtype=torch.bfloat16), _x(1, 64, 2, 32, dtype=torch.bfloat16)

    def wan(x, c, s):  # transformer_wan's nested apply_rotary_emb
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        c, s = c[..., 0::2], s[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * c - x2 * s
        out[..., 1::2] = x1 * s + x2 * c
        return out.type_as(x)

    for c, s in ((cos, sin), (cos.bfloat16(), sin.bfloat16())):
        qo, _ = rd._Rotate("torch", "x")(q, k, c[:, None], s[:, None])
        assert torch.equal(qo, wan(q, c[:, None], s[:, None]))


@needs_diffusers
@pytest.mark.parametrize("name", ["qwenimage", "zimage", "lumina2", "mochi", "hidream"])
def test_diffusers_native_refuses_other_rotations(name):
    mod = _diffusers_case(name)
    model, _ = mod.build(name)
    with pytest.raises(ValueError, match=r"rounding='native'\): its rotation .* is not one rounding='native' "
                                         r"reproduces; rounding='native' patches WanTransformer3DModel"):
        rome.integrations.patch(model, rounding="native")
    rome.integrations.patch(model).undo()


@needs_diffusers
def test_diffusers_native_refuses_rebound_families():
    """The rebound processors' rotary functions (rome/integrations/_diffusers_rope.py) round
    exactly only: those families are refused with rounding="native", saying so."""
    mod = _diffusers_case("allegro")
    model, _ = mod.build("allegro")
    with pytest.raises(ValueError, match=r"rounding='native'\): its processor is rebound to rome's rotary "
                                         r"functions .* which round exactly only"):
        rome.integrations.patch(model, rounding="native")
    rome.integrations.patch(model).undo()


# --- no q/k norm fused with native ------------------------------------------------------------------


@needs_transformers
@pytest.mark.parametrize("family", ["qwen3", "gemma3", "olmo2"])
def test_transformers_native_fuses_no_norm(family, monkeypatch):
    """Qwen3 and Gemma 3, whose q/k norms an exact patch fuses (rome.apply_qk_norm, the norm
    modules passing their input through), keep their norms with rounding="native": the norm
    modules run as the model runs them, no apply_qk_norm, one apply_qk per layer, bf16 logits
    bitwise the unpatched ones (norm weights away from 1). OLMo 2 (fused too with exact) is
    refused by the probe: its apply_rotary_pos_emb computes in the promoted dtype and casts back
    to q's, neither rule of ``_native_rule``."""
    import test_integrations_transformers_families as fams
    from helpers import RomeCalls, token_ids
    from rome.integrations import patch
    from rome.integrations import transformers as rome_tf

    cls_name, config_name, kw, _ = fams.NORMED[family]
    cls, config = getattr(transformers, cls_name, None), getattr(transformers, config_name, None)
    if cls is None or config is None:
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    torch.manual_seed(0)
    model = cls(config(**{**fams.TEXT, **kw})).eval()
    norms = [m for n, m in model.named_modules() if n.endswith(("q_norm", "k_norm"))]
    with torch.no_grad():
        for m in norms:
            m.weight.uniform_(-0.5, 1.5)
    model = model.to(torch.bfloat16)
    ids = token_ids(1, 8)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    with patch(model, backend="torch"):  # (exact: the norms are fused, so the check below means something)
        assert all("forward" in m.__dict__ for m in norms)
    if family == "olmo2":
        with pytest.raises(ValueError, match=r"rounding='native'\): olmo2's apply_rotary_pos_emb does not round"):
            patch(model, backend="torch", rounding="native")
        assert not any("forward" in m.__dict__ for m in norms)  # (nothing left patched)
        return
    handle = patch(model, backend="torch", rounding="native")
    count = RomeCalls(monkeypatch, rome_tf)
    try:
        assert not any("forward" in m.__dict__ for m in norms)
        with torch.no_grad():
            out = model(input_ids=ids).logits
        assert count.by == {"apply_qk": fams._rope_layers(model)}
        assert torch.equal(out, ref)
    finally:
        handle.undo()


@needs_diffusers
@pytest.mark.parametrize("name", ["wan", "flux", "hunyuan", "cogvideox", "ltx"])
def test_diffusers_native_fuses_no_norm(name, monkeypatch):
    """The processors that fuse the model's q/k norms into rome.apply_qk_norm with rounding="exact"
    (Wan and LTX-Video over a token's heads, Flux, HunyuanVideo, CogVideoX per head) run the
    model's own norms with rounding="native" (``_Rotate.normed`` declines): only apply_qk, bf16
    output bitwise the unpatched model's."""
    import test_integrations_diffusers as a
    from rome.integrations import diffusers as rd

    model, inputs = a.build(name, torch.bfloat16)
    ref = a.run(model, inputs)
    calls = a._spy_rome(monkeypatch)
    with rome.integrations.patch(model, backend="torch"):
        a.run(model, inputs)
    assert set(calls) == {"apply_qk_norm"}  # (exact fuses them)
    calls.clear()
    with rome.integrations.patch(model, backend="torch", rounding="native"):
        out = a.run(model, inputs)
    assert calls and set(calls) == {"apply_qk"}
    assert torch.equal(out, ref)
    assert rd._Rotate("torch", "float").normed(*(torch.zeros(1, 2, 2, 8),) * 2, *(torch.ones(2, 1, 8),) * 2,
                                               torch.nn.RMSNorm(8, eps=1e-6), torch.nn.RMSNorm(8, eps=1e-6)) is None


def test_rope_module_native_refuses_norm():
    """rome.RoPE(rounding="native") refuses norm= (the fused norm is not the model's rounding);
    apply_qk_norm takes no rounding at all; the launcher refuses native with the norm prologue."""
    layout = rome.rope_layout(rome.rope_frequencies(16))
    q, k = _x(1, 2, 9, 16, dtype=torch.bfloat16), _x(1, 1, 9, 16, dtype=torch.bfloat16)
    spec = rome.QKNorm(torch.ones(16), torch.ones(16))
    with pytest.raises(ValueError, match=r"norm= is rome's fused q/k norm.*rounding='native'"):
        rome.RoPE(layout, rounding="native", backend="torch")(q, k, norm=spec)
    rome.RoPE(layout, backend="torch")(q, k, norm=spec)  # (exact takes it)
    with pytest.raises(TypeError):
        rome.apply_qk_norm(q, k, *_tables(9, 16), rotation_matrix([16], "half", dtype=torch.bfloat16),
                           torch.ones(16), torch.ones(16), rounding="native")
    pytest.importorskip("triton")
    from rome import launcher

    if not launcher.INTERPRET and not torch.cuda.is_available():
        pytest.skip("the launcher needs CUDA or TRITON_INTERPRET=1")
    x = _x(1, 2, 9, 16, dtype=torch.float32)
    w = torch.ones(16, device=x.device)
    with pytest.raises(ValueError, match=r"rounding='native' does not take the norm prologue"):
        launcher.rotate([x], [torch.empty_like(x)], *_tables(9, 16), rotation_matrix([16], "half", device=x.device),
                        transpose=False, norm=("rms", 1e-6, [(w, None)]), native=True)


def test_patch_refuses_bad_rounding():
    with pytest.raises(ValueError, match=r"rounding must be one of \('exact', 'native'\), got 'bits'"):
        rome.integrations.patch(torch.nn.Linear(2, 2), rounding="bits")
