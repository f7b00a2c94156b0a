"""``rome.apply`` and ``rome.apply_qk``: checks, backends, torch.library ops and autograd.

Four custom ops, two families that are each other's adjoint in x:

    rome::apply                out = x*cos + (x @ M) * sin
    rome::apply_qk             the same for q and k in one launch
    rome::apply_transposed     out = x*cos + (x*sin) @ Mᵀ     (dx of apply, given dy)
    rome::apply_qk_transposed  the same for q and k

The backward of one family calls the other (so double backward works), plus the table grads:
forward:   dcos = Σ h*x,  dsin = Σ h*(x@M),  dM = Σ xᵀ(h*sin)
transpose: dcos = Σ h*x,  dsin = Σ x*(h@M),  dM = Σ hᵀ(x*sin)
(Σ over the dims cos/sin/M were broadcast along). The ops also have batching rules (vmap).

Rounding (the ops' trailing ``rounding`` arg, every entry point's ``rounding=``): ``"exact"``, one
rounding of the exact value, or ``"native"``, the eager chain's bits (``torch_backend._native``,
``kernel._native``); the backward of a native op is the transposed native op (the eager chain's
backward), its table grads the exact ones.

Positions (``apply_at``/``apply_qk_at``; the ops' optional ``positions``/``axis`` args): cos and
sin are then caches ``[P, D]`` and element (r, j) of x reads row ``positions[r, axis[j]]`` of them
(``rome.positions.gather_rows``); the kernel gathers them itself, no per-token table is
materialised. dx is the same kernel transposed at the same positions; the cache grads are the
per-token table grads scattered back (``scatter_rows``, an accumulating index_put). With
``angles=True`` (``apply_qk_angles``) there is no cache: cos holds inv_freq as float32 hi + lo
``[2, D]``, sin the ``[2, D]`` scales (hi + lo), and the kernel computes the angles (no grads for those).
Forward-mode AD and torch.func transforms go through ``_Rotate``, an autograd.Function with the
same backward and a jvp, which the public functions use when one is active.

Per-call cost: a repeated call of one signature (shapes, strides, dtypes, device, matrix) takes
the lean path (``_lean``): its checks, plan and launches were worked out by the first call and are
replayed, with no torch.library dispatch in eager mode. Positions are never read on the host by
default: their range is asserted on the device (``position_checks``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import threading
import warnings
import weakref

import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from . import torch_backend
from .checks import DTYPES, check_arguments, check_position_types, check_rounding, check_types
from .matrices import check_mode, check_size, kept_rotation_matrix
from .positions import angle_rows, axis_run, cache_index, check_range, gather_rows, rows_of, scatter_rows
from .settings import ThreadSetting
from .types import BACKENDS, Backend, Mode, Rounding

# Triton's interpreter patches triton.language globally while it runs a kernel, so two threads
# interpreting at once fail (InterpreterError); launches under TRITON_INTERPRET take this lock.
# Compiled (GPU) launches are thread-safe and never take it.
_INTERPRET_LOCK = threading.Lock()


@functools.lru_cache(maxsize=None)
def _kernel():
    """The Triton kernel's launcher (``rome.launcher``), imported on first use (TRITON_INTERPRET
    is read then)."""
    try:
        from . import launcher
    except ImportError as e:  # pragma: no cover - platforms without triton
        raise RuntimeError(
            f"backend='triton' needs triton, which failed to import: {e}. A CUDA build of torch on "
            "Linux brings triton (a ROCm build its pytorch-triton-rocm); otherwise install it, e.g. "
            "pip install 'rome-rope[triton]' (docs/install.md), or use backend='torch'"
        ) from e
    return launcher


def _check(xs: dict[str, Tensor], cos, sin, matrix, backend, positions=None, axis=None, angles=False) -> str:
    """Validate the arguments of any of the four ops (``rome.checks.check_arguments``); return the
    backend that will run."""
    check_arguments(xs, cos, sin, matrix, backend, positions, axis, angles)
    x0 = next(iter(xs.values()))
    if backend == "auto":
        kernel_ok = x0.dtype != torch.float64 and x0.shape[-1] <= 256
        return "triton" if x0.is_cuda and kernel_ok and _has_triton() and _kernel_arch_ok(x0.device) else "torch"
    return backend


@functools.lru_cache(maxsize=None)
def _has_triton() -> bool:
    """Whether a ``triton`` module is installed, looked up without importing it: a CUDA torch on
    Linux brings one, a ROCm torch its ``pytorch-triton-rocm``; a torch without one (CPU, Windows,
    macOS, a source build) leaves ``backend="auto"`` on the torch backend (docs/install.md)."""
    return importlib.util.find_spec("triton") is not None


def _kernel_arch_ok(device: torch.device) -> bool:
    """Whether ``backend="auto"`` may take the Triton kernel on ``device`` (a CUDA-type device): on a
    CUDA build always; on a ROCm build (``torch.version.hip``) only for the AMD archs the kernel is
    compiled and checked for (``rome.launch.HIP_ARCHS``, docs/amd.md), else the torch backend."""
    if not getattr(torch.version, "hip", None):
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _gcn_arch(index) in _kernel().launch.HIP_ARCHS


@functools.lru_cache(maxsize=None)
def _gcn_arch(index: int) -> str:
    """The base arch of ROCm device ``index``: "gfx942" of gcnArchName "gfx942:sramecc+:xnack-"."""
    return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]


ANGLE_POSITIONS = 1 << 24  # angles: positions below it are exact in float32


def _check_position_values(positions: Tensor, axis, rows: int, angles=False) -> None:
    """``0 <= positions < P`` (angles: ``< 2**24``) and ``0 <= axis < A`` on the host (syncs):
    ``position_checks("host")``. Meta tensors have no values to check (and the op reads none)."""
    if positions.device.type == "meta":
        return
    if angles:
        span = check_range(positions)
        if span is not None and span[1] >= ANGLE_POSITIONS:
            raise ValueError(
                f"positions must be < 2**24 = {ANGLE_POSITIONS} with angles (exact in float32), got max {span[1]}"
            )
    else:
        check_range(positions, rows, name="the caches' rows P")
    if axis is not None:
        _check_axis_values(axis, positions.shape[-1])


def _check_axis_values(axis: Tensor, a: int) -> list:
    """axis's values (read on the host: a sync), each in ``[0, A)`` (else ValueError)."""
    values = axis.tolist()
    if values and (min(values) < 0 or max(values) >= a):
        raise ValueError(f"axis values must lie in [0, A) = [0, {a}), got min {min(values)} max {max(values)}")
    return values


# Positions are not read on the host: the kernel never reads a cache row outside [0, P) (nor,
# with angles, a position outside [0, 2**24)): the elements that would read one come out NaN, and
# the torch backend gives the same NaN (``_torch_rotate``). ``position_checks`` adds a check:
# "device" asserts the range on the device (``torch._assert_async``: no sync; on a GPU a failed
# assertion is a device-side assert, which ends the process's CUDA context, on the CPU a
# RuntimeError at once), "host" reads it on the host (a sync; ValueError naming min and max).
# ``positions_checked()`` (rome.RoPE) says the caller checked them already (in range: the torch
# backend then gathers without clamping); a backward checks nothing its forward checked.
# axis, which the kernel reads unmasked, is read on the host once per axis tensor (remembered by
# identity, version and address, as a model passes one kept tensor), never while capturing; the
# same read gives the runs of columns the forward reads its cache rows in (``_check_axis_once``).
#
# The default is "device": an out-of-range position is an error, never a quiet NaN, and still no
# sync. Its few ops run once per positions tensor (remembered, as axis is, by identity, version
# and address: a model's layers share one positions tensor per step); an inference tensor has no
# version counter and is checked on every call. "kernel" leaves the check to the NaN (no op at
# all: for a caller that measured the check and wants it gone).
POSITION_CHECKS = ("kernel", "device", "host")
_CHECKED = ThreadSetting(False)
_POSITION_CHECK = ThreadSetting("device")
_POSITIONS_OK: dict = {}  # id(positions) -> (weakref(positions), (version, data_ptr, limit))


@contextlib.contextmanager
def positions_checked():
    """Inside: the ops trust that positions lie in ``[0, P)`` and axis in ``[0, A)``."""
    with _CHECKED.scoped(True):
        yield


def _checked_now():
    """What a forward leaves its backward: True where its positions are known in range (the
    caller checked them: ``positions_checked()``), else "forward" (the forward ran the thread's
    ``position_checks``; the backward checks nothing again but still never reads outside)."""
    return True if _CHECKED.get() is True else "forward"


@contextlib.contextmanager
def position_checks(how: str):
    """How this thread's position ops check their positions' values inside the block:
    ``"device"`` (the default: ``torch._assert_async``, no sync, once per positions tensor),
    ``"kernel"`` (no check: out-of-range elements are NaN) or ``"host"`` (ValueError, a sync)."""
    if how not in POSITION_CHECKS:
        raise ValueError(f"position_checks takes one of {POSITION_CHECKS}, got {how!r}")
    with _POSITION_CHECK.scoped(how):
        yield


_AXES: dict = {}  # id(axis) -> (weakref(axis), (version, data_ptr, A), run, checked): axis tensors read already
_AXES_LOCK = threading.Lock()


def _axis_key(axis: Tensor, a: int):
    """What identifies ``axis``'s values (None where nothing does: an inference tensor has no
    version counter, a functorch-wrapped or fake one no storage)."""
    if axis.is_inference() or type(axis) is not Tensor:
        return None
    try:
        return axis._version, axis.data_ptr(), a
    except RuntimeError:
        return None


def _axis_read(axis: Tensor, a: int):
    """The entry of ``_AXES`` for ``axis`` where its values were read already (and not written
    since), else None."""
    entry = _AXES.get(id(axis))
    return entry if entry is not None and entry[0]() is axis and entry[1] == _axis_key(axis, a) else None


def _check_axis_once(axis: Tensor, a: int, check: bool = True) -> int:
    """``0 <= axis < A`` (``check``), read on the host once per axis tensor (again after an
    in-place write; inference tensors, which have no version counter, on every call, and not at
    all where nothing is checked); not while a CUDA graph is captured (no read can run there) nor
    for meta tensors (no values). Returns ``rome.positions.axis_run`` of its values (1 where they
    were not read): the runs the gather kernel reads its cache rows in."""
    if axis.device.type == "meta":
        return 1
    entry = _axis_read(axis, a)
    if entry is not None and (entry[3] or not check):
        return entry[2]
    if axis.is_cuda and torch.cuda.is_current_stream_capturing():
        return 1
    key = _axis_key(axis, a)
    if key is None and not check:
        return 1
    values = _check_axis_values(axis, a) if check else axis.tolist()
    run = axis_run(values)
    if key is not None:
        with _AXES_LOCK:
            if len(_AXES) >= 64:
                _AXES.clear()
            _AXES[id(axis)] = (weakref.ref(axis), key, run, check)
    return run


def _check_values(positions: Tensor, axis, rows: int, angles: bool) -> int:
    """The value checks of a position op's call (see above); returns the axis's run
    (``_check_axis_once``; 1 without an axis)."""
    run = 1 if axis is None else _check_axis_once(axis, positions.shape[-1], check=not _CHECKED.get())
    if _CHECKED.get():
        return run
    how = _POSITION_CHECK.get()
    if how == "kernel" or positions.device.type == "meta" or not positions.numel():
        return run
    if positions.is_cuda and torch.cuda.is_current_stream_capturing():
        return run
    if how == "host":
        _check_position_values(positions, None, rows, angles)
        return run
    limit = ANGLE_POSITIONS if angles else rows
    key = _axis_key(positions, limit)
    entry = _POSITIONS_OK.get(id(positions))
    if key is not None and entry is not None and entry[0]() is positions and entry[1] == key:
        return run  # this tensor's values were asserted in range already
    what = "2**24 (angles)" if angles else f"the caches' rows P={rows}"
    torch._assert_async(torch.logical_and(positions >= 0, positions < limit).all(),
                        f"rome: positions must lie in [0, {what})")
    if key is not None:
        with _AXES_LOCK:
            if len(_POSITIONS_OK) >= 64:
                _POSITIONS_OK.clear()
            _POSITIONS_OK[id(positions)] = (weakref.ref(positions), key)
    return run


def _out_like(x: Tensor) -> Tensor:
    """The output buffer, always with a unit last stride (the kernel writes rows of D).

    x's layout (``torch.empty_like``) where that has one, else contiguous. empty_like of an
    overlapping x orders the dims by stride, so e.g. strides (1, 0, 1) give a last stride of 5.
    """
    if x.shape[-1] <= 1 or x.stride(-1) == 1:
        out = torch.empty_like(x)
        if x.shape[-1] <= 1 or out.stride(-1) == 1:
            return out
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _unit_last(t: Tensor) -> Tensor:
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _resolved(t):
    """t with its negative bit applied (a lazily negated view, such as ``z.conj().imag``, whose
    storage holds -t: the kernel reads storage), else t itself."""
    return t.resolve_neg() if isinstance(t, Tensor) and t.is_neg() else t


def _rotate(xs, cos, sin, matrix, backend: str, transpose: bool, positions=None, axis=None,
            angles=False, outs=None, norm=None, rounding="exact") -> list[Tensor]:
    """The one launcher: into ``outs`` (x's shape and dtype, unit last stride; rome.inplace checks
    them and whether one may be its x) or, by default, into new tensors. ``norm``: the kernel's
    QK-norm prologue (``rome.launcher.rotate``'s; triton only, rome.qknorm decides). ``rounding``:
    "exact" or "native" (the eager chain's bits: ``torch_backend._native``, ``kernel._native``;
    not with ``norm``)."""
    check_rounding(rounding)
    names = ("q", "k") if len(xs) == 2 else ("x",)
    backend = _check(dict(zip(names, xs)), cos, sin, matrix, backend, positions, axis, angles)
    run = 1
    if positions is not None:
        run = _check_values(positions, axis, cos.shape[0], angles)
    outs = [_out_like(x) for x in xs] if outs is None else list(outs)
    learn = _LEARN.get()
    if learn is not None:
        learn.calls += 1
        learn.backend, learn.outs = backend, outs
    if backend == "triton":
        xs = [_resolved(x) for x in xs]
        cos, sin, matrix, positions, axis = map(_resolved, (cos, sin, matrix, positions, axis))
        kernel = _kernel()
        x0 = xs[0]
        warn = x0.is_cuda and x0.dtype != torch.float32 and kernel.launch.uses_fp32_dot(x0.dtype, matrix)
        if warn:
            _warn_fp32_dot(x0.dtype)
        with _INTERPRET_LOCK if kernel.INTERPRET else contextlib.nullcontext():
            with kernel.recording() if learn is not None else contextlib.nullcontext() as rec:
                kernel.rotate(
                    [_unit_last(x) for x in xs], outs, _unit_last(cos), _unit_last(sin), matrix,
                    transpose=transpose, positions=positions, axis=axis, angles=angles, axis_run=run,
                    **({} if norm is None else {"norm": norm}),
                    **({"native": True} if rounding == "native" else {}),
                )
        if learn is not None:
            learn.rec, learn.warn = rec, warn
    else:
        if norm is not None:
            raise ValueError("the QK-norm prologue is the triton backend's (the torch backend normalises first)")
        _torch_rotate(xs, outs, cos, sin, matrix, transpose, positions, axis, angles, **_native(rounding))
    return outs


def _native(rounding: str) -> dict:
    """``_rotate``'s rounding keyword, passed only where it is not the default (a test's spy of
    ``_rotate``, or a traced call, sees the calls it saw before)."""
    return {} if rounding == "exact" else {"rounding": rounding}


def _extra(rounding: str) -> tuple:
    """The ops' trailing rounding argument, passed only where it is not the default (a traced
    graph keeps the ops' calls as they were)."""
    return () if rounding == "exact" else (rounding,)


def _warn_fp32_dot(dtype) -> None:
    warnings.warn(
        f"rome: the matrix's values are not exact in {dtype} (nor bf16), so the kernel "
        "multiplies in IEEE fp32 rather than on the tensor cores",
        stacklevel=4,
    )


def _torch_rotate(xs, outs, cos, sin, matrix, transpose, positions, axis, angles, rounding="exact") -> None:
    """The torch backend, with the kernel's rule for positions outside the cache (or, with angles,
    outside ``[0, 2**24)``): never read, the elements that would read one NaN. Trusted positions
    (``positions_checked()``) go straight to the gather."""
    if positions is None or _CHECKED.get() is True or positions.device.type == "meta":
        torch_backend.rotate_into(xs, outs, cos, sin, matrix, transpose=transpose, positions=positions, axis=axis,
                                  angles=angles, **_native(rounding))
        return
    limit = ANGLE_POSITIONS if angles else cos.shape[0]
    bad = (positions < 0) | (positions >= limit)  # [..., A]
    safe = positions.clamp(0, limit - 1)
    torch_backend.rotate_into(xs, outs, cos, sin, matrix, transpose=transpose, positions=safe, axis=axis,
                              angles=angles, **_native(rounding))
    columns = _bad_columns(bad, axis, matrix, transpose)
    for out in outs:
        out.masked_fill_(columns, float("nan"))


def _bad_columns(bad: Tensor, axis, matrix: Tensor, transpose: bool) -> Tensor:
    """bool ``[..., D]``: the output elements that read a position in ``bad`` (``[..., A]``):
    column j reads its own position (cos, and sin in the forward); the transpose's column j also
    reads sin at every column i with ``M[j, i] != 0``."""
    d = matrix.shape[-1]
    columns = cache_index(bad.to(torch.int64), axis, d).to(torch.bool)
    if transpose and axis is not None:
        nz = (matrix != 0).to(torch.float32)
        columns = columns | (torch_backend.matmul(columns.to(torch.float32), nz.mT) > 0)
    return columns


def _fake(xs, cos, sin, matrix, backend: str, positions=None, axis=None, angles=False,
          rounding="exact") -> list[Tensor]:
    check_rounding(rounding)
    names = ("q", "k") if len(xs) == 2 else ("x",)
    _check(dict(zip(names, xs)), cos, sin, matrix, backend, positions, axis, angles)
    return [_out_like(x) for x in xs]


# --- the four ops -------------------------------------------------------------------------


# positions=None: cos/sin are per-row tables; else caches [P, D] read at positions [..., A]
# (axis [D]: the axis of each column, for A > 1); angles=True: cos/sin are the frequencies [2, D]
# and scales [2, D], the angles computed from the positions; rounding: "exact" or "native"


@torch.library.custom_op("rome::apply", mutates_args=())
def _apply(
    x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto",
    positions: Tensor | None = None, axis: Tensor | None = None, angles: bool = False,
    rounding: str = "exact",
) -> Tensor:
    return _rotate([x], cos, sin, matrix, backend, False, positions, axis, angles, **_native(rounding))[0]


@torch.library.custom_op("rome::apply_transposed", mutates_args=())
def _apply_t(
    x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto",
    positions: Tensor | None = None, axis: Tensor | None = None, angles: bool = False,
    rounding: str = "exact",
) -> Tensor:
    return _rotate([x], cos, sin, matrix, backend, True, positions, axis, angles, **_native(rounding))[0]


@torch.library.custom_op("rome::apply_qk", mutates_args=())
def _apply_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto",
    positions: Tensor | None = None, axis: Tensor | None = None, angles: bool = False,
    rounding: str = "exact",
) -> tuple[Tensor, Tensor]:
    q_out, k_out = _rotate([q, k], cos, sin, matrix, backend, False, positions, axis, angles, **_native(rounding))
    return q_out, k_out


@torch.library.custom_op("rome::apply_qk_transposed", mutates_args=())
def _apply_qk_t(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, backend: str = "auto",
    positions: Tensor | None = None, axis: Tensor | None = None, angles: bool = False,
    rounding: str = "exact",
) -> tuple[Tensor, Tensor]:
    q_out, k_out = _rotate([q, k], cos, sin, matrix, backend, True, positions, axis, angles, **_native(rounding))
    return q_out, k_out


def _fake_one(x, cos, sin, matrix, backend="auto", positions=None, axis=None, angles=False, rounding="exact"):
    return _fake([x], cos, sin, matrix, backend, positions, axis, angles, rounding)[0]


def _fake_two(q, k, cos, sin, matrix, backend="auto", positions=None, axis=None, angles=False, rounding="exact"):
    q_out, k_out = _fake([q, k], cos, sin, matrix, backend, positions, axis, angles, rounding)
    return q_out, k_out


for _op, _fake_impl in ((_apply, _fake_one), (_apply_t, _fake_one), (_apply_qk, _fake_two), (_apply_qk_t, _fake_two)):
    _op.register_fake(_fake_impl)


# --- autograd -----------------------------------------------------------------------------

# the four ops by (transpose, number of tensors); the adjoint in x of (t, n) is (not t, n)
_OPS = {(False, 1): _apply, (True, 1): _apply_t, (False, 2): _apply_qk, (True, 2): _apply_qk_t}


def _reduce_sum(terms: list[Tensor], like: Tensor) -> Tensor:
    return sum(t.sum_to_size(like.shape) for t in terms).to(like.dtype)


@torch_backend.no_autocast
def _table_grads(xs, hs, cos, sin, matrix, transpose: bool, needs):
    """Grads of cos, sin and matrix; h is the incoming grad of the output of x."""
    pairs = [(x, h) for x, h in zip(xs, hs) if h is not None]
    if not pairs or not any(needs):
        return None, None, None
    dt = _compute_dtype(pairs[0][0])
    pairs = [(x.to(dt), h.to(dt)) for x, h in pairs]
    s, m = sin.to(dt), matrix.to(dt)
    need_cos, need_sin, need_m = needs
    dcos = _reduce_sum([h * x for x, h in pairs], cos) if need_cos else None
    dsin = dm = None
    if need_sin:
        mm = torch_backend.matmul
        terms = [x * mm(h, m) if transpose else h * mm(x, m) for x, h in pairs]
        dsin = _reduce_sum(terms, sin)
    if need_m:
        outer = [(h, x * s) if transpose else (x, h * s) for x, h in pairs]
        d = matrix.shape[-1]  # Σ over rows of aᵀb; a matmul (torch's legacy vmap has no einsum)
        dm = sum(torch_backend.matmul(a.reshape(-1, d).mT, b.reshape(-1, d)) for a, b in outer).to(matrix.dtype)
    return dcos, dsin, dm


def _cache_grads(xs, hs, cos, sin, matrix, transpose: bool, needs, positions, axis, angles=False):
    """``_table_grads`` with positions: the per-token table grads, scattered into the caches."""
    if positions is None:
        return _table_grads(xs, hs, cos, sin, matrix, transpose, needs)
    if not any(needs) or all(h is None for h in hs):
        return None, None, None
    if angles and (needs[0] or needs[1]):
        raise RuntimeError("rome: no gradient for the frequencies and scales of the angles mode "
                           "(apply_qk_angles); detach them")
    # positions outside the cache (the forward's NaN elements) read and give nothing: read at a
    # clamped row, their grads zeroed (no sync to find out whether there are any)
    limit = ANGLE_POSITIONS if angles else cos.shape[0]
    bad = _bad_columns((positions < 0) | (positions >= limit), axis, matrix, transpose)
    hs = [None if h is None else h.masked_fill(bad, 0) for h in hs]
    positions = positions.clamp(0, limit - 1)
    if angles:
        _, rows_s = angle_rows(cos, sin, positions, axis)
        return _table_grads(xs, hs, rows_s, rows_s, matrix, transpose, needs)
    rows_c, rows_s = rows_of((cos, sin), positions, axis)
    dcos, dsin, dm = _table_grads(xs, hs, rows_c, rows_s, matrix, transpose, needs)
    p = cos.shape[0]
    dcos = None if dcos is None else scatter_rows(dcos, positions, axis, p)
    dsin = None if dsin is None else scatter_rows(dsin, positions, axis, p)
    return dcos, dsin, dm


def _grads(rotate, transpose: bool, xs, grads, cos, sin, matrix, needs_x, needs_tables,
           positions=None, axis=None, angles=False):
    """``(dxs, (dcos, dsin, dM))`` of op (transpose, len(grads)) given the grads of its outputs.

    dx is the adjoint map of the grad, ``rotate(not transpose, hs)``: one launch for q and k.
    """
    n = len(grads)
    dxs = [None] * n
    live = [i for i in range(n) if needs_x[i] and grads[i] is not None]
    if len(live) == n:
        dxs = rotate(not transpose, list(grads))
    else:
        for i in live:
            dxs[i] = rotate(not transpose, [grads[i]])[0]
    return dxs, _cache_grads(xs, grads, cos, sin, matrix, transpose, needs_tables, positions, axis, angles)


# The ops' own autograd (torch.library): reverse mode, double backward, torch.compile, opcheck.


def _launch_now() -> tuple[str, bool, bool] | None:
    """The launch's choices where a forward runs (``rome.launch.launch_state``: the product, the
    partner form, the pairs as halves): its backward takes the same, also where autograd runs it in
    another thread or outside the block."""
    try:
        from . import launch
    except ImportError:  # pragma: no cover - platforms without triton
        return None
    return launch.launch_state()


def _launch_block(state: tuple[str, bool, bool] | None):
    """A block in which launches take ``state`` (``_launch_now``'s, captured by a forward)."""
    if state is None:
        return contextlib.nullcontext()
    from . import launch

    return launch.launch_state_scoped(state)


def _setup_context(ctx, inputs, output):
    *xs, cos, sin, matrix, backend, positions, axis, angles, rounding = inputs
    n = len(xs)
    ctx.n, ctx.backend, ctx.angles, ctx.launch, ctx.checked = n, backend, angles, _launch_now(), _checked_now()
    ctx.rounding = rounding
    table_grads = any(ctx.needs_input_grad[n : n + 3])
    ctx.save_for_backward(*(xs if table_grads else [None] * n), cos, sin, matrix, positions, axis)


def _make_backward(transpose: bool):
    def backward(ctx, *grads):
        n = ctx.n
        *xs, cos, sin, matrix, positions, axis = ctx.saved_tensors
        needs = ctx.needs_input_grad

        def rotate(t, hs):  # (through the lean path: a model's first call, the one that learns its
            # signature, runs the op, and its backward is every step's backward where it is the graph kept)
            with _CHECKED.scoped(ctx.checked), _launch_block(ctx.launch):  # checked by the forward
                return _rotated(t, ctx.backend, positions, axis, ctx.angles, cos, sin, matrix, hs, ctx.rounding)

        dxs, table = _grads(rotate, transpose, xs[:n], grads, cos, sin, matrix, needs[:n], needs[n : n + 3],
                            positions, axis, ctx.angles)
        return (*dxs, *table, None, None, None, None, None)

    return backward


for (_transpose, _n), _op in _OPS.items():
    _op.register_autograd(_make_backward(_transpose), setup_context=_setup_context)


# The ops' batching rules (torch.vmap, and torch.func.jacrev/jacfwd, which vmap over tangents).


def _batch_front(t: Tensor, dim, size: int, rank: int) -> Tensor:
    """t with its batch dim first (expanded if t has none), then size-1 dims up to 1 + rank."""
    t = t.movedim(dim, 0) if dim is not None else t.expand(size, *t.shape)
    return t[(slice(None),) + (None,) * (rank + 1 - t.ndim)]


_TRAILING = ("auto", None, None, False, "exact")  # the ops' defaults of backend, positions, axis, angles, rounding


def _make_vmap(transpose: bool, n: int):
    def rule(info, in_dims, *args):
        pad = n + 3 + len(_TRAILING) - len(args)  # trailing defaults the caller left out
        args, in_dims = (*args, *_TRAILING[len(_TRAILING) - pad :]), (*in_dims, *(None,) * pad)
        *xs, cos, sin, matrix, backend, positions, axis, angles, rounding = args
        op, b = _OPS[(transpose, n)], info.batch_size
        cached = positions is not None
        tables_batched = in_dims[n] is not None or in_dims[n + 1] is not None
        if in_dims[n + 2] is not None or in_dims[n + 5] is not None or (cached and tables_batched):
            # a batch of matrices, axes or caches: one launch per sample
            def sample(i):
                return [t if d is None or t is None else t.select(d, i) for t, d in zip(args, in_dims)]

            per = [op(*sample(i)) for i in range(b)]
            outs = [torch.stack([p if n == 1 else p[j] for p in per]) for j in range(n)]
        else:
            # x as [B, 1.., *x], the tables (if batched) as [B, 1.., *cos]: one launch, which
            # broadcasts them as the unbatched op does per sample
            ranks = [x.ndim - (d is not None) for x, d in zip(xs, in_dims)]
            rank = max(ranks)
            bxs = [_batch_front(x, d, b, rank) for x, d in zip(xs, in_dims)]
            if tables_batched:
                cos, sin = (_batch_front(t, d, b, rank) for t, d in zip((cos, sin), in_dims[n : n + 2]))
            if in_dims[n + 4] is not None:  # positions [B, 1.., ..., A], as the tables
                positions = _batch_front(positions, in_dims[n + 4], b, rank)
            out = op(*bxs, cos, sin, matrix, backend, positions, axis, angles, *_extra(rounding))
            outs = [out] if n == 1 else list(out)
            outs = [o[(slice(None),) + (0,) * (rank - r)] for o, r in zip(outs, ranks)]
        return (outs[0], 0) if n == 1 else (tuple(outs), (0,) * n)

    return rule


for (_transpose, _n), _op in _OPS.items():
    _op.register_vmap(_make_vmap(_transpose, _n))


def _tangent_terms(x, tcos, tsin, tm, sin, matrix, transpose: bool):
    """The tangent of the output from those of the tables and the matrix, in compute dtype:

        apply      x*ċos + (x @ M)*ṡin + (x @ Ṁ)*sin
        transpose  x*ċos + (x*ṡin) @ Mᵀ + (x*sin) @ Ṁᵀ
    """
    dt = _compute_dtype(x)
    x = x.to(dt)
    terms = []
    if tcos is not None:
        terms.append(x * tcos.to(dt))
    if tsin is not None:
        m = matrix.to(dt)
        terms.append(torch_backend.matmul(x * tsin.to(dt), m.mT) if transpose else torch_backend.matmul(x, m) * tsin.to(dt))
    if tm is not None:
        tm = tm.to(dt)
        terms.append(torch_backend.matmul(x * sin.to(dt), tm.mT) if transpose else torch_backend.matmul(x, tm) * sin.to(dt))
    return sum(terms) if terms else None


class _Rotate(torch.autograd.Function):
    """The four ops as one autograd.Function, which the public API calls under forward-mode
    AD and torch.func transforms.

    torch.library's generated autograd for a custom op has no ``setup_context`` and no ``jvp``:
    torch.func.grad/vjp/jacrev refuse it and forward-mode AD (torch.func.jvp, jacfwd,
    torch.autograd.forward_ad) gets a zero tangent. This Function gives the same backward plus a
    forward-mode rule; vmap is generated from the ops' batching rules. out is linear in x, so

        ṫ = op(ẋ) + the table and matrix terms of ``_tangent_terms``

    (op(ẋ) alone, bitwise, when only x has a tangent; else one more rounding to x's dtype).
    forward(transpose, backend, positions, axis, angles, rounding, cos, sin, matrix, *xs) returns
    a tuple, one output per x (positions None: per-row tables; else caches read at positions).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(transpose, backend, positions, axis, angles, rounding, cos, sin, matrix, *xs):
        out = _OPS[(transpose, len(xs))](*xs, cos, sin, matrix, backend, positions, axis, angles, *_extra(rounding))
        return (out,) if len(xs) == 1 else tuple(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        transpose, backend, positions, axis, angles, rounding, cos, sin, matrix, *xs = inputs
        ctx.transpose, ctx.backend, ctx.angles, ctx.launch = transpose, backend, angles, _launch_now()
        ctx.checked, ctx.rounding = _checked_now(), rounding
        table_grads = any(ctx.needs_input_grad[6:9])
        ctx.save_for_backward(positions, axis, cos, sin, matrix, *(xs if table_grads else [None] * len(xs)))
        ctx.save_for_forward(positions, axis, cos, sin, matrix, *xs)

    @staticmethod
    def _rotate(ctx, positions, axis, cos, sin, matrix):
        def rotate(t, hs):
            with _CHECKED.scoped(getattr(ctx, "checked", "forward")), _launch_block(getattr(ctx, "launch", None)):
                return list(_Rotate.apply(t, ctx.backend, positions, axis, ctx.angles, ctx.rounding, cos, sin,
                                          matrix, *hs))

        return rotate

    @staticmethod
    def backward(ctx, *grads):
        positions, axis, cos, sin, matrix, *xs = ctx.saved_tensors
        needs = ctx.needs_input_grad
        rotate = _Rotate._rotate(ctx, positions, axis, cos, sin, matrix)
        dxs, table = _grads(rotate, ctx.transpose, xs, grads, cos, sin, matrix, needs[9:], needs[6:9],
                            positions, axis, ctx.angles)
        return (None, None, None, None, None, None, *table, *dxs)

    @staticmethod
    def jvp(ctx, _transpose, _backend, _positions, _axis, _angles, _rounding, tcos, tsin, tm, *txs):
        positions, axis, cos, sin, matrix, *xs = ctx.saved_tensors
        rotate = _Rotate._rotate(ctx, positions, axis, cos, sin, matrix)
        if ctx.angles:
            if tcos is not None or tsin is not None:
                raise RuntimeError("rome: no forward-mode derivative for the frequencies and scales of "
                                   "the angles mode (apply_qk_angles)")
            sin = angle_rows(cos, sin, positions, axis)[1]
        elif positions is not None:  # the terms of the tables as per-token tables
            tcos, tsin = (None if t is None else gather_rows(t, positions, axis) for t in (tcos, tsin))
            sin = gather_rows(sin, positions, axis)
        live = [i for i, t in enumerate(txs) if t is not None]
        base = [None] * len(xs)
        if len(live) == len(xs):
            base = rotate(ctx.transpose, list(txs))
        else:
            for i in live:
                base[i] = rotate(ctx.transpose, [txs[i]])[0]
        outs = []
        for x, b in zip(xs, base):
            terms = _tangent_terms(x, tcos, tsin, tm, sin, matrix, ctx.transpose)
            if terms is None:
                outs.append(b if b is not None else torch.zeros(x.shape, dtype=x.dtype, device=x.device))
            else:
                outs.append((terms if b is None else b.to(terms.dtype) + terms).to(x.dtype))
        return tuple(outs)


# --- public API ---------------------------------------------------------------------------


def _use_function(*tensors: Tensor) -> bool:
    """Whether the call needs _Rotate: a torch.func transform is active or an input carries a
    forward-mode tangent. Otherwise the op runs directly (its registered autograd covers reverse
    mode, at less Python overhead), and always under torch.compile, since Dynamo cannot trace
    an autograd.Function with a jvp (graph break gb0144; it traces the op itself)."""
    if torch.compiler.is_compiling():
        return False
    if torch._C._are_functorch_transforms_active():
        return True
    return any(fwAD.unpack_dual(t).tangent is not None for t in tensors)


_is_legacy_batched = torch._C._functorch.is_legacy_batchedtensor


def _direct(*tensors: Tensor) -> bool:
    """Whether an op may run its implementation (``_rotate``) without the dispatcher: eager, plain
    tensors, and nothing that would record the call (an autograd graph, a trace, a dispatch or
    torch-function mode, the profiler, which then shows ``rome::*`` as before). The result is
    the op's, bitwise; what is saved is the custom op's dispatch, ~50 µs a call."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled() or torch._C._autograd._profiler_enabled()
            or torch._C._are_functorch_transforms_active()):
        return False
    # legacy vmap (gradcheck's batched grads) wraps plain-typed tensors: the op batches them
    return all(type(t) is Tensor and not _is_legacy_batched(t) for t in tensors)


def _run(transpose: bool, backend, positions, axis, angles, cos, sin, matrix, xs, rounding="exact") -> list[Tensor]:
    """The rotated ``xs``: the implementation itself where ``_direct`` allows, else the op
    (autograd, compile, modes); the entry points and the op's backward both come here."""
    extra = [t for t in (positions, axis) if t is not None]
    if _direct(*xs, cos, sin, matrix, *extra):
        return _rotate(list(xs), cos, sin, matrix, backend, transpose, positions, axis, angles, **_native(rounding))
    outs = _OPS[(transpose, len(xs))](*xs, cos, sin, matrix, backend, positions, axis, angles, *_extra(rounding))
    return [outs] if len(xs) == 1 else list(outs)


def _call(transpose: bool, backend, positions, axis, angles, cos, sin, matrix, *xs, rounding="exact"):
    """The public entry points' one way in: ``_Rotate`` under forward AD and torch.func, else
    ``_run``."""
    check_rounding(rounding)
    if _use_function(*xs, cos, sin, matrix):
        outs = _Rotate.apply(transpose, backend, positions, axis, angles, rounding, cos, sin, matrix, *xs)
    else:
        outs = _run(transpose, backend, positions, axis, angles, cos, sin, matrix, xs, **_native(rounding))
    return outs[0] if len(xs) == 1 else tuple(outs)


# --- the lean path: a call's metadata work done once per signature ------------------------------
#
# A model calls rome with the same shapes, strides, dtypes, device and matrix in every layer of
# every step. The first call of a signature runs the full path above (every check, the plan, the
# split into launches) and is remembered: what the triton backend launched (``launcher.Recipe``:
# kernel, grid, constexprs, integer arguments, and which of the call's tensors each tensor
# argument is), or that the torch backend ran, with the outputs' strides. A later call of the
# same signature allocates its outputs and launches the recipe with its own tensors: no check
# (they depend only on the signature, which passed them), no torch.library dispatch. Only for
# plain tensors outside tracing, compiling, torch.func transforms, forward AD, dispatch and
# torch-function modes and the profiler (those take the full path, the op as before); with a
# tensor that requires grad under grad mode, through ``_Lean``, an autograd.Function with the
# ops' backward. The signature: per tensor its type, shape, strides, dtype, device and
# requires_grad; the matrix by identity and version (its values choose the plan); the backend,
# the thread's product, warp size, partner form and pairs (rome.launch.launch_state), ``capture``'s
# state and the functions a test may replace;
# with positions on several axes the axis's run (``_check_axis_once``: read once per axis tensor,
# a constexpr of the launch; a call whose axis was not read takes the full path). No other values
# are part of it: positions are checked per call as ``_check_values`` says.

_LEAN: dict = {}
_LEAN_MAX = 1024
_PLAIN = (Tensor, torch.nn.Parameter)
_LEARN: ThreadSetting = ThreadSetting(None)  # a miss being learned: what its _rotate did


class _Learn:
    __slots__ = ("calls", "backend", "outs", "rec", "warn")

    def __init__(self):
        self.calls, self.backend, self.outs, self.rec, self.warn = 0, None, None, None, False


class _Entry:
    __slots__ = ("matrix", "version", "values", "triton", "recipe", "outs", "warn", "grad", "n", "transpose",
                 "rounding")

    def __init__(self, matrix, triton, recipe, outs, warn, grad, n, transpose, rounding="exact"):
        self.matrix, self.version = matrix, matrix._version
        # (_unchanged: a triton recipe's gather is built from the values, and on the CPU (the
        # interpreter) they are compared per call; the torch backend's call reads the structure
        # through rome.structure, which compares them itself; recorded launches (profiling.overhead)
        # stand for a GPU's, where no compare runs)
        self.values = matrix.detach().clone() if triton and matrix.device.type == "cpu" \
            and _kernel().INTERPRET else None
        self.triton, self.recipe, self.outs, self.warn, self.grad, self.n = triton, recipe, outs, warn, grad, n
        self.transpose, self.rounding = transpose, rounding


def _plain_state() -> bool:
    """No tracing, compiling, transform, forward-AD level, mode or profiler: the lean path may run."""
    return not (torch.compiler.is_compiling() or fwAD._current_level >= 0
                or torch._C._are_functorch_transforms_active() or torch._C._is_tracing()
                or torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or torch._C._autograd._profiler_enabled())


def _settings():
    """The thread's settings a call's launches depend on beyond its tensors, or None where a
    function the lean path would skip has been replaced (a test's spy sees every call)."""
    if _rotate is not _ORIGINAL[0] or _kernel is not _ORIGINAL[1] or _run is not _ORIGINAL[2] \
            or torch_backend.rotate_into is not _ORIGINAL[3]:
        return None
    k = sys.modules.get("rome.launcher")
    if k is None:
        return ()
    if k.rotate is not k.ORIGINAL[0] or k._run is not k.ORIGINAL[1] or k._pick is not k.ORIGINAL[2]:
        return None
    # (the ThreadSettings' values read directly: a method call each costs as much as the read)
    L = k.launch
    c, p, n, f, h = k._capture, L._product, L._lanes, L._partner_form, L._pairs_halves
    captured = getattr(c._local, "value", c._default)
    return (k.INTERPRET, getattr(p._local, "value", p._default), getattr(n._local, "value", n._default),
            None if captured is None else captured.num_sms, getattr(f._local, "value", f._default),
            getattr(h._local, "value", h._default))


def _key(kind, tensors, backend, mode, rounding="exact"):
    """The call's signature, or None where the lean path does not apply (a tensor of another type,
    an unhashable argument, a legacy-vmap batched tensor, a layout without strides, a lazily
    negated view: the full path resolves it)."""
    settings = _settings()
    if settings is None:
        return None
    try:  # (the matrix by identity too: two matrices of one shape do not evict each other's entry)
        sig = [kind, backend, mode, rounding, () if backend == "torch" else settings, id(tensors[-3])]
        for t in tensors:
            if t is None:
                sig.append(None)
            elif type(t) in _PLAIN and not _is_legacy_batched(t) and not t.is_neg():
                sig.append((t.shape, t.stride(), t.dtype, t.device, t.requires_grad))
            else:
                return None
        positions, axis = tensors[-2], tensors[-1]
        if axis is not None and positions is not None:  # the axis's run, a constexpr of the launch
            # (_check_axis_once): known only once its values were read (else the full path reads them)
            read = _axis_read(axis, positions.shape[-1])
            if read is None:
                return None
            sig.append(read[2:])  # (run, range checked: the lean call then checks positions only)
        return tuple(sig)  # (hashed by the lookup: an unhashable argument is a TypeError there)
    except (RuntimeError, TypeError, NotImplementedError):
        return None


def _lean(kind, transpose, xs, cos, sin, matrix, positions, axis, angles, backend, mode, full, trusted=False,
          rounding="exact"):
    """``full()`` (the entry point's full path) the first time a signature is seen, learning it;
    the remembered work for the next calls of it (see above). ``kind``: which entry point."""
    if (mode is not None and matrix is not None) or not _plain_state():
        return full()
    tensors = (*xs, cos, sin, matrix if mode is None else None, positions, axis)
    key = _key(kind, tensors, backend, mode, rounding)
    if key is None:
        return full()
    try:
        entry = _LEAN.get(key)
    except TypeError:  # an unhashable backend or mode: the full path says what is wrong
        return full()
    if entry is not None and (mode is not None or (entry.matrix is matrix and matrix._version == entry.version
                                                   and (entry.values is None or _unchanged(entry, matrix)))) \
            and not (entry.recipe is not None and entry.recipe.pending and entry.recipe.stale()):
        axis_read = axis is not None and positions is not None and key[-1][1]
        outs = _lean_call(entry, xs, cos, sin, entry.matrix, positions, axis, angles, backend, trusted, axis_read)
        return outs[0] if len(outs) == 1 else tuple(outs)
    learn = _Learn()
    with _LEARN.scoped(learn):
        result = full()
    key = _key(kind, tensors, backend, mode, rounding)  # (the first triton call imports the launcher: its settings)
    if key is not None:
        _learned(key, learn, transpose, xs, cos, sin, matrix, positions, axis, mode, rounding)
    return result


def _unchanged(entry, matrix: Tensor) -> bool:
    """Whether a matrix the entry kept the values of (a triton recipe under the interpreter) still
    holds them: a write through ``.data`` (as ``gradcheck`` does) bypasses the version counter,
    and the recipe's gather was built from the old values. (Only there: on a GPU such writes are
    not seen, as ``rome.structure`` says; the lean call itself costs no call for the others.)"""
    return torch.equal(matrix.detach(), entry.values)


def _learned(key, learn, transpose, xs, cos, sin, matrix, positions, axis, mode, rounding="exact") -> None:
    """Remember the signature of a call whose full path ran once through ``_rotate``."""
    if learn.calls != 1 or learn.outs is None:
        return
    if mode is not None:  # the kept rotation matrix of the mode
        matrix = kept_rotation_matrix(xs[0].shape[-1], mode, dtype=xs[0].dtype, device=xs[0].device)
    outs = [(o.shape, o.stride(), o.stride() == x.stride()) for o, x in zip(learn.outs, xs)]
    grad = any(t is not None and t.requires_grad for t in (*xs, cos, sin, matrix))
    if learn.backend == "triton":
        if learn.rec is None:
            return
        from .launcher import Recipe

        two = len(xs) == 2
        roles = [xs[0], xs[1] if two else None, learn.outs[0], learn.outs[1] if two else None,
                 cos, sin, matrix, positions, axis]
        recipe = Recipe.bind(learn.rec, roles)
        if recipe is None:
            return
        entry = _Entry(matrix, True, recipe, outs, learn.warn, grad, len(xs), transpose, rounding)
    else:
        entry = _Entry(matrix, False, None, outs, False, grad, len(xs), transpose, rounding)
    if len(_LEAN) >= _LEAN_MAX:
        _LEAN.clear()
    _LEAN[key] = entry


def _lean_call(entry, xs, cos, sin, matrix, positions, axis, angles, backend, trusted,
               axis_read=False) -> list[Tensor]:
    if entry.grad and torch.is_grad_enabled():
        return list(_Lean.apply(entry, backend, positions, axis, angles, trusted, axis_read, cos, sin, matrix, *xs))
    return _lean_rotate(entry, xs, cos, sin, matrix, positions, axis, angles, trusted, axis_read)


def _lean_rotate(entry, xs, cos, sin, matrix, positions, axis, angles, trusted, axis_read=False) -> list[Tensor]:
    """The remembered call: outputs allocated, positions' values checked (the axis's not again
    where ``axis_read``: the signature's lookup found it checked), the recipe launched."""
    x0 = xs[0]
    # (empty_like where the output takes x's strides: ~0.4 µs less than empty_strided)
    outs = [torch.empty_like(x) if like else torch.empty_strided(shape, stride, dtype=x0.dtype, device=x0.device)
            for x, (shape, stride, like) in zip(xs, entry.outs)]
    if positions is not None and not trusted and not _CHECKED.get():
        _check_values(positions, None if axis_read else axis, cos.shape[0], angles)
    if not entry.triton:
        if trusted:
            with positions_checked():
                _torch_rotate(xs, outs, cos, sin, matrix, entry.transpose, positions, axis, angles,
                              **_native(entry.rounding))
        else:
            _torch_rotate(xs, outs, cos, sin, matrix, entry.transpose, positions, axis, angles, **_native(entry.rounding))
        return outs
    if entry.warn:
        _warn_fp32_dot(x0.dtype)
    two = entry.n == 2
    tensors = (x0, xs[1] if two else None, outs[0], outs[1] if two else None, cos, sin, matrix, positions, axis)
    kernel = _kernel()
    if kernel.INTERPRET:
        with _INTERPRET_LOCK:
            entry.recipe.replay(tensors)
    else:
        entry.recipe.replay(tensors)
    return outs


class _Lean(torch.autograd.Function):
    """A remembered call under autograd: the forward launches the recipe, the backward is the
    ops' (``_grads``: dx by the transposed rotation, the table grads), through the lean path again."""

    @staticmethod
    def forward(ctx, entry, backend, positions, axis, angles, trusted, axis_read, cos, sin, matrix, *xs):
        outs = _lean_rotate(entry, xs, cos, sin, matrix, positions, axis, angles, trusted, axis_read)
        n = len(xs)
        ctx.backend, ctx.angles, ctx.launch, ctx.transpose = backend, angles, _launch_now(), entry.transpose
        ctx.rounding = entry.rounding
        ctx.checked = True if trusted else _checked_now()
        table_grads = any(ctx.needs_input_grad[7:10])
        ctx.save_for_backward(positions, axis, cos, sin, matrix, *(xs if table_grads else [None] * n))
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        positions, axis, cos, sin, matrix, *xs = ctx.saved_tensors
        needs = ctx.needs_input_grad

        def rotate(t, hs):
            with _CHECKED.scoped(ctx.checked), _launch_block(ctx.launch):  # checked by the forward
                return _rotated(t, ctx.backend, positions, axis, ctx.angles, cos, sin, matrix, hs, ctx.rounding)

        dxs, table = _grads(rotate, ctx.transpose, xs, grads, cos, sin, matrix, needs[10:], needs[7:10],
                            positions, axis, ctx.angles)
        return (None, None, None, None, None, None, None, *table, *dxs)


def _rotated(transpose, backend, positions, axis, angles, cos, sin, matrix, hs, rounding="exact") -> list[Tensor]:
    """``_run`` through the lean path (the backward's rotation)."""
    def full():
        outs = _run(transpose, backend, positions, axis, angles, cos, sin, matrix, hs, **_native(rounding))
        return outs[0] if len(outs) == 1 else tuple(outs)

    # (the kind names the direction: the key has no other place for it, and a double backward
    # rotates both ways with tensors of one signature)
    out = _lean("rotate-transposed" if transpose else "rotate", transpose, hs, cos, sin, matrix, positions, axis,
                angles, backend, None, full, rounding=rounding)
    return [out] if len(hs) == 1 else list(out)


def _no_dtensor(fn: str, named: dict) -> None:
    """The positions/angles ops have no DTensor sharding rules (their positions index the cache
    rows, which a shard of x cannot know): a clear error instead of DTensor's own."""
    if _distributed(*named.values()) is not None:
        raise TypeError(
            f"rome.{fn} takes no DTensor ({', '.join(named)}): use rome.apply/apply_qk with "
            "per-token tables sharded like q and k (rome.RoPE does this for DTensor q/k)"
        )


def _distributed(*tensors: Tensor):
    """rome.distributed (imported now: it registers the ops' DTensor sharding rules) when a
    tensor is a DTensor, else None. No DTensor can exist before torch.distributed.tensor loads."""
    dt = sys.modules.get("torch.distributed.tensor")
    if dt is None or not any(isinstance(t, dt.DTensor) for t in tensors):
        return None
    from . import distributed

    return distributed


def _matrix_or_mode(matrix, mode, x, name: str):
    """The matrix of ``apply``/``apply_qk``: ``matrix`` itself, or for ``mode`` the rotation of the
    whole head, ``rotation_matrix(D, mode)`` in x's dtype on x's device (exactly one of the two)."""
    if mode is None:
        if matrix is None:
            raise ValueError("pass matrix (a [D, D] tensor) or mode ('half' or 'interleave'), got neither")
        return matrix
    if matrix is not None:
        raise ValueError(f"pass matrix or mode, not both (got mode={mode!r} and a matrix)")
    check_mode(mode)
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    d = check_size(x.shape[-1] if x.ndim else 0, f"{name}'s head_dim (its last dim) for mode={mode!r}")
    dtype = x.dtype if x.dtype in DTYPES else torch.float32  # another dtype: check_types names it
    return kept_rotation_matrix(d, mode, dtype=dtype, device=x.device)


def apply(
    x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor | None = None, *, mode: Mode | None = None,
    backend: Backend = "auto", rounding: Rounding = "exact",
) -> Tensor:
    """Rotary position embedding as a matrix: ``x*cos + (x @ matrix)*sin``, a new tensor.

    x: ``[..., D]`` float32/float16/bfloat16 (float64 on the torch backend), any strides (unit
    last stride avoids a copy). cos, sin: float32 or x's dtype, broadcasting to x's shape
    (``[S, D]`` or ``[B, 1, S, D]`` for BNSD x, ``[S, 1, D]`` for BSND x, ``[N, S, D]`` per head).
    matrix: ``[D, D]``, e.g. ``rotation_matrix(sections, mode)``; any values. Or, instead of
    a matrix, ``mode="half"``/``"interleave"``: ``rotation_matrix(D, mode)`` over the whole
    head (built once per D, dtype and device); exactly one of matrix and mode.

    Computed in float32 (float64 for float64 x) and rounded once to x's dtype (``rounding="exact"``,
    the default); ``rounding="native"``: the bits of the eager chain ``x*cos + rotate(x)*sin`` in
    x's dtype instead (tables rounded to x's dtype, each product and the sum rounded to it, no
    fma; a signed permutation matrix only; docs/precision.md), its backward the eager backward's
    (``grad*cos`` and ``grad*sin`` rounded, moved by Mᵀ, summed and rounded). backend:
    ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``), ``"torch"``, or ``"auto"`` (the
    Triton kernel for CUDA tensors it supports, torch otherwise). Differentiable in x, cos, sin
    and matrix, in reverse and forward mode and under torch.func transforms; the backward of x
    runs the same fused kernel with Mᵀ.
    """
    return _lean("apply", False, (x,), cos, sin, matrix, None, None, False, backend, mode,
                 lambda: _full_apply(x, cos, sin, matrix, mode, backend, rounding), rounding=rounding)


def _full_apply(x, cos, sin, matrix, mode, backend, rounding="exact"):
    matrix = _matrix_or_mode(matrix, mode, x, "x")
    check_types({"x": x}, cos, sin, matrix, backend)
    if (dist := _distributed(x, cos, sin, matrix)) is not None:
        x, cos, sin, matrix = dist.prepare(("x",), x, cos, sin, matrix, backend=backend)
    return _call(False, backend, None, None, False, cos, sin, matrix, x, rounding=rounding)


def apply_qk(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor | None = None, *,
    mode: Mode | None = None, backend: Backend = "auto", rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """``(apply(q, ...), apply(k, ...))`` in one kernel launch; q and k may differ in head count
    (GQA) and layout but share head_dim, dtype and the tables. ``mode=`` and ``rounding=`` as
    in ``apply``."""
    return _lean("apply_qk", False, (q, k), cos, sin, matrix, None, None, False, backend, mode,
                 lambda: _full_apply_qk(q, k, cos, sin, matrix, mode, backend, rounding), rounding=rounding)


def _full_apply_qk(q, k, cos, sin, matrix, mode, backend, rounding="exact"):
    matrix = _matrix_or_mode(matrix, mode, q, "q")
    check_types({"q": q, "k": k}, cos, sin, matrix, backend)
    if (dist := _distributed(q, k, cos, sin, matrix)) is not None:
        q, k, cos, sin, matrix = dist.prepare(("q", "k"), q, k, cos, sin, matrix, backend=backend)
    return _call(False, backend, None, None, False, cos, sin, matrix, q, k, rounding=rounding)


def apply_at(
    x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, positions: Tensor, *,
    axis: Tensor | None = None, backend: Backend = "auto", rounding: Rounding = "exact",
) -> Tensor:
    """``apply`` with the tables read from caches at positions, no per-token table built:

        out[r, j] = x[r, j]*cos[p, j] + (x @ matrix)[r, j]*sin[p, j],   p = positions[r, axis[j]]

    cos, sin: caches ``[P, D]`` (one row per position value, float32 or x's dtype). positions:
    int32/int64 ``[..., A]`` whose ``[...]`` broadcasts to x's rows (``[B, 1, S, A]`` or
    ``[S, A]`` for BNSD x, ``[T, 1, A]`` for THD); ``axis``: int ``[D]`` in ``[0, A)``, the axis
    each column reads (needed for A > 1; for A = 1 every column reads ``positions[r, 0]``).
    Offsets and packed sequences are added into positions by the caller (``rome.positions``).

    Bitwise ``apply(x, gather_rows(cos, positions, axis), ...)`` on either backend, gradients
    included (the cache grads scattered back). Positions are not read on the host (no sync): by
    default (``position_checks("device")``) their range is asserted on the device (a RuntimeError
    on the CPU, a device-side assert on a GPU); under ``position_checks("kernel")`` an element
    whose position lies outside ``[0, P)`` is NaN, on either backend (the kernel masks the read;
    nothing outside the cache is ever read whatever the check); ``position_checks("host")``
    raises ValueError (a sync). ``axis``
    is read on the host once per axis tensor (it is read unmasked). ``rounding`` as in ``apply``
    (native: the gathered rows rounded to x's dtype, as the eager chain's tables).
    """
    return _lean("apply_at", False, (x,), cos, sin, matrix, positions, axis, False, backend, None,
                 lambda: _full_apply_at(x, cos, sin, matrix, positions, axis, backend, rounding), rounding=rounding)


def _full_apply_at(x, cos, sin, matrix, positions, axis, backend, rounding="exact"):
    check_types({"x": x}, cos, sin, matrix, backend)
    check_position_types(positions, axis)
    _no_dtensor("apply_at", {"x": x, "cos": cos, "sin": sin, "positions": positions})
    return _call(False, backend, positions, axis, False, cos, sin, matrix, x, rounding=rounding)


def apply_qk_at(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, positions: Tensor, *,
    axis: Tensor | None = None, backend: Backend = "auto", rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """``apply_at`` of q and k in one kernel launch (shared positions and caches, any head
    counts: positions broadcast over heads)."""
    return _lean("apply_qk_at", False, (q, k), cos, sin, matrix, positions, axis, False, backend, None,
                 lambda: _full_apply_qk_at(q, k, cos, sin, matrix, positions, axis, backend, rounding),
                 rounding=rounding)


def _apply_qk_at_checked(q, k, cos, sin, matrix, positions, axis, backend, rounding="exact"):
    """``apply_qk_at`` of positions the caller has checked (``positions_checked()`` without the
    context manager's cost): rome.RoPE's call."""
    def full():
        with positions_checked():
            return _full_apply_qk_at(q, k, cos, sin, matrix, positions, axis, backend, rounding)

    return _lean("apply_qk_at", False, (q, k), cos, sin, matrix, positions, axis, False, backend, None, full, True,
                 rounding=rounding)


def _full_apply_qk_at(q, k, cos, sin, matrix, positions, axis, backend, rounding="exact"):
    check_types({"q": q, "k": k}, cos, sin, matrix, backend)
    check_position_types(positions, axis)
    _no_dtensor("apply_qk_at", {"q": q, "k": k, "cos": cos, "sin": sin, "positions": positions})
    return _call(False, backend, positions, axis, False, cos, sin, matrix, q, k, rounding=rounding)


def apply_qk_angles(
    q: Tensor, k: Tensor, freqs: Tensor, scales: Tensor, matrix: Tensor, positions: Tensor, *,
    axis: Tensor | None = None, backend: Backend = "auto", rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """``apply_qk_at`` without a cache: the kernel computes each element's table entries,

        cos[r, j] = scale[j] * cos(p * inv_freq[j]),   p = positions[r, axis[j]]

    from ``(freqs, scales) = rome.positions.angle_frequencies(inv_freq, scale)`` (inv_freq and
    scale as float32 hi + lo ``[2, D]``; pass-through columns, inv_freq 0, give exactly 1 and 0).
    The angle is a double-float ``p*hi + p*lo`` reduced by pi/2 in double-float, then
    polynomials summed with one rounding: max |cos - cos64| 3.05e-8 for positions up to 2**20,
    against 2.98e-8 for the float64-derived fp32 table (fp32 angles: 6e-2). Positions must be
    in ``[0, 2**24)`` and inverse frequencies in ``[0, 1]`` (the op reads no value on the host, so
    it does not check them: ``angle_frequencies`` does, ``rome.positions.check_angle_frequencies``).
    The torch backend uses float64 angles (``rome.positions.angle_rows``). Differentiable in q, k
    and matrix, not in freqs/scales. ``rounding`` as in ``apply`` (native: the computed cos and sin
    rounded to q's dtype, as an eager chain's tables; the two backends' tables may then differ
    where the fp32 and float64 angles round apart, so native is bitwise an eager chain only
    with given tables)."""
    return _lean("apply_qk_angles", False, (q, k), freqs, scales, matrix, positions, axis, True, backend, None,
                 lambda: _full_apply_qk_angles(q, k, freqs, scales, matrix, positions, axis, backend, rounding),
                 rounding=rounding)


def _full_apply_qk_angles(q, k, freqs, scales, matrix, positions, axis, backend, rounding="exact"):
    check_types({"q": q, "k": k}, freqs, scales, matrix, backend, ("freqs", "scales"))
    check_position_types(positions, axis)
    _no_dtensor("apply_qk_angles", {"q": q, "k": k, "positions": positions})
    return _call(False, backend, positions, axis, True, freqs, scales, matrix, q, k, rounding=rounding)


# the functions the lean path skips, as defined (``_settings``: a replaced one turns it off)
_ORIGINAL = (_rotate, _kernel, _run, torch_backend.rotate_into)
