"""The report's pieces: workloads, the variant registry against the oracle, metrics, the CLI."""

import json
import math

import pytest
import torch

import rome
from profiling import accuracy, speed
from profiling.__main__ import main
from profiling.variants import VARIANTS, Setup, Unavailable, Unsupported
from profiling.workloads import WORKLOADS, qk, scaled_for_cpu, tables
from helpers import assert_rope_close

from conftest import DEVICE


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


@pytest.mark.parametrize("mode", rome.MODES)
@pytest.mark.parametrize("workload", ["default", "decode"])
def test_every_runnable_variant_matches_the_oracle(mode, workload):
    """The one registry the speed and precision parts share computes RoPE, adapters included."""
    w = scaled_for_cpu(WORKLOADS[workload]).replace(seq=min(WORKLOADS[workload].seq, 24))
    q, k = qk(w, dtype=torch.float32, device=DEVICE)
    t = tables(w, mode=mode, device=DEVICE)
    m = rome.rotation_matrix(w.sections, mode, device=DEVICE)
    ran = 0
    for v in VARIANTS.values():
        try:
            run = v.build(Setup(w, mode, t.cos, t.sin, t.angles, m, "triton"))
        except (Unsupported, Unavailable) as e:
            assert v.kind == "anchor" and str(e)
            continue
        q_out, k_out = run(v.prepare(q), v.prepare(k))
        assert_rope_close(q_out, q, t.cos, t.sin, w.sections, mode)
        assert_rope_close(k_out, k, t.cos, t.sin, w.sections, mode)
        ran += 1
    assert ran >= 6


def test_anchor_support_reasons():
    w = WORKLOADS["default"]
    t = tables(w.replace(seq=4))
    s = Setup(w, "half", t.cos, t.sin, t.angles, rome.rotation_matrix(w.sections, "half"), "torch")
    for name in ("liger-kernel", "flash-attn", "flashinfer", "transformer-engine"):
        with pytest.raises((Unsupported, Unavailable)):
            VARIANTS[name].build(s)


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


def test_report_cli_end_to_end(tmp_path):
    out = tmp_path / "rep"
    main(["report", "--workload", "cogvideox", "--shape", "1,2,1,32,64", "--precision-tokens", "32", "--out", str(out)])
    for f in ("report.md", "results.json", "speed.csv", "precision.csv", "gbps.png", "ulp_hist.png"):
        assert (out / f).stat().st_size > 0, f
    r = json.loads((out / "results.json").read_text())
    assert {"device", "torch", "triton", "commit"} <= set(r["environment"])
    ran = {s["variant"] for s in r["variants"] if s["status"] == "ok"}
    assert {"v1 slice+concat", "v3 torch.compile", "rome.apply", "rome.apply_qk"} <= ran
    assert all(s["reason"] for s in r["variants"] if s["status"] != "ok")  # never silently dropped
    prec_fields = {"variant", "dtype", "mode", "table_dtype", "max_abs", "max_rel", "seed_metric", "seed_count", "max_ulp", "ok"}
    combos = {(p["variant"], p["dtype"], p["mode"], p["table_dtype"]) for p in r["precision"]}
    for v in ran:
        for dtype in ("bfloat16", "float16", "float32"):
            for mode in rome.MODES:
                assert (v, dtype, mode, "float32") in combos
    for p in r["precision"]:
        assert prec_fields <= set(p) and all(p[f] is not None for f in prec_fields)
        if p["variant"].startswith("rome"):
            assert p["ok"] and p["backend"] == "triton"
    speed_fields = {"variant", "pass", "median_ms", "gbps", "pct_copy_bw", "speedup_vs_v1", "speedup_vs_compiled",
                    "kernels_per_call", "peak_mem_bytes"}
    assert {(s["variant"], s["pass"]) for s in r["speed"]} >= {(v, p) for v in ran for p in speed.PASSES}
    for s in r["speed"]:
        assert speed_fields <= set(s) and s["median_ms"] > 0
    assert "GPU speed needs a GPU" in (out / "report.md").read_text()
