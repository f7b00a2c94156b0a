"""rome.inplace: in-place, packed-QKV and out= ops against the functional op (bitwise), the
kernel's in-place hazard, opcheck, torch.compile, overlap and argument errors."""

import pytest
import torch

import rome
from rome import inplace, launch, ops
from rome.precision import ulp_error
from helpers import random_tables

from conftest import BACKENDS, DEVICE

# (head_dim, matrix): one panel; two panels with cross-panel blocks (half: the kernel cannot
# write in place, a temporary is used); two panels, diagonal blocks only (interleave: direct)
MATRICES = {
    "16-half": lambda: rome.rotation_matrix([8, 8], "half", device=DEVICE),
    "128-half": lambda: rome.rotation_matrix([128], "half", device=DEVICE),
    "128-interleave": lambda: rome.rotation_matrix([128], "interleave", device=DEVICE),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


# every backend and dtype it takes (the Triton kernel takes no float64)
BACKEND_DTYPES = [(b, dt) for b in BACKENDS for dt in DTYPES if not (b == "triton" and dt == torch.float64)]


def bnsd_and_bsnd(b, n, s, d, dtype):
    """A contiguous BNSD x and a BSND buffer viewed as BNSD."""
    return [torch.randn(b, n, s, d, device=DEVICE).to(dtype),
            torch.randn(b, s, n, d, device=DEVICE).to(dtype).transpose(1, 2)]


@pytest.mark.parametrize("which", MATRICES)
@pytest.mark.parametrize("backend, dtype", BACKEND_DTYPES)
def test_apply_in_place_is_bitwise_the_functional_op(backend, dtype, which):
    m = MATRICES[which]().to(dtype)
    d = m.shape[0]
    cos, sin = random_tables((5, d))
    for x in bnsd_and_bsnd(1, 2, 5, d, dtype):
        want = rome.apply(x, cos, sin, m, backend=backend)
        ptr, strides = x.data_ptr(), x.stride()
        got = rome.apply_(x, cos, sin, m, backend=backend)
        assert got is x and x.data_ptr() == ptr and x.stride() == strides
        assert torch.equal(x, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_qk_in_place_from_one_buffer(backend):
    """q and k sliced from one [B, S, H, D] buffer (interleaved in memory, disjoint): the exact
    overlap check accepts them, GQA head counts, one launch, bitwise apply_qk."""
    m = MATRICES["128-half"]()
    buf = torch.randn(1, 6, 4 + 2 + 3, 128, device=DEVICE)
    q, k = buf[:, :, :4].transpose(1, 2), buf[:, :, 4:6].transpose(1, 2)
    cos, sin = random_tables((6, 128))
    want = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    rest = buf[:, :, 6:].clone()
    got = rome.apply_qk_(q, k, cos, sin, m, backend=backend)
    assert got[0] is q and got[1] is k
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])
    assert torch.equal(buf[:, :, 6:], rest)


def count_launches(monkeypatch):
    """Calls of the one launcher ops._rotate, with the number of tensors each rotated."""
    calls = []
    real = ops._rotate

    def counting(xs, *args, **kwargs):
        calls.append(len(xs))
        return real(xs, *args, **kwargs)

    monkeypatch.setattr(ops, "_rotate", counting)
    return calls


@pytest.mark.parametrize("layout", ["stacked", "concat"])
@pytest.mark.parametrize("which", ["16-half", "128-half"])
@pytest.mark.parametrize("backend, dtype", BACKEND_DTYPES)
def test_apply_qkv_in_place(backend, dtype, which, layout, monkeypatch):
    m = MATRICES[which]().to(dtype)
    d = m.shape[0]
    b, s = 2, 3
    if layout == "stacked":
        qkv, heads = torch.randn(b, s, 3, 2, d, device=DEVICE).to(dtype), dict()
    else:
        qkv, heads = torch.randn(b, s, 4 + 2 * 2, d, device=DEVICE).to(dtype), dict(num_heads=4, num_kv_heads=2)
    cos, sin = random_tables((s, 1, d))  # BSND views
    q, k, v = rome.qkv_split(qkv, layout=layout, **heads)
    want = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    v_before = v.clone()
    calls = count_launches(monkeypatch)
    assert rome.apply_qkv_(qkv, cos, sin, m, layout=layout, backend=backend, **heads) is qkv
    assert calls == [2]  # q and k in one launch
    assert torch.equal(q, want[0]) and torch.equal(k, want[1])
    assert torch.equal(v.view(torch.uint8), v_before.view(torch.uint8))  # v bit for bit


def test_qkv_split_views():
    qkv = torch.randn(2, 3, 10, 8)
    q, k, v = rome.qkv_split(qkv, num_heads=6, num_kv_heads=2, layout="concat")
    assert [t.shape[-2] for t in (q, k, v)] == [6, 2, 2]
    assert all(t.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr() for t in (q, k, v))
    assert torch.equal(torch.cat([q, k, v], -2), qkv)
    q, k, v = rome.qkv_split(torch.randn(2, 3, 3, 4, 8))
    assert q.shape == k.shape == v.shape == (2, 3, 4, 8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_backend_float64_uses_a_temporary(dtype):
    """float64 x is the torch backend's compute dtype (no copy of x per chunk): in place goes
    through a temporary; other dtypes are written directly. Both bitwise the functional op."""
    m = MATRICES["16-half"]().to(dtype)
    x = torch.randn(3, 40, 16, device=DEVICE).to(dtype)
    cos, sin = random_tables((40, 16))
    assert inplace._direct_ok("torch", x, x, cos, m) == (dtype != torch.float64)
    want = rome.apply(x, cos, sin, m, backend="torch")
    assert torch.equal(rome.apply_(x, cos, sin, m, backend="torch"), want)


HAZARD_MATRICES = {**MATRICES, "256-half": lambda: rome.rotation_matrix([256], "half", device=DEVICE)}


@pytest.mark.parametrize("product", ["gather", "dot"])
@pytest.mark.parametrize("which", HAZARD_MATRICES)
def test_kernel_in_place_hazard_is_predicted(which, product):
    """The head-group kernel (the gather, and the dot for D <= 128) loads a head's whole rows
    before it stores them: always direct. The row-tile dot kernel (D = 256 under product("dot"))
    stores output panel n before it loads the input panels of panel n + 1, so it can write
    in place only where no panel reads an earlier one. _direct_ok says when; where it says no,
    writing x directly really is wrong (the interpreter runs the stores in order), so the
    temporary is not a needless copy; where it says yes, direct is right: within the kernel's
    fp32 bound of the float64 result (1 ulp: faithful, not always the correctly rounded one)."""
    m = HAZARD_MATRICES[which]()
    d = m.shape[0]
    x = torch.randn(2, 3, 7, d, device=DEVICE)
    cos, sin = random_tables((7, d))
    with launch.product(product):
        want = rome.apply(*(t.double() for t in (x, cos, sin, m)), backend="torch")
        direct = x.clone()
        ops._rotate([direct], cos, sin, m, "triton", False, outs=[direct])
        ok = inplace._direct_ok("triton", x, x, cos, m)
    assert ok == (product == "gather" or which != "256-half")
    if ok:
        assert ulp_error(direct, want, torch.float32).max() <= 1
    elif ops._kernel().INTERPRET:  # on a GPU the outcome of the race is not fixed
        assert ulp_error(direct, want, torch.float32).max() > 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_out(backend):
    m = MATRICES["16-half"]()
    cos, sin = random_tables((5, 16))
    x = torch.randn(2, 3, 5, 16, device=DEVICE)
    want = rome.apply(x, cos, sin, m, backend=backend)
    x_before = x.clone()
    for out in (torch.empty_like(x),
                torch.empty(2, 3, 16, 5, device=DEVICE).transpose(-1, -2),  # last stride 5
                torch.empty(2, 5, 3, 16, device=DEVICE).transpose(1, 2)):
        assert rome.apply_out(x, cos, sin, m, out=out, backend=backend) is out
        assert torch.equal(out, want)
        assert torch.equal(x, x_before)  # the input is not modified
    assert torch.equal(rome.apply_out(x, cos, sin, m, out=x, backend=backend), want)  # out=x: in place


@pytest.mark.parametrize("backend", BACKENDS)
def test_apply_qk_out(backend):
    m = MATRICES["128-half"]()
    cos, sin = random_tables((5, 128))
    q, k = torch.randn(1, 4, 5, 128, device=DEVICE), torch.randn(1, 2, 5, 128, device=DEVICE)
    want = rome.apply_qk(q, k, cos, sin, m, backend=backend)
    q_before = q.clone()
    out = (torch.empty_like(q), k)  # a new q_out, k in place
    got = rome.apply_qk_out(q, k, cos, sin, m, out=out, backend=backend)
    assert got[0] is out[0] and got[1] is k
    assert torch.equal(got[0], want[0]) and torch.equal(k, want[1]) and torch.equal(q, q_before)


def op_args(backend):
    m = MATRICES["16-half"]()
    cos, sin = random_tables((5, 16))
    q, k = torch.randn(2, 3, 5, 16, device=DEVICE), torch.randn(2, 5, 1, 16, device=DEVICE).transpose(1, 2)
    stacked = torch.randn(2, 5, 3, 2, 16, device=DEVICE)
    concat = torch.randn(2, 5, 3 + 2, 16, device=DEVICE)
    bsnd = (cos[:, None], sin[:, None])
    return {
        "apply_": [(q, cos, sin, m, backend)],
        "apply_qk_": [(q, k, cos, sin, m, backend)],
        "apply_qkv_": [(stacked, *bsnd, m, 2, 2, "stacked", backend),
                       (concat, *bsnd, m, 1, 2, "concat", backend)],
        "apply_out": [(q, cos, sin, m, torch.empty_like(q), backend)],
        "apply_qk_out": [(q, k, cos, sin, m, torch.empty_like(q), torch.empty_like(k), backend)],
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck(backend):
    cases = op_args(backend)
    assert set(cases) == set(inplace.OPS)
    for name, arg_sets in cases.items():
        for args in arg_sets:
            torch.library.opcheck(getattr(torch.ops.rome, name).default, args)


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_fullgraph(compiler, backend):
    """A block that rotates a packed qkv in place, then k again into an out buffer and in place."""
    def block(qkv, cos, sin, m, out):
        rome.apply_qkv_(qkv, cos, sin, m, num_heads=3, num_kv_heads=1, layout="concat", backend=backend)
        q, k, v = rome.qkv_split(qkv, num_heads=3, num_kv_heads=1, layout="concat")
        rome.apply_out(k, cos, sin, m, out=out, backend=backend)
        rome.apply_(out, cos, sin, m, backend=backend)
        return (q * out).sum(-1) + v.sum(-1)

    m = MATRICES["16-half"]()
    cos, sin = random_tables((4, 1, 16))
    qkv = torch.randn(2, 4, 5, 16, device=DEVICE)
    out = torch.empty(2, 4, 1, 16, device=DEVICE)
    qkv2, out2 = qkv.clone(), out.clone()
    compiled = torch.compile(block, fullgraph=True, backend=compiler)
    got = compiled(qkv, cos, sin, m, out)
    want = block(qkv2, cos, sin, m, out2)
    torch.testing.assert_close(got, want)  # inductor may sum in another order
    assert torch.equal(qkv, qkv2) and torch.equal(out, out2)  # the rotations reached the inputs, bitwise


# --- errors ---------------------------------------------------------------------------------


def tables16():
    return (*random_tables((5, 16)), MATRICES["16-half"]())


@pytest.mark.parametrize("qkv_shape, kwargs, match", [
    ((2, 5, 4, 2, 16), dict(layout="stacked"), r"layout='stacked' must be \[\.\.\., 3, N, D\], got \[2, 5, 4, 2, 16\]"),
    ((2, 5, 3, 2, 16), dict(layout="stacked", num_kv_heads=1), r"num_kv_heads=1 does not match qkv"),
    ((2, 5, 7, 16), dict(layout="concat", num_heads=4, num_kv_heads=2),
     r"\[\.\.\., 4 \+ 2\*2 = 8, D\] for num_heads=4, num_kv_heads=2, got \[2, 5, 7, 16\]"),
    ((2, 5, 7, 16), dict(layout="concat"), r"layout='concat' .* needs num_heads"),
    ((2, 5, 7, 16), dict(layout="concat", num_heads=0), r"num_heads must be an int >= 1, got 0"),
    ((2, 5, 7, 16), dict(layout="bshd"), r"layout must be one of \('stacked', 'concat'\), got 'bshd'"),
])
def test_packed_size_errors(qkv_shape, kwargs, match):
    cos, sin, m = tables16()
    qkv = torch.randn(qkv_shape, device=DEVICE)
    before = qkv.clone()
    with pytest.raises(ValueError, match=match):
        rome.apply_qkv_(qkv, cos[:, None], sin[:, None], m, **kwargs)
    assert torch.equal(qkv, before)


def test_raw_qkv_op_checks_sizes():
    cos, sin, m = tables16()
    with pytest.raises(ValueError, match=r"\[\.\.\., 2 \+ 2\*2 = 6, D\]"):
        torch.ops.rome.apply_qkv_(torch.randn(2, 5, 7, 16), cos[:, None], sin[:, None], m, 2, 2, "concat", "torch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_overlapping_x_is_refused(backend):
    cos, sin, m = tables16()
    for x in (torch.randn(1, 3, 1, 16, device=DEVICE).expand(2, 3, 5, 16),              # expanded
              torch.randn(200, device=DEVICE).as_strided((2, 3, 5, 16), (8, 8, 8, 1))):  # colliding rows
        before = x.clone()
        with pytest.raises(ValueError, match=r"x \[2, 3, 5, 16\] strides .* overlaps itself"):
            rome.apply_(x, cos, sin, m, backend=backend)
        assert torch.equal(x, before)


def test_non_overlapping_odd_strides_are_accepted():
    """Strides that the quick test cannot clear (3 <= 2*2) but that never collide: exact check."""
    cos, sin, m = (*random_tables((3, 16)), MATRICES["16-half"]())
    x = torch.randn(400).as_strided((3, 3, 16), (32, 48, 1))
    want = rome.apply(x, cos, sin, m, backend="torch")
    assert torch.equal(rome.apply_(x, cos, sin, m, backend="torch"), want)


def test_shared_memory_is_refused():
    cos, sin, m = tables16()
    buf = torch.randn(2, 5, 4, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"q and k share memory"):
        rome.apply_qk_(buf[:, :, :3], buf[:, :, 2:], cos[:, None], sin[:, None], m)
    x = torch.randn(2, 3, 5, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"out partially overlaps x"):
        rome.apply_out(x[:, :2], cos, sin, m, out=x[:, 1:])
    buf = torch.randn(7, 5, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"out shares memory with cos"):
        rome.apply_out(x, buf[3], sin, m, out=buf[1:].view(2, 3, 5, 16))


def test_x_sharing_memory_with_a_table_is_refused():
    cos, sin, m = tables16()
    buf = torch.randn(2, 3, 5, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"x shares memory with cos"):
        rome.apply_(buf, buf[0, 0], sin, m)


def test_out_dtype_shape_and_type_errors():
    cos, sin, m = tables16()
    x = torch.randn(2, 3, 5, 16, device=DEVICE)
    with pytest.raises(TypeError, match=r"out must have x's dtype torch.float32, got torch.bfloat16"):
        rome.apply_out(x, cos, sin, m, out=torch.empty_like(x, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out must have x's shape \[2, 3, 5, 16\], got \[2, 3, 5, 8\]"):
        rome.apply_out(x, cos, sin, m, out=torch.empty(2, 3, 5, 8, device=DEVICE))
    with pytest.raises(TypeError, match=r"k_out must have k's dtype"):
        rome.apply_qk_out(x, x.clone(), cos, sin, m, out=(torch.empty_like(x), x.half()))
    with pytest.raises(TypeError, match=r"out must be a \(q_out, k_out\) pair"):
        rome.apply_qk_out(x, x.clone(), cos, sin, m, out=torch.empty_like(x))
    with pytest.raises(ValueError, match=r"matrix must be \[D, D\] = \[16, 16\]"):
        rome.apply_(x, cos, sin, torch.eye(8, device=DEVICE))


def test_grad_is_refused_and_no_grad_runs():
    cos, sin, m = tables16()
    x = torch.randn(2, 3, 5, 16, device=DEVICE, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"rome.apply_: x requires grad.*rome.apply"):
        rome.apply_(x, cos, sin, m)
    with pytest.raises(RuntimeError, match=r"rome.apply_out: cos requires grad"):
        rome.apply_out(x.detach(), cos.requires_grad_(), sin, m, out=torch.empty(2, 3, 5, 16, device=DEVICE))
    with pytest.raises(RuntimeError, match=r"rome.apply_: x requires grad"):
        torch.ops.rome.apply_(x, cos.detach(), sin, m, "auto")  # the raw op checks too
    compiled = torch.compile(lambda t: rome.apply_(t, cos.detach(), sin, m), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"rome.apply_: t requires grad|rome.apply_: x requires grad"):
        compiled(x.clone())  # refused at trace time too
    y = x.detach().clone()
    with torch.no_grad():
        want = rome.apply(x, cos.detach(), sin, m)
        assert torch.equal(rome.apply_(x, cos, sin, m), want)
    with torch.inference_mode():
        assert torch.equal(rome.apply_(y, cos, sin, m), want)


def test_empty():
    cos, sin, m = (*random_tables((0, 16)), MATRICES["16-half"]())
    x = torch.randn(2, 3, 0, 16, device=DEVICE)
    assert rome.apply_(x, cos, sin, m).shape == (2, 3, 0, 16)
