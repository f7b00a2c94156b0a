"""Forward: both backends against the float64 oracle, over dtypes, modes, sections, layouts."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rome
from rome.precision import tolerance
from helpers import assert_rope_close, random_tables, tables

from conftest import BACKENDS, DEVICE, DTYPES, MODES, SECTIONS


def matrix(sections, mode, dtype):
    return rome.rotation_matrix(sections, mode, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sections", SECTIONS.values(), ids=SECTIONS.keys())
@pytest.mark.parametrize("mode", MODES)
def test_bnsd_against_oracle(backend, dtype, sections, mode):
    d = sum(sections)
    x = torch.randn(2, 3, 11, d, device=DEVICE).to(dtype)
    cos, sin = tables(sections, mode, 11)
    out = rome.apply(x, cos, sin, matrix(sections, mode, dtype), backend=backend)
    assert_rope_close(out, x, cos, sin, sections, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_tables_and_table_dtype(backend, dtype):
    """Distinct random cos/sin (a swap or a wrong sign shows) in x's dtype and in fp32."""
    sections, mode = (44, 44, 40), "half"
    x = torch.randn(2, 3, 9, 128, device=DEVICE).to(dtype)
    for table_dtype in {torch.float32, dtype}:
        cos, sin = random_tables((9, 128), dtype=table_dtype)
        out = rome.apply(x, cos, sin, matrix(sections, mode, torch.float32), backend=backend)
        assert_rope_close(out, x, cos, sin, sections, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_bsnd_layout(backend, dtype):
    sections, mode = (16, 24, 24), "interleave"
    x = torch.randn(2, 10, 3, 64, device=DEVICE).to(dtype)  # [B, S, N, D]
    cos, sin = tables(sections, mode, 10)
    out = rome.apply(x, cos[:, None], sin[:, None], matrix(sections, mode, dtype), backend=backend)
    assert_rope_close(out, x, cos[:, None], sin[:, None], sections, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_views(backend, dtype):
    sections, mode = (44, 44, 40), "half"
    m = matrix(sections, mode, dtype)
    base = torch.randn(2, 13, 3, 128, device=DEVICE).to(dtype)
    cos, sin = tables(sections, mode, 13)
    views = {
        "bsnd->bnsd transpose": base.transpose(1, 2),
        "strided seq slice": base.transpose(1, 2)[:, :, ::2],
        "head slice of a fused qkv": torch.randn(2, 13, 9, 128, device=DEVICE).to(dtype)[:, :, 3:6].transpose(1, 2),
        "expanded batch": base.transpose(1, 2)[:1].expand(3, -1, -1, -1),
    }
    for name, x in views.items():
        c, s = cos[: x.shape[2]], sin[: x.shape[2]]
        out = rome.apply(x, c, s, m, backend=backend)
        assert_rope_close(out, x, c, s, sections, mode)
    # a transposed view keeps its layout in the output (no copy was needed to read it)
    out = rome.apply(views["bsnd->bnsd transpose"], cos, sin, m, backend=backend)
    assert out.stride() == views["bsnd->bnsd transpose"].stride()


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_unit_last_stride_and_strided_tables(backend):
    sections, mode = (8, 8), "half"
    x = torch.randn(3, 16, 5, device=DEVICE).transpose(1, 2)  # last stride 5
    cos, sin = tables(sections, mode, 5)
    c, s = cos.T.contiguous().T, sin.T.contiguous().T  # column-major tables
    out = rome.apply(x, c, s, matrix(sections, mode, torch.float32), backend=backend)
    assert_rope_close(out, x, cos, sin, sections, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_per_batch_and_per_head_tables(backend, dtype):
    sections, mode = (16, 56, 56), "interleave"
    x = torch.randn(2, 3, 7, 128, device=DEVICE).to(dtype)
    m = matrix(sections, mode, dtype)
    pos = torch.stack([rome.grid_positions([1, 1, 7]), rome.grid_positions([7, 1, 1])])  # per batch
    cos, sin = rome.rope_cos_sin(pos.reshape(14, 3), sections, mode=mode, theta=256.0, device=DEVICE)
    cos, sin = cos.reshape(2, 1, 7, 128), sin.reshape(2, 1, 7, 128)
    assert_rope_close(rome.apply(x, cos, sin, m, backend=backend), x, cos, sin, sections, mode)
    ch, sh = random_tables((3, 7, 128))  # per head [N, S, D]
    assert_rope_close(rome.apply(x, ch, sh, m, backend=backend), x, ch, sh, sections, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_apply_qk_gqa(backend, dtype):
    sections, mode = (44, 44, 40), "half"
    q = torch.randn(2, 8, 9, 128, device=DEVICE).to(dtype)
    k = torch.randn(2, 9, 2, 128, device=DEVICE).to(dtype).transpose(1, 2)  # 2 kv heads, BSND storage
    cos, sin = tables(sections, mode, 9)
    m = matrix(sections, mode, dtype)
    q_out, k_out = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    assert_rope_close(q_out, q, cos, sin, sections, mode)
    assert_rope_close(k_out, k, cos, sin, sections, mode)
    assert torch.equal(q_out, rome.apply(q, cos, sin, m, backend=backend))
    assert torch.equal(k_out, rome.apply(k, cos, sin, m, backend=backend))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "shape,sections",
    [((1, 1, 1, 64), (64,)), ((3, 1, 17, 80), (40, 40)), ((1, 5, 3, 96), (32, 32, 32)),
     ((2, 2, 5, 256), (64, 96, 96)), ((7, 2), (2,)), ((5, 3, 2, 2, 4, 16), (8, 8)), ((33, 24), (8, 8, 8))],
    ids=["single-token", "D80", "D96", "D256", "D2-2d", "6d", "2d-rows"],
)
def test_odd_shapes(backend, shape, sections):
    for mode in MODES:
        x = torch.randn(shape, device=DEVICE)
        cos, sin = tables(sections, mode, shape[-2])
        out = rome.apply(x, cos, sin, matrix(sections, mode, torch.float32), backend=backend)
        assert_rope_close(out, x, cos, sin, sections, mode)


@pytest.mark.parametrize("backend", BACKENDS)
def test_six_dims_that_do_not_merge(backend):
    """More than three row dims that strides cannot merge: the launcher splits the launch."""
    sections, mode = (8, 8), "interleave"
    x = torch.randn(3, 4, 5, 6, 2, 16, device=DEVICE).permute(1, 0, 3, 2, 4, 5)
    cos, sin = random_tables((6, 5, 2, 16))
    out = rome.apply(x, cos, sin, matrix(sections, mode, torch.float32), backend=backend)
    assert_rope_close(out, x, cos, sin, sections, mode)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_general_matrix(backend, dtype):
    """The kernel computes the product; it does not assume a permutation."""
    x = torch.randn(2, 7, 48, device=DEVICE).to(dtype)
    cos, sin = random_tables((7, 48))
    m = torch.randn(48, 48, device=DEVICE)
    out = rome.apply(x, cos, sin, m, backend=backend)
    x64, m64 = x.double(), m.double()
    want = x64 * cos.double() + (x64 @ m64) * sin.double()
    magnitude = (x64 * cos.double()).abs() + ((x64.abs() @ m64.abs()) * sin.double().abs())
    bound = tolerance(want, 4 * magnitude, dtype)  # a 48-term fp32 dot: a few more roundings
    assert ((out.double() - want).abs() <= bound).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_float64_on_torch_backend(backend):
    sections, mode = (44, 44, 40), "half"
    x = torch.randn(2, 3, 5, 128, dtype=torch.float64, device=DEVICE)
    cos, sin = tables(sections, mode, 5, dtype=torch.float64)
    m = matrix(sections, mode, torch.float64)
    if backend == "triton":
        with pytest.raises(TypeError, match="float64"):
            rome.apply(x, cos, sin, m, backend=backend)
        return
    assert_rope_close(rome.apply(x, cos, sin, m, backend=backend), x, cos, sin, sections, mode)
    assert_rope_close(rome.apply(x, cos, sin, m), x, cos, sin, sections, mode)  # auto


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_size(backend):
    m = matrix((8,), "half", torch.float32)
    for shape in [(0, 3, 5, 8), (2, 0, 5, 8), (2, 3, 0, 8)]:
        x = torch.randn(shape, device=DEVICE)
        cos, sin = random_tables((shape[2], 8))
        out = rome.apply(x, cos, sin, m, backend=backend)
        assert out.shape == x.shape and out.dtype == x.dtype
    q_out, k_out = rome.apply_qk(torch.randn(1, 2, 5, 8, device=DEVICE), torch.randn(1, 0, 5, 8, device=DEVICE),
                                 *random_tables((5, 8)), m, backend=backend)
    assert q_out.shape == (1, 2, 5, 8) and k_out.shape == (1, 0, 5, 8)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_inputs_not_mutated_and_runs_bitwise_equal(backend, dtype):
    sections, mode = (44, 44, 40), "half"
    q = torch.randn(1, 4, 9, 128, device=DEVICE).to(dtype)
    k = torch.randn(1, 2, 9, 128, device=DEVICE).to(dtype)
    cos, sin = random_tables((9, 128))
    m = matrix(sections, mode, dtype)
    before = [t.clone() for t in (q, k, cos, sin, m)]
    first = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    second = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    for a, b in zip(before, (q, k, cos, sin, m)):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert first[0].data_ptr() != q.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backends_agree_on_rope_matrices(dtype):
    """Both backends round x*cos + rot(x)*sin once, to within 1 ulp of the exact value (the kernel
    by error-free products and a compensated fp32 sum, the torch backend in float64): each is
    within 1 ulp of the oracle, and they agree bit for bit except on results at a rounding tie."""
    from rome.precision import ulp_error
    from rome.reference import exact

    sections, mode = (16, 56, 56), "interleave"
    x = torch.randn(2, 3, 21, 128, device=DEVICE).to(dtype)
    cos, sin = tables(sections, mode, 21)
    m = matrix(sections, mode, dtype)
    a = rome.apply(x, cos, sin, m, backend="torch")
    b = rome.apply(x, cos, sin, m, backend="triton")
    want = exact(x, cos, sin, sections, mode)
    assert ulp_error(a, want, dtype).max() <= 1 and ulp_error(b, want, dtype).max() <= 1
    assert (a != b).float().mean() < 1e-3


def test_auto_backend_on_cpu_is_torch(monkeypatch):
    import rome.ops as ops

    monkeypatch.setattr(ops, "_kernel", lambda: pytest.fail("auto must not run the kernel on CPU"))
    x = torch.randn(2, 8)
    rome.apply(x, *random_tables((2, 8), device="cpu"), rome.half_matrix(8))


def _cancelling(d, rows, dtype):
    """x with x*cos + rotate(x)*sin ~ 0 in its first half (half mode, one section): each x[j] for
    j >= D/2 is the value that cancels its partner's term, rounded to dtype, so the two terms
    cancel to many bits — where plain fp32 loses thousands of ulp."""
    h = d // 2
    angles = torch.rand(rows, d, dtype=torch.float64) * 6.28
    angles[:, h:] = angles[:, :h]
    cos, sin = angles.cos().float(), angles.sin().float()
    x = torch.randn(rows, d, dtype=torch.float64)
    # out[j] = x[j]*cos[j] - x[j+h]*sin[j]  (j < h): choose x[j+h] = x[j]*cos[j]/sin[j]
    x[:, h:] = x[:, :h] * cos[:, :h].double() / sin[:, :h].double()
    return x.to(dtype).to(DEVICE), cos.to(DEVICE), sin.to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_within_one_ulp_where_terms_cancel(backend, dtype):
    """Issue 6 item 4: the cancellation of x*cos and rot(x)*sin costs nothing — every output is
    within 1 ulp of the exact value (error-free products and a compensated sum)."""
    from rome.precision import ulp_error
    from rome.reference import exact

    x, cos, sin = _cancelling(64, 48, dtype)
    m = rome.half_matrix(64, dtype=dtype, device=DEVICE)
    out = rome.apply(x, cos, sin, m, backend=backend)
    want = exact(x, cos, sin, (64,), "half")
    err = ulp_error(out, want, dtype)
    assert err.max().item() <= 1.0, f"max {err.max().item():.3g} ulp"
    naive = ((x.double() * cos.double()).float() + (x @ m).float() * sin).to(dtype)  # fp32 math
    if dtype == torch.float32:  # the inputs really do cancel: plain fp32 is far off
        assert ulp_error(naive, want, dtype).max().item() > 16


def test_matrix_with_an_asymmetric_block_mask():
    """Block (0, 1) of M nonzero and block (1, 0) zero (D=128, 64-wide panels): the kernel's
    block mask (bit n*NP + k) must send input panel 0 into output panel 1 and not the reverse,
    forward and, with Mᵀ, backward. Against the float64 formula."""
    g = torch.Generator().manual_seed(3)
    d = 128
    m = torch.eye(d)
    m[:64, 64:] = torch.randint(-2, 3, (64, 64), generator=g).float()  # exact, not a permutation
    x = torch.randn(2, 5, d, generator=g)
    cos, sin = torch.randn(5, d, generator=g), torch.randn(5, d, generator=g)
    dy = torch.randn(2, 5, d, generator=g)
    x64, c64, s64, m64, dy64 = (t.double() for t in (x, cos, sin, m, dy))
    want = x64 * c64 + (x64 @ m64) * s64
    want_dx = dy64 * c64 + (dy64 * s64) @ m64.T
    xs = x.to(DEVICE).requires_grad_()
    out = rome.apply(xs, cos.to(DEVICE), sin.to(DEVICE), m.to(DEVICE), backend="triton")
    (dx,) = torch.autograd.grad(out, [xs], dy.to(DEVICE))
    torch.testing.assert_close(out.cpu().double(), want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dx.cpu().double(), want_dx, rtol=1e-5, atol=1e-4)


class _SeenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_eager_calls_skip_the_dispatcher_only_where_nothing_records(backend):
    """Eager calls without grad run the op's implementation directly (ops._direct); a dispatch
    mode, the profiler and autograd still see ``rome::*`` ops, with the same bits."""
    q = torch.randn(1, 2, 6, 16, device=DEVICE)
    k = torch.randn(1, 1, 6, 16, device=DEVICE)
    cos, sin = random_tables((6, 16))
    m = matrix((8, 8), "half", torch.float32)
    direct = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    via_op = torch.ops.rome.apply_qk(q, k, cos, sin, m, backend)
    assert all(torch.equal(a, b) for a, b in zip(direct, via_op))
    with _SeenOps() as seen:
        moded = rome.apply(q, cos, sin, m, backend=backend)
    assert "rome.apply.default" in seen.ops and torch.equal(moded, direct[0])
    with torch.profiler.profile() as prof:
        rome.apply_qk(q, k, cos, sin, m, backend=backend)
    assert "rome::apply_qk" in {e.name for e in prof.events()}
    ql = q.detach().requires_grad_()
    out = rome.apply(ql, cos, sin, m, backend=backend)
    assert "rome_apply" in type(out.grad_fn).__name__ and torch.equal(out.detach(), direct[0])
    g = torch.randn_like(out)
    (plain,) = torch.autograd.grad(out, ql, g)  # the backward's transposed op runs directly
    with torch.profiler.profile() as prof:  # ... and through the op under the profiler
        (profiled,) = torch.autograd.grad(rome.apply(ql, cos, sin, m, backend=backend), ql, g)
    assert "rome::apply_transposed" in {e.name for e in prof.events()}
    assert torch.equal(plain, profiled)
