"""rome.launch.candidates and rome.tuning: what the GPU autotuner may pick, and its launch path.

The autotuner's benchmarker needs a GPU; here it is replaced by one that runs each candidate once
and reports times that make the last candidate win (Triton's autotuner takes a ``do_bench``), so
the whole path runs under the interpreter: scratch outputs for the timed runs (an in-place
launch is rotated once), the choice remembered per key, the same bits whichever candidate runs.
Under the interpreter ``candidates`` gives one config, so the tests give two where they run
there (a GPU tests its real candidates)."""

import dataclasses
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import triton

import rome
from rome import launch, ops, tuning
from helpers import random_tables

from conftest import DEVICE

ROOT = Path(__file__).resolve().parents[1]

kernel = ops._kernel()

HALF, FP32, BF16 = torch.float16, torch.float32, torch.bfloat16


def _grid():
    """choose()'s config for every x dtype, head_dim, pass, table dtype, matrix kind, product and
    positions."""
    for x in (BF16, HALF, FP32):
        for d in launch.HEAD_DIMS:
            for transpose in (False, True):
                for gather, ex, eb in ((True, True, True), (False, True, True), (False, False, False)):
                    for t in dict.fromkeys((FP32, x)):
                        for product in launch.PRODUCTS:
                            yield launch.choose(x, t, d, transpose=transpose, gather=gather, exact_in_x=ex,
                                                exact_in_bf16=eb, product=product)
                for positions in (1, 2):
                    for angles in (False, True):
                        yield launch.choose(x, FP32, d, transpose=transpose, gather=True, exact_in_x=True,
                                            exact_in_bf16=True, positions=positions, angles=angles)


TILE = ("block_r", "num_warps")


def test_the_compilers_the_choices_were_not_read_off_take_the_smaller_builds():
    """launch.TUNED_COMPILER: triton 3.6 and 3.9+, under which every configuration compiled without
    spill; under another (3.7, 3.8) the pairs' bf16 batch is four heads (six spilled 32 B under 3.8),
    fp16 and fp32 and the whole head's halves unchanged (profiling/results/cpu/triton-37-38/)."""
    pairs = types.SimpleNamespace(halves=False)
    whole = types.SimpleNamespace(halves=True)
    assert [launch.halves_depth(pairs, d, tuned=True) for d in (BF16, HALF, FP32)] == [6, 3, 3]
    assert [launch.halves_depth(pairs, d, tuned=False) for d in (BF16, HALF, FP32)] == [4, 3, 3]
    assert [launch.halves_depth(whole, d, tuned=t) for d in (BF16, HALF) for t in (True, False)] == [3, 3, 2, 2]
    assert launch.halves_depth(pairs, BF16) == (6 if launch.TUNED_COMPILER else 4)


_UNDER_VERSION = """
import sys
import triton
triton.__version__ = sys.argv[1]  # (before rome reads it)
from rome import launch
from rome.launcher import kernel_configs
configs = {c.name: c for c in kernel_configs(90)}
pairs = configs["bf16 bwd D=128 tables=fp32 product=gather gather-sin positions=axes M=rotation sections=44/44/40 halves"]
norm = configs["bf16 bwd D=128 tables=fp32 product=gather gather-sin M=rotation norm=rms_heads backward heads=40/40 interleave"]
twice = [n for n in configs if n.startswith("fp32 bwd D=64 tables=fp32 product=gather gather-sin M=rotation tuned BLOCK_R=32 ")]
print(launch.TUNED_COMPILER, pairs.meta["gather_depth"], norm.num_warps, len(twice))
"""


@pytest.mark.parametrize("version, want", [("3.6.0", "True 6 8 1"), ("3.8.0", "False 4 16 0"),
                                           ("3.10.0", "True 6 8 1")])
def test_the_launcher_takes_the_compilers_choices(version, want, tmp_path):
    """What the launcher lists (``kernel_configs``: every build it can launch) under a triton that
    reports ``version``: the bf16 pairs' batch depth, Wan's fused-norm backward warps and fp32 x's
    twice-the-program candidate follow ``TUNED_COMPILER`` (triton 3.6 and 3.9+), not only the
    functions' ``tuned=`` argument (a launcher that passed ``tuned=True`` would fail here)."""
    script = tmp_path / "under_version.py"
    script.write_text(_UNDER_VERSION)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # (a compiling process's list)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(script), version], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[-2] == want, r.stdout + r.stderr[-2000:]


def test_candidates_change_only_the_tile_and_only_where_the_bits_cannot_change():
    tuned = set()
    for cfg in _grid():
        cands = launch.candidates(cfg, tuned=True)  # (the compilers the tiles were read off)
        assert cands[0] == cfg
        # another compiler (launch.TUNED_COMPILER false: triton 3.7, 3.8): fp32 x without twice the
        # program, which spilled 8 B under 3.8 on sm_80
        other = launch.candidates(cfg, tuned=False)
        assert other == (cands if cfg.x_dtype != FP32 else tuple(
            c for c in cands if c.num_warps <= cfg.num_warps)), cfg.name
        assert launch.candidates(cfg) == (cands if launch.TUNED_COMPILER else other)
        assert launch.candidates(cfg, interpret=True) == (cfg,)
        if cfg.product == "dot":
            # tl.dot's M: triton 3.2-3.4 reject fewer than 16 rows (the floor is 3.2); a dot's sums
            # could round differently on another tile: never tuned
            assert cfg.block_r >= launch.MIN_ROWS, cfg.name
            assert cands == (cfg,), cfg.name
            continue
        # the gather kernel: no dot, every element computed alone; tuned where models launch it
        assert cfg.permutation
        tunable = not cfg.angles and cfg.positions != 2 and (cfg.positions == 1 or cfg.table_dtype == FP32)
        want = []  # (a thread's rows x columns the chosen tile's: the same code and registers)
        if tunable and cfg.block_r >= 2 and cfg.num_warps >= 2:
            want.append((cfg.block_r // 2, cfg.num_warps // 2))  # half the program
        if tunable and 2 * cfg.num_warps <= launch.MAX_TUNED_WARPS:
            want.append((2 * cfg.block_r, 2 * cfg.num_warps))  # twice the program
        assert [(c.block_r, c.num_warps) for c in cands[1:]] == want, cfg.name
        assert all(c.block_r * cfg.num_warps == cfg.block_r * c.num_warps for c in cands), cfg.name
        for alt in cands[1:]:
            tuned.add(alt)
            same = {f.name for f in dataclasses.fields(cfg)} - set(TILE)
            assert all(getattr(alt, f) == getattr(cfg, f) for f in same), alt
    assert len(tuned) == 120  # x dtype x D x pass x (fp32 tables, one-axis positions) x 2 alternatives
    bf16_128 = launch.choose(BF16, FP32, 128, transpose=False, gather=True, exact_in_x=True, exact_in_bf16=True)
    assert bf16_128.product == "gather"
    assert [(c.block_r, c.num_warps) for c in launch.candidates(bf16_128)] == [(8, 4), (4, 2), (16, 8)]
    dot = launch.choose(BF16, FP32, 128, transpose=False, gather=True, exact_in_x=True, exact_in_bf16=True,
                        product="dot")
    assert dot.product == "dot" and launch.candidates(dot) == (dot,)


# --- the launch path, with a stand-in benchmarker --------------------------------------------


class Bench:
    """Runs each timed candidate once (into the scratch outputs) and makes the last one win, or
    the ``winner``-th of each tuning counted from ``start``."""

    def __init__(self):
        self.calls = 0
        self.winner = self.start = None

    def __call__(self, fn, quantiles=None):
        fn()
        self.calls += 1
        if self.winner is None:
            return [1.0 / self.calls] * 3
        return [0.0 if self.calls - 1 - self.start == self.winner else 1.0] * 3


# triton 3.2/3.3's autotuner passes warp-specialisation options (num_buffers_warp_spec, ...) that
# their JIT takes on a GPU but their interpreter rejects: the launch path is checked from 3.4 on
INTERPRETER_TUNES = not (kernel.INTERPRET and "num_buffers_warp_spec" in triton.Config({}).all_kwargs())


@pytest.fixture
def bench(monkeypatch):
    if not INTERPRETER_TUNES:
        pytest.skip(f"triton {triton.__version__}'s interpreter rejects its autotuner's launch options")
    b = Bench()
    monkeypatch.setattr(kernel, "_DO_BENCH", b)  # (kernel: rome.launcher)
    monkeypatch.setattr(tuning, "MIN_ELEMENTS", 1)
    monkeypatch.delenv(tuning.ENV, raising=False)
    if kernel.INTERPRET:  # two candidates where the interpreter has one: half the rows
        real = launch.candidates
        monkeypatch.setattr(launch, "candidates", lambda cfg, interpret=False: (
            real(cfg), (cfg, dataclasses.replace(cfg, block_r=cfg.block_r // 2)))[cfg.permutation])
    tuning.reset()
    yield b
    tuning.reset()


def _inputs(d=64, mode="interleave", dtype=FP32):
    m = rome.rotation_matrix([d], mode, device=DEVICE)
    q = torch.randn(1, 2, 40, d, device=DEVICE).to(dtype)
    k = torch.randn(1, 1, 40, d, device=DEVICE).to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
    cos, sin = random_tables((40, d))
    return q, k, cos, sin, m


def _want(q, k, cos, sin, m, monkeypatch):
    with monkeypatch.context() as mp:
        mp.setenv(tuning.ENV, "0")
        return rome.apply_qk(q, k, cos, sin, m, backend="triton")


def test_the_first_launch_times_the_candidates_and_every_later_one_reuses_the_choice(bench, monkeypatch):
    q, k, cos, sin, m = _inputs()
    want = _want(q, k, cos, sin, m, monkeypatch)
    assert bench.calls == 0 and not tuning.chosen()  # ROME_AUTOTUNE=0: choose()'s config, nothing timed
    q0, k0 = q.clone(), k.clone()
    got = rome.apply_qk(q, k, cos, sin, m, backend="triton")
    n = len(launch.plan(m, FP32, FP32, transpose=False, interpret=kernel.INTERPRET).candidates)
    assert bench.calls == n
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(q, q0) and torch.equal(k, k0)  # inputs untouched by the timed runs
    cfg = launch.plan(m, FP32, FP32, transpose=False, interpret=kernel.INTERPRET).candidates[-1]
    assert list(tuning.chosen().values()) == [launch.tile_name(cfg)]  # the last one won
    again = rome.apply_qk(q, k, cos, sin, m, backend="triton")
    assert bench.calls == n and torch.equal(again[0], want[0])
    # the backward is another key: timed once, same bits as untuned
    qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
    go = torch.randn_like(q), torch.randn_like(k)
    torch.autograd.backward(rome.apply_qk(qg, kg, cos, sin, m, backend="triton"), go)
    nt = len(launch.plan(m, FP32, FP32, transpose=True, interpret=kernel.INTERPRET).candidates)
    assert bench.calls == n + nt and len(tuning.chosen()) == 2
    with monkeypatch.context() as mp:
        mp.setenv(tuning.ENV, "0")
        qw, kw = q.clone().requires_grad_(), k.clone().requires_grad_()
        torch.autograd.backward(rome.apply_qk(qw, kw, cos, sin, m, backend="triton"), go)
    assert torch.equal(qg.grad, qw.grad) and torch.equal(kg.grad, kw.grad)


def test_an_in_place_launch_that_tunes_is_rotated_once(bench, monkeypatch):
    q, k, cos, sin, m = _inputs(64, "interleave")  # the gather kernel writes q and k directly
    want = _want(q, k, cos, sin, m, monkeypatch)
    rome.apply_qk_(q, k, cos, sin, m, backend="triton")
    assert bench.calls > 1  # it tuned on this launch (scratch outputs: q and k written once)
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])


def test_small_launches_and_general_matrices_are_not_tuned(bench, monkeypatch):
    q, k, cos, sin, m = _inputs()
    monkeypatch.setattr(tuning, "MIN_ELEMENTS", q.numel() + k.numel() + 1)
    rome.apply_qk(q, k, cos, sin, m, backend="triton")
    assert bench.calls == 0 and not tuning.chosen()  # below the size worth timing: not remembered
    monkeypatch.setattr(tuning, "MIN_ELEMENTS", 1)
    g = torch.randn(64, 64, device=DEVICE)  # a general matrix: one candidate
    assert len(launch.plan(g, FP32, FP32, transpose=False, interpret=kernel.INTERPRET).candidates) == 1
    rome.apply_qk(q, k, cos, sin, g, backend="triton")
    assert bench.calls == 0
    rome.apply_qk(q, k, cos, sin, m, backend="triton")  # large enough now: tuned
    assert bench.calls > 1 and len(tuning.chosen()) == 1


def test_the_autotuner_is_keyed_on_head_dim_dtype_and_pass(bench, monkeypatch):
    """One choice per specialisation: another head_dim, x dtype or pass tunes again."""
    seen = 0
    for d, dtype in ((64, FP32), (32, FP32), (64, BF16)):
        q, k, cos, sin, m = _inputs(d, "half", dtype)
        want = _want(q, k, cos, sin, m, monkeypatch)
        got = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        p = launch.plan(m, dtype, FP32, transpose=False, interpret=kernel.INTERPRET)
        halves = launch.halves_config(p, dtype, interpret=kernel.INTERPRET)  # (bf16's whole-head half rotation)
        seen += len(p.candidates if halves is None else launch.halves_candidates(halves, kernel.INTERPRET))
        assert bench.calls == seen and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert len(tuning.chosen()) == 3
    assert tuning.tuner(kernel.kernel._rome_gather_kernel, launch.plan(m, BF16, FP32, transpose=False, interpret=kernel.INTERPRET).candidates,
                        bench).keys == ["D"]  # (Triton adds every tensor argument's dtype to the key)


@pytest.mark.parametrize("dtype, mode", [(FP32, "half"), (BF16, "interleave")])
def test_every_candidate_gives_the_same_bits(bench, monkeypatch, dtype, mode):
    """Each candidate made the winner in turn: forward and backward bitwise choose()'s."""
    q, k, cos, sin, m = _inputs(128, mode, dtype)
    go = torch.randn_like(q), torch.randn_like(k)

    def run():
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        out = rome.apply_qk(qg, kg, cos, sin, m, backend="triton")
        torch.autograd.backward(out, go)
        return out[0].detach(), out[1].detach(), qg.grad, kg.grad

    with monkeypatch.context() as mp:
        mp.setenv(tuning.ENV, "0")
        want = run()
    for transpose in (False, True):
        cands = launch.plan(m, dtype, FP32, transpose=transpose, interpret=kernel.INTERPRET).candidates
        assert len(cands) > 1
        for i, cand in enumerate(cands):
            tuning.reset()
            bench.winner, bench.start = i, bench.calls
            if transpose:  # the forward's key tuned first (its pick: the first candidate)
                bench.winner = len(launch.plan(m, dtype, FP32, transpose=False, interpret=kernel.INTERPRET)
                                   .candidates) + i
            got = run()
            picked = [t for name, t in tuning.chosen().items() if (" bwd " in name) == transpose]
            assert picked == [launch.tile_name(cand)], (picked, i)
            for g, w in zip(got, want):
                assert torch.equal(g, w), (launch.tile_name(cand), transpose)


def test_no_memory_for_the_scratch_outputs_keeps_the_first_config(bench, monkeypatch):
    q, k, cos, sin, m = _inputs()
    cands = launch.plan(m, FP32, FP32, transpose=False, interpret=kernel.INTERPRET).candidates

    def oom(autotuner):
        raise torch.cuda.OutOfMemoryError("no room")

    with pytest.warns(UserWarning, match="no memory to time"):
        got = tuning.pick(kernel.kernel._rome_gather_kernel, cands, q.device, 1 << 30, oom, bench)
    assert got is cands[0] and list(tuning.chosen().values()) == [launch.tile_name(cands[0])]
    assert tuning.pick(kernel.kernel._rome_gather_kernel, cands, q.device, 1 << 30, oom, bench) is cands[0]  # not retried


@pytest.mark.parametrize("value, on", [("0", False), ("off", False), ("False", False), ("no", False),
                                       ("1", True), ("on", True), ("TRUE", True), ("", True)])
def test_the_environment_switch(monkeypatch, value, on):
    monkeypatch.setenv(tuning.ENV, value)
    assert tuning.enabled() is on


def test_an_unknown_environment_value_is_an_error_naming_it(monkeypatch):
    monkeypatch.setenv(tuning.ENV, "sometimes")
    with pytest.raises(ValueError, match="ROME_AUTOTUNE='sometimes'"):
        tuning.enabled()
    monkeypatch.delenv(tuning.ENV)
    assert tuning.enabled()
