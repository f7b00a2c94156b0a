"""The gather kernel (x @ M as the signed column gather, every rotation matrix) and what an
independent fuzz found in the kernels (issue 21 items 1-3), each against the torch backend (its
own float64 arithmetic) or the float64 formula written here:

- the per-column ``axis`` is read through its strides (a strided or expanded view gave wrong
  output or read out of bounds);
- cos and sin of different dtypes are each read as their own (sin's fp32 bytes were read as bf16);
- a result that overflows, or an infinite table entry, gives the exact result's ±inf, not NaN;
- the launch layout: T rows x head groups that cross from q to k, BSND (two head dims),
  per-batch tables, GQA, in place, both products bitwise.
"""

import contextlib
import threading

import pytest
import torch

import rome
from rome import launch, launcher
from rome.precision import ulp_error

from conftest import DEVICE
from helpers import random_tables

BF16, FP32, FP16 = torch.bfloat16, torch.float32, torch.float16


def _oracle(x, cos, sin, m):
    """x*cos + (x@M)*sin in float64 (exact for these inputs up to one final rounding)."""
    x64 = x.double()
    return x64 * cos.double() + (x64 @ m.double()) * sin.double()


def _layout3(d=48):
    return rome.layouts.section_layout((d // 3,) * 3, mode="half")


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("how", ["strided", "expanded", "flipped"])
def test_axis_is_read_through_its_strides(backend, how):
    d = 48
    m = rome.rotation_matrix((16, 16, 16), "half", device=DEVICE)
    q = torch.randn(1, 2, 9, d, device=DEVICE)
    k = torch.randn(1, 1, 9, d, device=DEVICE)
    cache_c, cache_s = random_tables((32, d))
    pos = torch.randint(0, 32, (9, 3), device=DEVICE)
    base = torch.arange(d, device=DEVICE) // 16  # the contiguous axis
    if how == "strided":  # every other element of a longer tensor
        axis = torch.stack([base, torch.full_like(base, 7)], 1).reshape(-1)[::2]
        assert axis.stride(0) == 2
    elif how == "expanded":  # one axis for every column, stride 0
        base = torch.zeros(d, dtype=torch.int64, device=DEVICE)
        axis = torch.zeros(1, dtype=torch.int64, device=DEVICE).expand(d)
        assert axis.stride(0) == 0
    else:  # a negative stride is not possible in torch: a transposed [d, 1] column instead
        axis = base[:, None].t().contiguous().t()[:, 0]
    got = rome.apply_qk_at(q, k, cache_c, cache_s, m, pos, axis=axis, backend=backend)
    want = rome.apply_qk_at(q, k, cache_c, cache_s, m, pos, axis=base.contiguous(), backend="torch")
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    freqs = torch.rand(2, d, device=DEVICE) * 1e-3
    scales = torch.ones(2, d, device=DEVICE)
    scales[1] = 0
    got = rome.apply_qk_angles(q, k, freqs, scales, m, pos, axis=axis, backend=backend)
    want = rome.apply_qk_angles(q, k, freqs, scales, m, pos, axis=base.contiguous(), backend=backend)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("x_dtype", [BF16, FP16, FP32])
@pytest.mark.parametrize("cos_dtype, sin_dtype", [(BF16, FP32), (FP32, BF16), (FP16, FP32), (FP32, FP16)])
@pytest.mark.parametrize("product", ["gather", "dot"])
def test_tables_of_two_dtypes_are_each_read_as_their_own(x_dtype, cos_dtype, sin_dtype, product):
    if {cos_dtype, sin_dtype} - {x_dtype, FP32}:
        pytest.skip("tables are fp32 or x's dtype")
    d = 32
    m = rome.rotation_matrix((d,), "half", device=DEVICE)
    x = torch.randn(2, 3, 5, d, device=DEVICE).to(x_dtype)
    cos, sin = random_tables((5, d))
    cos, sin = cos.to(cos_dtype), sin.to(sin_dtype)
    with launch.product(product):
        got = rome.apply(x, cos, sin, m, backend="triton")
    want = rome.apply(x, cos, sin, m, backend="torch")
    assert torch.equal(got, want)
    gx = x.clone().requires_grad_()
    dy = torch.randn_like(x)
    with launch.product(product):
        rome.apply(gx, cos, sin, m, backend="triton").backward(dy)
    wx = x.clone().requires_grad_()
    rome.apply(wx, cos, sin, m, backend="torch").backward(dy)
    assert torch.equal(gx.grad, wx.grad)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_overflow_and_infinite_tables_give_the_exact_infinity(backend, dtype):
    d = 16
    m = rome.rotation_matrix((d,), "half", device=DEVICE)
    big = torch.finfo(dtype).max
    x = torch.full((1, 2, 4, d), big, device=DEVICE).to(dtype)
    x[0, 1] = -x[0, 1]
    cos = torch.full((4, d), 0.9, device=DEVICE)
    sin = torch.full((4, d), 0.9, device=DEVICE)
    sin[:, : d // 2] = -0.9  # x*cos + rotate_half(x)*sin = 0.9 * (x + x) = 1.8 x: overflows
    cos[2, 3] = float("inf")  # and one infinite table entry
    want = _oracle(x, cos, sin, m).to(dtype)  # ±inf where it overflows, finite elsewhere
    got = rome.apply(x, cos, sin, m, backend=backend)
    assert not got.isnan().any()
    assert torch.equal(got, want), (got[got != want][:4], want[got != want][:4])


@pytest.mark.parametrize("scale", ["tiny", "normal", "largest"])
def test_the_dots_fp32_split_at_the_ends_of_the_range(scale):
    """Under product("dot") fp32 x reaches the tensor cores as three bf16 pieces cut from its bits
    (kernel.py ``_dot``). With cos = 0 and sin = 1 the output is x @ M itself, each element one
    signed element of x: bitwise that in the normal range and next to fp32's largest value (a
    first piece rounded up there would be inf, and the row NaN); below bf16's smallest subnormal
    (2**-133) within 2**-134 of it (the last piece rounded to nearest; truncated, up to 2**-133)."""
    d = 64
    m = rome.rotation_matrix((d,), "half", device=DEVICE)
    g = torch.Generator().manual_seed(7)
    mantissa = 1 + torch.rand(2, 3, 16, d, generator=g, dtype=torch.float64)
    exponent = {"tiny": torch.randint(-127, -112, mantissa.shape, generator=g),
                "normal": torch.randint(-20, 20, mantissa.shape, generator=g),
                "largest": torch.full(mantissa.shape, 127)}[scale]
    sign = torch.where(torch.rand(mantissa.shape, generator=g) < 0.5, -1.0, 1.0).double()
    x = (sign * mantissa * 2.0 ** exponent.double()).float().to(DEVICE)  # rounded once to fp32
    cos, sin = torch.zeros(16, d, device=DEVICE), torch.ones(16, d, device=DEVICE)
    want = _oracle(x, cos, sin, m)  # x @ M: exact in float64, and each element an fp32 value
    with launch.product("dot"):
        got = rome.apply(x, cos, sin, m, backend="triton")
    assert got.isfinite().all()
    if scale == "tiny":
        err = (got.double() - want).abs().max().item()
        assert err <= 2.0**-134, err
    else:
        assert torch.equal(got.double(), want)


@pytest.mark.parametrize("product", ["gather", "dot"])
@pytest.mark.parametrize("layout", ["bnsd", "bsnd", "per-batch", "gqa-bsnd", "3d", "few-heads"])
def test_launch_layouts_bitwise_the_torch_backend(layout, product):
    """T rows x head groups (3 heads a program under the interpreter: q's 4 heads in groups of
    3 and 1, k's 2 in a group of their own (``launch.head_groups``), wrapping a second head dim;
    "few-heads": 2 + 1 heads, one group walking q's and then k's), forward and backward, both
    products the same bits."""
    d = 32
    m = rome.rotation_matrix((16, 16), "interleave", device=DEVICE)
    b, s, nq, nk = 2, 7, 4, 2
    if layout == "few-heads":
        layout, nq, nk = "gqa-bsnd", 2, 1
    if layout == "bnsd":
        q, k = torch.randn(b, nq, s, d), torch.randn(b, nk, s, d)
        cos, sin = random_tables((s, d))
    elif layout in ("bsnd", "gqa-bsnd"):
        q, k = torch.randn(b, s, nq, d).transpose(1, 2), torch.randn(b, s, nk if layout == "gqa-bsnd" else nq, d).transpose(1, 2)
        cos, sin = random_tables((s, d))
    elif layout == "per-batch":
        q, k = torch.randn(b, nq, s, d), torch.randn(b, nk, s, d)
        cos, sin = random_tables((b, 1, s, d))
    else:  # 3 row dims of x besides heads, tables over two of them
        q, k = torch.randn(b, 3, nq, s, d), torch.randn(b, 3, nk, s, d)
        cos, sin = random_tables((3, 1, s, d))
    q, k = q.to(DEVICE), k.to(DEVICE)
    dq, dk = torch.randn_like(q), torch.randn_like(k)

    def run(backend):
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        with launch.product(product):
            out = rome.apply_qk(qg, kg, cos, sin, m, backend=backend)
            torch.autograd.backward(out, (dq, dk))
        return (*out, qg.grad, kg.grad)

    for g, w in zip(run("triton"), run("torch")):
        assert torch.equal(g, w)
    q2, k2 = q.clone(), k.clone()
    with launch.product(product):
        rome.apply_qk_(q2, k2, cos, sin, m, backend="triton")
    want = rome.apply_qk(q, k, cos, sin, m, backend="torch")
    assert torch.equal(q2, want[0]) and torch.equal(k2, want[1])


def test_heads_per_program():
    # enough T tiles: every head in one program (the tables read once)
    assert launch.heads_per_program(1800, 48, 132) == 48
    # a decode step (4 T tiles of 16 rows, 32 + 8 heads): three heads per program (the loop's
    # first batch), 56 programs; fewer heads than that: all of them
    assert launch.heads_per_program(4, 40, 132) == 3
    assert launch.heads_per_program(4, 2, 132) == 2
    # in between: groups even, at least 8 programs per SM
    hb = launch.heads_per_program(200, 48, 132)
    assert 200 * -(-48 // hb) >= 8 * 132 and hb * -(-48 // hb) - 48 < -(-48 // hb)
    # q's and k's heads apart (head_groups' split): the programs counted as the split makes them.
    # Llama's prefill (1,024 T tiles of 8 rows, 32 + 8 heads): one group each, 2,048 programs of
    # the 1,056 wanted, where the count over both took 20 a program (q's 2 groups and k's 1: 3,072)
    assert launch.heads_per_program(1024, 40, 132) == 20
    assert launch.heads_per_program(1024, 40, 132, 32) == 32
    assert launch.head_groups(1024, 32, 8, 132) == (32, 1, 2)
    for t, q, k in ((1024, 32, 8), (500, 32, 8), (200, 24, 24), (100, 28, 4), (60, 12, 3), (300, 40, 40)):
        hb = launch.heads_per_program(t, q + k, 132, q)

        def programs(n):
            return t * (-(-q // n) + -(-k // n))
        groups = -(-q // hb)  # q's: even, enough programs (but at the floor), one group fewer not
        assert hb == -(-q // groups) and (programs(hb) >= 8 * 132 or hb == launch.MIN_HEADS_PER_PROGRAM)
        assert groups == 1 or programs(-(-q // (groups - 1))) < 8 * 132
    # a decode step: the floor, as before; enough T tiles: every head, as before
    assert launch.heads_per_program(4, 40, 132, 32) == 3
    assert launch.heads_per_program(1800, 48, 132, 32) == 48


def _first_program_loads(monkeypatch):
    """The pointer tiles program (0, 0) loads, in order, as the interpreter runs it (a list that
    fills as kernels run)."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    real = builder.create_masked_load
    loads = []

    def load(ptrs, mask, other, *rest):
        if tuple(builder.grid_idx) == (0, 0, 0):
            loads.append(ptrs.data.copy())
        return real(ptrs, mask, other, *rest)

    monkeypatch.setattr(builder, "create_masked_load", load)
    return loads


def _reads(p, t):
    """Whether the pointer tile p's first address lies in tensor t."""
    return t.data_ptr() <= int(p.flat[0]) < t.data_ptr() + t.numel() * t.element_size()


@pytest.mark.skipif(not launcher.INTERPRET, reason="reads the interpreter's loads (on a GPU: the SASS, docs/kernels.md)")
def test_the_dot_issues_its_first_batch_and_matrix_before_its_tables(monkeypatch):
    """The head groups' dot holds one program an SM (sm_90's wide tile), so its prologue is not
    hidden: the kernel issues its first batch's x (two heads, bf16) and M before the tables, whose
    layout conversions' barriers held those loads back a round trip each, and the transpose reads
    sin at its own columns (a contiguous row) and moves it to src in registers, where a gather at
    src took its addresses through shared memory and two round trips. Program (0, 0)'s loads as
    the interpreter runs them, forward and backward; the bits are the gather's (the tests above)."""
    loads = _first_program_loads(monkeypatch)
    d = 32
    m = rome.rotation_matrix((d,), "half", device=DEVICE)
    q = torch.randn(1, 3, 6, d, device=DEVICE).to(BF16).requires_grad_()
    k = torch.randn(1, 2, 6, d, device=DEVICE).to(BF16).requires_grad_()
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    cos, sin = random_tables((6, d))

    def order(x):  # the loads' kinds: x's tiles, M ([D, D]), the tables
        named = []
        for p in loads:
            if p.shape == (d, d):
                named.append("M")
                continue
            for name, t in (("x", x), ("cos", cos), ("sin", sin)):
                if _reads(p, t):
                    named.append(name)
        return named

    with launch.product("dot"):
        qo, ko = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        assert order(q)[:5] in (["x", "x", "M", "sin", "cos"], ["x", "x", "M", "cos", "sin"]), order(q)
        loads.clear()
        torch.autograd.grad((qo, ko), (q, k), (dq, dk))
    assert order(dq)[:5] in (["x", "x", "M", "sin", "cos"], ["x", "x", "M", "cos", "sin"]), order(dq)
    s = next(p for p in loads if _reads(p, sin))
    assert (s[:, 1:] - s[:, :-1] == 4).all()  # a row's own columns, in order: not gathered at src


@pytest.mark.skipif(not launcher.INTERPRET, reason="reads the interpreter's loads (on a GPU: the SASS, docs/kernels.md)")
def test_the_gather_issues_its_first_batch_before_its_tables_where_first_batch_first_says(monkeypatch):
    """``FIRST`` (launch.first_batch_first: sm_90 and the interpreter, not fp16): the head groups'
    gather issues its whole first batch before the tables, whose layout conversions held the
    second head's loads back a round trip; fp16 keeps the first head first and the rest after
    the tables (its forwards spilled 8 B on sm_90 with them early). Program (0, 0)'s loads under
    the interpreter (2 + 1 heads: one group, not the SEAM build); the bits are the torch backend's."""
    assert launch.first_batch_first(90, BF16) and launch.first_batch_first(None, FP32)
    assert not launch.first_batch_first(90, FP16) and not launch.first_batch_first(80, BF16)
    assert not launch.first_batch_first("gfx942", BF16) and not launch.first_batch_first(100, BF16)
    loads, consts = _first_program_loads(monkeypatch), []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, c, *rest: (consts.append(dict(c)),
                                                                             run(fn, grid, args, c, *rest))[1])
    d = 32
    m = rome.rotation_matrix((d,), "half", device=DEVICE)
    cos, sin = random_tables((6, d))
    for dtype, first in ((BF16, True), (FP16, False)):
        loads.clear()
        consts.clear()
        q = torch.randn(1, 2, 6, d, device=DEVICE).to(dtype)
        k = torch.randn(1, 1, 6, d, device=DEVICE).to(dtype)
        with launch.partner_form():  # (bf16's whole-head half rotation would take its halves)
            got = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        want = rome.apply_qk(q, k, cos, sin, m, backend="torch")
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert consts[0]["FIRST"] is first and not consts[0]["SEAM"] and consts[0]["DEPTH"] >= 2
        assert not consts[0]["HALVES"]

        def kind(p):
            for name, t in (("x", q), ("cos", cos), ("sin", sin)):
                if _reads(p, t):
                    return name
        named = [n for n in map(kind, loads) if n]
        tables = min(named.index("cos"), named.index("sin"))
        assert named[:2] == ["x", "x"] if first else named[:2] == ["x", named[tables]], (dtype, named)
        assert (tables == 2) is first, (dtype, named)


def test_the_dots_heads_a_program_count_its_prologue():
    """The head groups' dot (one program an SM with sm_90's wide tile): heads a program by
    ``dot_heads_per_program``, the waves of (prologue + heads) fewest, where the gather's eight
    programs an SM gave llama-1d's prefill five heads a program and eight prologues an SM."""
    wide = launch.choose_gather(torch.bfloat16, torch.float32, 128, transpose=False, product="dot", arch=90)
    narrow = launch.choose_gather(torch.bfloat16, torch.float32, 128, transpose=False, product="dot", arch=80)
    assert (wide.block_r, wide.num_warps, launch.dot_programs_per_sm(wide)) == (64, 16, 1)
    assert (narrow.block_r, narrow.num_warps, launch.dot_programs_per_sm(narrow)) == (32, 8, 2)
    # llama-1d (8192 rows: 128 tiles of 64, 32 + 8 heads): every head a program, one wave
    assert launch.gather_groups(wide, 8192, 32, 8, 132) == (wide, 40, 0, 1)
    # default (28800 rows: 450 tiles, 24 + 24 heads): two groups of 24 (7 waves of 24 + 5) where
    # 16 took 11 of 16 + 5 and 48 takes 4 of 48 + 5
    assert launch.gather_groups(wide, 28800, 24, 24, 132) == (wide, 24, 0, 2)
    # a decode step's one tile: the gather's floor of three heads a program
    assert launch.dot_heads_per_program(1, 40, 132) == 3
    assert launch.dot_heads_per_program(1, 2, 132) == 2
    # the gather keeps its own rule, and a given group size (the interpreter's 3) stands
    gather = launch.choose_gather(torch.bfloat16, torch.float32, 128, transpose=False, arch=90)
    assert launch.gather_groups(gather, 8192, 32, 8, 132)[1] == launch.heads_per_program(1024, 40, 132, 32)
    assert launch.gather_groups(wide, 8192, 32, 8, 132, heads=3)[1:] == (3, 0, 14)
    # no other group count gives fewer waves of (prologue + heads)
    for t, h, slots in ((128, 40, 132), (450, 48, 132), (512, 80, 264), (7, 12, 132), (1052, 48, 132)):
        hb = launch.dot_heads_per_program(t, h, slots)

        def cost(n):
            return -(-t * -(-h // n) // slots) * (launch.DOT_PROLOGUE_HEADS + n)
        assert all(cost(hb) <= cost(n) for n in range(min(h, launch.MIN_HEADS_PER_PROGRAM), h + 1))


def test_head_groups_keep_q_and_k_apart_where_a_group_is_not_every_head():
    # (HB, KG, groups): a decode step's 32 + 8 heads in groups of 3: q's 11 groups, then k's 3
    # (as many as 14 over both, none holding q's last heads and k's first)
    assert launch.head_groups(4, 32, 8, 132) == (3, 11, 14)
    # every head in one group: q's then k's in one program, the tables read once
    assert launch.head_groups(1800, 32, 16, 132) == (48, 0, 1)
    assert launch.head_groups(4, 2, 1, 132) == (3, 0, 1)
    # q alone (its groups the SEAM build's too), the launcher's given group size (the
    # interpreter's 3), and the head groups' dot (apart=False: the groups over both, as before)
    assert launch.head_groups(4, 40, 0, 132) == (3, 14, 14)
    assert launch.head_groups(1, 4, 2, 1, heads=3) == (3, 2, 3)
    assert launch.head_groups(4, 32, 8, 132, apart=False) == (3, 0, 14)
    for t, q, k in ((4, 32, 8), (4, 28, 4), (16, 40, 40), (60, 12, 3)):
        hb, kg, groups = launch.head_groups(t, q, k, 132)
        spans = ([range(g * hb, min(g * hb + hb, q)) for g in range(kg)]
                 + [range(q + g * hb, min(q + g * hb + hb, q + k)) for g in range(groups - kg)]) if kg \
            else [range(g * hb, min(g * hb + hb, q + k)) for g in range(groups)]
        assert sorted(h for r in spans for h in r) == list(range(q + k)) and all(len(r) for r in spans)
        assert not kg or all(r[-1] < q or r[0] >= q for r in spans)


def test_angles_take_full_rows_outside_the_seam_build(monkeypatch):
    """choose_gather halves the angles' rows; launch.gather_groups gives a launch twice that
    (launch.angle_rows: 16-bit x, the gather, D <= 128, no norm, not the interpreter's fixed tile)
    where neither tile makes it a SEAM build; the decode step's SEAM build, and a launch that the
    wide tile would make one, keep the half rows. ANGLE_FULL_ROWS=False keeps them everywhere."""
    half = launch.choose_gather(BF16, FP32, 128, transpose=False, positions=2, angles=True, arch=90)
    tables = launch.choose_gather(BF16, FP32, 128, transpose=False, positions=2, arch=90)
    assert half.block_r == tables.block_r // 2 and launch.angle_rows(half).block_r == tables.block_r
    bwd = launch.choose_gather(torch.float16, FP32, 64, transpose=True, positions=1, angles=True, arch=90)
    assert launch.angle_rows(bwd).block_r == 2 * bwd.block_r
    for cfg, kw in ((half, {"norm": True}), (half, {"interpret": True}), (tables, {}),
                    (launch.choose_gather(torch.float32, FP32, 128, transpose=False, positions=2, angles=True,
                                          arch=90), {}),
                    (launch.choose_gather(BF16, FP32, 256, transpose=False, positions=2, angles=True, arch=90), {}),
                    (launch.choose_gather(BF16, FP32, 128, transpose=False, positions=2, angles=True, arch=90,
                                          product="dot"), {})):
        assert launch.angle_rows(cfg, **kw) is cfg, (cfg, kw)
    # default's 28800 tokens, 24 + 24 heads: every head a program at either tile, so the wide one
    wide = launch.gather_groups(half, 28800, 24, 24, 132)
    assert wide == (launch.angle_rows(half), 48, 0, 1)
    # a decode step (64 rows, 32 + 8 heads): SEAM at the half rows, kept
    assert launch.gather_groups(half, 64, 32, 8, 132) == (half, *launch.head_groups(-(-64 // half.block_r), 32, 8, 132))
    # llama-1d's 8192 tokens: not SEAM at the half rows, SEAM at the wide ones (fewer T tiles than
    # 8 programs a SM): the half rows kept
    n_t = 8192
    assert launch.head_groups(-(-n_t // half.block_r), 32, 8, 132)[1] == 0
    assert launch.head_groups(-(-n_t // (2 * half.block_r)), 32, 8, 132)[1] > 0
    assert launch.gather_groups(half, n_t, 32, 8, 132) == (half, *launch.head_groups(-(-n_t // half.block_r), 32, 8, 132))
    # tables are never widened
    assert launch.gather_groups(tables, 28800, 24, 24, 132)[0] is tables
    monkeypatch.setattr(launch, "ANGLE_FULL_ROWS", False)
    assert launch.angle_rows(half) is half and launch.gather_groups(half, 28800, 24, 24, 132)[0] is half


def test_product_switch():
    m = rome.rotation_matrix((16,), "half")
    assert launch.plan(m, BF16, FP32, transpose=False, interpret=False).config.product == "gather"
    with launch.product("dot"):
        assert launch.plan(m, BF16, FP32, transpose=False, interpret=False).config.product == "dot"
    assert launch.plan(torch.randn(16, 16), BF16, FP32, transpose=False, interpret=False).config.product == "dot"
    with pytest.raises(ValueError, match="product must be one of"):
        with launch.product("matmul"):
            pass


def test_the_backward_takes_the_forwards_product(monkeypatch):
    """A forward under product("dot") runs its backward with the dot too (autograd runs the
    backward outside the block, in its own thread on a GPU); at D = 256 (M too big for the head-group
    kernel's one operand) both run on the row-tile dot kernel."""
    from rome import kernel, launcher

    seen = []
    real = launcher._run

    def run(fn, grid, args, consts, cfg, transpose, *rest):
        seen.append((fn, consts.get("DOT"), transpose))
        return real(fn, grid, args, consts, cfg, transpose, *rest)

    monkeypatch.setattr(launcher, "_run", run)
    for d, fn, dot in ((16, kernel._rome_gather_kernel, True), (256, kernel._rome_kernel, None)):
        seen.clear()
        m = rome.rotation_matrix((d,), "half", device=DEVICE)
        x = torch.randn(2, 5, d, device=DEVICE, requires_grad=True)
        cos, sin = random_tables((5, d))
        with launch.product("dot"):
            y = rome.apply(x, cos, sin, m, backend="triton")
        y.backward(torch.randn_like(y))
        assert seen == [(fn, dot, False), (fn, dot, True)]  # forward and transposed, both with the dot
    seen.clear()  # (the whole head's halves: a forward in its partner form, the backward too; run here in
    # another thread, as autograd's on a GPU; rome.launch.launch_state)
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, consts, *rest: (seen.append(consts["HALVES"]),
                                                                                real(fn, grid, args, consts, *rest))[1])
    groups = launch.gather_groups  # (one group of all six heads: more than a decode step's, launch.halves_walk)
    monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, **kw:
                        groups(cfg, n_t, ha, hb, sms, heads=ha + hb, **kw))
    x = torch.randn(2, 3, 5, 32, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    cos, sin = random_tables((5, 32))
    for sections, block, halves in (((32,), launch.partner_form, False), ((32,), contextlib.nullcontext, True),
                                    ((12, 12, 8), launch.pairs_halves, True),
                                    ((12, 12, 8), contextlib.nullcontext, False)):
        seen.clear()  # (the sections' pairs: a forward in a pairs_halves() block, the backward too)
        m = rome.rotation_matrix(sections, "half", device=DEVICE)
        with block():
            y = rome.apply_qk(x, x, cos, sin, m, backend="triton")
        worker = threading.Thread(target=torch.autograd.backward, args=(y, [torch.ones_like(t) for t in y]))
        worker.start(), worker.join()
        assert len(seen) == 2 and seen == [halves] * 2, (sections, block, seen)
    before = launch.launch_state()  # (the block a backward enters: its state inside, the old one after,
    # an exception too)
    assert before == ("gather", False, False)
    with pytest.raises(RuntimeError):
        with launch.launch_state_scoped(("dot", True, True)):
            assert launch.launch_state() == ("dot", True, True) and launch.takes_pairs()
            assert launch.current_product() == "dot"
            raise RuntimeError
    assert launch.launch_state() == before


def test_the_dots_threads_are_the_same_on_64_lane_warps():
    """The head-group kernel's dot takes 256 threads: 8 warps of 32 lanes, 4 of 64 (8 waves of 64
    spilled VGPRs on gfx942); target_warp_size chooses for another GPU than the runtime's."""
    m = rome.rotation_matrix((64,), "half")
    with launch.product("dot"):
        cuda = launch.plan(m, BF16, FP32, transpose=False, interpret=False).config
        with launch.target_warp_size(64):
            amd = launch.plan(m, BF16, FP32, transpose=False, interpret=False).config
    assert (cuda.num_warps, amd.num_warps) == (8, 4)
    assert cuda.block_r == amd.block_r == 32 and cuda.heads and amd.heads
    assert launch.warp_size() == 32  # restored (this CPU build is not ROCm)
    with pytest.raises(ValueError, match="lanes must be 32 or 64"):
        with launch.target_warp_size(48):
            pass


def _signed_pair_permutation(pairs, swapped, d):
    """The [d, d] signed permutation whose column pair i reads input pair pairs[i] (in order, or
    its two columns exchanged where swapped[i]), signs alternating: built column by column, the
    way rome.structure reads a gather back from a matrix."""
    m = torch.zeros(d, d)
    for i, (p, sw) in enumerate(zip(pairs, swapped)):
        a, b = (2 * p + 1, 2 * p) if sw else (2 * p, 2 * p + 1)
        m[a, 2 * i], m[b, 2 * i + 1] = -1.0, 1.0
    return m


@pytest.mark.parametrize("seed", range(4))
def test_pair_class_of_built_permutations(seed):
    """The class the kernel's reads rely on, against permutations built to have it: pairs moved
    in order -> PAIRS_KEPT (its vector loads assume src in 2-runs from even columns), every pair
    itself swapped -> PAIRS_SWAPPED (the partner is x[:, j ^ 1]), a mix or pairs broken -> NONE."""
    from rome.structure import describe

    g = torch.Generator().manual_seed(seed)
    d = 2 * int(torch.randint(2, 40, (1,), generator=g))
    pairs = torch.randperm(d // 2, generator=g).tolist()
    for swapped, want in (([False] * (d // 2), launch.PAIRS_KEPT), ([True] * (d // 2), None)):
        m = _signed_pair_permutation(pairs, swapped, d)
        src = launch._signed_gather(describe(m), False)[0]
        assert src.shape == (d + 1,) and src.dtype == torch.int32
        # the gather the kernel reads: x @ M == sign * x[:, src]
        x = torch.randn(3, d)
        assert torch.equal(x[:, src[:d].long()] * describe(m).sign.to(x.dtype), x @ m)
        if want is None:  # swapped pairs are PAIRS_SWAPPED only where each stays in place
            want = launch.PAIRS_SWAPPED if pairs == list(range(d // 2)) else launch.PAIRS_NONE
        assert int(src[d]) == want == launch.pair_class(src[:d])
    # every pair in place and swapped: interleave
    m = _signed_pair_permutation(list(range(d // 2)), [True] * (d // 2), d)
    assert launch.pair_class(launch._signed_gather(describe(m), False)[0][:d]) == launch.PAIRS_SWAPPED
    # one pair broken (its columns read from two pairs): no class
    src = torch.arange(d)
    src[[1, 2]] = src[[2, 1]]
    assert launch.pair_class(src) == launch.PAIRS_NONE
    assert launch.pair_class(torch.arange(d - 1)) == launch.PAIRS_NONE  # odd D


@pytest.mark.parametrize("mode, sections, want", [
    ("half", (44, 44, 40), "KEPT"), ("half", (128,), "KEPT"), ("interleave", (16, 56, 56), "SWAPPED"),
    ("half", (14, 14, 20), "NONE"), ("half", (42,), "NONE")])
def test_rotation_matrices_classes(mode, sections, want):
    """The workloads' rotations (default, llama-1d: kept pairs; hunyuan-video: swapped) and half
    sections of 2 mod 4 columns (their halves odd: pairs broken), forward and transpose."""
    from rome.structure import describe

    m = rome.rotation_matrix(sections, mode)
    for transpose in (False, True):
        src = launch._signed_gather(describe(m), transpose)[0]
        assert int(src[-1]) == getattr(launch, f"PAIRS_{want}")


def _matrix_families():
    """Signed permutations of every family the gather reads: rotations (half and interleave, whole
    heads and sections, 1-4 axes), partial rotary (pass-through columns), sections whose halves
    are odd, pairs moved as built permutations, and the identity."""
    from rome.matrices import rotation_matrix

    out = [("identity", torch.eye(64))]
    for mode in ("half", "interleave"):
        for sections in ((128,), (64,), (80,), (96,), (256,), (40,), (72,), (44, 44, 40), (16, 56, 56), (12, 12, 24),
                         (8, 8, 32), (24, 52, 52), (32, 48, 48), (20, 20, 24), (4, 4, 8, 16), (42,), (14, 14, 20)):
            out.append((f"{mode} {sections}", rotation_matrix(sections, mode)))
    for rot, d in ((32, 128), (64, 128), (16, 64), (8, 64), (12, 48), (96, 128), (24, 64)):
        out.append((f"partial {rot}/{d}", torch.block_diag(rotation_matrix((rot,), "half"), torch.eye(d - rot))))
    g = torch.Generator().manual_seed(0)
    for d in (16, 48, 128):
        for _ in range(3):
            pairs = torch.randperm(d // 2, generator=g).tolist()
            out.append((f"pairs {d}", _signed_pair_permutation(pairs, [False] * (d // 2), d)))
        quads = torch.randperm(d // 8, generator=g).tolist()  # runs of 8 moved whole
        pairs = [4 * q + i for q in quads for i in range(4)]
        out.append((f"runs of 8, {d}", _signed_pair_permutation(pairs, [False] * (d // 2), d)))
    # the residues of src mod 8 are j's, but the runs are pairs: column pairs 0 and 4 exchanged
    out.append(("pairs 0 and 4 exchanged", _signed_pair_permutation([4, 1, 2, 3, 0, 5, 6, 7], [False] * 8, 16)))
    return out


def _runs_hold(take, n):
    """Whether ``take`` ([D] ints) moves whole runs of n columns from multiples of n: the
    definition, column by column."""
    d = take.shape[0]
    if d % n:
        return False
    t = take.view(-1, n)
    return bool((t[:, 0] % n == 0).all() and (t == t[:, :1] + torch.arange(n)).all())


@pytest.mark.parametrize("name, m", _matrix_families(), ids=lambda v: v if isinstance(v, str) else "")
def test_kept_run_is_the_longest_run_src_moves_whole(name, m):
    """The kept-pairs loads are KEPT_RUN elements wide and the compiler is told so: the run
    ``kept_run`` names must hold for the matrix's gather (forward's and transpose's), twice it
    must not (the longest run), 2 must hold exactly where the class is PAIRS_KEPT, and the src
    handed to the kernel (built from each run's first column) must be the gather itself."""
    from rome.structure import describe

    info = describe(m)
    for transpose in (False, True):
        src, _, cls, run = launch._signed_gather(info, transpose)
        take = (info.take_t if transpose else info.take).long()
        d = take.shape[0]
        assert torch.equal(src[:d].long(), take)
        assert (run >= 2) == (cls == launch.PAIRS_KEPT) == _runs_hold(take, 2), (name, run, cls)
        if run >= 2:
            assert _runs_hold(take, run), (name, run)
        if run in (2, 4):
            assert not _runs_hold(take, 2 * run), (name, run)
    half = launch.kept_run(launch._signed_gather(info, False)[0][:-1])
    want = {"half (128,)": 8, "half (44, 44, 40)": 2, "half (12, 12, 24)": 2, "half (8, 8, 32)": 4,
            "half (16, 56, 56)": 4, "partial 32/128": 8, "partial 8/64": 4, "partial 12/48": 2,
            "half (40,)": 4, "half (80,)": 8, "partial 24/64": 4, "pairs 0 and 4 exchanged": 2,
            "interleave (128,)": 1, "half (42,)": 1, "identity": 8}.get(name)
    assert want is None or half == want, (name, half)


def test_the_launcher_gives_the_kernel_the_plans_kept_run(monkeypatch):
    """The constants a gather launch runs with carry ``launch_kept_run`` of its plan: a whole
    head's half rotation 8 in bf16, 4 in fp32; sections with 10-column halves 2 (the
    interpreter's launches)."""
    from rome import launcher

    seen = []
    run = launcher._run

    def spy(fn, grid, args, consts, *rest, **kw):
        seen.append(consts["KEPT_RUN"])
        return run(fn, grid, args, consts, *rest, **kw)

    monkeypatch.setattr(launcher, "_run", spy)
    for x_dtype, sections, want in ((BF16, (64,), 8), (FP32, (64,), 4), (BF16, (20, 20, 24), 2)):
        m = rome.rotation_matrix(sections, "half", device=DEVICE)
        q = torch.randn(1, 2, 5, 64, device=DEVICE).to(x_dtype)
        k = torch.randn(1, 1, 5, 64, device=DEVICE).to(x_dtype)
        cos, sin = random_tables((5, 64))
        seen.clear()
        with launch.partner_form():  # (bf16's whole-head half rotation would take its halves)
            rome.apply_qk(q, k, cos, sin, m, backend="triton")
        assert seen and set(seen) == {want}, (x_dtype, sections, seen)
    # the norm's prologue reads the runs; its backward epilogue keeps pairs (launch_kept_run)
    m = rome.rotation_matrix((64,), "half", device=DEVICE)
    q = torch.randn(1, 2, 5, 64, device=DEVICE).to(BF16).requires_grad_()
    k = torch.randn(1, 1, 5, 64, device=DEVICE).to(BF16).requires_grad_()
    w = torch.ones(64, device=DEVICE)
    cos, sin = random_tables((5, 64))
    seen.clear()
    out = rome.apply_qk_norm(q, k, cos, sin, m, w, w, norm="layer", backend="triton")
    assert seen and set(seen) == {8}, seen
    seen.clear()
    torch.autograd.backward(out, [torch.randn_like(o) for o in out])
    assert seen and set(seen) == {2}, seen


@pytest.mark.parametrize("x_dtype, sections, mode, product, want", [
    (BF16, (128,), "half", "gather", 8), (FP16, (64,), "half", "gather", 8), (FP32, (128,), "half", "gather", 4),
    (BF16, (44, 44, 40), "half", "gather", 2), (BF16, (8, 8, 48), "half", "gather", 2),
    (FP32, (8, 8, 48), "half", "gather", 4), (BF16, (128,), "interleave", "gather", 2),
    (BF16, (42, 42, 44), "half", "gather", 2), (BF16, (128,), "half", "dot", 2)])
def test_the_launch_tells_the_kernel_its_kept_run(x_dtype, sections, mode, product, want):
    """KEPT_RUN as a launch's plan gives it, forward and backward: the matrix's kept run up to 16
    bytes of x (one vector load); 2 where the partner is not read as kept pairs (swapped, no
    class, the dot), so those launches share one build. (The launcher passes it: the static
    table's rows, tests/test_kernels_static.py.)"""
    m = rome.rotation_matrix(sections, mode)
    for transpose in (False, True):
        with launch.product(product):
            p = launch.plan(m, x_dtype, FP32, transpose=transpose, interpret=True)
        assert launch.launch_kept_run(p, x_dtype) == want, (transpose, p.pair, p.run)
        assert launch.launch_kept_run(p, x_dtype, norm_grad=True) == 2


# the sum's bound before the store's rounding (rome/kernel.py): bf16 in and out takes _dot2_short,
# within 1/64 of a bf16 ulp of the exact value, so within 0.5 + 1/64 ulp after it; fp32 the
# TwoSum (_dot2), faithful: within 1 ulp. Neither is the correctly rounded float64 result on every
# element (a GPU's random inputs met a bf16 element 0.500003 ulp off, so did the CPU's: 1 in 147K)
PAIR_CLASS_ULPS = {BF16: 0.5 + 2.0**-6, FP32: 1.0}


@pytest.mark.parametrize("x_dtype", [BF16, FP32])
@pytest.mark.parametrize("how", ["kept", "kept4", "kept2", "swapped", "none", "partial"])
def test_each_pair_class_within_its_ulps_of_float64(how, x_dtype):
    """Each way the kernel reads the partner (a program's branch on src[D]; kept pairs in runs of
    8 (fp32: 4) and 2, ``KEPT_RUN``: 8/8/32 sections 4 in fp32, pairs in bf16), q and k of other
    head counts (3 heads a program under the interpreter: batches of two heads cut at q's and k's
    last), forward and backward within ``PAIR_CLASS_ULPS`` of the torch backend's float64 result
    (a wrong partner is off by the partner's size), in place bitwise the out-of-place kernel."""
    d = 48
    if how == "partial":  # identity columns (src j, sign +1) beside a half rotation: kept pairs
        m = torch.block_diag(rome.rotation_matrix((32,), "half"), torch.eye(16))
    else:
        m = rome.rotation_matrix({"kept": (16, 16, 16), "kept4": (8, 8, 32), "kept2": (12, 12, 24),
                                  "swapped": (16, 16, 16), "none": (14, 14, 20)}[how],
                                 "interleave" if how == "swapped" else "half")
    m = m.to(DEVICE)
    q = torch.randn(2, 5, 7, d, device=DEVICE).to(x_dtype)
    k = torch.randn(2, 3, 7, d, device=DEVICE).to(x_dtype)
    cos, sin = random_tables((7, d))
    dq, dk = torch.randn_like(q), torch.randn_like(k)

    def run(backend, *args):  # x, tables and matrix as given; the gradients in x's dtype
        qg, kg = (a.clone().requires_grad_() for a in args[:2])
        out = rome.apply_qk(qg, kg, *args[2:], backend=backend)
        torch.autograd.backward(out, (dq.to(qg.dtype), dk.to(qg.dtype)))
        return (*out, qg.grad, kg.grad)

    got = run("triton", q, k, cos, sin, m)
    for g, w in zip(got, run("torch", *(a.double() for a in (q, k, cos, sin, m)))):
        assert g.dtype == x_dtype
        assert ulp_error(g, w, x_dtype).max() <= PAIR_CLASS_ULPS[x_dtype]
    q2, k2 = q.clone(), k.clone()
    rome.apply_qk_(q2, k2, cos, sin, m, backend="triton")
    assert torch.equal(q2, got[0]) and torch.equal(k2, got[1])


def test_gather_tile_overrides_the_launch_and_the_tuner():
    m = rome.rotation_matrix((128,), "half")
    base = launch.plan(m, BF16, FP32, transpose=False, interpret=False)
    assert len(base.candidates) > 1  # tuned by default
    with launch.gather_tile(4, 8, 96):
        p = launch.plan(m, BF16, FP32, transpose=True, interpret=False)
        assert (p.config.block_r, p.config.num_warps, p.config.maxnreg) == (4, 8, 96)
        assert p.candidates == (p.config,) and p.config.transpose
        # the whole head's half rotation (bf16, sm_90) takes its halves at the tile given, untuned
        with launch.target_arch(90):
            h = launch.plan(m, BF16, FP32, transpose=False, interpret=False)
            tile = launch.halves_config(h, BF16)
        assert (tile.block_r, tile.num_warps, tile.maxnreg) == (4, 8, 96)
        assert launch.halves_candidates(tile, False, len(h.candidates) == 1) == (tile,)
        with launch.product("dot"):  # the dot keeps its tile (sm_90's and the interpreter's: the wide one)
            wide = launch.dot_wide(launch.current_arch(), BF16, 128)
            assert launch.plan(m, BF16, FP32, transpose=False, interpret=False).config.block_r == (64 if wide else 32)
    with launch.gather_tile(num_warps=8):
        p = launch.plan(m, BF16, FP32, transpose=False, interpret=False)
        assert (p.config.block_r, p.config.num_warps) == (base.config.block_r, 8)
    assert launch.plan(m, BF16, FP32, transpose=False, interpret=False).config == base.config
    with launch.target_arch(90):  # (untouched: twice choose's rows, the candidates but the half-size one)
        h = launch.plan(m, BF16, FP32, transpose=False, interpret=False)
        tile = launch.halves_config(h, BF16)
    assert tile.block_r == 2 * h.config.block_r and tile.num_warps == h.config.num_warps
    assert [c.num_warps for c in launch.halves_candidates(tile)] == [4, 8]
    with pytest.raises(ValueError, match="block_r must be a positive int"):
        with launch.gather_tile(block_r=0):
            pass


@pytest.mark.parametrize("mode, sections", [("interleave", (2,)), ("interleave", (16, 16, 16)),
                                            ("half", (16, 16, 16)), ("half", (14, 14, 20))])
def test_transpose_at_several_axes_reads_sin_at_src(mode, sections):
    """The backward with positions over several axes (sin at row pos[t, axis[src[j]]], column
    src[j]) equals the table path's on the gathered rows and the torch backend's (make fuzz found
    it read at column j)."""
    m = rome.rotation_matrix(sections, mode, device=DEVICE)
    d = sum(sections)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 5, d, generator=g).to(DEVICE)
    cache_c, cache_s = (torch.randn(7, d, generator=g).to(DEVICE) for _ in range(2))
    pos = torch.randint(0, 7, (2, 1, 5, 2), generator=g).to(DEVICE)
    axis = torch.randint(0, 2, (d,), generator=g).to(DEVICE)
    cos, sin = rome.positions.gather_rows(cache_c, pos, axis), rome.positions.gather_rows(cache_s, pos, axis)
    want = torch.ops.rome.apply_transposed(x, cos, sin, m, "torch")
    assert torch.equal(torch.ops.rome.apply_transposed(x, cos, sin, m, "triton"), want)
    assert torch.equal(torch.ops.rome.apply_transposed(x, cache_c, cache_s, m, "triton", pos, axis), want)


@pytest.mark.parametrize("mode", ["half", "interleave"])
@pytest.mark.parametrize("transpose", [False, True])
def test_bf16_within_one_ulp_where_the_terms_cancel(mode, transpose):
    """bf16 in and out takes the short exact sum (kernel.py ``_dot2_short``: one error-free
    product, one fma, one add). Where x*cos and (x@M)*sin cancel to 2**-12..2**-30 of their size,
    every element is within 1 bf16 ulp of the float64 result (no allowance for the terms' size),
    forward and transposed (the backward's dy*cos + (dy*sin) @ Mᵀ)."""
    d, s = 16, 64
    m = rome.rotation_matrix((d,), mode, device=DEVICE)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, s, d, generator=g).to(BF16)
    cos = torch.rand(s, d, generator=g, dtype=torch.float64) + 0.1
    x0 = x[0, 0].double()  # head 0: x*cos + (x@M)*sin ~ 0, or (x*sin) @ Mᵀ ~ -x*cos: x*sin ~ (-x*cos) @ M
    if transpose:
        sin = ((-x0 * cos) @ m.double().cpu()) / x0.where(x0 != 0, 1.0)
    else:
        partner = x0 @ m.double().cpu()
        sin = -x0 * cos / partner.where(partner != 0, 1.0)
    scale = 2.0 ** -torch.randint(12, 30, (s, d), generator=g).double()
    sin = (sin * (1 + scale)).float()  # cancels to about scale of the terms
    cos = cos.float()
    x, cos, sin = x.to(DEVICE), cos.to(DEVICE), sin.to(DEVICE)
    if transpose:
        got = torch.ops.rome.apply_transposed(x, cos, sin, m, "triton")
        want = x.double() * cos.double() + (x.double() * sin.double()) @ m.double().T
    else:
        got = rome.apply(x, cos, sin, m, backend="triton")
        want = _oracle(x, cos, sin, m)
    terms = (x.double() * cos.double()).abs()
    assert (want[0, 0].abs() < terms[0, 0] * 2.0**-10).float().mean() > 0.5  # the terms do cancel
    err = rome.precision.ulp_error(got, want, BF16)
    assert err.max().item() <= 1.0, err.max().item()


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_the_gather_loops_depth_follows_the_target_arch_and_keeps_the_bits(dtype, monkeypatch):
    """bf16 x: four heads a batch on sm_90; three for fp16 there, on the AMD archs and for bf16 on
    sm_80, else two (where three spilled at the register cap: ``launch.gather_depth``; fp16 on
    sm_100 at a cap of 168); the launch passes it as DEPTH and the depths give the same bits (each head's arithmetic
    is the same), within 1 ulp of float64's: 9 heads of q and 4 of k in groups of 3 (a decode step's
    SEAM build), of 5 (a prefill's SEAM build: four heads a batch in bf16 on sm_90) and of all 13."""
    from rome import launcher
    from rome.precision import ulp_error

    monkeypatch.setattr(launch, "HALVES", False)  # (the partner form's depths: bf16's whole-head half
    # rotation takes its halves, test_the_whole_heads_half_rotation_takes_its_halves)
    m = rome.rotation_matrix((32,), "half", device=DEVICE)
    q = torch.randn(2, 9, 7, 32, device=DEVICE).to(dtype)
    k = torch.randn(2, 4, 7, 32, device=DEVICE).to(dtype)
    cos, sin = random_tables((7, 32))
    want = {90: 4 if dtype == BF16 else 3, 80: 3 if dtype == BF16 else 2, 100: 2, "gfx942": 3}
    assert {a: launch.gather_depth(a, dtype) for a in want} == want
    caps = {}
    for arch in want:
        with launch.target_arch(arch):
            caps[arch] = launch.plan(m, dtype, FP32, transpose=False, interpret=False).config.maxnreg
    assert caps == {90: 128, 80: 128, 100: 168 if dtype == FP16 else 128, "gfx942": 128}
    seen, outs = [], {}
    real = launcher._run

    def run(fn, grid, args, consts, *rest):
        seen.append((consts.get("DEPTH"), consts.get("SEAM")))
        return real(fn, grid, args, consts, *rest)

    monkeypatch.setattr(launcher, "_run", run)
    for arch in (90, 100):
        seen.clear()
        with launch.target_arch(arch):
            outs[arch] = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        # (13 heads in groups of 3 under the interpreter: the SEAM build, where fp16 takes two, and
        # bf16 three on sm_90 too: a batch of 4 would hold a masked-off fourth head)
        assert seen == [(launch.gather_depth(arch, dtype, apart=True, heads=3), True)]
        assert seen[0][0] == (min(want[arch], 3) if dtype == BF16 else 2)
    # one group of all 13 heads (a long sequence's launch: no SEAM): q's 9 heads as 4 + 4 + 1 of a
    # batch of 4 (prefetches past the group masked), then k's 4 as one batch
    groups = launch.gather_groups
    monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, **kw:
                        groups(cfg, n_t, ha, hb, sms, heads=ha + hb, **kw))
    for arch in want:
        seen.clear()
        with launch.target_arch(arch):
            outs[arch, "all"] = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        assert seen == [(want[arch], False)]
    # the SEAM build of a prefill (five heads a program): q's groups 5 + 4, k's 4, each one batch
    # of four (the first batch's loads at the kernel's top) and, for q's first, a peeled last batch
    monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, **kw:
                        groups(cfg, n_t, ha, hb, sms, heads=5, **kw))
    for arch in (90, 100):
        seen.clear()
        with launch.target_arch(arch):
            outs[arch, "seam5"] = rome.apply_qk(q, k, cos, sin, m, backend="triton")
        assert seen == [({90: 4 if dtype == BF16 else 2, 100: 2}[arch], True)]
    for a, b, c, x in zip(outs[90], outs[100], outs[90, "all"], (q, k)):
        assert torch.equal(a, b) and torch.equal(a, c)
        for key in [*want, (90, "seam5"), (100, "seam5")]:
            got = outs[key, "all"] if key in want else outs[key]
            assert torch.equal(a, got[0 if x is q else 1])
        assert ulp_error(a, _oracle(x, cos, sin, m), dtype).max() <= 1


@pytest.mark.parametrize("sections", [(12, 12, 8), (14, 14, 20)])
def test_ks_partner_read_again_past_qs_heads_keeps_the_bits(sections, monkeypatch):
    """sm_100's head groups read k's partner columns from src again past q's heads (``SRC_AGAIN``,
    ``launch.src_again``: formed from q's, LLVM held src through q's loop and fp32 x's builds kept
    it on the stack there); sm_90's form them from q's offsets. q's 5 heads and k's 3 in one group
    (no SEAM build: one program walks q's heads and then k's), half sections whose pairs stay pairs
    (12/12/8: runs of 2) and whose pairs break (14/14/20: one load an element), bf16 and fp32 x,
    forward and backward (dx from dy): the same bits on both archs, within 1 ulp of float64's."""
    monkeypatch.setattr(launch, "HALVES", False)
    groups = launch.gather_groups
    monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, **kw:
                        groups(cfg, n_t, ha, hb, sms, heads=ha + hb, **kw))
    seen = []
    real = launcher._run

    def run(fn, grid, args, consts, *rest):
        seen.append((consts.get("SRC_AGAIN"), consts.get("SEAM"), consts.get("TRANSPOSE")))
        return real(fn, grid, args, consts, *rest)

    monkeypatch.setattr(launcher, "_run", run)
    d = sum(sections)
    m = rome.rotation_matrix(sections, "half", device=DEVICE)
    cos, sin = random_tables((7, d))
    assert launch.src_again(100) and not any(launch.src_again(a) for a in (90, 80, "gfx942", None))
    for dtype in (BF16, FP32):
        g = torch.Generator().manual_seed(d)
        q, k, dq, dk = (torch.randn(2, h, 7, d, generator=g).to(DEVICE, dtype) for h in (5, 3, 5, 3))
        outs = {}
        for arch in (90, 100):
            seen.clear()
            qq, kk = (t.clone().requires_grad_() for t in (q, k))
            with launch.target_arch(arch):
                qo, ko = rome.apply_qk(qq, kk, cos, sin, m, backend="triton")
                torch.autograd.backward((qo, ko), (dq, dk))
            assert seen == [(arch == 100, False, False), (arch == 100, False, True)], (arch, seen)
            outs[arch] = (qo.detach(), ko.detach(), qq.grad, kk.grad)
        for a, b in zip(outs[90], outs[100]):
            assert torch.equal(a, b), (dtype, sections)
        for got, x in zip(outs[90][:2], (q, k)):
            assert ulp_error(got, _oracle(x, cos, sin, m), dtype).max() <= 1
        for got, dy in zip(outs[90][2:], (dq, dk)):
            want = dy.double() * cos.double() + (dy.double() * sin.double()) @ m.double().T
            assert ulp_error(got, want, dtype).max() <= 1


def test_the_dots_wide_tile_on_sm90_and_its_two_heads_a_batch(monkeypatch):
    """The head groups' dot (``product("dot")``): on sm_90, 16-bit x at BLOCK_D 128, no angles, 64
    rows on 16 warps at the 128-register cap, two heads a batch for bf16 (``launch.dot_wide``,
    ``dot_depth``; one for fp16, whose sum spilled at two); elsewhere the 32 x 8 tile (16 rows for
    fp32 x and angles) and one head. The launch passes that DEPTH with DOT (the interpreter: the
    wide tile's at any D, so its loop runs here), and the bits are the gather product's (each output of x @ M is one ±x
    term: exact, then the same sum): 9 heads of q and 5 of k in one group (the last batch's second
    head masked off), and q alone, forward and backward."""
    from rome import launcher

    def tile(arch, x_dtype, d=128, angles=False):
        with launch.target_arch(arch), launch.product("dot"):
            cfg = launch.plan(rome.rotation_matrix(d, "half"), x_dtype, FP32, transpose=False, interpret=False,
                              positions=1 if angles else 0, angles=angles).config
        return cfg.block_r, cfg.num_warps, cfg.maxnreg, launch.dot_depth(cfg, arch)

    assert tile(90, BF16) == tile(90, BF16, 96) == (64, 16, 128, 2)
    assert tile(90, FP16) == (64, 16, 128, 1)
    for dt in (BF16, FP16):
        assert tile(90, dt, 64) == (32, 8, 128, 1)
        assert tile(90, dt, angles=True)[0] == 16 and tile(90, dt, angles=True)[3] == 1
        assert tile(80, dt)[1:] == (8, 128, 1) and tile(80, dt)[0] in (16, 32)
        assert tile(100, dt)[3] == tile("gfx942", dt)[3] == 1
    assert tile(90, FP32) == (16, 8, 128, 1)
    seen = []
    real = launcher._run

    def run(fn, grid, args, consts, *rest):
        seen.append((consts.get("DEPTH"), consts.get("DOT")))
        return real(fn, grid, args, consts, *rest)

    monkeypatch.setattr(launcher, "_run", run)
    groups = launch.gather_groups
    monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, **kw:
                        groups(cfg, n_t, ha, hb, sms, heads=ha + hb, **kw))
    d = 128 if DEVICE == "cuda" else 32  # (a GPU: the wide tile where it is sm_90's)
    m = rome.rotation_matrix(d, "half", device=DEVICE)
    cos, sin = random_tables((7, d))
    for dt in (FP16, BF16):
        q = torch.randn(2, 9, 7, d, device=DEVICE).to(dt).requires_grad_()
        k = torch.randn(2, 5, 7, d, device=DEVICE).to(dt).requires_grad_()
        g = torch.randn(2, 9, 7, d, device=DEVICE).to(dt), torch.randn(2, 5, 7, d, device=DEVICE).to(dt)
        seen.clear()
        with launch.product("dot"):
            got = rome.apply_qk(q, k, cos, sin, m, backend="triton")
            got_q = rome.apply(q, cos, sin, m, backend="triton")
            grads = torch.autograd.grad(got, (q, k), g)
        with launch.product("dot"):
            want_depth = launch.dot_depth(launch.plan(m, dt, FP32, transpose=False, interpret=launcher.INTERPRET).config,
                                          launch.current_arch(q.device if q.is_cuda else None))
        assert seen == [(want_depth, True)] * 3, seen  # apply_qk, apply, apply_qk's backward
        wide = DEVICE == "cpu" or launch.dot_wide(launch.current_arch(q.device), dt, d)
        assert want_depth == (2 if wide and dt == BF16 else 1)
        want = rome.apply_qk(q, k, cos, sin, m, backend="triton")  # the gather
        for a, b in zip((*got, got_q), (*want, want[0])):
            assert torch.equal(a, b)
        for a, b in zip(grads, torch.autograd.grad(want, (q, k), g)):
            assert torch.equal(a, b)


def test_the_gather_depth_by_dtype_norm_and_pass():
    """Fewer heads a batch where more spilled (launch.gather_depth's comment): fp32 x and the
    per-head norm prologue two, the norm's backward two (16-bit) or one (fp32 x; the LayerNorm's on
    sm_100); the norm over a token's heads as the plain loop, at most three."""
    g = launch.gather_depth
    for arch in (80, 90, 100, "gfx942", None):
        assert g(arch, FP32) == 2 and g(arch, BF16, "rms") == g(arch, FP16, "layer") == 2
        assert g(arch, BF16, "rms_heads") == min(g(arch, BF16), 3)  # (4 on sm_90 without a norm)
        assert g(arch, FP32, "rms", backward=True) == 1
        assert g(arch, BF16, "rms", backward=True) == g(arch, FP16, "rms_heads", backward=True) == 2
        assert g(arch, BF16, "layer", backward=True) == (1 if arch == 100 else 2)
    assert g(None, BF16) == g(90, BF16) == 4 and g(None, FP16) == g(90, FP16) == g(80, BF16) == g("gfx942", BF16) == 3
    # the SEAM build (a decode step's few heads a program): fp16 two (three spilled 8 B on sm_90)
    assert g(90, FP16, apart=True) == 2 and g(90, BF16, apart=True) == 4 and g(90, FP32, apart=True) == 2
    # (a program of fewer than four heads, a decode step's three, keeps three on sm_90)
    assert g(90, BF16, apart=True, heads=3) == 3 and g(90, BF16, apart=True, heads=4) == 4
    assert g(90, BF16, heads=3) == 4 and g(90, FP16, apart=True, heads=8) == 2
    assert g(80, BF16, apart=True) == g("gfx942", BF16, apart=True) == 3


@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["bnsd", "bsnd", "3d", "positions"])
def test_the_whole_heads_half_rotation_takes_its_halves(layout, dtype, monkeypatch):
    """16-bit x, a whole head's half rotation (src[j] = (j + D/2) % D), tables per row or a cache
    at one position per row: the launch takes ``HALVES`` (kernel._halves_heads: each head as its
    two halves, ``HALVES_DEPTH`` heads a batch, no SEAM build), forward and backward the partner
    form's bits (the same sums), within 1 ulp of the torch backend's and of float64's (tables):
    9 heads of q and 4 of k in groups of 3 (the interpreter's) and of 5, q's and k's groups apart
    (KG > 0), and in one group of all 13 walking q's and then k's; BSND, strided and 3-row-dim x;
    positions outside the cache (unchecked) NaN in their rows only, as the partner form's. Not
    taken for fp32 x, sections, several axes, angles, a fused norm, native rounding,
    D = 256, off sm_90, nor by a decode step's three heads a program on a GPU."""
    from rome import launcher, ops
    from rome.precision import ulp_error
    from rome.structure import describe

    d = 32
    m = rome.rotation_matrix((d,), "half", device=DEVICE)
    pos = None
    if layout in ("bnsd", "positions"):
        q, k = torch.randn(2, 9, 7, d), torch.randn(2, 4, 7, d)
        cos, sin = random_tables((7, d))
        if layout == "positions":  # caches of 11 rows at per-sequence positions, two out of range
            cos, sin = random_tables((11, d))
            pos = torch.randint(0, 11, (2, 1, 7, 1), device=DEVICE)
            pos[0, 0, 2], pos[1, 0, 5] = 11, -1
    elif layout == "bsnd":
        q, k = torch.randn(2, 7, 9, d).transpose(1, 2), torch.randn(2, 7, 4, d).transpose(1, 2)
        cos, sin = random_tables((2, 1, 7, d))
    else:  # 3 row dims of x besides heads, tables over two of them; q a strided view
        q, k = torch.randn(2, 3, 9, 7, 2 * d)[..., ::2], torch.randn(2, 3, 4, 7, d)
        cos, sin = random_tables((3, 1, 7, d))
    q, k = q.to(DEVICE).to(dtype), k.to(DEVICE).to(dtype)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    seen = []
    run = launcher._run

    def spy(fn, grid, args, consts, *rest, **kw):
        seen.append((consts["HALVES"], consts["DEPTH"], consts["SEAM"], args[-1]))
        return run(fn, grid, args, consts, *rest, **kw)

    monkeypatch.setattr(launcher, "_run", spy)

    def go(backend="triton"):
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        if pos is None:
            out = rome.apply_qk(qg, kg, cos, sin, m, backend=backend)
        else:
            with ops.position_checks("kernel"):
                out = rome.apply_qk_at(qg, kg, cos, sin, m, pos, backend=backend)
        torch.autograd.backward(out, (dq.nan_to_num(), dk.nan_to_num()))
        return (*out, qg.grad, kg.grad)

    with launch.partner_form():
        want = go()
    if pos is not None:  # (a row outside the cache: NaN in both passes' outputs, the rest read)
        bad = ((pos < 0) | (pos >= 11)).expand(2, 1, 7, d)
        for g in want[:2]:
            assert torch.isnan(g).eq(bad.expand_as(g)).all()
    for g, w in zip(want, go("torch")):  # (the kernel's sum against the torch backend's: 1 ulp where
        # the terms cancel, _dot2_short's bound; the same bits elsewhere)
        fin = g.isfinite() & w.isfinite()
        assert torch.equal(g.isnan(), w.isnan()) and ulp_error(g[fin], w[fin].double(), dtype).max() <= 1
    groups = launch.gather_groups
    for heads in (None, "all", 5):
        if heads is not None:
            monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, _h=heads, **kw:
                                groups(cfg, n_t, ha, hb, sms, heads=ha + hb if _h == "all" else _h, **kw))
        seen.clear()
        got = go()
        if heads is None and DEVICE != "cpu":  # (a GPU's groups here: three heads a program, the SEAM
            # build, launch.halves_walk)
            assert seen and all(not s[0] and s[2] for s in seen), seen
        else:
            assert seen and all(s[:3] == (True, launch.HALVES_DEPTH[dtype], False) for s in seen), (heads, seen)
            assert (heads != "all") == all(s[3] > 0 for s in seen), (heads, seen)  # KG: q's and k's groups apart
        for g, w in zip(got, want):
            assert torch.equal(g.nan_to_num(), w.nan_to_num()) and torch.equal(g.isnan(), w.isnan()), heads
    if pos is None:
        for g, x in zip(got[:2], (q, k)):
            assert ulp_error(g, _oracle(x, cos, sin, m), dtype).max() <= 1

    # the index: exactly the roll by D/2 (either pass: its own transpose), not pairs nor sections
    assert launch.is_halves(torch.tensor([2, 3, 0, 1])) and launch.is_halves(torch.tensor([1, 0]))
    assert not launch.is_halves(torch.tensor([1, 0, 3, 2])) and not launch.is_halves(torch.tensor([0, 2, 1]))
    assert not launch.is_halves(torch.tensor([2, 3, 1, 0])) and not launch.is_halves(torch.tensor([0, 1, 2, 3]))
    for sections, mode, want in (((32,), "half", True), ((16, 16), "half", False), ((32,), "interleave", False)):
        info = describe(rome.rotation_matrix(sections, mode))
        assert launch.is_halves(info.take) == launch.is_halves(info.take_t) == want, (sections, mode)

    def taken(x_dtype=BF16, sections=(128,), positions=0, angles=False, arch=90, **kw):
        with launch.target_arch(arch):
            p = launch.plan(rome.rotation_matrix(sections, "half"), x_dtype, FP32, transpose=False,
                            interpret=False, positions=positions, angles=angles)
        return launch.halves_config(p, x_dtype, **kw) is not None

    assert taken() and taken(sections=(64,)) and taken(positions=1) and taken(FP16)
    # (sections' pairs: only where a thread asks, launch.pairs_halves; test_sections_pairs_take_their_halves)
    assert not launch.takes_pairs() and not taken(sections=(44, 44, 40)) and not taken(FP32, sections=(44, 44, 40))
    with launch.pairs_halves():
        assert taken(sections=(44, 44, 40)) and taken(FP32, sections=(44, 44, 40)) and taken()
        assert taken(positions=2, sections=(44, 44, 40), axes=3) and not taken(positions=2, sections=(44, 44, 40))
        with launch.pairs_halves(False):
            assert not taken(sections=(44, 44, 40)) and taken()
    assert not taken(FP32) and not taken(sections=(42, 42, 44)) and not taken(sections=(256,))
    assert not taken(positions=2) and not taken(positions=1, angles=True) and not taken(norm=True)
    assert not taken(native=True) and not taken(arch=80) and not taken(arch=100) and not taken(arch="gfx942")
    assert launch.halves_walk(20) and not launch.halves_walk(3) and launch.halves_walk(3, interpret=True)


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("sections, run, axes", [((12, 12, 8), 2, 0), ((8, 8, 16), 4, 0), ((16, 16), 8, 0),
                                                 ((12, 12, 8), 2, 1), ((12, 12, 8), 2, 3), ((8, 8, 16), 4, 3)],
                         ids=["runs2", "runs4", "runs8", "runs2-positions", "runs2-axes", "runs4-axes"])
def test_sections_pairs_take_their_halves(sections, run, axes, dtype, monkeypatch):
    """bf16, fp16 and fp32 x, each axis's half rotation of its own section (default's 44/44/40 at
    D = 128): every column paired with another, so the launch in a ``pairs_halves()`` block (off by
    default: slower on an H200) takes ``HALVES`` with ``HALVES_RUN`` = the
    pairs' runs (kernel._halves_heads: x[:, acol] and x[:, bcol] each the other's partner, read from
    the pairs' table in src's place; ``PAIRS_DEPTH`` heads a batch), forward and backward the
    partner form's bits, within 1 ulp of the torch backend's and of float64's; q a strided view.
    Tables per row, or caches at positions (``axes``: one axis, or three read by row, ``AXES``,
    each section its own axis; there runs of 2 only, runs of 4 the partner form) with positions
    outside the cache (unchecked) NaN in their rows only, as the partner form's. ``halves_pairs``: the columns and runs by definition, None where
    a column is not paired (pass-through columns, a cycle of three) or no run of 2 holds
    (interleave, odd halves)."""
    from rome import ops
    from rome.structure import describe

    d = 32
    m = rome.rotation_matrix(sections, "half", device=DEVICE)
    src = describe(m).take.cpu()
    pairs = launch.halves_pairs(src)
    assert pairs is not None and pairs[1] == run
    acol, bcol = pairs[0][: d // 2].tolist(), pairs[0][d // 2 :].tolist()
    assert acol == sorted(acol) and sorted(acol + bcol) == list(range(d))
    assert all(src[a] == b and src[b] == a for a, b in zip(acol, bcol))
    q = torch.randn(2, 9, 7, 2 * d)[..., ::2].to(DEVICE).to(dtype)
    k = torch.randn(2, 4, 7, d).to(DEVICE).to(dtype)
    cos, sin = random_tables((7, d))
    pos = axis = None
    if axes:  # caches of 11 rows; two positions out of range (on the second axis where three)
        cos, sin = random_tables((11, d))
        pos = torch.randint(0, 11, (2, 1, 7, axes), device=DEVICE)
        pos[0, 0, 2, -1], pos[1, 0, 5, axes // 2] = 11, -1
        if axes > 1:
            axis = torch.repeat_interleave(torch.arange(len(sections)), torch.tensor(sections)).to(DEVICE)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    seen = []
    run_ = launcher._run

    def spy(fn, grid, args, consts, *rest, **kw):
        seen.append((consts["HALVES"], consts["HALVES_RUN"], consts["DEPTH"], consts["AXES"]))
        return run_(fn, grid, args, consts, *rest, **kw)

    monkeypatch.setattr(launcher, "_run", spy)
    if DEVICE != "cpu":  # (a GPU's groups here would be three heads a program: launch.halves_walk)
        groups = launch.gather_groups
        monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, **kw:
                            groups(cfg, n_t, ha, hb, sms, heads=5, **kw))

    def go(backend="triton"):
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        if pos is None:
            out = rome.apply_qk(qg, kg, cos, sin, m, backend=backend)
        else:
            with ops.position_checks("kernel"):
                out = rome.apply_qk_at(qg, kg, cos, sin, m, pos, axis=axis, backend=backend)
        torch.autograd.backward(out, (dq, dk))
        return (*out, qg.grad, kg.grad)

    with launch.partner_form(), launch.pairs_halves():
        want = go()
    assert seen and not any(s[0] for s in seen)
    seen.clear()
    with launch.pairs_halves():
        got = go()
    if axes > 1 and run > 2:  # (several axes: the pairs' runs of 2 only, launch.halves_config)
        assert seen and not any(s[0] for s in seen), seen
    else:
        depth = launch.PAIRS_DEPTH[dtype] if launch.TUNED_COMPILER else launch.PAIRS_DEPTH_OTHER.get(dtype, launch.PAIRS_DEPTH[dtype])
        assert seen and all(s == (True, run, depth, axes if axes > 1 else 0) for s in seen), seen
    for g, w in zip(got, want):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())
    if pos is not None:  # (a position outside the cache: NaN in both passes' outputs at the
        # columns of its axis in its row, only there)
        oob = (pos < 0) | (pos >= 11)
        bad = oob[..., axis] if axes > 1 else oob.expand(2, 1, 7, d)
        assert bad.any() and not bad.all()
        for g in got:
            assert torch.isnan(g).eq(bad.expand_as(g)).all()
    for g, w in zip(got, go("torch")):  # (_dot2_short's bound where the terms cancel)
        fin = g.isfinite() & w.isfinite()
        assert torch.equal(g.isnan(), w.isnan()) and ulp_error(g[fin], w[fin].double(), dtype).max() <= 1
    if pos is None:
        for g, x in zip(got[:2], (q, k)):
            assert ulp_error(g, _oracle(x, cos, sin, m), dtype).max() <= 1

    assert launch.halves_pairs(torch.tensor([1, 0, 3, 2])) is None  # (interleave: runs of 1)
    assert launch.halves_pairs(torch.tensor([2, 3, 0, 1, 6, 7, 4, 5]))[1] == 2
    assert launch.halves_pairs(torch.tensor([2, 3, 0, 1, 4, 5, 6, 7])) is None  # (pass-through)
    assert launch.halves_pairs(torch.tensor([1, 2, 0, 3])) is None  # (a cycle of three)
    assert launch.halves_pairs(torch.tensor([3, 4, 5, 0, 1, 2, 7, 6])) is None  # (halves of 3)
    assert launch.halves_pairs(torch.tensor([1, 0, 2])) is None  # (D not a power of two)
    default = launch.halves_pairs(describe(rome.rotation_matrix((44, 44, 40), "half")).take.cpu())
    assert default[1] == 2 and default[0][:64].tolist() == [*range(22), *range(44, 66), *range(88, 108)]


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("mode, sections", [("half", (16, 16)), ("interleave", (32,)), ("half", (6, 26))],
                         ids=["kept", "swapped", "none"])
def test_a_seam_builds_positions_read_at_its_top_give_the_tables_bits(dtype, mode, sections, monkeypatch):
    """The SEAM build (a decode step's few heads a program) with a cache at one position a row
    loads the positions at the kernel's top, before x's first batch, and hands them to the tables
    read after the class's branch: the same bits as tables gathered at those positions on the
    host, in each pair class (kept pairs, swapped pairs, neither), forward and backward, 7 rows (a
    tile's last rows masked off); a position outside the cache (unchecked) NaN in its row only."""
    from rome import ops

    d = 32
    m = rome.rotation_matrix(sections, mode, device=DEVICE)
    q = torch.randn(2, 5, 7, d, device=DEVICE).to(dtype)
    k = torch.randn(2, 2, 7, d, device=DEVICE).to(dtype)
    cache_c, cache_s = random_tables((11, d))
    pos = torch.randint(0, 11, (2, 1, 7, 1), device=DEVICE)
    pos[0, 0, 3], pos[1, 0, 6] = 11, -1
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    seen = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, c, *rest: (
        seen.append((c["SEAM"], c["POSITIONS"], c["HALVES"])), run(fn, grid, args, c, *rest))[1])

    def go(at):
        qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
        if at:
            with ops.position_checks("kernel"):
                y = rome.apply_qk_at(qg, kg, cache_c, cache_s, m, pos, backend="triton")
        else:  # (the in-range rows' tables gathered on the host)
            ok = pos.clamp(0, 10)[..., 0]
            y = rome.apply_qk(qg, kg, cache_c[ok], cache_s[ok], m, backend="triton")
        torch.autograd.backward(y, (dq, dk))
        return (*y, qg.grad, kg.grad)

    with launch.partner_form():
        got = go(True)
        assert seen and all(s == (True, 1, False) for s in seen), seen
        want = go(False)
    bad = ((pos < 0) | (pos > 10)).expand(2, 1, 7, d)
    for g, w in zip(got[:2], want[:2]):
        assert torch.isnan(g).eq(bad.expand_as(g)).all()
        assert torch.equal(g[~bad.expand_as(g)], w[~bad.expand_as(g)])
    rows = ~bad.expand_as(got[2])  # (the backward: a row outside the cache is NaN, the rest read)
    for g, w in zip(got[2:], want[2:]):
        assert torch.equal(g[rows[:, :1].expand_as(g)], w[rows[:, :1].expand_as(g)])


@pytest.mark.parametrize("dtype", [BF16, FP16, FP32], ids=["bf16", "fp16", "fp32"])
def test_int64_offsets_give_the_same_bits(dtype, monkeypatch):
    """The launch's I64 build (64-bit offsets inside a tile: some tensor spans 2**31 elements),
    taken here for small tensors by lowering the limit: forward and backward the int32 build's
    bits, the halves (16-bit x) and the partner form, tables and a cache at positions."""
    from rome import launcher, ops

    d = 32
    m = rome.rotation_matrix((d,), "half", device=DEVICE)
    q = torch.randn(2, 5, 7, d, device=DEVICE).to(dtype)
    k = torch.randn(2, 3, 7, d, device=DEVICE).to(dtype)
    cos, sin = random_tables((7, d))
    cache_cos, cache_sin = random_tables((11, d))
    pos = torch.randint(0, 11, (2, 1, 7, 1), device=DEVICE)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    seen = []
    run = launcher._run
    monkeypatch.setattr(launcher, "_run", lambda fn, grid, args, c, *rest: (seen.append(c["I64"]),
                                                                             run(fn, grid, args, c, *rest))[1])

    def go():
        out = []
        for at in (False, True):
            qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
            y = rome.apply_qk_at(qg, kg, cache_cos, cache_sin, m, pos, backend="triton") if at else \
                rome.apply_qk(qg, kg, cos, sin, m, backend="triton")
            torch.autograd.backward(y, (dq, dk))
            out += [*y, qg.grad, kg.grad]
        return out

    for form in (contextlib.nullcontext, launch.partner_form):
        with form():
            seen.clear()
            want = go()
            assert seen and not any(seen)
            with monkeypatch.context() as mp:
                mp.setattr(launcher, "_INT32_LIMIT", 1)
                seen.clear()
                got = go()
            assert seen and all(seen)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
