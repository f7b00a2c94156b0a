"""Issue 28: the lean eager path (a call's metadata work remembered per signature) and no host
sync by default (positions are not read on the host; out-of-range elements are NaN).

The lean path is checked against the full path (the same call inside a pass-through
TorchFunctionMode, which turns the lean path off: bitwise) and against a float64 reference
(x*cos + (x@M)*sin computed in float64: within 2 fp32 ulps of the value's size, the kernel's and
the torch backend's bound being 1). Host reads are counted by replacing the Tensor methods that
bring values to the host."""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import rome
from rome import ops
from rome.layouts import cos_sin_cache, mrope_layout, rope_layout
from rome.frequencies import rope_frequencies
from rome.positions import angle_frequencies, angle_rows, gather_rows

from conftest import BACKENDS, DEVICE

P = 40


class _Full(TorchFunctionMode):
    """Pass-through: with a torch-function mode active rome takes its full path (the op)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _reference(x, cos, sin, m):
    x64 = x.double()
    return x64 * cos.double() + (x64 @ m.double()) * sin.double()


def _close(out, ref):
    """Within 2 fp32 ulps of the terms' size (the result is rounded once from fp32)."""
    scale = ref.abs().clamp_min(1.0)
    assert ((out.double() - ref).abs() <= 2 * 2.0**-23 * scale).all()


def _setup(n_axes=1):
    layout = rope_layout(rope_frequencies(32), mode="half") if n_axes == 1 else \
        mrope_layout(rope_frequencies(32), [4, 6, 6])
    cos, sin = cos_sin_cache(layout, P, device=DEVICE)
    axis = layout.axis.to(DEVICE) if n_axes > 1 else None
    return layout, cos, sin, layout.matrix(torch.float32, DEVICE), axis


def _calls(name):
    """A spy on ops.<name> (an entry point's full path): the calls that missed the lean path."""
    seen = []
    real = getattr(ops, name)

    def spy(*args):
        seen.append(1)
        return real(*args)

    return spy, seen


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_repeated_call_takes_the_lean_path_bitwise(backend, monkeypatch):
    layout, cache_c, cache_s, m, _ = _setup()
    spy, seen = _calls("_full_apply_qk")
    monkeypatch.setattr(ops, "_full_apply_qk", spy)
    spy_at, seen_at = _calls("_full_apply_qk_at")
    monkeypatch.setattr(ops, "_full_apply_qk_at", spy_at)
    for step in range(3):  # new values, one signature: the full path once, then the lean one
        q, k = torch.randn(2, 4, 5, 32, device=DEVICE), torch.randn(2, 2, 5, 32, device=DEVICE)
        pos = torch.randint(0, P, (2, 1, 5, 1), device=DEVICE)
        cos, sin = gather_rows(cache_c, pos), gather_rows(cache_s, pos)
        got = rome.apply_qk(q, k, cos, sin, m, backend=backend)
        got_at = rome.apply_qk_at(q, k, cache_c, cache_s, m, pos, backend=backend)
        with _Full():
            want = rome.apply_qk(q, k, cos, sin, m, backend=backend)
            want_at = rome.apply_qk_at(q, k, cache_c, cache_s, m, pos, backend=backend)
        for a, b, x in zip((*got, *got_at), (*want, *want_at), (q, k, q, k)):
            assert torch.equal(a, b)
            _close(a, _reference(x, cos, sin, m))
    assert (len(seen), len(seen_at)) == (1 + 3, 1 + 3)  # one miss, and the 3 calls of the full path


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_entry_point_lean_and_full_agree(backend):
    layout, cache_c, cache_s, m, axis = _setup(n_axes=3)
    freqs, scales = (t.to(DEVICE) for t in angle_frequencies(layout.inv_freq))
    for _ in range(2):
        x = torch.randn(3, 2, 4, 32, device=DEVICE)
        k = torch.randn(3, 1, 4, 32, device=DEVICE)
        pos = torch.randint(0, P, (3, 1, 4, 3), device=DEVICE)
        calls = [
            lambda: rome.apply(x, gather_rows(cache_c, pos, axis), gather_rows(cache_s, pos, axis), m,
                               backend=backend),
            lambda: rome.apply(x, cache_c[:4], cache_s[:4], mode="half", backend=backend),
            lambda: rome.apply_at(x, cache_c, cache_s, m, pos, axis=axis, backend=backend),
            lambda: rome.apply_qk_at(x, k, cache_c, cache_s, m, pos, axis=axis, backend=backend),
            lambda: rome.apply_qk_angles(x, k, freqs, scales, m, pos, axis=axis, backend=backend),
        ]
        for f in calls:
            got = f()
            with _Full():
                want = f()
            got, want = (got,) if isinstance(got, torch.Tensor) else got, \
                (want,) if isinstance(want, torch.Tensor) else want
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    c, s = angle_rows(freqs, scales, pos, axis, dtype=torch.float64)
    out = rome.apply_qk_angles(x, k, freqs, scales, m, pos, axis=axis, backend=backend)[0]
    # angles: the kernel's cos/sin within 3.05e-8 of float64 (rome.ops), the product one rounding
    assert (out.double() - _reference(x, c, s, m)).abs().max() <= 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
def test_lean_gradients_are_the_ops(backend):
    """Under autograd the lean path's Function gives the op's grads, bitwise: x, the caches and the
    matrix, and double backward."""
    layout, cache_c, cache_s, m, axis = _setup(n_axes=3)
    for _ in range(2):
        q = torch.randn(2, 2, 4, 32, device=DEVICE, requires_grad=True)
        k = torch.randn(2, 1, 4, 32, device=DEVICE, requires_grad=True)
        c, s = cache_c.clone().requires_grad_(), cache_s.clone().requires_grad_()
        mm = m.clone().requires_grad_()
        pos = torch.randint(0, P, (2, 1, 4, 3), device=DEVICE)
        grads = [torch.randn(2, 2, 4, 32, device=DEVICE), torch.randn(2, 1, 4, 32, device=DEVICE)]

        def run():
            out = rome.apply_qk_at(q, k, c, s, mm, pos, axis=axis, backend=backend)
            return torch.autograd.grad(out, (q, k, c, s, mm), grads, create_graph=True)

        got = run()
        with _Full():
            want = run()
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        gg = torch.autograd.grad(got[0].sum(), (q,), allow_unused=True)[0]
        with _Full():
            gw = torch.autograd.grad(want[0].sum(), (q,), allow_unused=True)[0]
        assert (gg is None and gw is None) or torch.equal(gg, gw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_ops_backward_takes_the_lean_path(backend, monkeypatch):
    """A signature's first call runs the op (the full path, learning it); a graph of that call kept
    and run again (retain_graph: a benchmark's backward, a kept graph re-run) rotates its gradients
    through the lean path from its second backward on, with the first backward's bits. (The op's
    backward used to call the full path every time: ~0.5 ms of host time a backward on an H100.)"""
    _, cos, sin, m, _ = _setup()
    cos, sin = cos[:5], sin[:5]
    q = torch.randn(2, 4, 5, 32, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 2, 5, 32, device=DEVICE, requires_grad=True)
    out = rome.apply_qk(q.detach(), k.detach(), cos, sin, m, backend=backend)  # (a miss: nothing learnt
    out = rome.apply_qk(q, k, cos, sin, m, backend=backend)  # for requires_grad) this signature's first
    grads = [torch.randn_like(o) for o in out]
    first = torch.autograd.grad(out, (q, k), grads, retain_graph=True)  # (learns the rotation's signature)
    hits = []
    real = ops._lean_call
    monkeypatch.setattr(ops, "_lean_call", lambda *a: hits.append(1) or real(*a))
    second = torch.autograd.grad(out, (q, k), grads, retain_graph=True)
    assert hits == [1]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    for a, g in zip(second, grads):  # the adjoint: g*cos + (g*sin) @ Mᵀ, in float64
        g64 = g.double()
        _close(a, g64 * cos.double() + (g64 * sin.double()) @ m.double().mT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_hit_still_refuses_bad_input(backend):
    """A signature is remembered only after its full check passed: a call that differs in any
    checked property misses and gets the full path's error; a matrix written in place is planned
    again; inputs are never modified."""
    _, cache_c, cache_s, m, _ = _setup()
    q, k = torch.randn(2, 4, 5, 32, device=DEVICE), torch.randn(2, 2, 5, 32, device=DEVICE)
    cos, sin = cache_c[:5], cache_s[:5]
    for _ in range(2):
        rome.apply_qk(q, k, cos, sin, m, backend=backend)
    before = [t.clone() for t in (q, k, cos, sin, m)]
    cases = [
        (lambda: rome.apply_qk(q, k, cos.double(), sin, m, backend=backend), TypeError, "cos must be float32"),
        (lambda: rome.apply_qk(q, k[..., :16], cos, sin, m, backend=backend), ValueError, "same head_dim"),
        (lambda: rome.apply_qk(q, k, cos[:4], sin[:4], m, backend=backend), ValueError, "must broadcast"),
        (lambda: rome.apply_qk(q, k, cos, sin, m[:16], backend=backend), ValueError, r"matrix must be \[D, D\]"),
        (lambda: rome.apply_qk(q, k, cos, sin, m, backend="cuda"), ValueError, "backend must be one of"),
        (lambda: rome.apply_qk(q.half(), k, cos, sin, m, backend=backend), TypeError, "must have one dtype"),
        (lambda: rome.apply_qk(q, k, cos, sin, m, mode="half", backend=backend), ValueError, "not both"),
        (lambda: rome.apply_qk_at(q, k, cache_c, cache_s, m, torch.zeros(2, 1, 5, 1), backend=backend),
         TypeError, "positions must be an int32 or int64 tensor"),
    ]
    for fn, exc, match in cases:
        for _ in range(2):
            with pytest.raises(exc, match=match):
                fn()
    assert all(torch.equal(a, b) for a, b in zip(before, (q, k, cos, sin, m)))
    # the matrix's values choose the plan: written in place, the next call plans again
    mm = m.clone()
    for _ in range(2):
        rome.apply_qk(q, k, cos, sin, mm, backend=backend)
    mm.copy_(rome.rotation_matrix(32, "interleave", device=DEVICE))
    out = rome.apply_qk(q, k, cos, sin, mm, backend=backend)
    _close(out[0], _reference(q, cos, sin, mm))


# --- host reads -----------------------------------------------------------------------------------

HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture
def no_host_reads(monkeypatch):
    """Within ``no_host_reads()``, a Tensor method that brings values to the host raises."""
    import contextlib

    @contextlib.contextmanager
    def block():
        originals = {n: getattr(torch.Tensor, n) for n in HOST_READS}

        def fail(name):
            def read(self, *a, **kw):
                raise AssertionError(f"host read: Tensor.{name} of a {list(self.shape)} {self.dtype} tensor")
            return read

        for n in HOST_READS:
            monkeypatch.setattr(torch.Tensor, n, fail(n))
        try:
            yield
        finally:
            for n, f in originals.items():
                monkeypatch.setattr(torch.Tensor, n, f)

    return block


def test_the_spy_catches_a_host_read(no_host_reads):
    """The counter can fail: the host check (position_checks("host")) reads the positions."""
    _, cache_c, cache_s, m, _ = _setup()
    q = torch.randn(1, 2, 3, 32, device=DEVICE)
    pos = torch.randint(0, P, (3, 1), device=DEVICE)
    with no_host_reads(), pytest.raises(AssertionError, match="host read"):
        with ops.position_checks("host"):
            rome.apply_qk_at(q, q, cache_c, cache_s, m, pos, backend="torch")


@pytest.mark.parametrize("backend", BACKENDS)
def test_position_ops_read_nothing_on_the_host(backend, no_host_reads):
    """apply_qk_at and apply_qk_angles, first (full) and later (lean) calls, forward and backward,
    out-of-range positions included: no value of any tensor is read on the host, once the matrix
    (its values choose the kernel: read once per matrix) and the axis tensor (read once per axis
    tensor: the kernel reads it unmasked) have been seen."""
    layout, cache_c, cache_s, m, axis = _setup(n_axes=3)
    freqs, scales = (t.to(DEVICE) for t in angle_frequencies(layout.inv_freq))
    _, c1, s1, m1, _ = _setup(n_axes=1)
    one = torch.randn(1, 1, 1, 32, device=DEVICE)
    for mm in (m, m1):  # each matrix's forward and transpose gathers (read once per matrix)
        o = one.clone().requires_grad_()
        out0 = rome.apply_qk_at(o, o, cache_c, cache_s, mm,
                                torch.zeros(1, 1, 1, 3, dtype=torch.int64, device=DEVICE), axis=axis, backend=backend)
        torch.autograd.grad(out0, (o,), (torch.ones_like(out0[0]), torch.ones_like(out0[1])))
    q = torch.randn(2, 4, 3, 32, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 2, 3, 32, device=DEVICE, requires_grad=True)
    for i in range(3):
        pos1 = torch.randint(0, P, (2, 1, 3, 1), device=DEVICE)
        pos3 = torch.randint(0, P, (2, 1, 3, 3), device=DEVICE)
        if i == 2:
            pos1[0, 0, 0, 0] = P + 3  # out of range: NaN (unchecked, below), not a read
        with no_host_reads(), ops.position_checks("kernel" if i == 2 else "device"):
            with torch.no_grad():
                rome.apply_qk_at(q, k, c1, s1, m1, pos1, backend=backend)
                rome.apply_qk_at(q, k, cache_c, cache_s, m, pos3, axis=axis, backend=backend)
                if backend == "triton":  # (the torch backend's angles on the CPU read distinct values
                    # of the frequencies there: a CPU-only path, computed per element on a device)
                    rome.apply_qk_angles(q, k, freqs, scales, m, pos3, axis=axis, backend=backend)
            out = rome.apply_qk_at(q, k, c1, s1, m1, pos1, backend=backend)
            torch.autograd.grad(out, (q, k), (torch.ones_like(out[0]), torch.ones_like(out[1])))
            with ops.position_checks("device"):  # an assert on the device, no read either
                rome.apply_qk_at(q.detach(), k.detach(), c1, s1, m1, pos1.clamp(0, P - 1), backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_decode_compiles_once_and_reads_nothing(backend, no_host_reads):
    """torch.compile(fullgraph=True, dynamic=True) of RoPE over growing lengths (a prefill, then
    decode steps at growing positions): one graph, and running it reads no value on the host."""
    rope = rome.RoPE(rope_layout(rope_frequencies(32), mode="half"), backend=backend)
    rope.reserve(64, device=DEVICE)
    graphs = []

    def backend_(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    f = torch.compile(lambda q, k, p: rope(q, k, p), fullgraph=True, dynamic=True, backend=backend_)
    counts = []
    for s, start in ((7, 0), (1, 7), (1, 8), (1, 9), (1, 30), (5, 10)):
        q, k = torch.randn(2, 4, s, 32, device=DEVICE), torch.randn(2, 2, s, 32, device=DEVICE)
        pos = torch.arange(start, start + s, device=DEVICE)[None].expand(2, s)
        if s == 1 and start > 7:  # compiled already: running it reads nothing
            with no_host_reads():
                out = f(q, k, pos)
        else:
            out = f(q, k, pos)
        want = rope(q, k, pos)
        assert all(torch.equal(a, b) for a, b in zip(out, want))
        counts.append(len(graphs))
    # a prefill's graph (lengths dynamic), one for decode (dynamo specialises size 1); then none:
    # not per position, nor for the next prefill length
    assert counts == [1, 2, 2, 2, 2, 2]


def _decode_step():
    """A warm decode step's calls: every entry point (lean, and under autograd) and RoPE with
    the step's positions tensor; the matrices and axis kept (each is read once, when first seen)."""
    layout, cache_c, cache_s, m, axis = _setup(n_axes=3)
    _, c1, s1, m1, _ = _setup()
    freqs, scales = (t.to(DEVICE) for t in angle_frequencies(layout.inv_freq))
    rope = rome.RoPE(layout, backend="triton")
    q = torch.randn(4, 8, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(4, 2, 1, 32, device=DEVICE, dtype=torch.bfloat16)
    mb, mb1 = m.bfloat16(), m1.bfloat16()
    ids = torch.randint(0, P, (4, 1), device=DEVICE)
    pos = ids[:, None, :, None].expand(4, 1, 1, 3).contiguous()
    qg, kg = q.float().requires_grad_(), k.float().requires_grad_()

    def step():
        rome.apply_qk(q, k, c1[:1], s1[:1], mb1, backend="triton")
        rome.apply_qk_at(q, k, cache_c, cache_s, mb, pos, axis=axis, backend="triton")
        rome.apply_qk_angles(q, k, freqs, scales, mb, pos, axis=axis, backend="triton")
        rope(q, k, ids)
        out = rome.apply_qk_at(qg, kg, cache_c, cache_s, m, pos, axis=axis, backend="triton")
        torch.autograd.grad(out, (qg, kg), (torch.ones_like(out[0]), torch.ones_like(out[1])))

    return step


def test_a_warm_decode_step_reads_nothing_on_the_host(no_host_reads):
    step = _decode_step()
    step()  # (RoPE reads its positions' range once per positions tensor)
    with no_host_reads():
        step()


@pytest.mark.gpu
def test_no_sync_on_the_gpu():
    """With CUDA's sync debug mode set to error, a warm decode step synchronises nothing."""
    step = _decode_step()
    step()
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_a_recipe_holds_while_its_tile_choices_would():
    """A recipe replays the tile ``tuning.pick`` chose: it is stale once pick would choose
    otherwise (an untuned choice tuned since, or now large enough and allowed to tune; a tuned
    one forgotten by tuning.reset or changed)."""
    from rome import launcher, tuning

    key = (("a", "b"), torch.device("cpu"))
    small = launcher.Recipe([], pending=[(key, 10, "a", False)])
    large = launcher.Recipe([], pending=[(key, tuning.MIN_ELEMENTS, "a", False)])
    tuned = launcher.Recipe([], pending=[(key, tuning.MIN_ELEMENTS, "b", True)])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tuning.ENV, "0")
        assert not small.stale() and not large.stale()
        mp.setenv(tuning.ENV, "1")
        assert not small.stale() and large.stale()  # autotuning on: the large launch would tune
        assert tuned.stale()  # its choice is not remembered (reset)
        mp.setitem(tuning._chosen, key, "b")
        assert small.stale() and not tuned.stale()
    assert not launcher.Recipe([]).stale()


def test_a_stale_recipe_takes_the_full_path(monkeypatch):
    from rome import launcher, tuning

    _, cache_c, cache_s, m, _ = _setup()
    q, k = torch.randn(1, 2, 3, 32, device=DEVICE), torch.randn(1, 1, 3, 32, device=DEVICE)
    spy, seen = _calls("_full_apply_qk")
    monkeypatch.setattr(ops, "_full_apply_qk", spy)
    for _ in range(2):
        rome.apply_qk(q, k, cache_c[:3], cache_s[:3], m, backend="triton")
    assert len(seen) == 1
    (entry,) = [e for k, e in ops._LEAN.items() if k[0] == "apply_qk" and e.matrix is m and e.triton]
    key = (("untuned", "candidates"), torch.device(DEVICE))
    monkeypatch.setattr(entry, "recipe", launcher.Recipe(entry.recipe.launches, pending=[(key, 1, "a", False)]))
    rome.apply_qk(q, k, cache_c[:3], cache_s[:3], m, backend="triton")
    assert len(seen) == 1  # still untuned: the recipe holds
    monkeypatch.setitem(tuning._chosen, key, "tuned")
    rome.apply_qk(q, k, cache_c[:3], cache_s[:3], m, backend="triton")
    assert len(seen) == 2  # tuned since: learned again


def test_a_remembered_call_does_not_cross_a_launch_form_block(monkeypatch):
    """The lean path's key holds the thread's launch state (rome.launch.launch_state): a call
    remembered outside ``partner_form()`` / ``pairs_halves()`` is not replayed inside one (its
    recipe would launch the other form), and inside the block a repeat is a hit again; the
    launches of each are the form the block asks (``HALVES``)."""
    from rome import launch, launcher

    if not launcher.INTERPRET and DEVICE == "cpu":
        pytest.skip("the triton backend needs a GPU or TRITON_INTERPRET=1")
    spy, seen = _calls("_full_apply_qk")
    monkeypatch.setattr(ops, "_full_apply_qk", spy)
    groups = launch.gather_groups  # (one group of every head: more than a decode step's, launch.halves_walk)
    monkeypatch.setattr(launch, "gather_groups", lambda cfg, n_t, ha, hb, sms, heads=None, **kw:
                        groups(cfg, n_t, ha, hb, sms, heads=ha + hb, **kw))
    q = torch.randn(1, 3, 5, 32, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(1, 3, 5, 32, device=DEVICE, dtype=torch.bfloat16)
    cos, sin = torch.rand(5, 32, device=DEVICE), torch.rand(5, 32, device=DEVICE)
    for sections, block, halves in (((32,), launch.partner_form, True), ((12, 12, 8), launch.pairs_halves, False)):
        m = rome.rotation_matrix(sections, "half", device=DEVICE)
        seen.clear()
        plain = [rome.apply_qk(q, k, cos, sin, m, backend="triton") for _ in range(2)]
        assert len(seen) == 1  # (learned, then a hit)
        with block():
            inside = [rome.apply_qk(q, k, cos, sin, m, backend="triton") for _ in range(2)]
        assert len(seen) == 2  # (a miss inside the block, then a hit there)
        forms = {e.recipe.launches[0][4]["HALVES"] for key, e in ops._LEAN.items()
                 if key[0] == "apply_qk" and e.matrix is m and e.triton}
        assert forms == {halves, not halves}, forms  # (the two recipes: each its form)
        for a, b in zip(plain[0] + inside[0], plain[1] + inside[1]):
            assert torch.equal(a, b)
        assert all(torch.equal(a, b) for a, b in zip(plain[0], inside[0]))  # (the same bits)


def test_split_launches_and_packed_buffers():
    """A launch split into blocks (offset views: here three T dims that cannot merge) is never
    remembered, and q and k sliced from one buffer (one storage) take the lean path correctly."""
    spy, seen = _calls("_full_apply")
    _, cache_c, cache_s, m, _ = _setup()
    x = torch.randn(2, 3, 8, 5, 32, device=DEVICE)[:, :, ::2]
    cos, sin = torch.randn(2, 1, 4, 5, 32, device=DEVICE), torch.randn(2, 1, 4, 5, 32, device=DEVICE)
    import pytest as _pytest

    with _pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "_full_apply", spy)
        for _ in range(2):
            _close(rome.apply(x, cos, sin, m, backend="triton"), _reference(x, cos, sin, m))
    assert len(seen) == 2
    for _ in range(3):
        qkv = torch.randn(2, 5, 3, 4, 32, device=DEVICE)  # [B, S, 3, H, D]: q, k, v of one projection
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
        c, s = cache_c[:5], cache_s[:5]
        got = rome.apply_qk(q, k, c, s, m, backend="triton")
        for a, t in zip(got, (q, k)):
            _close(a, _reference(t, c, s, m))
