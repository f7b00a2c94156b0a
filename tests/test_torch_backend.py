"""rome.torch_backend: within one ulp of the exact result, gather == dense, chunking, autocast."""

import threading

import pytest
import torch

import rome
from rome import structure, torch_backend
from rome.precision import tolerance, ulp, ulp_error
from rome.reference import exact, rotate_index

from conftest import DEVICE, DTYPES, MODES, SECTIONS
from helpers import assert_rope_close, random_tables


def _adversarial(shape, sections, mode, dtype, *, transpose=False):
    """x, cos, sin in ``dtype`` / fp32 whose two terms cancel to every depth down to the fp32
    roundoff of the tables: forward sin = -x*cos / rot(x) * (1 + u*2**-e), transpose cos =
    -rotᵀ(x*sin) / x * (1 + u*2**-e), u in (-1, 1), e in [0, 30) per element, rounded to fp32.
    x is scaled by 2**12 so that what is left stays in float16's normal range."""
    m64 = rome.rotation_matrix(sections, mode, dtype=torch.float64, device=DEVICE)
    x = (torch.randn(shape, device=DEVICE) * 4096).to(dtype)
    x = torch.where(x == 0, torch.ones_like(x), x)  # no zero divisors
    x64 = x.double()
    free = torch.rand(shape, dtype=torch.float64, device=DEVICE) * 2 - 1
    u = torch.rand(shape, dtype=torch.float64, device=DEVICE) * 2 - 1
    depth = 1 + u * torch.exp2(-torch.randint(0, 30, shape, device=DEVICE).double())
    if transpose:
        s = free.float()
        c = (-((x64 * s.double()) @ m64.T) / x64 * depth).float()
    else:
        c = free.float()
        s = (-(x64 * c.double()) / (x64 @ m64) * depth).float()
    return x, c, s, m64


def _exact(x, c, s, m64, transpose):
    """float64 value: the products of fp32/bf16/fp16 inputs are exact there, one rounding."""
    x64, c64, s64 = x.double(), c.double(), s.double()
    if transpose:
        return x64 * c64 + (x64 * s64) @ m64.T
    return x64 * c64 + (x64 @ m64) * s64


@pytest.mark.parametrize("transpose", [False, True], ids=["forward", "transpose"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_within_one_ulp_where_terms_cancel(dtype, mode, transpose):
    sections = (44, 44, 40)
    x, c, s, m64 = _adversarial((3, 64, 128), sections, mode, dtype, transpose=transpose)
    want = _exact(x, c, s, m64, transpose)
    m = m64.to(dtype)
    out = torch_backend.rotate(x, c, s, m, transpose=transpose)
    assert out.dtype == dtype
    assert ulp_error(out, want, dtype).max() <= 0.5 + 2**-12  # rounded once (fp64 -> fp32 -> dtype)
    # the inputs do cancel: fp32 arithmetic (the seed's and the old backend's) is far off
    xf, cf, sf, mf = x.float(), c.float(), s.float(), m64.float()
    fp32 = (xf * cf + (xf * sf) @ mf.T) if transpose else (xf * cf + (xf @ mf) * sf)
    assert ulp_error(fp32.to(dtype), want, dtype).max() > 4


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_op_within_one_ulp_against_reference_exact(dtype):
    """Through rome.apply (backend='torch'), against rome.reference.exact."""
    sections, mode = (16, 56, 56), "interleave"
    x, c, s, _ = _adversarial((2, 3, 32, 128), sections, mode, dtype)
    out = rome.apply(x, c, s, rome.rotation_matrix(sections, mode, dtype=dtype, device=DEVICE), backend="torch")
    assert ulp_error(out, exact(x, c, s, sections, mode), dtype).max() <= 0.5 + 2**-12


def test_bf16_tables_and_float64():
    sections, mode = (44, 44, 40), "half"
    x, c, s, m64 = _adversarial((4, 16, 128), sections, mode, torch.bfloat16)
    cb, sb = c.bfloat16(), s.bfloat16()
    out = torch_backend.rotate(x, cb, sb, m64.bfloat16())
    assert ulp_error(out, _exact(x, cb, sb, m64, False), torch.bfloat16).max() <= 0.5 + 2**-12
    x64 = torch.randn(2, 5, 128, dtype=torch.float64, device=DEVICE)
    c64, s64 = random_tables((5, 128), dtype=torch.float64)
    assert_rope_close(torch_backend.rotate(x64, c64, s64, m64), x64, c64, s64, sections, mode)


def _dense_only(monkeypatch):
    monkeypatch.setattr(torch_backend, "_structure", lambda m: None)


def _scattered_permutation(d, *, partial=False):
    g = torch.Generator().manual_seed(3)
    perm = torch.randperm(d, generator=g)
    m = torch.zeros(d, d, dtype=torch.float64)
    m[perm, torch.arange(d)] = torch.randint(0, 2, (d,), generator=g).double() * 2 - 1
    if partial:
        m[:, d // 2 :] = 0  # half the columns zero
    return m.to(DEVICE)


@pytest.mark.parametrize("transpose", [False, True], ids=["forward", "transpose"])
@pytest.mark.parametrize("which", ["half 44/44/40", "interleave 16/56/56", "scattered", "partial"])
def test_gather_equals_dense_bitwise_float64(which, transpose, monkeypatch):
    if which == "scattered":
        m = _scattered_permutation(128)
    elif which == "partial":
        m = _scattered_permutation(128, partial=True)
    else:
        mode, sections = which.split()
        m = rome.rotation_matrix(tuple(map(int, sections.split("/"))), mode, dtype=torch.float64, device=DEVICE)
    assert structure.describe(m).gather
    x = torch.randn(2, 3, 9, 128, dtype=torch.float64, device=DEVICE)
    c, s = random_tables((9, 128), dtype=torch.float64)
    gathered = torch_backend.rotate(x, c, s, m, transpose=transpose)
    _dense_only(monkeypatch)
    dense = torch_backend.rotate(x, c, s, m, transpose=transpose)
    assert torch.equal(gathered, dense)
    # against the same formula in float64 (which may round x*c separately where addcmul fuses)
    m64 = m.double()
    want = x * c + ((x * s) @ m64.T if transpose else (x @ m64) * s)
    mag = (x * c).abs() + ((x * s).abs() @ m64.abs().T if transpose else (x.abs() @ m64.abs()) * s.abs())
    assert ((gathered - want).abs() <= tolerance(want, mag, torch.float64)).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("transpose", [False, True], ids=["forward", "transpose"])
def test_general_matrix(dtype, transpose):
    x = torch.randn(2, 7, 48, device=DEVICE).to(dtype)
    c, s = random_tables((7, 48))
    m = torch.randn(48, 48, device=DEVICE)
    out = torch_backend.rotate(x, c, s, m, transpose=transpose)
    x64, c64, s64, m64 = x.double(), c.double(), s.double(), m.double()
    want = x64 * c64 + ((x64 * s64) @ m64.T if transpose else (x64 @ m64) * s64)
    # a 48-term float64 dot, rounded once to dtype
    mag = (x64 * c64).abs() + ((x64 * s64).abs() @ m64.abs().T if transpose else (x64.abs() @ m64.abs()) * s64.abs())
    assert ((out.double() - want).abs() <= ulp(want, dtype) + 2.0**-45 * mag).all()


def test_matrix_changed_in_place_between_calls():
    sections, mode = (8, 8), "half"
    m = rome.rotation_matrix(sections, mode, device=DEVICE)
    x = torch.randn(3, 16, device=DEVICE)
    c, s = random_tables((3, 16))
    assert_rope_close(torch_backend.rotate(x, c, s, m), x, c, s, sections, mode)
    m.mul_(2.0)  # no longer a signed permutation
    want = x.double() * c.double() + (x.double() @ m.double()) * s.double()
    torch.testing.assert_close(torch_backend.rotate(x, c, s, m).double(), want, rtol=2**-23, atol=0)


LAYOUTS = {
    "bnsd, [S, D] tables": lambda d: (torch.randn(2, 3, 37, d), (37, d)),
    "bsnd storage viewed bnsd": lambda d: (torch.randn(2, 37, 3, d).transpose(1, 2), (37, d)),
    "bsnd, [S, 1, D] tables": lambda d: (torch.randn(2, 37, 3, d), (37, 1, d)),
    "per-batch tables": lambda d: (torch.randn(2, 3, 37, d), (2, 1, 37, d)),
    "per-head tables": lambda d: (torch.randn(2, 3, 37, d), (3, 37, d)),
    "head slice of fused qkv": lambda d: (torch.randn(2, 37, 9, d)[:, :, 3:6].transpose(1, 2), (37, d)),
    "last stride 5": lambda d: (torch.randn(2, 37, d, 5)[..., 0], (37, d)),
    "expanded x": lambda d: (torch.randn(1, 3, 37, d).expand(4, -1, -1, -1), (37, d)),
    "six dims, permuted": lambda d: (torch.randn(3, 4, 5, 6, 2, d).permute(1, 0, 3, 2, 4, 5), (6, 5, 2, d)),
    "one row": lambda d: (torch.randn(d), (d,)),
}


@pytest.mark.parametrize("transpose", [False, True], ids=["forward", "transpose"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_chunks_cover_every_layout(layout, transpose, monkeypatch):
    """Small chunks (19 rows) give the same bits as one chunk, and the right values."""
    sections, mode = (4, 6, 6), "interleave"
    x, table_shape = LAYOUTS[layout](16)
    x = x.to(DEVICE)
    c, s = random_tables(table_shape)
    m = rome.rotation_matrix(sections, mode, device=DEVICE)
    whole = torch_backend.rotate(x, c, s, m, transpose=transpose)
    monkeypatch.setitem(torch_backend.CHUNK_ELEMENTS, DEVICE, 19 * 16)
    monkeypatch.setattr(torch_backend, "_DEFAULT_CHUNK", 19 * 16)
    chunked = torch_backend.rotate(x, c, s, m, transpose=transpose)
    assert torch.equal(whole, chunked)
    # the float64 formula rounded once to float32 (its products are exact): the same bits
    x64, c64, s64, m64 = x.double(), c.double(), s.double(), m.double()
    want = x64 * c64 + ((x64 * s64) @ m64.T if transpose else (x64 @ m64) * s64)
    assert torch.equal(chunked, want.float())
    if not transpose:
        assert_rope_close(chunked, x, c, s, sections, mode)


def test_out_argument_and_inputs_untouched():
    sections, mode = (8, 8), "half"
    x = torch.randn(2, 5, 16, device=DEVICE)
    c, s = random_tables((5, 16))
    m = rome.rotation_matrix(sections, mode, device=DEVICE)
    before = [t.clone() for t in (x, c, s, m)]
    out = torch.full_like(x, float("nan"))
    assert torch_backend.rotate(x, c, s, m, out=out) is out
    assert_rope_close(out, x, c, s, sections, mode)
    assert all(torch.equal(a, b) for a, b in zip(before, (x, c, s, m)))
    with pytest.raises(ValueError, match=r"out must have x's shape \[2, 5, 16\] and dtype torch.float32, got \[2, 5, 8\]"):
        torch_backend.rotate(x, c, s, m, out=out[..., :8])
    empty = torch.randn(0, 5, 16, device=DEVICE)
    assert torch_backend.rotate(empty, c, s, m).shape == (0, 5, 16)


def test_non_finite_x_stays_in_its_columns():
    """The gather reads one x per output: an inf reaches its own column and its partner only
    (a dense product would spread NaN over the whole row)."""
    sections, mode = (8, 8), "half"
    x = torch.randn(1, 16, device=DEVICE)
    x[0, 3] = float("inf")
    c, s = random_tables((1, 16))
    m = rome.rotation_matrix(sections, mode, device=DEVICE)
    out = torch_backend.rotate(x, c, s, m)
    index, _ = rotate_index(sections, mode)
    hit = {3, int((index == 3).nonzero())}
    finite = out.isfinite()[0]
    assert all(finite[j] for j in range(16) if j not in hit) and not any(finite[j] for j in hit)


@pytest.mark.parametrize("general", [False, True], ids=["rotation", "general matrix"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_autocast_changes_nothing(general, dtype):
    """Under autocast the op computes as documented: x's dtype out, the same bits, grads too."""
    sections, mode = (44, 44, 40), "half"
    m = torch.randn(128, 128, device=DEVICE) if general else rome.rotation_matrix(sections, mode, device=DEVICE)
    x = torch.randn(2, 3, 5, 128, device=DEVICE)
    c, s = random_tables((5, 128))

    def run():
        leaves = [t.detach().clone().requires_grad_() for t in (x, c, s, m)]
        out = rome.apply(*leaves, backend="torch")
        out.backward(torch.ones_like(out))
        return [out.detach()] + [t.grad for t in leaves]

    plain = run()
    with torch.autocast(DEVICE, dtype=dtype):
        cast = run()
    assert cast[0].dtype == torch.float32
    for a, b in zip(plain, cast):
        assert a.dtype == b.dtype and torch.equal(a, b)
    if general:  # the plain result is fp64-accurate; autocast's bf16 matmul would not be
        want = x.double() * c.double() + (x.double() @ m.double()) * s.double()
        torch.testing.assert_close(plain[0].double(), want, rtol=2**-22, atol=1e-6)


def test_no_autocast_restores_state():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with torch_backend.no_autocast():
            assert not torch.is_autocast_enabled("cpu")
        assert torch.is_autocast_enabled("cpu")


def test_scratch_kept_per_thread_gives_each_call_its_own_result(monkeypatch):
    """The float64 scratch kept between calls (``_Work``): calls of growing, shrinking and
    over-the-cap sizes, and threads at once, each get the result of a fresh computation."""
    monkeypatch.setitem(torch_backend.CHUNK_ELEMENTS, DEVICE, 7 * 16)
    monkeypatch.setattr(torch_backend._Work, "KEEP_ELEMENTS", 12 * 16)
    m = rome.rotation_matrix((8, 8), "half", device=DEVICE)
    cases = []
    for rows in (3, 40, 5, 2, 64, 1):  # tables over and under the cap, chunks and no chunks
        x = torch.randn(2, rows, 16, device=DEVICE).bfloat16()
        c, s = random_tables((rows, 16))
        x64, c64, s64, m64 = x.double(), c.double(), s.double(), m.double()
        want = (x64 * c64 + (x64 @ m64) * s64).bfloat16()
        want_t = (x64 * c64 + (x64 * s64) @ m64.T).bfloat16()
        cases.append((x, c, s, want, want_t))

    def run_all(results):
        for x, c, s, want, want_t in cases * 3:
            results.append(torch.equal(torch_backend.rotate(x, c, s, m), want))
            results.append(torch.equal(torch_backend.rotate(x, c, s, m, transpose=True), want_t))

    alone = []
    run_all(alone)
    assert all(alone)
    threaded = [[] for _ in range(3)]
    threads = [threading.Thread(target=run_all, args=(r,)) for r in threaded]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(all(r) and len(r) == len(alone) for r in threaded)


@pytest.mark.parametrize("transpose", [False, True], ids=["forward", "transpose"])
def test_pair_gather_and_its_fallback(transpose, monkeypatch):
    """Half rotation with even halves moves aligned pairs (``MatrixInfo.pairs``): the gather runs
    on complex128 views; an odd offset of a float64 x, odd halves or an interleave matrix (no
    pairs) take the element gather. Every path gives the float64 formula's bits."""
    seen = []
    real_gather = torch.gather
    monkeypatch.setattr(torch, "gather", lambda t, *a, **k: seen.append(t.dtype) or real_gather(t, *a, **k))
    for sections, mode, pairs in (((8, 8), "half", True), ((6, 10), "half", False), ((8, 8), "interleave", False)):
        m = rome.rotation_matrix(sections, mode, dtype=torch.float64, device=DEVICE)
        assert (structure.describe(m).pairs is not None) == pairs
        c, s = random_tables((5, 16))  # fp32, and x with bf16 values: every product exact
        wide = torch.randn(2, 5, 17, device=DEVICE).bfloat16().double()
        for x, paired in ((wide[..., :16].bfloat16(), pairs), (wide[..., :16].contiguous(), pairs),
                          (wide[..., 1:], False)):  # odd storage offset: no complex view
            seen.clear()
            got = torch_backend.rotate(x, c, s, m, transpose=transpose)
            x64, c64, s64 = x.double(), c.double(), s.double()
            want = x64 * c64 + ((x64 * s64) @ m.T if transpose else (x64 @ m) * s64)
            assert torch.equal(got, want.to(x.dtype))
            assert (torch.complex128 in seen) == paired
