"""Property-based fuzzing of rome.apply / apply_qk (issue 9), both backends, against a float64
oracle written here (einsum over the given values, independent of rome.reference).

Drawn: shapes of 1-6 dims (tiny sizes, D even in 2..256), cos/sin broadcasting to x, layouts
(permuted dims, steps, storage offsets, stride-0 expanded dims incl. the last one), x dtypes
(fp32/fp16/bf16, fp64 on the torch backend), table dtypes (fp32 or x's), matrices (signed
permutations from rome.rotation_matrix with random sections and mode, partial rotary with a
zero block, dense random, integer-valued) in x's dtype or fp32, with their own layouts; on the
triton backend the kernel's product (``rome.launch.product``: the gather, or the seed's dot, whose
head-group loop takes two heads a batch for bf16: ``rome.launch.dot_depth``), and whether the
launch may hold sections' pairs as halves (``rome.launch.pairs_halves``: opt-in, off by default).
Checked: the value against the oracle within ``bound`` below, the gradients of x, cos, sin and
matrix likewise, inputs unmodified (bitwise, whole storage), apply_qk bitwise equal to two apply
calls, two runs bitwise equal, unit last stride of the output. The other entry points on the
same drawn inputs: positions into caches (bitwise the table path), apply_qk_angles, in place and
out=; and rome.RoPE on drawn layouts, positions, offsets and packed sequences (bitwise the table
path built here).

Profiles (tests/conftest.py): "rome" bounded, the default of `make test`; "fuzz" with thousands
of examples (`make fuzz`). A failure prints the drawn parameters and a reproduce blob.

Value ranges (scales 2**k of randn), drawn per case: "normal"; "large" (fp16 values whose
products pass 65504: the backward's |dy*sin| > 65504, outputs and gradients that overflow to
inf; bf16/fp32 values near 2**50; fp64 near 2**400); "tiny" (values at and below the smallest
normal of x's dtype). Where the exact result rounds past the dtype's largest finite value, the
answer must be inf of its sign; elsewhere it must be finite and within ``bound``.
"""

import functools
import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import event, given, note, reject
from hypothesis import strategies as st

import rome
from rome import launch
from rome.precision import SIGNIFICAND_BITS, tolerance, ulp_error

from conftest import DEVICE

# torch.func and gradcheck import torch's jvp decompositions, which call torch.jit.script
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")  # (Deprecation- or, torch 2.15, FutureWarning)

HALF = (torch.float16, torch.bfloat16)
# The kernel feeds fp32 operands to the tensor cores as three bf16 pieces (fp32 x with a
# bf16-exact matrix; bf16 x's dy*sin with a general one). The pieces are exact down to bf16's
# smallest subnormal, 2**-133: below it the last piece rounds, <= 2**-134 per operand (kernel doc).
SPLIT_FLUSH = 2.0**-134
ANGLE_REL = 2.0**-24  # the kernel's cos/sin, and the fp32 table's, are each within ~half an ulp of float64
# each fp32 (fp64) operation on subnormal values rounds to the subnormal grid: half its spacing
SUBNORMAL_STEP = {torch.float64: 2.0**-1074}


# --- the oracle and the tolerance ----------------------------------------------------------------


def rope64(x, cos, sin, m):
    """float64 ``x*cos + (x @ M)*sin`` from the values as given (einsum, broadcasting)."""
    x, cos, sin, m = (t.double() for t in (x, cos, sin, m))
    return x * cos + torch.einsum("...i,ij->...j", x, m) * sin


def oracle(x, cos, sin, m, dy=None):
    """Value and magnitude of the output, and (given dy) of the four gradients.

    rope64 is a sum of products, so its float64 autograd at (|x|, |cos|, |sin|, |M|) with
    cotangent |dy| is the sum of the magnitudes of the terms of each gradient: e.g.
    dM_ij = Σ_rows x_i (dy*sin)_j has magnitude Σ_rows |x_i||dy_j||sin_j|.
    """
    a = [t.detach().double() for t in (x, cos, sin, m)]
    value, magnitude = rope64(*a), rope64(*(t.abs() for t in a))
    if dy is None:
        return value, magnitude, None
    a = [t.requires_grad_() for t in a]
    grads = torch.autograd.grad(rope64(*a), a, dy.double())
    b = [t.detach().abs().requires_grad_() for t in a]
    grad_magnitudes = torch.autograd.grad(rope64(*b), b, dy.double().abs())
    return value, magnitude, list(zip(grads, grad_magnitudes))


def bound(expected, magnitude, dtype, terms=0):
    """Allowed |actual - expected| for a result computed in fp32 (fp64 for fp64 x) and rounded
    once to ``dtype``: ``rome.precision.tolerance`` (1 ulp + 4·u·magnitude, u = 2**-24) plus
    ``terms``·u·magnitude for the sums the op accumulates.

    With a signed permutation each output of x @ M is one exact term (terms = 0). A dense D×D
    matrix makes each output a dot of D products: in any order (fp32 accumulators, FMA, tensor
    cores) the dot's error is at most γ_D·Σ|x_i||M_ij| ≈ D·u·Σ|x_i||M_ij| (Higham, recursive
    summation, plus one rounding of each product when x and M are not both half precision),
    and the magnitude already holds Σ|x_i||M_ij||sin_j|. Gradients sum over the broadcast rows
    too: N more terms. The lead plans a tighter fp32 path (<= 1 ulp): tighten here.
    """
    u = 2.0**-53 if dtype == torch.float64 else 2.0**-24
    step = SUBNORMAL_STEP.get(dtype, 2.0**-149)  # a few roundings on the compute dtype's subnormal grid
    return tolerance(expected, magnitude, dtype) + terms * u * magnitude.double() + 4 * step


def assert_within(actual, expected, magnitude, dtype, terms, what, extra=0.0):
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype}, want {dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {list(actual.shape)}, want {list(expected.shape)}"
    actual = actual.double()
    allowed = bound(expected, magnitude, dtype, terms) + extra
    # past the largest finite value plus half an ulp the rounded result is inf, of its sign
    fi = torch.finfo(dtype)
    overflow = fi.max + 2.0 ** (math.frexp(fi.max)[1] - 1 - SIGNIFICAND_BITS[dtype]) if dtype != torch.float64 else math.inf
    must_inf = expected.abs() - allowed >= overflow
    may_inf = expected.abs() + allowed >= overflow
    is_inf = actual.isinf() & (actual.sign() == expected.sign())
    err = (actual - expected).abs()
    ok = torch.where(must_inf, is_inf, (err <= allowed) | (may_inf & is_inf))  # NaN is never ok
    bad = ~ok
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())}/{err.numel()} elements out of bound; at {i}: got "
            f"{actual[tuple(i)].item()!r}, want {expected[tuple(i)].item()!r} "
            f"(error {err[tuple(i)].item():.3g} > {allowed[tuple(i)].item():.3g})"
        )


# --- strategies ------------------------------------------------------------------------------------


@dataclass
class Layout:
    """A view over a larger storage: dims laid out in ``perm`` order (the last of perm
    innermost), every ``step``-th element from ``offset``, ``expand``ed dims of stride 0."""

    perm: tuple
    steps: tuple
    offsets: tuple
    expand: tuple
    unit_strides: tuple  # any stride is valid for a size-1 dim: these replace theirs (None: keep)
    window: tuple = None  # else: as_strided with these strides (overlapping windows, unfold-like)

    def storage_shape(self, shape):
        if self.window:
            return [self.offsets[0] + sum((n - 1) * st for n, st in zip(shape, self.window)) + 1]
        return [(1 if self.expand[d] else shape[d]) * self.steps[d] + self.offsets[d] for d in self.perm]

    def view(self, storage, shape):
        """The view of ``shape`` into ``storage`` (of storage_shape(shape))."""
        if self.window:
            return storage.as_strided(shape, self.window, self.offsets[0])
        n = len(shape)
        sizes = [1 if self.expand[d] else shape[d] for d in range(n)]
        index = tuple(slice(self.offsets[d], self.offsets[d] + sizes[d] * self.steps[d], self.steps[d])
                      for d in self.perm)
        view = storage[index].permute([self.perm.index(d) for d in range(n)]).expand(shape)
        strides = [st if n == 1 and st is not None else s
                   for n, st, s in zip(shape, self.unit_strides, view.stride())]
        return view.as_strided(shape, strides, view.storage_offset())

    def place(self, values, storage):
        """Write ``values`` (taken at index 0 along expanded dims) through the view; a window
        view overlaps itself, so there the storage's own random values stay."""
        if not self.window:
            first = tuple(slice(0, 1) if e else slice(None) for e in self.expand)
            self.view(storage, values.shape)[first].copy_(values[first])


@st.composite
def layouts(draw, ndim):
    kind = draw(st.sampled_from(["contiguous", "permuted", "strided", "expanded", "mixed", "window"]))
    perm, steps, offsets, expand = tuple(range(ndim)), (1,) * ndim, (0,) * ndim, (False,) * ndim
    if kind == "window":  # row strides 0-3 or wide, last stride 1 or 2: windows that overlap
        rows = st.lists(st.sampled_from([0, 1, 2, 3, 300]), min_size=ndim - 1, max_size=ndim - 1)
        window = (*draw(rows), draw(st.sampled_from([1, 1, 2])))
        return Layout(perm, steps, (draw(st.integers(0, 2)),) * ndim, expand, (None,) * ndim, window)
    if kind in ("permuted", "mixed"):
        perm = tuple(draw(st.permutations(range(ndim))))
    if kind in ("strided", "mixed"):
        steps = tuple(draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim)))
        offsets = tuple(draw(st.lists(st.integers(0, 2), min_size=ndim, max_size=ndim)))
    if kind in ("expanded", "mixed"):
        expand = tuple(draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim)))
    unit = st.one_of(st.none(), st.sampled_from([0, 1, 2, 1000]))
    unit_strides = tuple(draw(st.lists(unit, min_size=ndim, max_size=ndim)))
    return Layout(perm, steps, offsets, expand, unit_strides)


def random_sections(draw, d):
    """Even sizes summing to d (1-4 sections)."""
    cuts = sorted(draw(st.sets(st.integers(1, d // 2 - 1), max_size=3))) if d >= 4 else []
    edges = [0, *cuts, d // 2]
    return [2 * (b - a) for a, b in zip(edges, edges[1:])]


def bounded_sizes(draw, n, limit):
    """n dim sizes in 1..4 whose product is at most limit."""
    sizes = []
    for _ in range(n):
        sizes.append(draw(st.integers(1, max(1, min(4, limit)))))
        limit //= sizes[-1]
    return sizes


@dataclass
class Case:
    backend: str
    dtype: torch.dtype
    table_dtype: torch.dtype
    matrix_dtype: torch.dtype
    d: int
    x_shape: tuple
    k_shape: tuple
    cos_shape: tuple
    matrix_kind: str
    sections: list
    mode: str
    layouts: dict
    scales: dict
    seed: int
    product: str = "gather"  # rome.launch.product on the triton backend: "dot" the seed's formulation
    pairs: bool = False  # rome.launch.pairs_halves on the triton backend (sections' pairs as halves: opt-in)


@st.composite
def cases(draw):
    backend = draw(st.sampled_from(["torch", "triton"]))
    dtypes = [torch.float32, torch.float16, torch.bfloat16] + ([torch.float64] if backend == "torch" else [])
    dtype = draw(st.sampled_from(dtypes))
    table_dtype = draw(st.sampled_from(sorted({torch.float32, dtype}, key=str)))
    matrix_dtype = draw(st.sampled_from(sorted({torch.float32, dtype}, key=str)))
    d = 2 * draw(st.one_of(st.integers(1, 8), st.integers(1, 128)))
    # the interpreter is slow: keep the triton rows few (fewer still for wide D)
    max_rows = (48 if d <= 64 else 16) if backend == "triton" else 256
    ndim = draw(st.integers(1, 6))
    rows = bounded_sizes(draw, ndim - 1, max_rows)
    x_shape = (*rows, d)
    # cos/sin: the last c of x's row dims, each kept or 1; k differs from x where cos is 1/absent
    c = draw(st.integers(0, ndim - 1))
    keep = draw(st.lists(st.booleans(), min_size=c, max_size=c))
    cos_rows = [n if kp else 1 for n, kp in zip(rows[ndim - 1 - c :], keep)]
    cos_shape = (*cos_rows, d)
    fixed = [i >= ndim - 1 - c and cos_rows[i - (ndim - 1 - c)] != 1 for i in range(ndim - 1)]
    free = iter(bounded_sizes(draw, fixed.count(False), max_rows // math.prod(
        n for n, f in zip(rows, fixed) if f)))
    k_rows = [n if f else next(free) for n, f in zip(rows, fixed)]
    matrix_kind = draw(st.sampled_from(["rotation", "partial", "dense", "integer"]))
    sections = random_sections(draw, d)
    mode = draw(st.sampled_from(rome.MODES))
    shapes = {"x": x_shape, "k": (*k_rows, d), "cos": cos_shape, "sin": cos_shape, "matrix": (d, d), "dy": x_shape}
    lay = {name: draw(layouts(len(shape))) for name, shape in shapes.items()}
    # value ranges as scales 2**k of randn (module doc): (x, k, dy) exponents and the tables'
    value_range = draw(st.sampled_from(["normal", "normal", "large", "tiny"]))
    exponents = {
        "normal": ((-4, 4), (-2, 2)),
        "large": {torch.float16: ((10, 13), (-1, 2)), torch.float64: ((400, 450), (-2, 2))}.get(
            dtype, ((45, 55), (-2, 2))),
        "tiny": {torch.float16: ((-24, -14), (-2, 0)), torch.float64: ((-1075, -1015), (-2, 0))}.get(
            dtype, ((-135, -118), (-2, 0))),
    }[value_range]
    scales = {name: 2.0 ** draw(st.integers(*exponents[0])) for name in ("x", "k", "dy")}
    scales["tables"] = 2.0 ** draw(st.integers(*exponents[1]))
    seed = draw(st.integers(0, 2**31 - 1))
    # the kernel's product for a rotation (general matrices take the dot kernel either way): the
    # head groups' dot (D <= 128), with its own tile and heads a batch (launch.dot_depth)
    product = draw(st.sampled_from(["gather", "dot"])) if backend == "triton" else "gather"
    # the sections' pairs as halves (off by default: launch.pairs_halves): where a thread asks, a
    # rotation whose src pairs every column in runs of 2+ (D a power of two) takes them
    pairs = draw(st.booleans()) if backend == "triton" else False
    case = Case(backend, dtype, table_dtype, matrix_dtype, d, x_shape, (*k_rows, d), cos_shape,
                matrix_kind, sections, mode, lay, scales, seed, product, pairs)
    note(repr(case))
    event(f"{backend} {str(dtype)[6:]}")
    event(f"matrix {matrix_kind}")
    event(f"{ndim} dims")
    event("D > 64" if d > 64 else "D <= 64")
    event(f"values {value_range}")
    event(f"product {product}")
    event(f"pairs {pairs}")
    return case


def in_product(test):
    """Run a property of ``cases()`` under its case's ``rome.launch.product`` and
    ``rome.launch.pairs_halves``."""
    @functools.wraps(test)
    def run(case, *args, **kwargs):
        with launch.product(case.product), launch.pairs_halves(case.pairs):
            return test(case, *args, **kwargs)
    return run


def split_flush(case, m, sin, backward=False):
    """The absolute error the kernel's bf16 split may add (SPLIT_FLUSH per dot operand): fp32 x
    (forward and backward), and bf16 x's backward with a general matrix. 0 where no split runs."""
    if case.backend != "triton" or case.dtype == torch.float16:
        return 0.0
    if case.dtype == torch.bfloat16 and not backward:
        return 0.0
    a, s = m.detach().double().abs(), sin.detach().double().abs()
    if backward:  # dx_i = Σ_j (dy*sin)_j M_ij (or (dy @ Mᵀ)_i * sin[src_i])
        return SPLIT_FLUSH * a.sum(-1) * max(1.0, s.max().item() if s.numel() else 1.0)
    return SPLIT_FLUSH * a.sum(0) * s  # out_j = x_j*cos_j + (Σ_i x_i M_ij) * sin_j


def exact_products(m):
    """Whether every output of x @ M and of h @ Mᵀ is one exact term (a signed permutation, or
    one with zero rows/columns): then the dots add no rounding (``bound``'s terms = 0)."""
    m = m.detach().double()
    ones = (m == 0) | (m.abs() == 1)
    return bool(ones.all() and (m != 0).sum(0).max() <= 1 and (m != 0).sum(1).max() <= 1)


def build(case: Case, requires_grad=False):
    """The inputs as views with their drawn layouts, and their storages (random where the view
    does not reach: the op must not read there, nor write anywhere)."""
    g = torch.Generator().manual_seed(case.seed)
    d = case.d
    if case.matrix_kind in ("rotation", "partial"):
        m = rome.rotation_matrix(case.sections, case.mode, dtype=torch.float64)
        if case.matrix_kind == "partial":  # partial rotary: the last section passes through
            m[-case.sections[-1] :, -case.sections[-1] :] = 0
    elif case.matrix_kind == "dense":
        m = torch.randn(d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    else:
        m = torch.randint(-2, 3, (d, d), generator=g).double()

    def randn(shape, scale, zeros=False):
        t = torch.randn(shape, generator=g, dtype=torch.float64) * scale
        return t * (torch.rand(shape, generator=g) > 0.2) if zeros else t  # some exact zeros

    tables = case.scales["tables"]
    specs = {  # name: (values, dtype)
        "x": (randn(case.x_shape, case.scales["x"], zeros=True), case.dtype),
        "k": (randn(case.k_shape, case.scales["k"]), case.dtype),
        "cos": (randn(case.cos_shape, tables), case.table_dtype),
        "sin": (randn(case.cos_shape, tables, zeros=True), case.table_dtype),
        "matrix": (m, case.matrix_dtype),
        "dy": (randn(case.x_shape, case.scales["dy"]), case.dtype),
    }
    views, storages = {}, {}
    for name, (values, dtype) in specs.items():
        lay = case.layouts[name]
        scale = values.abs().max().item() if values.numel() else 1.0  # for what a window shows
        # (finite in the dtype: an overlapping window shows storage as its values, and at the
        # "large" range its noise rounded to ±inf in fp16, an input no case draws; the float64
        # oracle's dense product then made NaN of inf·0 at M's zeros)
        fmax = torch.finfo(dtype).max
        storage = randn(lay.storage_shape(values.shape), scale / 2).clamp(-fmax, fmax).to(dtype).to(DEVICE)
        lay.place(values.to(dtype).to(DEVICE), storage)
        if requires_grad and name in ("x", "cos", "sin", "matrix"):
            storage.requires_grad_()
        storages[name], views[name] = storage, lay.view(storage, values.shape)
    return views, storages


def snapshot(storages):
    return {n: t.detach().clone() for n, t in storages.items()}


def assert_unmodified(storages, before):
    for n, t in storages.items():
        assert torch.equal(t.detach(), before[n]), f"{n} was modified"


# --- the properties ----------------------------------------------------------------------------


@given(cases())
@in_product
def test_forward(case):
    v, storages = build(case)
    before = snapshot(storages)
    x, k, cos, sin, m = (v[n] for n in ("x", "k", "cos", "sin", "matrix"))

    out = rome.apply(x, cos, sin, m, backend=case.backend)
    assert out.stride(-1) == 1
    value, magnitude, _ = oracle(x, cos, sin, m)
    terms = 0 if exact_products(m) else case.d
    assert_within(out, value, magnitude, case.dtype, terms, "apply", split_flush(case, m, sin))

    again = rome.apply(x, cos, sin, m, backend=case.backend)
    assert torch.equal(out, again), "two runs differ"

    q_out, k_out = rome.apply_qk(x, k, cos, sin, m, backend=case.backend)
    assert torch.equal(q_out, out), "apply_qk's q differs from apply"
    assert torch.equal(k_out, rome.apply(k, cos, sin, m, backend=case.backend)), "apply_qk's k differs from apply"
    assert_unmodified(storages, before)


@given(cases(), st.sampled_from(["x", "cos", "sin", "matrix", "all"]))
@in_product
def test_gradients(case, wrt):
    v, storages = build(case, requires_grad=True)
    x, k, cos, sin, m, dy = (v[n] for n in ("x", "k", "cos", "sin", "matrix", "dy"))
    names = ["x", "cos", "sin", "matrix"] if wrt == "all" else [wrt]
    inputs = [v[n] for n in names]
    before = snapshot(storages)

    out = rome.apply(x, cos, sin, m, backend=case.backend)
    grads = torch.autograd.grad(out, inputs, dy)
    _, _, want = oracle(x, cos, sin, m, dy)
    rows = x.numel() // case.d
    for name, got in zip(names, grads):
        i = ["x", "cos", "sin", "matrix"].index(name)
        expected, magnitude = want[i]
        like = {"x": x, "cos": cos, "sin": sin, "matrix": m}[name]
        if name == "x":  # dx = dy*cos + (dy*sin) @ Mᵀ: a dot of D terms, as three pieces for half x
            terms = 0 if exact_products(m) else 3 * case.d
            extra = split_flush(case, m, sin, backward=True)
        else:  # the sums over the broadcast rows, and the dot of x @ M for dsin
            extra, terms = 0.0, rows + case.d + 2
        assert_within(got, expected, magnitude, like.dtype, terms, f"d{name}", extra)

    again = torch.autograd.grad(rome.apply(x, cos, sin, m, backend=case.backend), inputs, dy)
    assert all(torch.equal(a, b) for a, b in zip(grads, again)), "two backward runs differ"

    if "x" in names:  # apply_qk's dq is apply's dx, bitwise (the same kernel, one launch)
        q_out, k_out = rome.apply_qk(x, k.detach(), cos, sin, m, backend=case.backend)
        (dq,) = torch.autograd.grad(q_out, [x], dy)
        assert torch.equal(dq, grads[names.index("x")]), "apply_qk's dq differs from apply's dx"
    assert_unmodified(storages, before)


@given(cases(), st.integers(1, 3), st.data())
@in_product
def test_positions_and_in_place_entry_points(case, n_axes, data):
    """The other entry points on the same drawn inputs: ``apply_at``/``apply_qk_at`` (cos/sin
    read from caches at positions, A axes, each column its own axis) bitwise ``apply`` on the
    gathered tables, forward and dx; ``apply_``/``apply_qk_`` (in place) and ``apply_out``
    bitwise ``apply``; inputs other than the written ones unmodified."""
    v, storages = build(case)
    x, k, m = v["x"], v["k"], v["matrix"]
    g = torch.Generator().manual_seed(case.seed + 1)
    rows = 1 + data.draw(st.integers(0, 40), label="cache rows - 1")
    cos_c, sin_c = (torch.randn(rows, case.d, generator=g, dtype=torch.float64).to(case.table_dtype).to(DEVICE)
                    for _ in range(2))
    # positions [..., A] over x's row dims (size 1 where k differs: broadcast over heads there)
    pos_shape = [nx if nx == nk else 1 for nx, nk in zip(x.shape[:-1], k.shape[:-1])]
    positions = torch.randint(0, rows, (*pos_shape, n_axes), generator=g).to(DEVICE)
    axis = torch.randint(0, n_axes, (case.d,), generator=g).to(DEVICE) if n_axes > 1 else None
    cos, sin = rome.positions.gather_rows(cos_c, positions, axis), rome.positions.gather_rows(sin_c, positions, axis)
    before = snapshot(storages)

    want = rome.apply(x, cos, sin, m, backend=case.backend)
    assert torch.equal(rome.apply_at(x, cos_c, sin_c, m, positions, axis=axis, backend=case.backend), want)
    wq, wk = rome.apply_qk(x, k, cos, sin, m, backend=case.backend)
    gq, gk = rome.apply_qk_at(x, k, cos_c, sin_c, m, positions, axis=axis, backend=case.backend)
    assert torch.equal(gq, wq) and torch.equal(gk, wk), "apply_qk_at differs from the table path"
    dx = torch.ops.rome.apply_transposed(x, cos, sin, m, case.backend)
    assert torch.equal(torch.ops.rome.apply_transposed(x, cos_c, sin_c, m, case.backend, positions, axis), dx)

    with torch.no_grad():
        # in place needs storage of its own (x may be an overlapping view); the reference runs on
        # the same layout (a dense matrix's dot may add in another order for another layout)
        y, z = x.clone(), k.clone()
        want_y = rome.apply(y, cos, sin, m, backend=case.backend)
        wq, wk = rome.apply_qk(y, z, cos, sin, m, backend=case.backend)
        assert torch.equal(rome.apply_(y, cos, sin, m, backend=case.backend), want_y)
        rome.apply_qk_(y.copy_(x), z, cos, sin, m, backend=case.backend)
        assert torch.equal(y, wq) and torch.equal(z, wk), "apply_qk_ differs from apply_qk"
        out = torch.empty_like(y)
        assert torch.equal(rome.apply_out(x, cos, sin, m, out=out, backend=case.backend), want)

    if case.dtype != torch.float64:  # apply_qk_angles: cos/sin from positions and frequencies
        inv = torch.rand(case.d, generator=g, dtype=torch.float64) * (torch.rand(case.d, generator=g) < 0.9)
        scale = 0.5 + torch.rand((), generator=g, dtype=torch.float64).item()
        freqs, scales = (t.to(DEVICE) for t in rome.positions.angle_frequencies(inv, scale))
        apos = torch.randint(0, 2**20, (*pos_shape, n_axes), generator=g).to(DEVICE)
        got = rome.apply_qk_angles(x, k, freqs, scales, m, apos, axis=axis, backend=case.backend)
        c32, s32 = rome.positions.angle_rows(freqs, scales, apos, axis)  # float64 angles, rounded once
        want = rome.apply_qk(x, k, c32, s32, m, backend=case.backend)
        for y, w, xin in zip(got, want, (x, k)):
            if case.backend == "torch":  # the torch backend builds exactly those tables
                assert torch.equal(y, w), "apply_qk_angles (torch) differs from its tables"
            else:  # the kernel's own cos/sin: within 1.05 x the tables' rounding of float64
                mag = xin.double().abs() + xin.double().abs() @ m.double().abs()
                # (+ one step of the subnormal range: there a rounding's error is that absolute
                # step, not relative to the value; seed 156039's fp32 x of ~1e-39 was one step off)
                fi = torch.finfo(case.dtype)
                bound = 2 * fi.eps * w.double().abs() + 2 * ANGLE_REL * scale * mag + fi.smallest_normal * fi.eps
                yd, wd = y.double(), w.double()
                # equal (infs of an fp16 overflow too), within the bound, or one rounded past the
                # largest finite value where the other stopped at it
                at_edge = (yd.isinf() | wd.isinf()) & (torch.minimum(yd.abs(), wd.abs()) >= torch.finfo(case.dtype).max)
                ok = (yd == wd) | ((yd - wd).abs() <= bound) | at_edge
                assert ok.all(), "apply_qk_angles off its tables"
    assert_unmodified(storages, before)


# --- rome.RoPE: the module's positions handling against an independent table path ---------------


@st.composite
def module_cases(draw):
    """A layout (1D with partial rotary, per-axis sections, mRoPE plain or interleaved), q/k
    shapes, a positions form, offsets, or packed sequences with cu_seqlens."""
    from rome.layouts import mrope_layout, rope_layout, section_layout

    kind = draw(st.sampled_from(["1d", "sections", "mrope"]))
    mode = draw(st.sampled_from(rome.MODES))
    theta = draw(st.sampled_from([100.0, 1e4, 5e5]))
    if kind == "1d":
        rotary = 2 * draw(st.integers(1, 12))
        layout = rope_layout(rome.rope_frequencies(rotary + draw(st.sampled_from([0, 2, 6])), theta=theta,
                                                   rotary_dim=rotary), mode=mode)
    elif kind == "sections":
        sections = draw(st.lists(st.integers(1, 6).map(lambda n: 2 * n), min_size=2, max_size=3))
        layout = section_layout(sections, mode=mode, theta=theta)
    else:
        interleaved = draw(st.booleans())  # (interleaved: transformers' rule for any sections)
        mrope = draw(st.lists(st.integers(1, 4), min_size=3, max_size=3))
        layout = mrope_layout(rome.rope_frequencies(2 * sum(mrope), theta=theta), mrope, interleaved=interleaved)
    backend = draw(st.sampled_from(["torch", "triton"]))
    dtypes = [torch.float32, torch.float16, torch.bfloat16] + ([torch.float64] if backend == "torch" else [])
    return dict(layout=layout, backend=backend, dtype=draw(st.sampled_from(dtypes)),
                packed=draw(st.booleans()), batch=draw(st.integers(1, 3)), seq=draw(st.integers(1, 6)),
                heads=(draw(st.integers(1, 3)), draw(st.integers(1, 2))),
                form=draw(st.integers(0, 2)),  # none, [S] or [S, A], [B, S] or [B, S, A]
                offsets=draw(st.sampled_from(["none", "int", "per-sequence"])),
                seed=draw(st.integers(0, 2**16)))


@given(module_cases())
def test_module_positions_against_the_table_path(c):
    """rome.RoPE(layout)(q, k, positions, offsets=..., cu_seqlens=...) bitwise rome.apply on
    per-token tables gathered here from a float64-angle cache at positions computed here (the
    form broadcast to [B, S, A], offsets added; packed: 0..n-1 per sequence); inputs unmodified."""
    from rome.layouts import cos_sin_cache

    layout, dtype, backend = c["layout"], c["dtype"], c["backend"]
    g = torch.Generator().manual_seed(c["seed"])
    a, d = layout.n_axes, layout.head_dim
    nq, nk = c["heads"]
    if c["packed"]:  # sequences of random lengths packed as [T, N, D]
        lengths = torch.randint(1, 5, (c["batch"],), generator=g)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        t = int(cu[-1])
        q = torch.randn(t, nq, d, generator=g).to(dtype).to(DEVICE)
        k = torch.randn(t, nk, d, generator=g).to(dtype).to(DEVICE)
        n_seq, positions = len(lengths), None
        base = torch.cat([torch.arange(int(n)) for n in lengths])[None, :, None].expand(1, t, a)
        seq_of_token = torch.repeat_interleave(torch.arange(n_seq), lengths)
    else:
        b, s = c["batch"], c["seq"]
        q = torch.randn(b, nq, s, d, generator=g).to(dtype).to(DEVICE)
        k = torch.randn(b, nk, s, d, generator=g).to(dtype).to(DEVICE)
        n_seq = b
        form = (("none", "[S]", "[B, S]") if a == 1 else ("none", "[S, A]", "[B, S, A]"))[c["form"]]
        shape = {"none": None, "[S]": (s,), "[B, S]": (b, s), "[S, A]": (s, a), "[B, S, A]": (b, s, a)}[form]
        positions = None if shape is None else torch.randint(0, 40, shape, generator=g)
        base = {"none": lambda: torch.arange(s)[None, :, None], "[S]": lambda: positions[None, :, None],
                "[B, S]": lambda: positions[:, :, None], "[S, A]": lambda: positions[None],
                "[B, S, A]": lambda: positions}[form]().expand(b, s, a)
        seq_of_token = None
    offsets = None
    if c["offsets"] == "int":
        offsets = int(torch.randint(0, 30, (), generator=g))
        shift = torch.full((n_seq,), offsets)
    elif c["offsets"] == "per-sequence":
        shift = torch.randint(0, 30, (n_seq,), generator=g)
        offsets = shift.to(DEVICE)
    else:
        shift = torch.zeros(n_seq, dtype=torch.int64)
    if seq_of_token is not None:
        pos_bsa = base + shift[seq_of_token][None, :, None]
    else:
        pos_bsa = base + shift[:, None, None]
    note(f"layout {layout!r} positions {None if positions is None else list(positions.shape)} offsets {offsets}")

    event(f"module {backend} {str(dtype)[6:]} {'packed' if c['packed'] else 'bnsd'} axes={a}")
    rope = rome.RoPE(layout, backend=backend)
    before = [t.clone() for t in (q, k, *(() if positions is None else (positions,)))]
    if c["packed"]:
        got = rope(q, k, offsets=offsets, cu_seqlens=cu.to(DEVICE))
    else:
        # B = S = A: [B, S, A] (or [S, A] vs [B, S]) also fits another form; say where the axes are
        axes_dim = -1 if a > 1 and positions is not None and b == s == a else None
        got = rope(q, k, None if positions is None else positions.to(DEVICE), offsets=offsets, axes_dim=axes_dim)

    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    cache = cos_sin_cache(layout, int(pos_bsa.max()) + 1, dtype=table_dtype)
    cos, sin = rome.layouts.tables_for_positions(layout, cache, pos_bsa[..., 0] if a == 1 else pos_bsa)  # [B', S, D]
    cos, sin = ((t[0][:, None] if c["packed"] else t[:, None]).to(DEVICE) for t in (cos, sin))
    m = layout.matrix(dtype, DEVICE)
    for x, out in zip((q, k), got):
        want = rome.apply(x, cos, sin, m, backend=backend)
        assert out.dtype == dtype and torch.equal(out, want), "rome.RoPE differs from the table path"
    for t, b4 in zip((q, k, *(() if positions is None else (positions,))), before):
        assert torch.equal(t, b4), "an input was modified"


# --- issue 21: what an independent fuzz found --------------------------------------------------
# Fewer examples than the properties above under the default profile (the interpreter is slow);
# `make fuzz` (profile "fuzz") runs ten times as many as "rome" gives here.

from hypothesis import settings  # noqa: E402

FEW = settings(max_examples=max(10, settings.default.max_examples // 10))


@st.composite
def small_qk(draw, dtypes=(torch.float32, torch.float16, torch.bfloat16)):
    backend = draw(st.sampled_from(["torch", "triton"]))
    dtype = draw(st.sampled_from(dtypes))
    d = 2 * draw(st.integers(1, 16))
    sections = random_sections(draw, d)
    mode = draw(st.sampled_from(rome.MODES))
    b, s, nq, nk = (draw(st.integers(1, 3)) for _ in range(4))
    return dict(backend=backend, dtype=dtype, d=d, sections=sections, mode=mode, shape=(b, s, nq, nk),
                seed=draw(st.integers(0, 2**31 - 1)))


def _small_inputs(c, g):
    b, s, nq, nk = c["shape"]
    q = torch.randn(b, nq, s, c["d"], generator=g).to(c["dtype"]).to(DEVICE)
    k = torch.randn(b, nk, s, c["d"], generator=g).to(c["dtype"]).to(DEVICE)
    m = rome.rotation_matrix(c["sections"], c["mode"], dtype=c["dtype"]).to(DEVICE)
    return q, k, m


@FEW
@given(small_qk(), st.integers(2, 3), st.sampled_from(["strided", "expanded", "offset"]), st.data())
def test_axis_read_through_its_strides(c, n_axes, how, data):
    """apply_qk_at / apply_qk_angles with ``axis`` a strided view, an expanded one (stride 0) or
    one at a storage offset: bitwise the same call with the contiguous axis (issue 21 item 1)."""
    g = torch.Generator().manual_seed(c["seed"])
    q, k, m = _small_inputs(c, g)
    d, (b, s, _, _) = c["d"], c["shape"]
    if how == "expanded":
        axis = torch.full((1,), data.draw(st.integers(0, n_axes - 1)), dtype=torch.int64).expand(d)
    elif how == "strided":
        step = data.draw(st.integers(2, 4))
        axis = torch.randint(0, n_axes, (d * step,), generator=g)[::step]
    else:
        axis = torch.randint(0, n_axes, (d + 3,), generator=g)[3:]
    axis = axis.to(DEVICE)
    assert how == "offset" or not axis.is_contiguous()
    rows = 1 + data.draw(st.integers(0, 20))
    cos_c, sin_c = (torch.randn(rows, d, generator=g).to(DEVICE) for _ in range(2))
    positions = torch.randint(0, rows, (b, 1, s, n_axes), generator=g).to(DEVICE)
    got = rome.apply_qk_at(q, k, cos_c, sin_c, m, positions, axis=axis, backend=c["backend"])
    want = rome.apply_qk_at(q, k, cos_c, sin_c, m, positions, axis=axis.contiguous().clone(), backend=c["backend"])
    assert all(torch.equal(x, y) for x, y in zip(got, want)), f"apply_qk_at with a {how} axis"
    freqs, scales = (t.to(DEVICE) for t in rome.positions.angle_frequencies(
        torch.rand(d, generator=g, dtype=torch.float64), 1.0))
    apos = torch.randint(0, 2**16, (b, 1, s, n_axes), generator=g).to(DEVICE)
    got = rome.apply_qk_angles(q, k, freqs, scales, m, apos, axis=axis, backend=c["backend"])
    want = rome.apply_qk_angles(q, k, freqs, scales, m, apos, axis=axis.contiguous().clone(), backend=c["backend"])
    assert all(torch.equal(x, y) for x, y in zip(got, want)), f"apply_qk_angles with a {how} axis"
    event(f"axis {how} {c['backend']}")


# the kernel's sum before the store's rounding (rome/kernel.py): bf16 in and out (_dot2_short)
# within 2**-6 of a bf16 ulp, so 0.5 + 2**-6 after it; fp16 (_dot2) faithful: 1 ulp. Neither is
# the correctly rounded float64 result on every element (the torch backend's, <= 0.5 ulp)
MIXED_ULPS = {torch.bfloat16: 0.5 + 2.0**-6, torch.float16: 1.0}


@FEW
@given(small_qk(dtypes=(torch.float16, torch.bfloat16)), st.booleans(), st.booleans())
def test_cos_and_sin_of_two_dtypes(c, cos_fp32, at_positions):
    """cos in fp32 and sin in x's dtype (or the other way round), each read as its own dtype:
    the triton backend within its ulps (``MIXED_ULPS``) of the torch backend's float64 result,
    both within the float64 oracle (issue 21 item 2: sin's fp32 bytes were read as bf16, ~1e30)."""
    g = torch.Generator().manual_seed(c["seed"])
    q, k, m = _small_inputs(c, g)
    d, (b, s, _, _) = c["d"], c["shape"]
    dtypes = (torch.float32, c["dtype"]) if cos_fp32 else (c["dtype"], torch.float32)
    if at_positions:
        rows = 8
        cos, sin = (torch.randn(rows, d, generator=g).to(t).to(DEVICE) for t in dtypes)
        positions = torch.randint(0, rows, (b, 1, s, 1), generator=g).to(DEVICE)
        run = lambda backend, *a: rome.apply_qk_at(*a, positions, backend=backend)  # noqa: E731
        tables = (rome.positions.gather_rows(cos, positions), rome.positions.gather_rows(sin, positions))
    else:
        cos, sin = (torch.randn(b, 1, s, d, generator=g).to(t).to(DEVICE) for t in dtypes)
        run = lambda backend, *a: rome.apply_qk(*a, backend=backend)  # noqa: E731
        tables = (cos, sin)
    got = run(c["backend"], q, k, cos, sin, m)
    want = run("torch", *(t.double() for t in (q, k, cos, sin, m)))
    assert all(ulp_error(x, y, c["dtype"]).max() <= MIXED_ULPS[c["dtype"]] for x, y in zip(got, want)), \
        "mixed table dtypes differ from the torch backend's float64 result"
    for x, out in zip((q, k), got):
        value, magnitude, _ = oracle(x, *tables, m)
        assert_within(out, value, magnitude, c["dtype"], 0, "mixed table dtypes")
    event(f"mixed tables {c['backend']} cos {'fp32' if cos_fp32 else 'x'}")


@FEW
@given(small_qk(dtypes=(torch.float32, torch.float16, torch.bfloat16)), st.sampled_from(["apply_qk", "at", "angles"]))
def test_overflowing_inputs_give_the_rounded_infinity(c, entry):
    """x near its dtype's largest value: where the float64 result rounds past it the output is
    that infinity (no NaN from inf - inf in the error-free products), elsewhere within the
    oracle's bound; apply_qk, apply_qk_at and apply_qk_angles (issue 21 item 3)."""
    g = torch.Generator().manual_seed(c["seed"])
    _, _, m = _small_inputs(c, g)
    d, (b, s, nq, nk) = c["d"], c["shape"]
    big = torch.finfo(c["dtype"]).max
    sign = lambda n: torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()  # noqa: E731
    q = (big * (0.5 + 0.5 * torch.rand(b, nq, s, d, generator=g, dtype=torch.float64)) * sign((b, nq, s, d)))
    k = (big * (0.5 + 0.5 * torch.rand(b, nk, s, d, generator=g, dtype=torch.float64)) * sign((b, nk, s, d)))
    q, k = (t.to(c["dtype"]).to(DEVICE) for t in (q, k))
    angles = torch.rand(b, 1, s, d // 2, generator=g, dtype=torch.float64) * 2 * math.pi
    angles = torch.cat([angles, angles], -1)
    cos, sin = angles.cos().float().to(DEVICE), angles.sin().float().to(DEVICE)
    if entry == "apply_qk":
        got = rome.apply_qk(q, k, cos, sin, m, backend=c["backend"])
        tables = (cos, sin)
    elif entry == "at":
        cos_c, sin_c = cos.reshape(-1, d), sin.reshape(-1, d)
        positions = torch.arange(b * s, device=DEVICE).reshape(b, 1, s, 1)
        got = rome.apply_qk_at(q, k, cos_c, sin_c, m, positions, backend=c["backend"])
        tables = (cos, sin)
    else:
        freqs, scales = (t.to(DEVICE) for t in rome.positions.angle_frequencies(
            torch.rand(d, generator=g, dtype=torch.float64), 1.0))
        positions = torch.randint(0, 2**12, (b, 1, s, 1), generator=g).to(DEVICE)
        got = rome.apply_qk_angles(q, k, freqs, scales, m, positions, backend=c["backend"])
        tables = rome.positions.angle_rows(freqs, scales, positions)  # within ANGLE_REL of the kernel's
    for x, out in zip((q, k), got):
        assert not out.isnan().any(), f"{entry}: NaN from finite inputs"
        value, magnitude, _ = oracle(x, *tables, m)
        extra = 2 * ANGLE_REL * magnitude if entry == "angles" and c["backend"] == "triton" else 0.0
        assert_within(out, value, magnitude, c["dtype"], 0, entry, extra)
    event(f"overflow {entry} {c['backend']} {'inf' if any(o.isinf().any() for o in got) else 'finite'}")


# --- issue 21: unknown HF model types ------------------------------------------------------------

from conftest import optional  # noqa: E402

_transformers, needs_transformers = optional("transformers")
_CONFIG_KINDS = sorted(_transformers.CONFIG_MAPPING.keys()) if _transformers else ["(none)"]
_ROPE_CHANGES = ("missing", "not a dict", "no rope_type", "unknown rope_type", "no rope_theta", "rope_theta",
                 "linear", "linear without factor", "yarn", "dynamic")


@st.composite
def hf_configs(draw):
    """A default config of any class transformers registers, then one perturbation: an unknown
    model_type string (on the object, or on its config.json dict), odd rope parameters, a
    partial_rotary_factor, a head_dim that disagrees with hidden_size / heads."""
    kind = draw(st.sampled_from(_CONFIG_KINDS))
    try:
        config = _transformers.CONFIG_MAPPING[kind]()
    except Exception:  # noqa: BLE001 - transformers' own defaults refused (gemma4_assistant, nougat)
        reject()
    change = draw(st.sampled_from(["none", "model_type", "model_type dict", "rope_parameters",
                                   "partial_rotary_factor", "head_dim"]))
    params = getattr(config, "rope_parameters", None)
    params = dict(params) if isinstance(params, dict) else {}
    try:
        if change == "model_type":
            config.model_type = draw(st.sampled_from(["zz_", "x", "my_"])) + kind.replace("-", "_") + "_custom"
        elif change == "model_type dict":
            config = {**config.to_dict(), "model_type": "no_such_" + kind}
        elif change == "rope_parameters":
            how = draw(st.sampled_from(_ROPE_CHANGES))
            value = {
                "missing": None, "not a dict": "default",
                "no rope_type": {k: v for k, v in params.items() if k != "rope_type"},
                "unknown rope_type": {**params, "rope_type": "bogus"},
                "no rope_theta": {k: v for k, v in params.items() if k != "rope_theta"},
                "rope_theta": {**params, "rope_theta": draw(st.sampled_from([1.0, 500.0, 1e6, 0.0, -1.0, math.nan]))},
                "linear": {**params, "rope_type": "linear", "factor": draw(st.sampled_from([0.5, 1.0, 2.0, 4.0]))},
                "linear without factor": {**{k: v for k, v in params.items() if k != "factor"}, "rope_type": "linear"},
                "yarn": {**params, "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                "dynamic": {**params, "rope_type": "dynamic", "factor": 2.0},
            }[how]
            event(f"rope_parameters {how}")
            config.rope_parameters = value
        elif change == "partial_rotary_factor":
            value = draw(st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.75, 1.0, 0.0, -0.5, 1.5]))
            config.partial_rotary_factor = value
            if params:
                config.rope_parameters = {**params, "partial_rotary_factor": value}
        elif change == "head_dim":
            text = config.get_text_config()
            heads = getattr(text, "num_attention_heads", None)
            hidden = getattr(text, "hidden_size", None)
            base = hidden // heads if isinstance(heads, int) and isinstance(hidden, int) and heads else 64
            text.head_dim = draw(st.sampled_from([base + 2, 2 * base, base - 2, base + 1, 0, -4, 6]))
    except Exception:  # noqa: BLE001 - transformers' strict config refused the assignment itself
        reject()
    event(f"perturbation {change}")
    return kind, change, config


@needs_transformers
@FEW
@given(hf_configs())
def test_unknown_hf_model_types(drawn):
    """``RoPE.from_hf_config`` on configs drawn from transformers' registry and perturbed: a RoPE
    that rotates as transformers' own code for that config, or a ValueError naming the model
    type; never another exception, never a silently different rotation (issue 21 item 4). Only
    where transformers' own rotary module raises on the perturbed config is there no rotation to
    compare ("unchecked", counted as an event); any other failure of the check against
    transformers' code fails (tests/test_hf_rotation.py: check_hf_config)."""
    import warnings

    from test_hf_rotation import check_hf_config

    kind, change, config = drawn
    note(f"{kind}: {change}")
    warnings.filterwarnings("ignore")
    outcome, problem = check_hf_config(config, torch.Generator().manual_seed(0), strict=False)
    event(f"outcome {outcome}")
    assert problem is None, f"{kind} ({change}): {problem}"


# --- rome.apply_qk_norm: q/k norm then RoPE (issue 29) -------------------------------------------


def _norm_rope64(x, w, b, cos, sin, m, *, norm, over, eps, offset):
    """float64 oracle of norm-then-rotate: the norm by its formula (per head, or over a token's
    heads with head-major weights), then x*cos + (x@M)*sin."""
    return rope64(_norm64(x, w, b, norm=norm, over=over, eps=eps, offset=offset), cos, sin, m)


def _norm64(x, w, b, *, norm, over, eps, offset):
    """The float64 normalised x of ``_norm_rope64`` (before the rotation)."""
    x = x.double()
    dims = (-1,) if over == "head" else (1, -1)
    if norm == "layer":
        x = x - x.mean(dims, keepdim=True)
    y = x / torch.sqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    shape = (-1,) if over == "head" else (x.shape[1], 1, x.shape[-1])
    y = y * (w.double().view(shape) + offset)
    if b is not None:
        y = y + b.double().view(shape)
    return y


@FEW
@given(small_qk(), st.sampled_from(["rms", "layer"]), st.sampled_from(["head", "heads"]),
       st.sampled_from([0.0, 1.0]), st.booleans(), st.sampled_from(["bnsd", "bshd", "strided"]), st.booleans())
def test_qk_norm_against_its_oracle(c, norm, over, offset, positions, layout, token_tile):
    """apply_qk_norm / apply_qk_norm_at over rms/layer, per head / over heads, Gemma's offset,
    BNSD, transposed-BSHD and strided q/k, bf16/fp16/fp32, the torch and triton backends: within
    the rounding of the dtype (the torch backend's float64 norm: 1 ulp in half precision; the
    kernel's fp32 norm: rome.precision.tolerance, 1 ulp plus its rounding carried through a
    rotation that cancels; 2e-6 relative in fp32) of the float64 oracle;
    inputs unmodified. RMSNorm over heads on the triton backend interprets the token tile or the
    head groups, drawn (a GPU takes the token tile: rome.launch.TOKEN_TILE_INTERPRETED)."""
    before = launch.TOKEN_TILE_INTERPRETED
    launch.TOKEN_TILE_INTERPRETED = token_tile
    try:
        _check_qk_norm(c, norm, over, offset, positions, layout)
    finally:
        launch.TOKEN_TILE_INTERPRETED = before
    event(f"qk_norm {norm} over {over} {c['backend']} {layout}"
          + (" token tile" if token_tile and over == "heads" and norm == "rms" and c["backend"] == "triton" else ""))


def _check_qk_norm(c, norm, over, offset, positions, layout):
    g = torch.Generator().manual_seed(c["seed"])
    b, s, nq, nk = c["shape"]
    d, dtype = c["d"], c["dtype"]

    def make(h):
        if layout == "bshd":
            return torch.randn(b, s, h, d, generator=g).to(dtype).transpose(1, 2).to(DEVICE)
        if layout == "strided":
            return torch.randn(b, h, s, 2 * d, generator=g).to(dtype)[..., ::2].to(DEVICE)
        return torch.randn(b, h, s, d, generator=g).to(dtype).to(DEVICE)

    q, k = make(nq), make(nk)
    m = rome.rotation_matrix(c["sections"], c["mode"], dtype=dtype).to(DEVICE)
    n = lambda h: d if over == "head" else h * d  # noqa: E731
    wq, wk = (torch.rand(n(h), generator=g).add(0.5).to(DEVICE) for h in (nq, nk))
    bq, bk = ((torch.randn(n(h), generator=g).mul(0.1).to(DEVICE) for h in (nq, nk)) if norm == "layer"
              else (None, None))
    rows = s + 3
    ang = torch.randn(rows, d, generator=g, dtype=torch.float64)
    cos_c, sin_c = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    before = [t.clone() for t in (q, k)]
    kw = dict(eps=1e-5, norm=norm, over=over, weight_offset=offset, q_bias=bq, k_bias=bk, backend=c["backend"])
    if positions:
        pos = torch.randint(0, rows, (b, 1, s, 1), generator=g).to(DEVICE)
        got = rome.apply_qk_norm_at(q, k, cos_c, sin_c, m, pos, wq, wk, **kw)
        cos, sin = cos_c[pos[..., 0]], sin_c[pos[..., 0]]
    else:
        cos, sin = cos_c[:s], sin_c[:s]
        got = rome.apply_qk_norm(q, k, cos, sin, m, wq, wk, **kw)
    assert all(torch.equal(x, y) for x, y in zip((q, k), before)), "inputs modified"
    for out, x, w, bias in zip(got, (q, k), (wq, wk), (bq, bk)):
        want = _norm_rope64(x, w, bias, cos, sin, m, norm=norm, over=over, eps=1e-5, offset=offset)
        assert out.dtype == dtype and out.shape == x.shape
        if dtype == torch.float32:
            tol = 2e-6 * want.abs() + 2e-6 * want.abs().max()
            if norm == "layer":  # fp32 x - mean keeps |mean| / std fewer of x's bits than the
                # float64 oracle (a row's condition; torch's fp32 layer_norm alike): seed 258's k
                # head at 1.26 and 1.32, |mean| / std = 44, 2e-6 off in outputs of ~0.075
                xd = x.double()
                dims = (-1,) if over == "head" else (1, -1)
                mean = xd.mean(dims, keepdim=True)
                cond = mean.abs() / torch.sqrt((xd - mean).pow(2).mean(dims, keepdim=True) + 1e-5)
                tol = tol + 8 * torch.finfo(torch.float32).eps * cond * (w.double().abs().max() + offset)
            err = (out.double() - want).abs()
            assert (err <= tol).all(), f"{(err - tol).max().item()} over the bound"
        elif c["backend"] == "torch":  # (a float64 norm, rounded once)
            ulps = rome.precision.ulp_error(out, want, dtype).max().item()
            assert ulps <= 1.0 + 1e-6, f"{ulps} ulp"
        else:  # the kernel's fp32 norm: its rounding is carried through the rotation, which can
            # cancel (seed 42097: fp16 LayerNorm, a result 1e-4 of its terms, 2.46 ulp): the stated
            # tolerance, 1 ulp + 4·2**-24·(|x̂·cos| + |x̂[src]·sin|)
            y = _norm64(x, w, bias, norm=norm, over=over, eps=1e-5, offset=offset)
            magnitude = (y * cos.double()).abs() + ((y @ m.double()) * sin.double()).abs()
            err = (out.double() - want).abs()
            bound = rome.precision.tolerance(want, magnitude, dtype)
            assert (err <= bound).all(), f"{((err - bound) / bound).max().item()} over the bound"
    # the gradients of q, k, the weights and biases (the fused backward on the triton backend)
    # against the float64 oracle's autograd. dx = rstd·(g·w − x̂·mean(g·w·x̂) [− mean(g·w)]) is a
    # difference of terms of size rstd·|g·w| (|g| <= 2 max|dy|) that can cancel (LayerNorm over 2
    # values: dx ~ 0): the fp32 arithmetic's error is relative to that size, 1e-5 of it (the fp32
    # rows' tolerance); half precision adds its one rounding (1 ulp). The weights' and biases'
    # sums: 1e-5 of Σ_rows |g|·|x̂| (<= 2 max|dy| · max|x̂| · rows) likewise.
    leaves = [t.detach().requires_grad_() for t in (q, k, wq, wk, *((bq, bk) if bq is not None else ()))]
    qg, kg, wqg, wkg = leaves[:4]
    bqg, bkg = leaves[4:] if bq is not None else (None, None)
    kw = dict(kw, q_bias=bqg, k_bias=bkg)
    out = (rome.apply_qk_norm_at(qg, kg, cos_c, sin_c, m, pos, wqg, wkg, **kw) if positions
           else rome.apply_qk_norm(qg, kg, cos, sin, m, wqg, wkg, **kw))
    dys = [torch.randn(o.shape, generator=g).to(dtype).to(DEVICE) for o in out]
    got = torch.autograd.grad(out, leaves, dys)
    want = [_norm_rope64(x, w, bias, cos, sin, m, norm=norm, over=over, eps=1e-5, offset=offset)
            for x, w, bias in zip((qg, kg), (wqg, wkg), (bqg, bkg))]
    ref = torch.autograd.grad(want, leaves, [dy.double() for dy in dys])
    dims = (-1,) if over == "head" else (1, -1)
    for i, (a, r) in enumerate(zip(got, ref)):
        x, w, dy = ((qg, wqg, dys[0]), (kg, wkg, dys[1]))[i % 2]
        x64 = x.detach().double()
        if norm == "layer":
            x64 = x64 - x64.mean(dims, keepdim=True)
        rstd = torch.rsqrt(x64.pow(2).mean(dims, keepdim=True) + 1e-5)
        g_max = 2 * dy.double().abs().max().item()
        if i < 2:  # dq, dk
            size = g_max * (w.detach().double().abs().max().item() + abs(offset)) * rstd.max().item()
            err = (a.double() - r.double()).abs()
            ok = err <= 1e-5 * size
            if dtype != torch.float32:
                ok |= rome.precision.ulp_error(a, r.double(), dtype) <= 1.0 + 1e-6
            assert ok.all(), f"d{'qk'[i]}: error {err.max().item():.3g} (terms' size {size:.3g})"
        else:  # dw, db (fp32)
            size = g_max * (x64 * rstd).abs().max().item() * (x64.numel() / a.numel())
            torch.testing.assert_close(a.double(), r.double(), rtol=1e-5, atol=1e-5 * size)
