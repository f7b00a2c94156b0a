"""GPU-only: the seed's workload, offsets past 2**31 elements, real fp32 dots (TF32 would fail).

Skipped without CUDA (conftest); on a GPU machine every other test module runs on CUDA too.
"""

import pytest
import torch

import rome
from helpers import assert_rope_close, tables

pytestmark = pytest.mark.gpu
SEED_SHAPE = (1, 24, 28800, 128)


@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_seed_workload(mode):
    sections = (44, 44, 40)
    q = torch.randn(SEED_SHAPE, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(SEED_SHAPE, device="cuda", dtype=torch.bfloat16)
    pos = rome.grid_positions([20, 36, 40]).cuda()  # 28800 tokens of a t*h*w latent
    cos, sin = rome.rope_cos_sin(pos, sections, mode=mode, device="cuda")
    m = rome.rotation_matrix(sections, mode, dtype=torch.bfloat16, device="cuda")
    q_out, k_out = rome.apply_qk(q, k, cos, sin, m)
    for x, out in ((q, q_out), (k, k_out)):
        for h in (0, 11, 23):  # the float64 oracle per head keeps memory small
            assert_rope_close(out[:, h], x[:, h], cos, sin, sections, mode)


def test_fp32_uses_ieee_dots():
    """TF32 keeps 10 mantissa bits: fp32 x would be off by ~1e-3 relative, far past the bound."""
    sections, mode = (44, 44, 40), "half"
    x = torch.randn(4, 8, 333, 128, device="cuda")
    cos, sin = tables(sections, mode, 333)
    m = rome.rotation_matrix(sections, mode, device="cuda")
    assert_rope_close(rome.apply(x, cos, sin, m, backend="triton"), x, cos, sin, sections, mode)


def test_offsets_past_2_pow_31_elements():
    sections, mode = (64,), "half"
    rows = 2**31 // 64 + 4096  # 2**31 + 262144 elements, 4 GiB in bf16
    x = torch.randn(rows, 64, device="cuda", dtype=torch.bfloat16)
    cos, sin = tables(sections, mode, 1, device="cuda")
    m = rome.rotation_matrix(sections, mode, dtype=torch.bfloat16, device="cuda")
    out = rome.apply(x, cos, sin, m, backend="triton")
    for part in (slice(0, 4096), slice(rows - 8192, rows)):
        assert_rope_close(out[part], x[part], cos, sin, sections, mode)
    del out, x
    torch.cuda.empty_cache()


def test_large_strides_in_a_transposed_view():
    """Row strides past 2**31 elements: BSND storage read as BNSD."""
    sections, mode = (44, 44, 40), "half"
    b, s, n = 2, 2**31 // (4 * 128) + 64, 4  # batch stride s*n*128 = 2**31 + 2**15 elements
    x = torch.randn(b, s, n, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    cos, sin = tables(sections, mode, s, device="cuda")
    m = rome.rotation_matrix(sections, mode, dtype=torch.bfloat16, device="cuda")
    out = rome.apply(x, cos, sin, m)
    last = (slice(b - 1, b), slice(None), slice(s - 64, s))
    assert_rope_close(out[last], x[last], cos[s - 64 :], sin[s - 64 :], sections, mode)


def test_module_decode_step_in_a_cuda_graph():
    """rome.RoPE inside a captured CUDA graph (a serving engine's decode step): no host sync while
    capturing; replays with new positions written into the captured tensor match eager calls."""
    from rome.frequencies import rope_frequencies
    from rome.layouts import rope_layout

    rope = rome.RoPE(rope_layout(rope_frequencies(128, theta=500000.0)), backend="triton")
    rope.reserve(4096, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(8, 32, 1, 128, device="cuda", generator=g).bfloat16()
    k = torch.randn(8, 8, 1, 128, device="cuda", generator=g).bfloat16()
    pos = torch.randint(0, 4096, (8, 1), device="cuda", generator=g)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch's docs do
        rope(q, k, pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rope(q, k, pos)
    for step in range(3):
        pos.copy_(torch.randint(0, 4096, (8, 1), device="cuda", generator=g))
        graph.replay()
        want = rope(q, k, pos)
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1]), f"replay {step}"


def test_autotuning_with_tritons_benchmarker(monkeypatch):
    """The first launch of >= 4M elements times the candidates with Triton's own benchmarker,
    remembers one, and gives choose()'s bits; a captured graph of a new key is not tuned."""
    from rome import tuning

    tuning.reset()
    sections, mode = (44, 44, 40), "half"
    q = torch.randn(1, 32, 1024, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 8, 1024, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = tables(sections, mode, 1024)
    m = rome.rotation_matrix(sections, mode, device="cuda")
    with monkeypatch.context() as mp:
        mp.setenv(tuning.ENV, "0")
        want = rome.apply_qk(q, k, cos, sin, m, backend="triton")
    assert not tuning.chosen()
    got = rome.apply_qk(q, k, cos, sin, m, backend="triton")
    assert len(tuning.chosen()) == 1, tuning.chosen()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # in a capture a key not tuned yet (the transpose's) takes choose()'s config and stays untuned
    with monkeypatch.context() as mp:
        mp.setenv(tuning.ENV, "0")  # warm-up: the host work for Mᵀ, outside the capture
        want_t = torch.ops.rome.apply_qk_transposed(q, k, cos, sin, m, "triton")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_t = torch.ops.rome.apply_qk_transposed(q, k, cos, sin, m, "triton")
    graph.replay()
    torch.cuda.synchronize()
    assert len(tuning.chosen()) == 1
    assert torch.equal(out_t[0], want_t[0]) and torch.equal(out_t[1], want_t[1])
    tuning.reset()


def _eager(x, cos, sin, sections, mode):
    """The eager chain on CUDA in x's dtype, tables cast to it, section by section."""
    cos, sin, parts, start = cos.to(x.dtype), sin.to(x.dtype), [], 0
    for w in sections:
        sl = slice(start, start + w)
        v, c, s = x[..., sl], cos[..., sl], sin[..., sl]
        if mode == "half":
            rot = torch.cat([-v[..., w // 2:], v[..., : w // 2]], -1)
        else:
            rot = torch.stack([-v[..., 1::2], v[..., 0::2]], -1).flatten(-2)
        parts.append(v * c + rot * s)
        start += w
    return torch.cat(parts, -1)


@pytest.mark.parametrize("product", ["gather", "dot"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_native_rounding_is_the_cuda_eager_chain(dtype, product):
    """rounding="native" on the compiled kernel (its own bf16/fp16 casts, fp fusion off): bit for
    bit PyTorch's eager CUDA chain, forward and backward (autograd of the chain), for the pair
    classes (interleave's swapped pairs, half's kept pairs, sections of odd pairs) and the dot."""
    from rome import launch

    for sections, mode in (((128,), "interleave"), ((128,), "half"), ((44, 44, 40), "half"), ((16, 56, 56), "half")):
        q = torch.randn(2, 8, 1024, 128, device="cuda").mul(4).to(dtype).requires_grad_()
        k = torch.randn(2, 2, 1024, 128, device="cuda").mul(4).to(dtype).requires_grad_()
        cos, sin = tables(sections, mode, 1024, device="cuda")
        m = rome.rotation_matrix(sections, mode, dtype=dtype, device="cuda")
        gq, gk = torch.randn_like(q), torch.randn_like(k)
        with launch.product(product):
            qo, ko = rome.apply_qk(q, k, cos, sin, m, backend="triton", rounding="native")
            dq, dk = torch.autograd.grad((qo, ko), (q, k), (gq, gk))
        rq, rk = _eager(q, cos, sin, sections, mode), _eager(k, cos, sin, sections, mode)
        eq, ek = torch.autograd.grad((rq, rk), (q, k), (gq, gk))
        for got, want in ((qo, rq), (ko, rk), (dq, eq), (dk, ek)):
            assert torch.equal(got, want), (sections, mode, (got != want).sum().item())


@pytest.mark.parametrize("kind", ["rms", "layer", "rms_heads"])
@pytest.mark.parametrize("alone", [False, True], ids=["q-and-k", "q-alone"])
def test_fused_qk_norm_compiled_forward_and_backward(kind, alone):
    """The fused QK-norm on the compiled kernel (the interpreter checks no types: an int32 stand-in
    for k's weight once failed to compile over heads, on an H100 only): per head (RMSNorm,
    LayerNorm) and over a token's heads, q/k as a [B, S, H, D] projection's transposed views; q and k
    in one launch, or, with MQA at per-batch positions, each alone. Forward and backward (dq, dk,
    the weights) against the torch backend in float64: outputs, dq and dk off by at most one bf16 ulp
    of their largest value, the weights' gradients 1e-2 relative (bf16 weights)."""
    heads = kind == "rms_heads"
    g = torch.Generator(device="cuda").manual_seed(0)
    b, s, hq, hk, d = 2, 1000, 8, 1 if alone else 2, 128
    sections, mode = (44, 42, 42), "interleave"
    q = torch.randn(b, s, hq, d, device="cuda", generator=g).bfloat16().transpose(1, 2).requires_grad_()
    k = torch.randn(b, s, hk, d, device="cuda", generator=g).bfloat16().transpose(1, 2).requires_grad_()
    m = rome.rotation_matrix(sections, mode, dtype=torch.bfloat16, device="cuda")
    p = 1024
    cc, sc = rome.rope_cos_sin(rome.grid_positions([4, 16, 16], device="cuda"), sections, mode=mode, device="cuda")
    pos = torch.randint(0, p, (b, 1, s, 1), device="cuda", generator=g) if alone else None
    nq, nk = (hq * d, hk * d) if heads else (d, d)
    wq, wk = ((1 + 0.1 * torch.randn(n, device="cuda", generator=g)).bfloat16().requires_grad_() for n in (nq, nk))
    bq, bk = ((0.1 * torch.randn(d, device="cuda", generator=g)).bfloat16().requires_grad_() for _ in range(2)) \
        if kind == "layer" else (None, None)
    kw = dict(norm="layer" if kind == "layer" else "rms", over="heads" if heads else "head", q_bias=bq, k_bias=bk)
    leaves = [q, k, wq, wk] + ([bq, bk] if bq is not None else [])

    if not alone:  # per-token tables
        cc, sc = cc[:s], sc[:s]

    def run(backend, cast):
        xs = [cast(t) for t in (q, k, cc, sc, m, wq, wk)]
        extra = dict(kw, q_bias=cast(bq) if bq is not None else None, k_bias=cast(bk) if bk is not None else None)
        if alone:
            return rome.apply_qk_norm_at(*xs[:5], pos, *xs[5:], backend=backend, **extra)
        return rome.apply_qk_norm(*xs, backend=backend, **extra)

    got = run("triton", lambda t: t)
    want = run("torch", lambda t: t.double())
    gq, gk = (torch.randn(x.shape, device="cuda", generator=g).bfloat16() for x in (q, k))
    dgot = torch.autograd.grad(got, leaves, (gq, gk))
    dwant = torch.autograd.grad(want, leaves, (gq.double(), gk.double()))
    for name, a, w in [("q_out", got[0], want[0]), ("k_out", got[1], want[1]), *zip(("dq", "dk"), dgot, dwant)]:
        err = (a.double() - w.double()).abs().max()
        ulp = 2.0 ** (torch.floor(torch.log2(w.double().abs().max())) - 7)  # bf16's at the largest value
        assert err <= ulp, (name, err.item(), ulp.item())
    for name, a, w in zip(("dwq", "dwk", "dbq", "dbk"), dgot[2:], dwant[2:]):
        torch.testing.assert_close(a.double(), w.double(), rtol=1e-2, atol=1e-2 * w.abs().max().item(), msg=name)


def test_the_plain_triton_copy_on_the_gpu():
    """The report's Triton ceiling on CUDA: every element copied, a positive rate no faster than
    twice the device copy's (a sanity bound: the same bytes, read and written)."""
    from profiling import speed

    q = torch.randn(1, 4, 4096, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 4096, 128, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(q.flatten())
    speed.triton_copy(q.flatten(), dst)
    assert torch.equal(dst, q.flatten())
    t, c = speed.triton_copy_bandwidth(q, k, q.device), speed.copy_bandwidth(q, k, q.device)
    assert t["bytes"] == c["bytes"] and 0 < t["gbps"] < 2 * c["gbps"]



def test_the_clocks_are_sampled_on_the_gpu():
    """profiling.clocks on the machine's nvidia-smi: the timed GPU's own samples (torch's UUID is
    one nvidia-smi lists, so the filter picks it, not the one-GPU fallback), SM and memory clocks in
    MHz, inside a window around a kernel loop."""
    import shutil
    import subprocess
    import time

    from profiling import clocks

    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi on this GPU machine")
    device = torch.device("cuda")
    mig = subprocess.run(["nvidia-smi", "--query-gpu=mig.mode.current", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    if "Enabled" in mig:
        pytest.skip("MIG: torch names the instance, nvidia-smi the GPU")
    listed = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True,
                            text=True, check=True).stdout
    assert clocks.device_uuid(device) in {clocks._bare(u) for u in listed.split()}, listed
    a = torch.randn(4096, 4096, device=device)
    with clocks.Clocks(device) as sampler:
        t0 = time.monotonic()
        while not sampler.lines:  # (nvidia-smi's start: up to seconds without persistence mode)
            assert time.monotonic() - t0 < 20 and sampler.proc.poll() is None, sampler.lines
            time.sleep(0.01)
        a = (a @ a).clamp_(-1, 1)  # (warm: cuBLAS's first call outside the window)
        torch.cuda.synchronize()
        with sampler.window():
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.0:
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    s = sampler.summary()
    assert "error" not in s, s
    assert s["samples"] >= 3 and s["timed_calls"] == 1, s
    assert 100 <= s["sm_mhz"]["min"] <= s["sm_mhz"]["median"] <= s["sm_mhz"]["max"] <= 4000, s
    assert 100 <= s["mem_mhz"]["median"] <= 20000, s
