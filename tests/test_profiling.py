"""The report's pieces: workloads, the variant registry against the oracle, metrics, the CLI."""

import json
import math
import time

import pytest
import torch

import rome
from einops import repeat
from profiling import accuracy, models, speed, variants
from profiling.__main__ import main
from profiling.variants import VARIANTS, Setup, Unavailable, Unsupported, per_section, section_setups
from profiling.workloads import WORKLOADS, qk, scaled_for_cpu, tables
from rome.reference import exact, rotate_every_two, rotate_half, slice_concat
from helpers import assert_rope_close

from conftest import DEVICE, optional

# the model-function variants and the Wan block run diffusers' own code: without it they are
# Unavailable with the reason (the report says so), and the tests that compare them are skipped
diffusers, needs_diffusers = optional("diffusers")


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_are_consistent(name):
    w = WORKLOADS[name]
    assert w.head_dim == sum(w.sections) and w.q_heads % w.kv_heads == 0
    if w.grid is not None:
        assert math.prod(w.grid) == w.seq
    small = scaled_for_cpu(w)
    t = tables(small)
    q, k = qk(small)
    assert torch.broadcast_shapes(q.shape, t.cos.shape) == q.shape
    assert k.shape[1] == small.kv_heads and q.shape[-1] == w.head_dim


def test_grid_workload_positions_follow_the_latent():
    w = WORKLOADS["default"]
    pos = w.positions()
    assert pos.shape == (28800, 3) and pos[-1].tolist() == [19, 35, 39]


def _small(name: str):
    """The workload with at most 24 tokens (varlen: 5 packed sequences, one of a single token)."""
    w = scaled_for_cpu(WORKLOADS[name])
    if w.seqlens is not None:
        return w.replace(seq=24, seqlens=(9, 1, 6, 3, 5))
    return w.replace(seq=min(w.seq, 24))


POSITION_VARIANTS = ("rome.apply_qk_at", "rome.apply_qk_angles", "rome.RoPE")


@pytest.mark.parametrize("workload, mode", [
    ("default", "half"), ("default", "interleave"), ("decode", "half"), ("decode", "interleave"),
    ("llama-yarn-128k", "interleave"), ("qwen2-vl", "half"),  # scaled (|cos| > 1) and mRoPE tables
    ("varlen", "half"), ("llama3-128k", "half"),
])
def test_every_runnable_variant_matches_the_oracle(mode, workload):
    """The one registry the speed and precision parts share computes RoPE, adapters included;
    rome's positions variants (a cache read at the positions, the module, varlen with cu_seqlens)
    are bitwise rome.apply_qk with the per-token tables, and the kernel's own angles within 2 ulp."""
    w = _small(workload)
    q, k = qk(w, dtype=torch.float32, device=DEVICE)
    t = tables(w, mode=mode, device=DEVICE)
    m = rome.rotation_matrix(w.sections, mode, device=DEVICE)
    setup = Setup(w, mode, t.cos, t.sin, t.angles, m, "triton", t.positions)
    want = VARIANTS["rome.apply_qk"].build(setup)(q, k)
    ran = set()
    for v in VARIANTS.values():
        try:
            run = v.build(setup)
        except (Unsupported, Unavailable) as e:
            assert (v.kind in ("anchor", "model") or v.normed) and str(e)  # (norm variants: *-qknorm only)
            continue
        q_out, k_out = run(v.prepare(q), v.prepare(k))
        assert_rope_close(q_out, q, t.cos, t.sin, w.sections, mode)
        assert_rope_close(k_out, k, t.cos, t.sin, w.sections, mode)
        if v.name in ("rome.apply_qk_at", "rome.RoPE"):
            assert torch.equal(q_out, want[0]) and torch.equal(k_out, want[1]), v.name
        ran.add(v.name)
    assert len(ran) >= 10 and set(POSITION_VARIANTS) <= ran, ran


def test_positions_variants_support():
    """The module and the angles variant keep fp32 tables: Unsupported (with the reason) for
    bf16 tables; the cache variant reads a cache in the tables' dtype; no positions, no variant."""
    w = _small("llama-1d")
    t = tables(w, device=DEVICE)
    m = rome.rotation_matrix(w.sections, w.mode, dtype=torch.bfloat16, device=DEVICE)
    bf16 = Setup(w, w.mode, t.cos.bfloat16(), t.sin.bfloat16(), t.angles, m, "torch", t.positions)
    for name in ("rome.apply_qk_angles", "rome.RoPE"):
        with pytest.raises(Unsupported, match="keeps float32 tables"):
            VARIANTS[name].build(bf16)
    q, k = qk(w, device=DEVICE)
    got = VARIANTS["rome.apply_qk_at"].build(bf16)(q, k)
    want = VARIANTS["rome.apply_qk"].build(bf16)(q, k)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for name in POSITION_VARIANTS:
        with pytest.raises(Unsupported, match="no positions"):
            VARIANTS[name].build(Setup(w, w.mode, t.cos, t.sin, t.angles, m, "torch"))


def test_varlen_workload():
    w = WORKLOADS["varlen"]
    cu = w.cu_seqlens()
    assert w.batch == 1 and w.seq == int(cu[-1]) == sum(w.seqlens) and cu.dtype == torch.int32
    pos = w.positions()
    assert pos.shape == (w.seq,) and pos[cu[1]].item() == 0 and pos[cu[1] - 1].item() == w.seqlens[0] - 1
    small = scaled_for_cpu(w)
    assert small.seq == sum(small.seqlens) <= 2048 and len(small.seqlens) == len(w.seqlens)
    with pytest.raises(ValueError, match="varlen workload packs its sequences"):
        w.replace(seq=24)


MODEL_FNS = ("diffusers apply_rotary_emb", "diffusers Wan rotary", "transformers apply_rotary_pos_emb")
# where each model function can express a workload: (mode, one section?, decode?) -> runs
MODEL_SUPPORT = {
    "diffusers apply_rotary_emb": lambda mode, one, decode: not decode and (mode == "interleave" or one),
    "diffusers Wan rotary": lambda mode, one, decode: mode == "interleave",
    "transformers apply_rotary_pos_emb": lambda mode, one, decode: mode == "half" and one,
}


@needs_diffusers
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", rome.MODES)
@pytest.mark.parametrize("workload", ["default", "llama-1d", "wan", "decode"])
def test_model_rope_functions_match_the_oracle(workload, mode, dtype):
    """diffusers' and transformers' own RoPE functions, as variants: RoPE wherever they run
    (fp32: to 1 ulp + fp32 math; bf16 with bf16 tables, what Llama passes: Wan's and Llama's
    compute in bf16, three roundings), Unsupported with a reason exactly where their formula cannot
    express the workload."""
    w, q, k, t, _ = _workload_setup(workload, mode, dtype)
    cos, sin = t.cos.to(dtype), t.sin.to(dtype)
    s = Setup(w, mode, cos, sin, t.angles, rome.rotation_matrix(w.sections, mode, dtype=dtype, device=DEVICE), "torch")
    for name in MODEL_FNS:
        v = VARIANTS[name]
        runs = MODEL_SUPPORT[name](mode, len(w.sections) == 1, w.decode)
        if not runs:
            with pytest.raises(Unsupported, match="interleave only|1D half|halves|decode"):
                v.build(s)
            continue
        assert v.kind == "model"
        q_out, k_out = v.build(s)(v.prepare(q), v.prepare(k))
        assert q_out.shape == q.shape and k_out.shape == k.shape and q_out.dtype == dtype
        for out, x in ((q_out, q), (k_out, k)):
            if dtype == torch.float32 or name == "diffusers apply_rotary_emb":  # fp32 math, rounded once
                assert_rope_close(out, x, cos, sin, w.sections, mode)
            else:  # bf16 math with bf16 tables: x*cos, rot(x)*sin and their sum each rounded, 2^-8 relative
                expected, magnitude = exact(x, cos, sin, w.sections, mode, magnitude=True)
                assert ((out.double() - expected).abs() <= 3 * 2.0**-8 * magnitude).all(), name


@needs_diffusers
def test_model_rope_functions_are_the_libraries_own(monkeypatch):
    """The Wan variant runs diffusers' nested function's own code object; without the library
    the model variants are Unavailable, not silently replaced."""
    from diffusers.models.transformers import transformer_wan

    f = variants.wan_rotary()
    assert f.__code__ in transformer_wan.WanAttnProcessor.__call__.__code__.co_consts
    w, q, k, t, s = _workload_setup("wan", "interleave")
    real = variants.importlib.import_module

    def no_libraries(name, *a):
        if name.split(".")[0] in ("diffusers", "transformers"):
            raise ImportError(f"No module named {name!r}")
        return real(name, *a)

    monkeypatch.setattr(variants.importlib, "import_module", no_libraries)
    for name in MODEL_FNS:
        with pytest.raises(Unavailable, match="not installed"):
            VARIANTS[name].build(s if name != "transformers apply_rotary_pos_emb" else _workload_setup("llama-1d", "half")[-1])


ANCHORS = ("liger-kernel", "flash-attn", "flashinfer", "transformer-engine")
V4 = ("v4 liger per section", "v4 flash-attn per section", "v4 flashinfer per section",
      "v4 transformer-engine per section")


def test_anchor_support_reasons():
    w = WORKLOADS["default"]
    t = tables(w.replace(seq=4))
    s = Setup(w, "half", t.cos, t.sin, t.angles, rome.rotation_matrix(w.sections, "half"), "torch")
    for name in ANCHORS:  # one call over the whole head cannot express 3D half RoPE
        with pytest.raises(Unsupported, match="section|1D half"):
            VARIANTS[name].build(s)
    for name in V4:  # the per-section split can: only the GPU is missing
        with pytest.raises(Unavailable, match="needs CUDA tensors"):
            VARIANTS[name].build(s)
    assert {"v1 torch.compile", *V4} <= set(VARIANTS)


def _workload_setup(workload, mode, dtype=torch.float32):
    w = scaled_for_cpu(WORKLOADS[workload]).replace(seq=min(WORKLOADS[workload].seq, 24), q_heads=2, kv_heads=1)
    q, k = qk(w, dtype=dtype, device=DEVICE)
    t = tables(w, mode=mode, device=DEVICE)
    m = rome.rotation_matrix(w.sections, mode, device=DEVICE)
    return w, q, k, t, Setup(w, mode, t.cos, t.sin, t.angles, m, "torch")


@pytest.mark.parametrize("layout", ["bnsd", "bsnd"])
@pytest.mark.parametrize("workload, mode", [("default", "half"), ("default", "interleave"),
                                            ("cogvideox", "interleave"), ("decode", "half")])
def test_v4_adapter_with_a_stand_in_1d_kernel(workload, mode, layout):
    """seed v4's split/concat and table slicing, with v1 on one section as the fused 1D kernel:
    the same bits as v1 over all sections (bf16, fp32 tables)."""
    w, q, k, t, s = _workload_setup(workload, mode, torch.bfloat16)
    seen = []

    def one_section(sub):
        (d,) = sub.sections
        assert sub.cos.shape[-1] == sub.sin.shape[-1] == sub.angles.shape[-1] == d and sub.cos.is_contiguous()
        assert torch.equal(sub.matrix, rome.rotation_matrix(d, mode, device=DEVICE))
        seen.append(d)

        def run(q, k):  # like the anchors: BSND storage in, BNSD-shaped out
            if layout == "bsnd":
                q, k = q.transpose(1, 2), k.transpose(1, 2)
            return slice_concat(q, sub.cos, sub.sin, d, mode), slice_concat(k, sub.cos, sub.sin, d, mode)

        return run

    run = per_section(one_section)(s)
    prep = (lambda x: x.transpose(1, 2).contiguous()) if layout == "bsnd" else (lambda x: x)
    q_out, k_out = run(prep(q), prep(k))
    assert seen == (list(w.sections) if mode == "half" else [w.head_dim])
    assert torch.equal(q_out, slice_concat(q, t.cos, t.sin, w.sections, mode))
    assert torch.equal(k_out, slice_concat(k, t.cos, t.sin, w.sections, mode))
    cols = [c for c, _ in section_setups(s)]
    assert cols[0].start == 0 and cols[-1].stop == w.head_dim and all(a.stop == b.start for a, b in zip(cols, cols[1:]))


# Pure-torch stand-ins written from each library's documented call, so the adapters' table
# layouts, offsets and reshapes are checked on the CPU (the real kernels need CUDA).
def _rotate(x, interleaved):
    return rotate_every_two(x) if interleaved else rotate_half(x)


def _flash_attn_apply_rotary_emb(x, cos, sin, interleaved=False, seqlen_offsets=0):
    """x [B, S, N, d]; cos/sin [S_ro, d/2]; token t of batch b reads row t + seqlen_offsets[b]."""
    b, sq = x.shape[:2]
    offsets = seqlen_offsets if torch.is_tensor(seqlen_offsets) else torch.full((b,), seqlen_offsets)
    rows = torch.arange(sq, device=x.device)[None] + offsets.to(x.device).long()[:, None]  # [B, S]
    spread = "... d -> ... 1 (d two)" if interleaved else "... d -> ... 1 (two d)"
    c, s = (repeat(t[rows], spread, two=2) for t in (cos, sin))
    xf = x.float()
    return (xf * c + _rotate(xf, interleaved) * s).to(x.dtype)


def _liger_rotary_pos_emb(q, k, cos, sin):
    """q, k [B, N, S, d] (views); cos/sin [1|B, S, d]: NeoX rotation."""
    c, s = cos[:, None], sin[:, None]
    return ((q.float() * c + rotate_half(q.float()) * s).to(q.dtype),
            (k.float() * c + rotate_half(k.float()) * s).to(k.dtype))


def _flashinfer_apply_rope_with_cos_sin_cache(positions, query, key, head_size, cache, is_neox=True):
    """query/key [T, heads*head_size]; cache [P, d] = cos half | sin half; token t reads row positions[t]."""
    half = cache.shape[-1] // 2
    spread = "t d -> t 1 (two d)" if is_neox else "t d -> t 1 (d two)"
    c, s = (repeat(part[positions], spread, two=2) for part in (cache[:, :half], cache[:, half:]))

    def one(x):
        xf = x.float().view(x.shape[0], -1, head_size)
        return (xf * c + _rotate(xf, not is_neox) * s).to(x.dtype).view(x.shape)

    return one(query), one(key)


def _te_cos_sin(freqs):
    return freqs.float().cos(), freqs.float().sin()


def _te_apply_rotary_pos_emb(t, freqs, tensor_format="bshd", interleaved=False, fused=True):
    """t [B, S, N, d] (bshd); freqs [S, 1, 1, d] angles laid out as the tables."""
    assert tensor_format == "bshd" and fused
    c, s = (v[:, 0, 0][None, :, None] for v in _te_cos_sin(freqs))
    return (t.float() * c + _rotate(t.float(), interleaved) * s).to(t.dtype)


STAND_INS = {"flash-attn": _flash_attn_apply_rotary_emb, "liger-kernel": _liger_rotary_pos_emb,
             "flashinfer": _flashinfer_apply_rope_with_cos_sin_cache,
             "transformer-engine": _te_apply_rotary_pos_emb}


@pytest.mark.parametrize("workload, mode", [("default", "half"), ("default", "interleave"),
                                            ("cogvideox", "interleave"), ("llama-1d", "half"), ("decode", "half")])
def test_anchor_adapters_with_stand_in_kernels(workload, mode, monkeypatch):
    """Every anchor and v4 adapter, fed a pure-torch stand-in of its library call, computes RoPE;
    the v4 ones also run where the plain adapter cannot express the workload (3D half)."""
    monkeypatch.setattr(variants, "_anchor", lambda s, package, *_: STAND_INS[package])
    w, q, k, t, s = _workload_setup(workload, mode)
    ran = set()
    for name in ANCHORS + V4:
        v = VARIANTS[name]
        try:
            run = v.build(s)
        except Unsupported as e:
            assert str(e)
            continue
        q_out, k_out = run(v.prepare(q), v.prepare(k))
        cos, sin = t.cos, t.sin
        if "transformer-engine" in name:  # TE turns fp32 angles into its own tables
            cos, sin = (v.double() for v in _te_cos_sin(t.angles))
        assert_rope_close(q_out, q, cos, sin, w.sections, mode)
        assert_rope_close(k_out, k, cos, sin, w.sections, mode)
        ran.add(name)
    if (workload, mode) == ("default", "half"):
        assert ran == set(V4)  # v1's workload: only the per-section split expresses it
    elif mode == "interleave":
        assert ran == set(ANCHORS + V4) - {"liger-kernel", "v4 liger per section"}
    else:
        assert ran >= set(V4) - {"v4 transformer-engine per section"}


def test_ulp_histogram_counts_every_element():
    u = torch.tensor([0.0, 0.5, 0.7, 1.0, 1.5, 3.0, 5.0, 9.0, float("nan")])
    h = accuracy.ulp_histogram(u)
    assert list(h.values()) == [2, 2, 1, 1, 1, 2] and sum(h.values()) == u.numel()


def test_passes_and_kernel_counts_on_cpu(tmp_path):
    w = scaled_for_cpu(WORKLOADS["cogvideox"]).replace(seq=16)
    q, k = qk(w, dtype=torch.float32)
    t = tables(w)
    s = Setup(w, w.mode, t.cos, t.sin, t.angles, rome.rotation_matrix(w.sections, w.mode), "torch")
    p = speed.Passes(VARIANTS["v1 slice+concat"].build(s), q, k, differentiable=True)
    assert set(p.passes) == set(speed.PASSES)
    dev = torch.device("cpu")
    counts = {n: speed.kernels_per_call(fn, dev, f"v1 {n}", tmp_path)["kernels_per_call"] for n, fn in p.passes.items()}
    assert counts["fwd"] > 2 and counts["fwd+bwd"] > counts["fwd"]  # slice and concat: many passes
    fused = speed.Passes(VARIANTS["rome.apply_qk"].build(s), q, k, differentiable=True)
    assert speed.kernels_per_call(fused.passes["fwd"], dev, "qk", tmp_path)["kernels_per_call"] < counts["fwd"]
    assert (tmp_path / "v1-fwd.json").exists()
    assert speed.io_bytes(q, k, t.cos, t.sin) == 2 * 4 * (q.numel() + k.numel()) + 4 * 2 * t.cos.numel()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_plain_triton_copy_copies_every_element_and_refuses_a_mismatch(dtype):
    """speed.triton_copy (the report's Triton ceiling) under the interpreter: a size that is not a
    multiple of its block, every element equal to the source's bits; a dtype, size or layout
    mismatch is a ValueError naming both; off a GPU its bandwidth is None (no bandwidth there)."""
    n = speed.TRITON_COPY_BLOCK + 37
    src = torch.randn(n).to(dtype)
    dst = torch.full_like(src, float("nan"))
    speed.triton_copy(src, dst)
    assert torch.equal(dst.view(torch.int16 if dtype == torch.bfloat16 else torch.int32),
                       src.view(torch.int16 if dtype == torch.bfloat16 else torch.int32))
    for bad in (torch.empty(n, dtype=torch.float16), torch.empty(n - 1, dtype=dtype),
                torch.empty(2 * n, dtype=dtype)[::2]):
        with pytest.raises(ValueError, match=r"triton_copy: src and dst must be contiguous, of one dtype and size"):
            speed.triton_copy(src, bad)
    assert speed.triton_copy_bandwidth(src, src, torch.device("cpu")) is None


def test_a_rows_shares_of_both_copies():
    """Each speed row's % of the device copy and of the plain Triton copy (run_speed's fields);
    none of the Triton copy where it was not measured (a CPU) or failed."""
    shares = speed.copy_shares(3000.0, {"gbps": 4000.0, "triton": {"gbps": 3750.0}})
    assert shares == {"pct_copy_bw": 75.0, "pct_triton_copy_bw": 80.0}
    for triton in (None, {"error": "CompilationError: no"}):
        assert speed.copy_shares(3000.0, {"gbps": 4000.0, "triton": triton}) == {
            "pct_copy_bw": 75.0, "pct_triton_copy_bw": None}


def test_report_names_the_plain_triton_copy_where_it_was_measured():
    """A GPU run's report (the first H200 make gpu's results.json, which predates the Triton copy,
    with one added): the plain Triton copy's line (GB/s and its share of the device copy) and each
    row's ``% Triton copy``. Without one, as that run was, neither appears."""
    from pathlib import Path

    from profiling import report

    path = Path(__file__).resolve().parents[1] / "profiling/results/h200/speed/default/results.json"
    r = json.loads(path.read_text())
    assert "plain Triton copy" not in report.markdown(r) and "% Triton copy" not in report.markdown(r)
    copy = r["copy_bandwidth"]["gbps"]
    r["copy_bandwidth"]["triton"] = {"gbps": 0.97 * copy, "median_ms": 1.0, "block": 4096, "num_warps": 8}
    for row in r["speed"]:
        row["pct_triton_copy_bw"] = row["pct_copy_bw"] / 0.97 if isinstance(row["pct_copy_bw"], float) else None
    text = report.markdown(r)
    assert f"plain Triton copy of the same bytes" in text and f"{0.97 * copy:.1f} GB/s, 97.0 % of the copy's" in text
    head = next(line for line in text.splitlines() if line.startswith("| variant |") and "% copy BW" in line)
    assert "% Triton copy" in head
    col = head.split(" | ").index("% Triton copy")
    rome_row = next(line for line in text.splitlines() if line.startswith("| rome.apply_qk | fwd"))
    want = next(x for x in r["speed"] if x["variant"] == "rome.apply_qk" and x["pass"] == "fwd")
    assert rome_row.split(" | ")[col] == f"{want['pct_copy_bw'] / 0.97:.1f}"
    r["copy_bandwidth"]["triton"] = {"error": "CompilationError: no"}  # (a copy that failed: said, no column)
    for row in r["speed"]:
        row["pct_triton_copy_bw"] = None
    text = report.markdown(r)
    assert "The plain Triton copy of the same bytes failed: CompilationError: no" in text
    assert "% Triton copy" not in next(line for line in text.splitlines() if line.startswith("| variant |"))


def test_report_cli_end_to_end(tmp_path, monkeypatch, capsys):
    out = tmp_path / "rep"
    monkeypatch.setenv("COLUMNS", "80")  # a CI log's width: the console tables must stay readable
    # the CLI end to end, not the timings' quality (speed.py's own tests): a round, the fewest calls
    monkeypatch.setattr(speed, "CPU_WARMUP_S", 0.0)
    monkeypatch.setattr(speed, "CPU_MEASURE_S", 0.01)
    # the compiled variants' graphs through aot_eager: inductor's C++ codegen of their 24 graphs
    # took ~70 of this test's ~100 s on CI's CPUs; that they compile with inductor, once per set-up
    # and never fall back to eager, is test_compiled_variants_compile_per_setup_and_never_fall_back_to_eager's
    monkeypatch.setattr(variants, "COMPILE_BACKEND", "aot_eager")
    main(["report", "--workload", "cogvideox", "--shape", "1,2,1,32,64", "--precision-tokens", "32", "--out", str(out),
          "--skip-kernels", "--skip-models"])  # each section has its own tests (kernels: minutes)
    console = capsys.readouterr().out
    assert max(len(line) for line in console.splitlines()) <= 80
    for name in ("rome.apply_qk_at", "rome.apply_qk_angles", "v3 torch.compile"):  # whole, not "rome.ap…"
        assert f"│ {name} " in console, name
    r = json.loads((out / "results.json").read_text())
    # the speed plot suits the device: GB/s against copy on a GPU, speed relative to v1 on a CPU
    plot = "gbps.png" if torch.cuda.is_available() else "speed_vs_v1.png"
    for f in ("report.md", "results.json", "speed.csv", "precision.csv", plot, "ulp_hist.png"):
        assert (out / f).stat().st_size > 0, f
    assert not (out / ("speed_vs_v1.png" if torch.cuda.is_available() else "gbps.png")).exists()
    assert {"device", "torch", "triton", "commit"} <= set(r["environment"])
    # the clocks over the speed timings: sampled or why not on a GPU (profiling.clocks), none on a CPU
    assert ("sm_mhz" in r["clocks"] or "error" in r["clocks"]) if torch.cuda.is_available() else r["clocks"] is None
    ran = {s["variant"] for s in r["variants"] if s["status"] == "ok"}
    assert {"v1 slice+concat", "v1 torch.compile", "v3 torch.compile", "rome.apply", "rome.apply_qk"} <= ran
    assert all(s["reason"] for s in r["variants"] if s["status"] != "ok")  # never silently dropped
    prec_fields = {"variant", "dtype", "mode", "table_dtype", "max_abs", "max_rel", "seed_metric", "seed_count", "max_ulp", "ok"}
    model_fns = {"diffusers apply_rotary_emb", "diffusers Wan rotary"}
    if diffusers is not None:
        assert model_fns <= ran  # interleave: the model functions run
    else:  # not installed: listed as unavailable, saying so
        status = {s["variant"]: s for s in r["variants"]}
        assert all(status[v]["status"] == "unavailable" and "diffusers" in status[v]["reason"] for v in model_fns)
    combos = {(p["variant"], p["dtype"], p["mode"], p["table_dtype"]) for p in r["precision"]}
    skips = {(p["variant"], p["dtype"], p["mode"], p["table_dtype"]) for p in r["precision_skipped"] if p["reason"]}
    for v in ran:
        for dtype in ("bfloat16", "float16", "float32"):
            for mode in rome.MODES:  # measured, or (a model function in half mode of 3 sections) skipped, saying why
                assert (v, dtype, mode, "float32") in (combos if VARIANTS[v].kind != "model" or mode == "interleave" else skips)
    for p in r["precision"]:
        native = p["variant"].endswith("(native)")  # the eager chain's rounding: shown, not judged
        assert prec_fields <= set(p) and all(p[f] is not None for f in prec_fields - ({"ok"} if native else set()))
        if native:
            assert p["ok"] is None and p["backend"] == "triton"
        elif p["variant"].startswith("rome"):
            assert p["ok"] and p["backend"] == "triton"
    speed_fields = {"variant", "pass", "median_ms", "gbps", "pct_copy_bw", "speedup_vs_v1", "speedup_vs_compiled",
                    "kernels_per_call", "peak_mem_bytes"}
    assert {(s["variant"], s["pass"]) for s in r["speed"]} >= {(v, p) for v in ran for p in speed.PASSES}
    for s in r["speed"]:
        assert speed_fields <= set(s) and s["median_ms"] > 0
    assert "GPU speed needs a GPU" in (out / "report.md").read_text()
    a = r["angles"]  # the kernel's angles within 2x the fp32 table's own rounding; fp32 angles far off
    assert a["kernel_angles_max_abs"] <= 2 * a["fp32_cache_max_abs"] < 1e-6 < a["fp32_angles_max_abs"]
    assert "angles in the kernel" in (out / "report.md").read_text()
    assert r["models"] is None and "Not run (--skip-models)" in (out / "report.md").read_text()


@pytest.fixture
def quick_cpu_timing(monkeypatch):
    """speed.bench's CPU warm-up and measuring windows shortened (at least 10 timed calls stay)."""
    monkeypatch.setattr(speed, "CPU_WARMUP_S", 0.0)
    monkeypatch.setattr(speed, "CPU_MEASURE_S", 0.0)


@needs_diffusers
def test_models_section_measures_both_models(quick_cpu_timing):
    """Wan block and Llama layer on the CPU: every number measured and consistent, the patched
    model computing what the unpatched one does, both RoPE calls captured at the layer's own q/k,
    and every spy and patch gone afterwards."""
    from rome.integrations import diffusers as rome_diffusers, transformers as rome_transformers
    from transformers.models.llama import modeling_llama

    before = (modeling_llama.apply_rotary_pos_emb, rome_diffusers.apply_qk, rome_transformers.apply_qk)
    steps = []
    m = models.run_models(torch.device("cpu"), on_step=steps.append)
    assert (modeling_llama.apply_rotary_pos_emb, rome_diffusers.apply_qk, rome_transformers.apply_qk) == before
    assert len(steps) == models.STEPS * len(models.MODELS) and not m["skipped"] and "CPU" in m["method"]
    assert [c["model"] for c in m["cases"]] == list(models.MODELS)
    wan, llama = m["cases"]
    # 3x8x8 tokens, BSND; patched, Wan's q/k norms fused: rome.apply_qk_norm on the BNSD views
    assert "[1, 192, 2, 128]" in wan["rope_before"] and "q [1, 2, 192, 128]" in wan["rope_after"] and "apply_qk_norm" in wan["rope_after"]
    assert "[1, 4, 256, 128]" in llama["rope_before"] and "k [1, 1, 256, 128]" in llama["rope_after"]
    for c in m["cases"]:
        assert not c["full_size"] and c["dtype"] == "float32" and c["rome_backend"] == "torch"
        assert c["patched_vs_unpatched_rel"] < 1e-5  # the patch changes the RoPE's rounding only
        assert [r["pass"] for r in c["rows"]] == ["fwd", "fwd+bwd"]
        for r in c["rows"]:
            for key in ("unpatched_ms", "patched_ms", "rope_ms_before", "rope_ms_after"):
                assert math.isfinite(r[key]) and r[key] > 0, key
            assert r["speedup"] == pytest.approx(r["unpatched_ms"] / r["patched_ms"])
            assert r["rope_share_before"] == pytest.approx(r["rope_ms_before"] / r["unpatched_ms"])
            assert r["rope_share_after"] == pytest.approx(r["rope_ms_after"] / r["patched_ms"])
    assert models.rows(m) == wan["rows"] + llama["rows"]


def test_report_cli_models_section(tmp_path, quick_cpu_timing, monkeypatch):
    """The models section runs by default: a table in report.md, models.csv, results.json['models']."""
    monkeypatch.setattr(models, "MODELS", {"llama3-8b-layer": models.MODELS["llama3-8b-layer"]})
    out = tmp_path / "rep"
    main(["report", "--workload", "llama-1d", "--skip-speed", "--skip-precision", "--skip-kernels", "--out", str(out)])
    r = json.loads((out / "results.json").read_text())
    (case,) = r["models"]["cases"]
    assert case["model"] == "llama3-8b-layer" and len(case["rows"]) == 2
    text = (out / "report.md").read_text()
    assert "## Models" in text and "| model | pass | unpatched ms | patched ms | speedup |" in text
    row = case["rows"][1]
    assert f"| llama3-8b-layer | fwd+bwd | {row['unpatched_ms']:.4g} | {row['patched_ms']:.4g} |" in text
    assert (out / "models.csv").read_text().count("llama3-8b-layer") == 2
    # the skipped parts: said, no figures, strict JSON, no file claimed that was not written
    json.loads((out / "results.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in results.json"))
    assert "## Speed\n\nNot run (--skip-speed)." in text and "## Precision\n\nNot run (--skip-precision)." in text
    assert "GB/s" not in text.split("## Variants")[0] and "Shape timed" not in text
    files = next(line for line in text.splitlines() if line.startswith("Files: "))
    assert files == "Files: results.json (all numbers), models.csv."
    assert not any((out / f).exists() for f in ("speed.csv", "precision.csv", "ulp_hist.png", "speed_vs_v1.png"))


def test_a_cpu_reports_copy_is_not_a_devices(tmp_path):
    """The committed CPU run's results.json rendered again: the host copy named as cache bandwidth,
    no GB/s or % copy BW columns (as the console), and the total-ulp wording that allows it below
    max ulp (fp16 tables cancel the op's error there)."""
    from pathlib import Path

    from profiling import report

    r = json.loads((Path(__file__).resolve().parents[1] / "profiling/results/cpu/results.json").read_text())
    text = report.markdown(r)
    assert "Host memory copy of q's and k's bytes" in text and "cache bandwidth, not a device's" in text
    head = next(line for line in text.splitlines() if line.startswith("| variant | pass | backend |"))
    assert "GB/s" not in head and "% copy BW" not in head and "x v1" in head
    assert "device-to-device" not in text and "which can partly cancel" in text


def test_models_section_reports_what_it_could_not_measure(monkeypatch):
    """A missing library is 'unavailable', any other failure (out of memory) an 'error' with its
    message; neither stops the other cases or the report, and neither leaves a number."""
    import dataclasses

    def missing(*_):
        raise ImportError("No module named 'diffusers'")

    def broken(*_):
        raise RuntimeError("CUDA out of memory")

    wan = models.MODELS["wan-14b-block"]
    monkeypatch.setattr(models, "MODELS", {"a": dataclasses.replace(wan, name="a", build=missing),
                                           "b": dataclasses.replace(wan, name="b", build=broken)})
    m = models.run_models(torch.device("cpu"))
    assert m["cases"] == [] and models.rows(m) == []
    assert [(s["model"], s["status"]) for s in m["skipped"]] == [("a", "unavailable"), ("b", "error")]
    assert "diffusers" in m["skipped"][0]["reason"] and "out of memory" in m["skipped"][1]["reason"]
    from profiling.report import models_section

    text = models_section({"models": m})
    assert "a: not measured (unavailable)" in text and "| model |" not in text
    # an error fails the run (said first in report.md, non-zero exit); an unavailable library does not
    from profiling.report import failures

    failed = failures({"models": m, "variants": [{"variant": "v", "status": "unsupported", "reason": "1D only"}],
                       "precision": [{"variant": "rome.apply", "ok": False, "max_ulp": 3, "dtype": "bf16"},
                                     {"variant": "v1 torch.compile", "ok": False, "max_ulp": 9}]})
    assert len(failed) == 2 and failed[0].startswith("precision: rome.apply") and "CUDA out of memory" in failed[1]


def test_bench_interleaved_visits_every_callable_each_round(monkeypatch):
    """CPU timing in shared rounds: every callable is visited in every round (so a drifting
    machine lands on all alike), one that raises is reported under its key and dropped, the
    others still get at least 10 timed calls."""
    monkeypatch.setattr(speed, "CPU_WARMUP_S", 0.0)
    monkeypatch.setattr(speed, "CPU_MEASURE_S", 0.01)
    monkeypatch.setattr(speed, "CPU_BURST_S", 0.002)  # 5 rounds
    calls, boom = [], {"n": 0}

    def timed(key, seconds):
        def fn():
            calls.append(key)
            time.sleep(seconds)
        return fn

    def fails():
        boom["n"] += 1
        if boom["n"] > 3:  # passes its warm-up, fails in the first round
            raise RuntimeError("broken variant")

    timings, errors = speed.bench_interleaved({"a": timed("a", 0.001), "b": timed("b", 0.0005), "bad": fails})
    assert set(timings) == {"a", "b"} and isinstance(errors["bad"], RuntimeError)
    assert speed.cpu_rounds() == 5
    warm = 3  # each callable's warm-up calls come first
    assert calls[:2 * warm] == ["a"] * warm + ["b"] * warm
    timed_calls = calls[2 * warm:]
    assert timed_calls.count("a") >= 10 and timed_calls.count("b") >= 10
    runs = [k for i, k in enumerate(timed_calls) if i == 0 or timed_calls[i - 1] != k]
    assert len(runs) >= 2 * 5 - 4 and {"a", "b"} == set(runs)  # alternating bursts, round after round
    for t in timings.values():
        assert 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"]


CONTRACT = {"variant", "pass", "arch", "config", "cubin", "registers", "spill_bytes", "estimate_h100", "estimate_h200"}


def test_kernels_workload_writes_the_launch_contract(tmp_path):
    """``python -m profiling kernels --workload decode``: every launch the rome variants make,
    forward and backward, compiled for sm_90 (in worker processes: this one interprets) and
    modelled; kernels.json's ``launches`` carry the fields an independent check reads."""
    from profiling.static.launches import rome_variants

    out = tmp_path / "kernels"
    main(["kernels", "--workload", "decode", "--out", str(out), "--jobs", "2"])
    section = json.loads((out / "kernels.json").read_text())
    launches = section["launches"]
    # (the q/k-norm variant is Unsupported on a workload without a norm, saying so)
    unexpected = [s for s in section["skipped"] if not (s["variant"] == "rome.apply_qk_norm" and "q/k norm" in s["reason"])]
    assert section["workload"]["name"] == "decode" and not unexpected, section["skipped"]
    ran = set(rome_variants()) - {s["variant"] for s in section["skipped"]}
    assert {r["variant"] for r in launches} == ran
    assert {(r["variant"], r["pass"]) for r in launches} == {(v, p) for v in ran
                                                             for p in ("forward", "backward")}
    for r in launches:
        assert CONTRACT <= set(r) and r["ok"], r.get("error")
        assert r["arch"] == "sm_90" and open(r["cubin"], "rb").read(4) == b"\x7fELF"
        assert r["spill_bytes"] == 0 and r["registers"] > 0
        assert 0 < r["estimate_h100"] <= 1 and 0 < r["estimate_h200"] <= 1
        assert r["batches"] >= 1 and r["l1_bytes_per_element"] > 0 and r["time_us_h100"] > 0
        assert set(r["estimates_h100"]) == {"600ns@1.755GHz", "800ns@1.755GHz", "600ns@1.98GHz", "800ns@1.98GHz"}
    md = (out / "kernels.md").read_text()
    assert "| variant | pass | config |" in md and "est. H100" in md
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        assert section["liger"]["status"] == "not installed" and "Liger-Kernel: not installed" in md
    else:
        assert section["liger_launches"] and all(r["ok"] for r in section["liger_launches"])


def test_kernels_workload_dtype_reaches_the_capture(monkeypatch, tmp_path):
    """``--dtype fp32`` puts the workload's q and k in fp32 (the override the capture gets, and
    the workload it builds); an unknown dtype is refused by the parser."""
    import torch

    from profiling.static import cli, launches

    seen = {}

    class Stop(Exception):
        pass

    def collect(name, archs, out, *, overrides=None, **kw):
        seen.update(name=name, overrides=overrides)
        raise Stop

    monkeypatch.setattr(cli, "collect_workload", collect)
    with pytest.raises(Stop):
        main(["kernels", "--workload", "decode", "--dtype", "fp32", "--out", str(tmp_path / "k")])
    assert seen == {"name": "decode", "overrides": {"dtype": "fp32"}}
    assert launches._workload("decode", seen["overrides"]).dtype == torch.float32
    assert launches._workload("decode").dtype != torch.float32
    with pytest.raises(SystemExit):
        main(["kernels", "--workload", "decode", "--dtype", "fp64", "--out", str(tmp_path / "k")])


def test_compiled_variants_compile_per_setup_and_never_fall_back_to_eager(caplog):
    """Issue 28 item 4: the report builds the torch.compile variants once per set-up (dtype, mode,
    table dtype: 3 x 2 x 2 here, past dynamo's recompile_limit of 8 for one code object). Each
    set-up's function compiles on its own code object and runs with recompiles made errors, so a
    row can never time eager code under the name "torch.compile": no recompile_limit in the log,
    and every call runs a compiled graph (dynamo's frame counter grows by one compile per set-up)."""
    from torch._dynamo.utils import counters

    w = _small("default")
    counters.clear()
    built = 0
    with caplog.at_level("WARNING"):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            q, k = qk(w, dtype=dtype, device="cpu")
            for mode in ("half", "interleave"):
                t = tables(w, mode=mode, dtype=torch.float64, device="cpu")
                for table_dtype in dict.fromkeys((torch.float32, dtype)):  # 10 set-ups, as the report's
                    m = rome.rotation_matrix(w.sections, mode, dtype=dtype)
                    setup = Setup(w, mode, t.cos.to(table_dtype), t.sin.to(table_dtype), t.angles, m, "torch")
                    for name in ("v1 torch.compile",):  # (v3's is built the same way)
                        run = VARIANTS[name].build(setup)
                        want = VARIANTS["v1 slice+concat"].build(setup)(q, k)
                        for _ in range(2):
                            got = run(q, k)
                        for a, b in zip(got, want):
                            torch.testing.assert_close(a, b, rtol=2e-2 if dtype != torch.float32 else 1e-5,
                                                       atol=2e-2 if dtype != torch.float32 else 1e-5)
                        built += 1
    assert "recompile_limit" not in caplog.text and "cache_size_limit" not in caplog.text, caplog.text[-2000:]
    assert counters["stats"]["unique_graphs"] >= built, (dict(counters["stats"]), built)


@pytest.mark.parametrize("argv,message", [
    (["kernels", "--workload", "nope"], "invalid choice: 'nope'"),
    (["kernels", "--arch", "sm_999"], "unknown arch 'sm_999'"),
    (["report", "--arch", "sm_90,sm_999"], "unknown arch 'sm_999'"),
    (["report", "--precision-tokens", "0"], "must be a positive int, got '0'"),
    (["report", "--precision-tokens", "-5"], "must be a positive int, got '-5'"),
])
def test_the_cli_refuses_bad_arguments_by_name(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("shape", ["a,b,c,d", "1,-4,100,128", "0,4,100,128"])
def test_report_refuses_a_bad_shape_before_running(shape, tmp_path):
    with pytest.raises(SystemExit, match=r"--shape takes positive ints"):
        main(["report", "--shape", shape, "--out", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()


def test_overhead_refuses_a_baseline_that_is_no_checkout(tmp_path):
    with pytest.raises(SystemExit, match=r"--baseline .*: not a checkout of rome"):
        main(["overhead", "--baseline", str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()
