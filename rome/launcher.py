"""Launching the kernel: arguments from tensors, the grid, the autotuned tile, and the launch.

``rotate`` fills the outputs with the (transposed) rotation of one or two inputs (q and k) in one
launch per group of tensors: the gather kernel (``kernel._rome_gather_kernel``) for a signed
permutation, the dot kernel (``kernel._rome_kernel``) for a general matrix or where
``launch.product("dot")`` asks. ``capture()`` records the launches instead of running them, each
as the ``launch.KernelConfig`` a real launch specialises (what ``python -m profiling kernels
--workload`` compiles and models).

Gather kernel layout. The row dims of each x are split into T dims, along which the per-row data
(tables, or positions) varies, and H dims (heads, and batch where the tables do not depend on
it), along which it is broadcast (stride 0); each class is merged where strides allow, to at most
two dims (else the launch is split over the outermost dim). A program takes ``BLOCK_R`` T rows and
a group of ``HB`` heads (``launch.head_groups``): it reads its tables once and walks the heads,
q's then k's where a group is every head, else q's groups and k's apart (the kernel's ``SEAM``
build: a decode step's programs of a few heads, each its first batch's loads issued first and
its last batch without a prefetch). q and k share a launch when their T dims agree (they read one
table), as they do for every table that broadcasts to both.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch
import triton

from . import kernel, launch, tuning
from .positions import axis_run as _axis_run
from .settings import ThreadSetting

INTERPRET = kernel.INTERPRET
MAX_HEAD_DIM = launch.MAX_HEAD_DIM
SUPPORTED_DTYPES = tuple(launch.TL_DTYPE)
ANGLE_POSITIONS = 1 << 24  # angles from positions: positions below it are exact in fp32
_DO_BENCH = None  # the autotuner's benchmarker (None: Triton's); tests time candidates on the CPU
_INT32_LIMIT = 1 << 31


# --- capture: the launches, recorded instead of run ----------------------------------------

@dataclass(frozen=True)
class Launch:
    """One recorded launch: what a real one would compile and run."""

    kernel_config: launch.KernelConfig  # the specialisation (signature, constexprs, divisibility)
    grid: int  # programs
    units: int  # work units over the grid (programs; tiles for the persistent dot kernel)
    elements: int  # x elements of q and k together
    transpose: bool  # the backward's transposed product
    config: launch.Config
    args: tuple = ()  # the runtime arguments
    consts: dict | None = None  # the constexprs but BLOCK_R


class _Capture(NamedTuple):
    launches: list  # the ``Launch`` of every launch made inside ``capture``, in order
    num_sms: int  # the SMs its launches are planned for


_capture: ThreadSetting[_Capture | None] = ThreadSetting(None)  # None outside ``capture``


@contextlib.contextmanager
def capture(num_sms: int = 132):
    """Within the block, launches are recorded (a list of ``Launch``, yielded) and not run; tensors
    may live on the CPU (a process without TRITON_INTERPRET=1 plans them as for a GPU with
    ``num_sms`` SMs). The outputs are left as they were allocated."""
    with _capture.scoped(_Capture([], num_sms)) as captured:
        yield captured.launches


def capturing() -> bool:
    return _capture.get() is not None


def _num_sms(device) -> int:
    captured = _capture.get()
    return captured.num_sms if captured is not None else launch.num_sms(device)


# --- the dot kernel's arguments (rows collapsed to three dims) -----------------------------

def _row_layout(shape, tensors):
    """Merge the row dims (all but the last) of same-shaped tensors where every stride allows.

    Returns ``[(size, [stride per tensor]), ...]``, outermost first, size-1 dims dropped.
    """
    dims = []
    for i, n in enumerate(shape[:-1]):
        if n == 1:
            continue
        st = [t.stride(i) for t in tensors]
        if dims and all(ps == s * n for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    return dims


def _launch_args(x, out, cos, sin, pos):
    """Kernel args for one tensor, as lists of 3-row-dim blocks (one block unless > 3 dims).

    cos, sin and pos are views with x's row dims (stride 0 where they broadcast)."""
    tensors = (x, out, cos, sin, pos)
    dims = _row_layout(x.shape, tensors)
    if len(dims) > 3:  # rare (5D+ with no mergeable dims): one block per index of dim 0
        _split()
        return [a for i in range(x.shape[0]) for a in _launch_args(*(t[i] for t in tensors))]
    dims = [(1, [0] * len(tensors))] * (3 - len(dims)) + dims
    rows = dims[0][0] * dims[1][0] * dims[2][0]
    strides = [dims[d][1][t] for t in range(len(tensors)) for d in range(3)]
    return [(x, out, cos, sin, pos, rows, dims[1][0], dims[2][0], *strides)]


def _row_views(x, cos, sin, positions):
    """cos, sin and positions as views with x's row dims: the tables broadcast to x, or (with
    positions) the caches' first rows with stride 0 on every row dim and positions ``[..., A]``
    broadcast to x's rows (the kernel adds ``pos * row stride``)."""
    if positions is None:
        return cos.expand(x.shape), sin.expand(x.shape), launch._dummy(x.device).expand(*x.shape[:-1], 1)
    rows = (0,) * (x.ndim - 1)
    return (cos.as_strided(x.shape, (*rows, cos.stride(-1))), sin.as_strided(x.shape, (*rows, sin.stride(-1))),
            positions.expand(*x.shape[:-1], positions.shape[-1]))


# --- the gather kernel's arguments (T dims x head dims) ------------------------------------

@dataclass(eq=False)
class _Rows:
    """One tensor's rows for the gather kernel: two T dims and two head dims (outermost first),
    each ``(size, x stride, out stride)``, and the per-row data's strides along the T dims."""

    x: torch.Tensor
    out: torch.Tensor
    t: list  # [(size, x stride, out stride)] * 2
    h: list  # [(size, x stride, out stride)] * 2
    data: list  # per data view (cos, sin or positions): [stride of T dim 0, of T dim 1]
    views: tuple  # the data views (cos, sin or positions) these strides belong to
    index: int = 0  # which of the launch's tensors (q 0, k 1) the rows are of

    @property
    def t_key(self):
        return tuple(n for n, _, _ in self.t), tuple(map(tuple, self.data)), tuple(v.data_ptr() for v in self.views)


def _merge(dims, tensors_strides):
    """Merge adjacent dims ``[(index, size)]`` where every tensor's strides allow."""
    out = []
    for i, n in dims:
        st = [s[i] for s in tensors_strides]
        if out and all(ps == s * n for ps, s in zip(out[-1][1], st)):
            out[-1] = (out[-1][0] * n, st)
        else:
            out.append((n, st))
    return out


def _gather_rows(x, out, views) -> list[_Rows]:
    """``x``'s rows as ``_Rows`` (a list: split over the outermost dim where more than two T or
    two head dims remain)."""
    dims = [(i, n) for i, n in enumerate(x.shape[:-1]) if n != 1]
    is_t = {i: any(v.stride(i) != 0 for v in views) for i, _ in dims}
    xs, os_, vs = x.stride(), out.stride(), [v.stride() for v in views]
    t = _merge([d for d in dims if is_t[d[0]]], [xs, os_, *vs])
    h = _merge([d for d in dims if not is_t[d[0]]], [xs, os_])
    if len(t) > 2 or len(h) > 2:  # rare: one block per index of the outermost dim
        _split()
        i = dims[0][0]
        return [r for k in range(x.shape[i]) for r in _gather_rows(
            x.select(i, k), out.select(i, k), tuple(v.select(i, k) for v in views))]
    # one dim is the outer one, so its inner size (T1, H1) is 1: a constant in the kernel
    t = t + [(1, [0, 0] + [0] * len(views))] * (2 - len(t))
    h = h + [(1, [0, 0])] * (2 - len(h))
    return [_Rows(x, out, [(n, st[0], st[1]) for n, st in t], [(n, st[0], st[1]) for n, st in h],
                  [[st[2 + v] for _, st in t] for v in range(len(views))], views)]


def _span(t: torch.Tensor) -> int:
    """Elements from a view's first to its last element (+1)."""
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()) if n > 0)


def _gather_launches(xs, outs, cos, sin, positions, axis, angles, p: launch.Plan, norm=None):
    """(args, t rows, heads of a, heads of b, largest head count) per launch of the gather kernel.
    ``norm``: ``(eps, [(weight, bias) per x], over_heads)`` for the norm prologue (fp32 weights).
    Over heads (BNSD x): every row dim but the heads (dim 1) is a T dim, so that a program's head
    group is all the heads of its tokens."""
    blocks = []
    over_heads = norm is not None and norm[2]
    for i, (x, out) in enumerate(zip(xs, outs)):
        if not x.numel():
            continue
        if positions is None:
            views = (cos.expand(x.shape), sin.expand(x.shape))
        else:
            views = (positions.expand(*x.shape[:-1], positions.shape[-1]),)
        if over_heads:  # a marker varying along every row dim but the heads' (no data: meta)
            b, _, s, d = x.shape
            views += (torch.empty_strided(x.shape, (s * d, 0, d, 1), device="meta"),)
        for r in _gather_rows(x, out, views):
            r.index = i
            if over_heads:
                r.data, r.views = r.data[:-1], r.views[:-1]
                if r.h[0][0] * r.h[1][0] != x.shape[1]:  # (rome.qknorm never launches this)
                    raise ValueError(f"a norm over heads needs tables shared by the {x.shape[1]} heads of "
                                     f"a token; these differ between heads")
            blocks.append(r)
    groups = []
    while blocks:  # q and k share a launch where they read the same T rows of the same data
        a = blocks.pop(0)
        b = next((r for r in blocks if r.t_key == a.t_key), None)
        if b is not None:
            blocks = [r for r in blocks if r is not b]
        groups.append((a, b))
    dev = xs[0].device
    dummy = launch._dummy(dev)

    def norm_args(r, a):  # (weight, bias) of the tensor r's rows come from; no r (a launch of
        # a alone): a's, never read (no heads) but typed as the kernel's code for b expects
        if norm is None:
            return dummy, dummy
        w, b = norm[1][(a if r is None else r).index]
        return w, w if b is None else b

    w = p.operand  # the dot's matrix (M, read as Mᵀ by strides in the transpose; unused by the gather)
    swk, swn = w.stride()
    if p.config.transpose:
        swk, swn = swn, swk
    out = []
    for a, b in groups:
        (t0, _, _), (t1, _, _) = a.t
        n_t = t0 * t1
        spans = [_span(r.x) for r in (a, b) if r] + [_span(r.out) for r in (a, b) if r]
        spans += [_span(cos), _span(sin)] + ([_span(positions)] if positions is not None else [])
        i64 = max(spans) >= _INT32_LIMIT
        if positions is None:
            (sct0, sct1), (sst0, sst1) = a.data
            cv, sv = a.views
            data = (cv, sv, sct0, sct1, sst0, sst1, dummy, 0, 0, 0, 0, 0, 0)
            axis_args = (dummy, 0)
        else:
            (spt0, spt1), = a.data
            pv, = a.views
            multi = positions.shape[-1] > 1
            n_pos = ANGLE_POSITIONS if angles else cos.shape[0]
            data = (cos, sin, 0, 0, 0, 0, pv, spt0, spt1, positions.stride(-1) if multi else 0,
                    cos.stride(0), sin.stride(0), n_pos)
            axis_args = (axis, axis.stride(0)) if multi else (dummy, 0)

        def tensor_args(r):
            if r is None:
                return (a.x, a.out, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1)
            (_, sxt0, sot0), (_, sxt1, sot1) = r.t
            (h0, sxh0, soh0), (h1, sxh1, soh1) = r.h
            return (r.x, r.out, sxt0, sxt1, sot0, sot1, sxh0, sxh1, soh0, soh1, h0 * h1, h1)

        ta, tb = tensor_args(a), tensor_args(b)
        heads = (ta[-2], tb[-2])
        args = (p.src, p.sign, w, swk, swn, *axis_args, *data, n_t, t1, *ta, *tb, xs[0].shape[-1],
                *norm_args(a, a), *norm_args(b, a), 0.0 if norm is None else norm[0], dummy, dummy, dummy, dummy)
        out.append((args, n_t, heads, i64, (a, b)))
    return out


def same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors of one shape lay their elements out alike (strides of size-1 dims,
    which no offset uses, may differ)."""
    return all(n == 1 or sa == sb for n, sa, sb in zip(a.shape, a.stride(), b.stride()))


def _at_view(t: torch.Tensor, like: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """A one-element view of ``t`` at the offset ``like`` (a view of ``base``) has in ``base``:
    the kernel's pointer to t's block where ``like``'s block is (t and base share strides)."""
    delta = (like.data_ptr() - base.data_ptr()) // base.element_size()
    return t.as_strided((1,), (1,), t.storage_offset() + delta)


# --- launching -----------------------------------------------------------------------------

_GATHER_OUT = tuple(kernel._rome_gather_kernel.arg_names.index(n) for n in ("a_o", "b_o"))
_DOT_OUT = tuple(kernel._rome_kernel.arg_names.index(n) for n in ("a_o", "b_o"))


def rotate(xs, outs, cos, sin, matrix, *, transpose: bool, positions=None, axis=None, angles=False,
           norm=None, native: bool = False, norm_grad=None, axis_run: int = 1):
    """Fill ``outs[i]`` with the (transposed) rotation of ``xs[i]``; one launch for q and k.

    Without positions, cos/sin are per-row tables broadcasting to every x. With positions
    (int32/int64 ``[..., A]``, ``[...]`` broadcasting to x's rows), cos/sin are caches ``[P, D]``
    and element (r, j) reads row ``positions[r, axis[j]]`` of them (``positions[r, 0]`` for A = 1;
    axis: int ``[D]`` in ``[0, A)``, any stride). A position outside ``[0, P)`` is never read: the
    kernel writes NaN there (the op's documented result: rome.ops ``position_checks``).

    ``angles`` (with positions): no cache; cos is fp32 ``[2, D]``, inv_freq as hi + lo, sin the fp32
    ``[2, D]`` scale of each column (hi + lo), and the kernel computes ``scale * cos(p * inv_freq)`` itself
    (``_cos_sin_angle``: double-float angle and reduction by pi/2, then fp32 polynomials) for
    positions in ``[0, 2**24)``; columns with inv_freq 0 pass through (cos 1, sin 0).

    cos and sin may have different dtypes (each is read as its own).

    ``norm`` (forward, gather kernel only: the caller checks ``norm_fusable``): ``(kind, eps,
    [(weight, bias) per x])``, kind ``"rms"`` or ``"layer"`` (over each head's D values: weight
    (weight + offset) and bias fp32 ``[D]`` contiguous, bias None for RMSNorm) or ``"rms_heads"``
    (RMSNorm over all H·D values of a token, BNSD x: weight fp32 ``[H·D]`` head-major): each x
    normalised first, in fp32, the result rounded once (the QK-norm prologue).

    ``norm_grad`` (transpose, gather kernel only): ``(kind, eps, [(weight, bias) per x], [x_in per
    x])``, kind as ``norm``'s: xs are the gradients of the fused forward's outputs (dy), x_in the
    forward's inputs (with dy's strides); outs get dx of the norm-then-rotate, in one pass (the
    transposed rotation of dy in fp32, then the norm's backward as the epilogue). Returns per x
    the fp32 ``[2, W]`` sums ``(Σ g·x̂, Σ g)`` over its rows (W the weight's length: D, or H·D for
    rms_heads, whose second row is zeros): dweight and dbias.

    ``axis_run`` (positions on several axes): ``rome.positions.axis_run`` of axis's values, which
    the caller read on the host (the ops: once per axis tensor); the forward reads its cache rows
    in runs of it (the kernel's ``AXIS_RUN``). 1 (the default) claims nothing.

    ``native`` (``rounding="native"``): the eager chain's rounding (``kernel._native``): the tables
    rounded to x's dtype, each product rounded to it, then the sum; a signed permutation only. Not
    with ``norm``: the prologue's fp32 result is not a model's norm rounded to x's dtype.

    Preconditions (checked by the caller): x and out share shape and dtype, unit last stride;
    cos/sin broadcast to every x (or are [P, D] caches) and have a unit last stride; matrix is [D, D].
    """
    x0 = xs[0]
    rec = _recipe.get()
    if rec is not None:
        rec.rotated = True
    if not INTERPRET and not x0.is_cuda and not capturing():
        raise RuntimeError(
            "backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 set before rome's "
            f"kernel is first used, to run it on the CPU); got tensors on {x0.device}"
        )
    if not any(x.numel() for x in xs):
        return
    mode = 0 if positions is None else (1 if positions.shape[-1] == 1 else 2)
    plan = launch.plan(matrix, x0.dtype, cos.dtype, transpose=transpose, interpret=INTERPRET,
                       positions=mode, angles=angles, sin_dtype=sin.dtype)
    if native and not launch.describe(matrix).gather:
        raise ValueError(_NATIVE_GATHER)
    if native and norm is not None:
        raise ValueError("rounding='native' does not take the norm prologue (the fused norm's fp32 result "
                         "is not the model's norm rounded to x's dtype): run the norm, then rotate")
    elements = sum(x.numel() for x in xs)
    if rec is not None:
        kept = (plan.src, plan.sign, plan.operand, plan.pairs, launch._dummy(x0.device))  # (pairs: HALVES_RUN's table)
        rec.constants.update((t.data_ptr(), t.dtype) for t in kept if t is not None)
    if norm is not None and not (plan.config.heads and plan.config.product != "dot" and not transpose):
        raise ValueError("the norm prologue is in the gather kernel's forward only (a signed permutation, "
                         "not the dot formulation): rome.launcher.norm_fusable says where")
    if norm_grad is not None:
        if not (transpose and plan.config.heads and plan.config.product != "dot") or norm is not None or native \
                or norm_grad[0] not in ("rms", "layer", "rms_heads"):
            raise ValueError("the norm's backward epilogue is the gather kernel's transpose (rms or layer per "
                             "head, rms_heads), without the prologue or rounding='native'")
        for x, xn in zip(xs, norm_grad[3]):
            if xn.shape != x.shape or not same_strides(xn, x) or xn.dtype != x.dtype:
                raise ValueError(f"norm_grad's inputs must match the gradients' shape, strides and dtype, got "
                                 f"{list(xn.shape)} {xn.stride()} {xn.dtype} and {list(x.shape)} {x.stride()} {x.dtype}")
    if norm is not None or norm_grad is not None:  # the row statistics and weights: a higher register cap
        cap = launch.norm_registers((norm or norm_grad)[0], backward=norm_grad is not None, arch=plan.arch,
                                    x_dtype=xs[0].dtype, head_dim=xs[0].shape[-1])
        plan = replace(plan, config=replace(plan.config, maxnreg=cap),
                       candidates=tuple(replace(c, maxnreg=cap) for c in plan.candidates))
    if plan.config.heads:  # (norm_grad's sums: its launches are this kernel's, checked above)
        return _rotate_gather(xs, outs, cos, sin, positions, axis, angles, plan, transpose, elements, norm, native,
                              norm_grad, axis_run)
    else:
        _rotate_dot(xs, outs, cos, sin, positions, axis, angles, plan, transpose, elements, mode, native)


_NATIVE_GATHER = ("rounding='native' needs a signed permutation matrix (every rotation matrix, partial "
                  "rotary's too): the eager chain it reproduces gathers x, it does not multiply by M")


def _run(fn, grid, args, consts, cfg, transpose, elements, units, meta=None):
    """Launch (or record, under ``capture``) one kernel launch of config ``cfg``. ``grid``: a
    function of the meta-parameters, or the grid itself (a tuple)."""
    recipe = _recipe.get()
    if recipe is not None:
        recipe.launches.append((fn, grid if isinstance(grid, tuple) else grid({"BLOCK_R": cfg.block_r}),
                                tuple(args), consts, cfg, transpose, elements, units, meta))
    if capturing():
        _record(fn, grid, args, consts, cfg, transpose, elements, units, meta)
        return
    # (ops.py serialises interpreted launches: they are not thread-safe; the interpreter takes
    # no compile options)
    fn[grid](*args, **consts, BLOCK_R=cfg.block_r, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
             **({} if INTERPRET else launch.target_options(cfg.options)))


def _record(fn, grid, args, consts, cfg, transpose, elements, units, meta=None):
    """``capture``'s work for one launch: its specialisation and grid, recorded."""
    kc = launch.specialise(fn, args, consts | {"BLOCK_R": cfg.block_r}, cfg, meta=meta)
    programs = grid if isinstance(grid, tuple) else grid({"BLOCK_R": cfg.block_r})
    n = programs[0] * (programs[1] if len(programs) > 1 else 1)
    _capture.get().launches.append(Launch(kc, n, units, elements, transpose, cfg, tuple(args), dict(consts)))


# --- recipes: a call's launches, replayed for the next call of the same signature ---------------
#
# ``rome.ops`` caches, per call signature (shapes, strides, dtypes, device, matrix, settings), what
# ``rotate`` computes from metadata alone: the plan, the split into launches, their grids,
# constexprs and integer arguments. ``recording()`` collects the launches of one ``rotate`` (with
# their tensor arguments); ``Recipe.bind`` maps each tensor argument to the call's tensor it came
# from (a view at offset 0 of it: the kernel reads only its address and dtype), and ``replay``
# launches them again with another call's tensors of the same signature.


class _Recording:
    __slots__ = ("launches", "rotated", "pending", "constants", "split")

    def __init__(self):
        self.launches = []
        self.constants = set()  # (address, dtype) of the plan's tensors: what a recipe may keep
        self.rotated = False  # ``rotate`` ran (not a stand-in)
        self.pending = []  # (tuning key, elements, config, tuned) of each tunable choice
        self.split = False  # a tensor was split into blocks (offset views): not replayable


_recipe: ThreadSetting[_Recording | None] = ThreadSetting(None)


def _split() -> None:
    rec = _recipe.get()
    if rec is not None:
        rec.split = True


@contextlib.contextmanager
def recording():
    """Within the block, ``rotate``'s launches are also recorded (yields a ``_Recording``)."""
    with _recipe.scoped(_Recording()) as rec:
        yield rec


class Recipe:
    """A recorded call's launches with each tensor argument replaced by a role: the index of the
    call's tensor it was (or a view at offset 0 of it), or kept as a constant (the plan's own
    tensors: the gather index, signs, the matrix operand, the dummy)."""

    __slots__ = ("launches", "pending")

    def __init__(self, launches, pending=()):
        self.launches = launches  # [(fn, grid, template args, [(slot, role)], consts, cfg, kwargs, info)]
        self.pending = tuple(pending)  # (tuning key, elements, config, tuned) of its tunable choices

    def stale(self) -> bool:
        """Whether ``tuning.pick`` would now choose otherwise for one of the recipe's launches: a
        tuned choice forgotten or changed (``tuning.reset``), or an untuned one (a launch below
        ``MIN_ELEMENTS``, autotuning off, graph capture) tuned since or now to be tuned. The
        recipe is then learned again, through ``_pick``."""
        for key, elements, cfg, tuned in self.pending:
            if tuned:
                if tuning._chosen.get(key) is not cfg:
                    return True
            elif key in tuning._chosen or (elements >= tuning.MIN_ELEMENTS and tuning.enabled()
                                            and not tuning._capturing(key[1])):
                return True
        return False

    @classmethod
    def bind(cls, rec: _Recording, tensors) -> Recipe | None:
        """The recipe of ``rec`` for the call's ``tensors`` (a list; None entries allowed), or None
        where it cannot be replayed: ``rotate`` did not run, or an argument is a copy or an offset
        view, or could be either of two tensors of the call."""
        if not rec.rotated or rec.split:  # (an offset view could share the address of another tensor
            return None  # of the call, e.g. q's second block and k sliced from one buffer)
        by_ptr = {}
        for i, t in enumerate(tensors):
            if t is not None:
                by_ptr.setdefault((t.data_ptr(), t.dtype), []).append(i)
        launches = []
        for fn, grid, args, consts, cfg, transpose, elements, units, meta in rec.launches:
            slots = []
            template = list(args)
            for j, a in enumerate(args):
                if not isinstance(a, torch.Tensor):
                    continue
                roles = by_ptr.get((a.data_ptr(), a.dtype), [])
                if len(roles) > 1:
                    return None  # two of the call's tensors share this address: ambiguous
                if roles:
                    if not a.numel():
                        return None
                    slots.append((j, roles[0]))
                    template[j] = None
                elif (a.data_ptr(), a.dtype) not in rec.constants:
                    return None  # a copy made for this call (e.g. a contiguous x): not replayable
            kwargs = dict(consts, BLOCK_R=cfg.block_r, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
                          **({} if INTERPRET else launch.target_options(cfg.options)))
            launches.append((fn, grid, template, slots, consts, cfg, kwargs, (transpose, elements, units, meta)))
        return cls(launches, rec.pending)

    def replay(self, tensors) -> None:
        """Launch (or record, under ``capture``) the recipe with ``tensors`` in the recorded roles."""
        capture_ = _capture.get() is not None
        for fn, grid, template, slots, consts, cfg, kwargs, info in self.launches:
            args = template.copy()
            for j, role in slots:
                args[j] = tensors[role]
            if capture_:
                _record(fn, grid, args, consts, cfg, *info)
            else:
                fn[grid](*args, **kwargs)


def _pick(fn, plan, device, elements, args, grid, consts, out_index):
    """The tile to launch: ``tuning.pick`` times the candidates on scratch outputs on a GPU."""
    if capturing():
        return plan.config

    def time_candidates(autotuner):  # the first launch's arguments, outputs replaced by scratch
        targs = list(args)
        for i in out_index:
            o = targs[i]
            targs[i] = torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
        # the compile options but the register cap, which each candidate's triton.Config carries
        options = {k: v for k, v in launch.target_options(plan.config.options).items() if k != "maxnreg"}
        autotuner[grid](*targs, **consts, **options)

    cfg = tuning.pick(fn, plan.candidates, device, elements, time_candidates, _DO_BENCH)
    rec = _recipe.get()
    if rec is not None and len(plan.candidates) > 1:  # a tunable choice: a recipe holds while it would stay
        key = (plan.candidates, device)
        rec.pending.append((key, elements, cfg, key in tuning._chosen))
    return cfg


def norm_fusable(matrix, x_dtype, table_dtype, sin_dtype=None, *, positions: int = 0, angles=False) -> bool:
    """Whether the gather kernel's forward takes this rotation, so the norm prologue can be fused
    into it (a signed permutation, head_dim the kernel takes, not the dot formulation)."""
    plan = launch.plan(matrix, x_dtype, table_dtype, transpose=False, interpret=INTERPRET,
                       positions=positions, angles=angles, sin_dtype=sin_dtype or table_dtype)
    return bool(plan.config.heads) and plan.config.product != "dot"


_NORMS = {None: 0, "rms": 1, "layer": 2, "rms_heads": 3}  # kernel.NORM_NONE, _RMS, _LAYER, _RMS_HEADS

# the backward of the norm over heads: its tile (rows, warps). Its two sweeps re-read each of a
# program's tokens (dy and the forward's x: H·D values each) from L1/L2: the rows resident on an SM
# set what must stay cached between the reads (rows × H·D × 2 tensors); each program's per-head
# dw partial sums ([programs, H·D]) are written and summed once, fewer with more rows. Measured
# (H100, triton 3.6, Wan 2.1's q/k [1, 32760, 40, 128] bf16, kernel us): 8x4 2334, 8x8 4063,
# 4x4 2526, 4x2 1864, 2x2 1927 (+ the partial sums' reduction 41 / 69 / 124 us for 8 / 4 / 2 rows)
# (profiling/results/h100/qknorm-tiles-6ab34fe/)
NORM_GRAD_HEADS_TILE = (4, 2)


def _rotate_gather(xs, outs, cos, sin, positions, axis, angles, plan, transpose, elements, norm=None,
                   native=False, norm_grad=None, axis_run=1):
    cfg0 = plan.config
    arch = plan.arch  # (asked once a launch, by launch.plan)
    kind = norm_grad[0] if norm_grad is not None else None if norm is None else norm[0]
    consts = dict(POSITIONS=cfg0.positions, ANGLES=cfg0.angles, TRANSPOSE=transpose, BLOCK_D=cfg0.block_d,
                  DOT=cfg0.product == "dot", SPLIT=cfg0.split, OP_DTYPE=cfg0.op_dtype, FP32_DOT=cfg0.fp32_dot,
                  RAW_X=cfg0.raw_x, RAW_C=cfg0.raw_t, RAW_S=cfg0.raw_s, F64=kernel.F64,
                  NORM=_NORMS[kind], NATIVE=native, HEADS_B=0, BLOCKS=1, PAIRS=0, OPAQUE=False, FULL=False)
    d = xs[0].shape[-1]
    width = [d * (x.shape[1] if kind == "rms_heads" else 1) for x in xs]  # the weights' lengths
    sums = [torch.zeros(2, n, dtype=torch.float32, device=xs[0].device) for n in width] if norm_grad else None
    if norm_grad is not None:  # (the weights and biases as the prologue's: norm[2] is [(w, b) per x])
        norm = (kind, norm_grad[1], norm_grad[2])
    sms = 1 if INTERPRET else _num_sms(xs[0].device)
    fn = kernel._rome_gather_kernel
    cfg = None
    over_heads = norm is not None and norm[0] == "rms_heads"
    # the whole head's half rotation as its two halves (kernel._halves_heads, its own tile rows:
    # launch.halves_config) where a launch's programs walk more than a decode step's heads
    # (launch.halves_walk)
    axes = launch.position_axes(cfg0.positions, 0 if positions is None else positions.shape[-1], transpose,
                                cfg0.product, arch)
    halves = launch.halves_config(plan, xs[0].dtype, norm=kind is not None, native=native, interpret=INTERPRET,
                                  axes=0 if norm_grad is not None or (transpose and angles) else axes)
    picked = None
    for args, n_t, (ha, hb), i64, rows in _gather_launches(xs, outs, cos, sin, positions, axis, angles, plan,
                                                           None if norm is None else (*norm[1:], over_heads)):
        c = dict(consts, I64=i64)
        # heads per program, q's and k's in groups of their own where a group is not all of them
        # (the interpreter walks 3, so groups wrap H1 and, with few heads, cross from q to k
        # inside a program); a norm over heads: all of them (q's and k's heads of its tokens)
        # (the angles' wide tile outside the SEAM build: launch.gather_groups)
        tile_cfg, heads, kg, groups = launch.gather_groups(
            cfg0, n_t, ha, hb, sms, heads=ha + hb if over_heads else 3 if INTERPRET else None,
            norm=norm is not None or norm_grad is not None, interpret=INTERPRET)
        rows_plan = plan if tile_cfg is cfg0 else replace(plan, config=tile_cfg, candidates=(tile_cfg,))
        halved = halves is not None and launch.halves_walk(heads, INTERPRET)
        if halved:  # (the heads a program walks as the partner form's rows chose them)
            rows_plan = replace(plan, config=halves,
                                candidates=launch.halves_candidates(
                                    halves, INTERPRET, len(plan.candidates) == 1
                                    or launch.halves_fixed(not plan.halves, xs[0].dtype)))
        full = (*args, heads, kg)
        # (HALVES: its own first batch, KG read at run time: one build whatever KG, no partner;
        # a src pairing its columns otherwise: the pairs' columns in src's place, HALVES_RUN)
        c["HALVES"] = halved
        c["HALVES_RUN"] = plan.pairs_run if halved and not plan.halves else 0
        if c["HALVES_RUN"]:
            full = (plan.pairs, *full[1:])
        c["SEAM"] = kg > 0 and not halved
        c["DEPTH"] = launch.halves_depth(plan, xs[0].dtype) if halved else launch.dot_depth(cfg0, arch) \
            if cfg0.product == "dot" else \
            launch.gather_depth(arch, xs[0].dtype, kind, norm_grad is not None, apart=kg > 0, heads=heads)
        c["KEPT_RUN"] = 2 if halved else launch.launch_kept_run(plan, xs[0].dtype, norm_grad is not None)  # (its load width)
        # (not the norm's backward epilogue, nor the angles' transpose: its bf16 builds spilled 64 B
        # on sm_90 under triton 3.9 with it)
        c["AXES"] = 0 if (halved and cfg0.positions != 2) or norm_grad is not None or (transpose and angles) \
            else axes
        c["AXIS_RUN"] = launch.launch_axis_run(axis_run, c["AXES"], angles, cos.stride(0), sin.stride(0))
        # the partner form's gather walking q's heads and then k's in one program (the SEAM build
        # and the dot issue their first batch first anyway: no second build)
        q_then_k = kg == 0 and cfg0.product == "gather" and not halved
        c["FIRST"] = q_then_k and launch.first_batch_first(arch, xs[0].dtype)
        c["SRC_AGAIN"] = q_then_k and launch.src_again(arch)
        # a norm over heads as the token tile (a tensor's heads of BLOCK_R tokens in registers,
        # persistent programs, q's and k's apart: grid axis 1), where a token's heads fit it (the
        # interpreter: where launch.TOKEN_TILE_INTERPRETED, see there)
        # (nothing masked where the blocks hold exactly the heads: q's and k's alike, D their width)
        unmasked = xs[0].shape[-1] == cfg0.block_d and hb in (0, ha)
        tile = launch.token_tile(max(ha, hb), cfg0.block_d, launch.warp_size(), backward=transpose,
                                 swapped=plan.pair == launch.PAIRS_SWAPPED, wide=xs[0].element_size() == 4,
                                 full=unmasked, arch=arch) \
            if over_heads and (not INTERPRET or launch.TOKEN_TILE_INTERPRETED) else None
        if tile is not None:
            c["HEADS_B"], c["BLOCKS"], c["PAIRS"] = tile[0], tile[1], plan.pair
            c["KEPT_RUN"] = 2  # (the token tile reads no partner at src: one build)
            c["AXES"] = 0  # (nor positions by row: _token_rows keeps the per-element read)
            c["AXIS_RUN"] = 1
            c["FIRST"] = False  # (nor the head groups' loop)
            c["SRC_AGAIN"] = False
            c["OPAQUE"] = not INTERPRET and not isinstance(arch, str)  # (inline PTX: compiled for NVIDIA only)
            c["FULL"] = unmasked and tile[0] * tile[1] == ha
            programs = min(n_t, sms * launch.TOKEN_PROGRAMS_PER_SM
                           * max(1, launch.TOKEN_MAX_WARPS * 32 // (tile[2] * launch.warp_size())))

            def grid(meta, programs=programs, tensors=1 + (hb > 0)):
                return (programs, tensors)
        else:
            def grid(meta, n_t=n_t, groups=groups):
                return (launch.cdiv(n_t, meta["BLOCK_R"]), groups)

        if tile is not None:  # (not tuned: the tile is the token's heads)
            cfg = replace(plan.config, block_r=1, num_warps=tile[2], maxnreg=tile[3])
        elif norm_grad is not None:  # (not tuned: the partial sums' rows are the launch's programs)
            cfg = plan.config
            if over_heads:
                cfg = replace(cfg, block_r=NORM_GRAD_HEADS_TILE[0], num_warps=NORM_GRAD_HEADS_TILE[1])
        elif cfg is None or picked != halved:
            cfg = _pick(fn, rows_plan, xs[0].device, elements, full, grid, c, _GATHER_OUT)
            picked = halved
        if norm_grad is not None:
            units = grid({"BLOCK_R": cfg.block_r})
            # (rows of partial sums: the token tile's one per program of the tensor's own, q's or
            # k's; the head groups' one per program of the launch)
            n_rows = units[0] if tile is not None else units[0] * units[1]
            bufs = [torch.empty(n_rows, 2, d if r is None else width[r.index], dtype=torch.float32,
                                device=xs[0].device) for r in rows]
            # (no b: a's forward input in its place, typed as the kernel's code for b expects)
            xn = [_at_view(norm_grad[3][r.index], r.x, xs[r.index]) for r in (rows[0], rows[1] or rows[0])]
            full = (*args[:-4], xn[0], bufs[0], xn[1], bufs[1], heads, kg)
        units = grid({"BLOCK_R": cfg.block_r})
        meta = None
        if capturing():  # the bytes an element must move: x read and written, its share of the tables
            xb = xs[0].element_size()
            if positions is None:
                per_row = cos.element_size() + sin.element_size()
            else:
                per_row = positions.element_size() * positions.shape[-1] / xs[0].shape[-1] \
                    + (0 if angles else cos.element_size() + sin.element_size())
            meta = dict(heads_per_program=heads, dram_bytes_per_element=(3 if norm_grad else 2) * xb + per_row / heads)
        _run(fn, grid, full, c, cfg, transpose, elements, units[0] * units[1], meta)
        if norm_grad is not None:
            for r, buf in zip(rows, bufs):
                if r is not None and kind == "rms_heads":
                    sums[r.index][0] += buf[:, 0].sum(0)
                elif r is not None:
                    sums[r.index] += buf.sum(0)
    return sums


def _rotate_dot(xs, outs, cos, sin, positions, axis, angles, plan, transpose, elements, mode, native=False):
    x0 = xs[0]
    blocks = []
    for x, out in zip(xs, outs):
        if x.numel():
            blocks += _launch_args(x, out, *_row_views(x, cos, sin, positions))
    if positions is None:
        pos_args = (launch._dummy(x0.device), 0, 0, 0, 0, 0)
    else:
        axis_t, stride_ax = (axis, axis.stride(0)) if mode == 2 else (launch._dummy(x0.device), 0)
        n_pos = ANGLE_POSITIONS if angles else cos.shape[0]
        pos_args = (axis_t, stride_ax, positions.stride(-1) if mode == 2 else 0, cos.stride(0), sin.stride(0),
                    n_pos)
    w = plan.operand  # M in the dot's operand dtype, converted once per matrix (exact)
    swk, swn = w.stride()
    if transpose:
        swk, swn = swn, swk
    captured = _capture.get()
    max_programs = launch.max_programs(x0.device, interpret=INTERPRET,
                                       num_sms=None if captured is None else captured.num_sms)
    groups = []  # (args, rows of a, rows of b): one launch each
    for group in (blocks[i : i + 2] for i in range(0, len(blocks), 2)):
        a = group[0]
        b = group[1] if len(group) == 2 else (*a[:5], 0, *a[6:])  # no k: zero rows
        groups.append(((w, swk, swn, plan.src, *pos_args, *a, *b, x0.shape[-1]), a[5], b[5]))

    def grid(a_rows, b_rows):  # persistent: at most max_programs programs over the tiles of a and b
        return lambda meta: (min(max(launch.cdiv(a_rows, meta["BLOCK_R"]), launch.cdiv(b_rows, meta["BLOCK_R"])),
                                 max_programs),)

    cfg0 = plan.config
    consts = dict(POSITIONS=cfg0.positions, ANGLES=cfg0.angles, TRANSPOSE=transpose, GATHER_SIN=cfg0.gather_sin,
                  NZ=plan.nz, BLOCK_D=cfg0.block_d, BLOCK_N=cfg0.block_n, SPLIT=cfg0.split, OP_DTYPE=cfg0.op_dtype,
                  FP32_DOT=cfg0.fp32_dot, RAW_X=cfg0.raw_x, RAW_C=cfg0.raw_t, RAW_S=cfg0.raw_s, F64=kernel.F64,
                  NATIVE=native)
    fn = kernel._rome_kernel
    args0, a_rows0, b_rows0 = groups[0]
    cfg = _pick(fn, plan, x0.device, elements, args0, grid(a_rows0, b_rows0), consts, _DOT_OUT)
    for args, a_rows, b_rows in groups:
        tiles = launch.cdiv(a_rows, cfg.block_r) + launch.cdiv(b_rows, cfg.block_r)
        _run(fn, grid(a_rows, b_rows), args, consts, cfg, transpose, elements, tiles)


# the functions a replayed recipe skips, as defined (rome.ops: a replaced one turns replays off)
ORIGINAL = (rotate, _run, _pick)


# --- every configuration, for the ahead-of-time inspection (python -m profiling kernels) -------

def kernel_configs(arch: int | str | None = None) -> list[launch.KernelConfig]:
    """Every specialisation ``rotate`` can launch on a GPU, as a real launch specialises it.

    The head-group kernel (signed permutations: every rotation matrix), its gather and (D <= 128,
    ``launch.product("dot")``) its dot: x dtype × head_dim × pass × tables (fp32 or x's dtype, per
    row) or positions (one axis, several, reading fp32 caches or computing the angles), each with
    the autotuner's other candidates (``launch.candidates``, named "tuned BLOCK_R=.. warps=.."),
    specialised from a captured launch of BNSD q ``[1, 4, 1024, D]`` and k ``[1, 2, 1024, D]``.
    The row-tile dot kernel (general matrices, and rotation matrices with D > 128 under
    ``product("dot")``): x dtype × head_dim × pass × matrix kind × tables, every block of M
    nonzero. One tensor or q+k is the same kernel. ``arch``: an NVIDIA compute capability (an int)
    or an AMD arch name ("gfx942": 64-lane warps, which change the warps of the head-group
    kernel's dot), which also sets the gather loop's depth (``launch.gather_depth``); None: the
    runtime's."""
    if INTERPRET:
        raise RuntimeError("kernel_configs() compiles for a GPU: call it in a process without "
                           "TRITON_INTERPRET=1 (the kernel is then a JITFunction)")
    if arch is None:
        return _kernel_configs()
    with launch.target_arch(arch):
        return _kernel_configs()


def _kernel_configs() -> list[launch.KernelConfig]:
    out = []
    for x_dtype in (torch.bfloat16, torch.float16, torch.float32):
        for d in launch.HEAD_DIMS:
            for transpose in (False, True):
                for label, gather, exact_x, exact_bf16 in launch._matrix_kinds(x_dtype, transpose):
                    for table_dtype in dict.fromkeys((torch.float32, x_dtype)):
                        cfg = launch.choose(x_dtype, table_dtype, d, transpose=transpose, gather=gather,
                                            exact_in_x=exact_x, exact_in_bf16=exact_bf16, product="dot",
                                            lanes=launch.warp_size())
                        if not cfg.heads:  # (a rotation's dot in the head-group kernel: below)
                            out.append(launch.dot_kernel_config(cfg, label))
                products = ("gather", "dot") if triton.next_power_of_2(d) <= launch.HEADS_DOT_MAX_D else ("gather",)
                for product in products:
                    for table_dtype in dict.fromkeys((torch.float32, x_dtype)):
                        out += _gather_configs(x_dtype, d, transpose, table_dtype, 0, False, product)
                    for positions, angles in ((1, False), (2, False), (1, True), (2, True)):
                        out += _gather_configs(x_dtype, d, transpose, torch.float32, positions, angles, product)
                    # a decode step's few heads a program (the gather's SEAM build): fp32 tables and the
                    # positions; and a prefill's SEAM build where its batch depth is not the decode
                    # step's (launch.gather_depth: four heads a batch with four or more a program)
                    arch = launch.current_arch()
                    prefill = launch.gather_depth(arch, x_dtype, apart=True, heads=4) != \
                        launch.gather_depth(arch, x_dtype, apart=True, heads=3)
                    for positions, angles in ((0, False), (1, False), (2, False), (1, True), (2, True)):
                        if product == "gather":
                            for few in (True, "prefill") if prefill else (True,):
                                out += _gather_configs(x_dtype, d, transpose, torch.float32, positions, angles,
                                                       product, few=few, partner=True)
            if d == 128 and x_dtype != torch.float32:  # the kept pairs' runs of 8 at positions on
                # several axes (32/48/48 sections; launch.kept_run), forward and backward
                for transpose in (False, True):
                    out += _gather_configs(x_dtype, d, transpose, torch.float32, 2, False, sections=(32, 48, 48))[:1]
            if d == 128:  # the cache rows at positions on several axes in runs of 2 (wan's 44/42/42
                # sections) and of 1 (an axis alternating by column), forward and backward; the
                # sections' axes above read runs of 4 (rome.positions.axis_run, the kernel's AXIS_RUN)
                for transpose in (False, True):
                    out += _gather_configs(x_dtype, d, transpose, torch.float32, 2, False, sections=(44, 42, 42))[:1]
                    out += _gather_configs(x_dtype, d, transpose, torch.float32, 2, False, axis_by_column=True)[:1]
            if d <= launch.HALVES_MAX_D and d & (d - 1) == 0:
                # sections' half rotations held as their pairs (HALVES_RUN, launch.halves_pairs): runs
                # of 2 (the default layout's 22-column halves) with fp32 tables per row and a cache at
                # one position a row, with the tuning candidates, and x's tables; at D = 128 runs of
                # 4 and 8 (16/56/56, 32/48/48 sections), positions on three axes; forward and backward. Not launched unless
                # a thread asks (launch.pairs_halves: slower on an H200), compiled here so it stays
                # spill-free while kept
                for transpose in (False, True):
                    with launch.pairs_halves():
                        for positions in (0, 1):
                            out += _gather_configs(x_dtype, d, transpose, torch.float32, positions, False,
                                                   sections=_axis_sections(d))
                        if x_dtype != torch.float32:  # (fp32's x's tables: the fp32 tables above)
                            out += _gather_configs(x_dtype, d, transpose, x_dtype, 0, False,
                                                   sections=_axis_sections(d))[:1]
                        # (positions on three axes read by row: runs of 2 only, launch.halves_config)
                        out += _gather_configs(x_dtype, d, transpose, torch.float32, 2, False,
                                               sections=_axis_sections(d))[:1]
                        if d == 128:
                            out += _gather_configs(x_dtype, d, transpose, torch.float32, 2, False,
                                                   axis_by_column=True)[:1]
                            for sections in ((16, 56, 56), (32, 48, 48)):
                                out += _gather_configs(x_dtype, d, transpose, torch.float32, 0, False,
                                                       sections=sections)[:1]
            if d in NORM_HEAD_DIMS:  # the QK-norm prologue (forward, gather, fp32 tables) and its
                # backward epilogue (the transpose): the chosen tile (the backward's is never tuned)
                for norm in ("rms", "layer", "rms_heads"):
                    for transpose in (False, True):
                        out += _gather_configs(x_dtype, d, transpose, torch.float32, 0, False, norm=norm)[:1]
                        if d == 128:  # q launched alone (k's rows elsewhere: GQA with B > 1, positions):
                            # the code for k still compiles, with a's arguments in its place
                            out += _gather_configs(x_dtype, d, transpose, torch.float32, 0, False, norm=norm,
                                                   alone=True)[:1]
                        if norm != "rms_heads":  # (a decode step's: Qwen3's per-head norm)
                            out += _gather_configs(x_dtype, d, transpose, torch.float32, 0, False, norm=norm,
                                                   few=True)[:1]
                        if d == 128 and norm == "rms_heads" and x_dtype == torch.bfloat16:
                            # the token tile at Wan 2.1's 40 heads (5 blocks of 8, 16 warps: the
                            # registers' worst case of the models'; 4 and 2 heads are one block),
                            # and in Wan's interleave (its own build: the forward on 8 warps)
                            for mode in ("half", "interleave"):
                                out += _gather_configs(x_dtype, d, transpose, torch.float32, 0, False, norm=norm,
                                                       heads=(40, 40), mode=mode)[:1]
    return out


# head dims whose norm-prologue launches the static table compiles (the models': Flux, Wan, Qwen3
# use 128; 64 for smaller heads)
NORM_HEAD_DIMS = (64, 128)


def _axis_sections(d: int) -> tuple:
    """Three sections of a head of ``d`` columns for three position axes, the first two of
    ``8 * (d // 24) + 4`` columns (44/44/40 at 128, the default layout's): halves of 2 mod 4
    columns, so the kept pairs' runs are 2."""
    a = 8 * (d // 24) + 4
    return (a, a, d - 2 * a)


def _gather_configs(x_dtype, d, transpose, table_dtype, positions, angles,
                    product: str = "gather", norm: str | None = None,
                    alone: bool = False, heads: tuple = (4, 2), few: bool | str = False,
                    mode: str = "half", sections: tuple | None = None,
                    partner: bool = False, axis_by_column: bool = False) -> list[launch.KernelConfig]:
    """The head-group kernel's launch of a representative BNSD q/k (see ``kernel_configs``) with
    ``product`` ("gather", or "dot" for the seed's dot), and its autotuning candidates,
    specialised as those launches would be. ``alone``: q's launch without k (b's arguments
    standing in, no heads); ``heads``: q's and k's head counts (the name says where not 4 and 2);
    ``few``: a decode step's (64 sequences of one token each, tables or positions per sequence,
    132 SMs: 3 heads a program, q's groups and k's apart, the ``SEAM`` build; ``"prefill"``: a
    prefill's SEAM build, q/k [1, 32 | 8, 2048, D] on 132 SMs: 5-20 heads a program); ``mode``: the
    rotation's ("half": its pairs kept; "interleave": swapped, which the token tile builds apart);
    ``sections``: the rotation's sections (else the whole head, or ``_axis_sections`` at positions
    on several axes), each section's columns one position axis (``axis_by_column``: the next axis
    each column, runs of 1)."""
    from .matrices import rotation_matrix

    if few == "prefill":
        heads = (32, 8)
    b, s = (64, 1) if few is True else (1, 2048) if few else (1, 1024)
    q = torch.zeros(b, heads[0], s, d, dtype=x_dtype)
    k = torch.zeros(b, heads[1], s, d, dtype=x_dtype)
    # positions on several axes rotate sections of the head, each axis its own (a video's three:
    # 44/44/40 at D = 128, whose 22-column halves move pairs, KEPT_RUN 2); else the whole head (a
    # half rotation's partner in runs of 16 bytes)
    named = sections is not None  # (the name says the sections given)
    if sections is None:
        sections = _axis_sections(d) if positions == 2 and mode == "half" else (d,)
    m = rotation_matrix(sections, mode)
    axis = None
    if positions == 0:
        cos = sin = torch.zeros(*((b, 1, 1) if few is True else (s,)), d, dtype=table_dtype)
        pos = None
    else:
        a = 1 if positions == 1 else 3
        pos = torch.zeros(b, 1, s, a, dtype=torch.int64)
        cos = sin = torch.zeros(2 if angles else 2 * max(s, b), d, dtype=torch.float32)
        if a > 1:  # each section's columns one axis (a video's layout: the forward's cache rows in
            # runs of rome.positions.axis_run), or with axis_by_column the next axis each column
            axis = torch.arange(d, dtype=torch.int64) % a if axis_by_column else \
                torch.repeat_interleave(torch.arange(len(sections)) % a, torch.tensor(sections))
    nargs = {}
    if norm is not None:
        over = norm == "rms_heads"
        ws = [torch.zeros(d * (x.shape[1] if over else 1), dtype=torch.float32) for x in (q, k)][:2 - alone]
        nargs = dict(norm=(norm, 1e-6, [(w, w if norm == "layer" else None) for w in ws]))
        if transpose:  # the backward: the norm's epilogue, reading the forward's q and k
            nargs = dict(norm_grad=(norm, 1e-6, [(w, None) for w in ws], [q, k][:2 - alone]))
    xs = [q, k][:2 - alone]
    form = launch.partner_form() if partner else contextlib.nullcontext()
    with capture(num_sms=132 if few else 1) as got, launch.product(product), form:
        rotate(xs, [torch.empty_like(x) for x in xs], cos, sin, m, transpose=transpose,
               positions=pos, axis=axis, angles=angles, axis_run=1 if axis is None else _axis_run(axis.tolist()),
               **nargs)
    (first,) = got
    if few and not first.consts.get("SEAM"):
        raise AssertionError(f"a {'decode step' if few is True else 'prefill'}'s launch did not take the SEAM "
                             f"build: {first.consts}")
    halves = bool(first.consts.get("HALVES"))
    alts = (launch.halves_candidates(first.config, fixed=launch.halves_fixed(bool(first.consts["HALVES_RUN"]), x_dtype))
            if halves else launch.candidates(first.config))[1:]
    label = " M=rotation" + (f" norm={norm}" + (" backward" if transpose else "") if norm else "") \
        + (" q alone" if alone else "") + (f" heads={heads[0]}/{heads[1]}" if tuple(heads) != (4, 2) else "") \
        + (f" {mode}" if mode != "half" else "") \
        + (f" sections={'/'.join(map(str, sections))}" if named else "") \
        + (" axis by column" if axis_by_column else "") \
        + (" decode (SEAM)" if few is True else " prefill (SEAM)" if few else "") \
        + (" halves" if halves else "")  # (partner: the name the launch had before HALVES)
    # (a launch that took its halves: the partner form's build too, a partial rotary's)
    partner_form = _gather_configs(x_dtype, d, transpose, table_dtype, positions, angles, product, norm, alone,
                                   heads, few, mode, sections if named else None, partner=True,
                                   axis_by_column=axis_by_column) if halves else []
    return [launch.specialise(kernel._rome_gather_kernel, first.args, first.consts | {"BLOCK_R": c.block_r}, c,
                              name=c.name + label + (f" tuned {launch.tile_name(c)}" if c is not first.config else ""),
                              meta=dict(first.kernel_config.meta, block_r=c.block_r,
                                        elements_per_tile=c.block_r * c.head_dim,
                                        tuned_candidate=c is not first.config, matrix="rotation",
                                        norm=norm, heads=tuple(heads), gather_depth=first.consts["DEPTH"],
                                        kept_run=first.consts["KEPT_RUN"], sections=tuple(sections), mode=mode,
                                        seam=bool(first.consts.get("SEAM")), halves=halves,
                                        halves_run=first.consts.get("HALVES_RUN", 0)))
            for c in (first.config, *alts)] + partner_form
