"""The torch backend: ``x*cos + (x @ M)*sin`` (or its transpose) in plain torch ops, exact.

    forward     out = x*cos + (x @ M) * sin
    transpose   out = x*cos + (x*sin) @ Mᵀ

x: ``[..., D]`` any strides and dtype; cos/sin broadcast to x; M: ``[D, D]``; out: x's dtype.

Precision: computed in float64 and rounded once to x's dtype (float32 only where the device has
no float64, e.g. MPS; there nothing is promised beyond fp32 math). For float32, bfloat16 and
float16 x with float32 (or x-dtype) tables, the products x*cos and x*sin are exact in float64,
so the float64 sum is within 2**-53 relative of the exact value and the result within one ulp
of x's dtype (``tests/test_torch_backend.py`` checks this where the two terms cancel). A
general (non-gather) M takes a float64 product.

Speed: a matrix that ``rome.structure`` finds to be a signed (partial) permutation is never
multiplied: per chunk, ``g = gather(x, index)``, ``g *= sign*sin`` (the signs folded into the sin
table once per call), ``g += x*cos``; a general M takes a float64 matmul. The work walks x in
chunks of ``CHUNK_ELEMENTS`` elements in x's memory order (views, never a copy of x) with float64
scratch allocated once per call (``_Work``), so the float64 temporaries stay a few MiB however
large x is; on devices other than the CPU chunks only bound their size.
On the CPU these passes are near what eager torch allows: per 128K float64 elements a gather
costs ~2x a copy, and neither index_select, slice-and-cat nor transposed layouts were faster
(measured); the one-ulp guarantee costs the float64 passes.

Rounding ``"native"`` (``rounding=`` of ``rotate_into``): the eager chain's bits instead,
``_native``: the tables rounded to x's dtype, ``x*cos`` and ``(x @ M)*sin`` each computed in
float32 (float64 for float64 x) and rounded to x's dtype, then their sum (so for fp32 x plain fp32
ops, no fma); a signed permutation only. What the Triton kernel's NATIVE epilogue computes, bit for bit.

Autocast: the op computes as documented whatever the ambient autocast state, and its output
dtype follows x; autocast is switched off inside (``no_autocast``), so x @ M never runs in a
lower precision because a caller's region asked for one.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import threading

import torch
from torch import Tensor

from . import structure
from .positions import angle_rows, rows_of

CHUNK_ELEMENTS = {"cpu": 1 << 18}  # elements of x per chunk (CPU: measured best of 2**16..2**19)
_DEFAULT_CHUNK = 1 << 22  # other devices: bounds the float64 temporaries to 32 MiB each


def no_autocast(fn=None):
    """Context manager (or decorator) that switches CPU and CUDA autocast off inside."""
    if fn is not None:

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with no_autocast():
                return fn(*args, **kwargs)

        return wrapped
    stack = contextlib.ExitStack()
    for device_type in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device_type):  # entering a context costs ~10 µs
            stack.enter_context(torch.autocast(device_type, enabled=False))
    return stack


def compute_dtype(x: Tensor) -> torch.dtype:
    """float64, or float32 on devices without float64 (MPS)."""
    return torch.float32 if x.device.type == "mps" else torch.float64


def matmul(a: Tensor, m: Tensor) -> Tensor:
    """``a @ m`` without TF32: an fp32 product on CUDA where TF32 is allowed runs in float64."""
    if a.is_cuda and a.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32:
        return (a.double() @ m.double()).float()
    return a @ m


def _structure(matrix: Tensor) -> structure.MatrixInfo | None:
    """The matrix's gather structure, or None where it must be multiplied (no sync allowed)."""
    if matrix.device.type == "meta":
        return None
    if matrix.is_cuda and torch.cuda.is_current_stream_capturing():
        return structure.cached(matrix)  # reading M now would break the CUDA graph capture
    return structure.describe(matrix)


def _merged(tensors: list[Tensor]) -> list[Tensor]:
    """The tensors (one shape ``[..., D]``) with leading dims in x's memory order, and adjacent
    leading dims merged wherever every tensor's strides allow (a view, never a copy)."""
    x = tensors[0]
    order = sorted(range(x.ndim - 1), key=lambda d: x.stride(d), reverse=True)
    sizes, strides = [], [[] for _ in tensors]
    for d in order:
        n = x.shape[d]
        if n == 1:
            continue
        if sizes and all(st[-1] == t.stride(d) * n for st, t in zip(strides, tensors)):
            sizes[-1] *= n
            for st, t in zip(strides, tensors):
                st[-1] = t.stride(d)
            continue
        sizes.append(n)
        for st, t in zip(strides, tensors):
            st.append(t.stride(d))
    d = x.shape[-1]
    return [t.as_strided((*sizes, d), (*st, t.stride(-1)), t.storage_offset())
            for t, st in zip(tensors, strides)]


def _chunked(fn, x: Tensor, out: Tensor, *tables: Tensor) -> None:
    """``fn(x_piece, out_piece, *table_pieces)`` over chunks of about ``CHUNK_ELEMENTS`` of x, in
    x's memory order; the tables broadcast to x."""
    rows = max(1, CHUNK_ELEMENTS.get(x.device.type, _DEFAULT_CHUNK) // x.shape[-1])
    if x.numel() <= rows * x.shape[-1]:
        fn(x, out, *tables)
        return
    tensors = _merged([x, out, *(t.expand(x.shape) for t in tables)])
    lead = tensors[0].shape[:-1]
    # split dim j, the outermost whose inner dims hold fewer than ``rows`` rows; loop over the rest
    j = next(j for j in range(len(lead)) if math.prod(lead[j + 1 :]) < rows)
    step = max(1, rows // math.prod(lead[j + 1 :]))
    inner = (*lead[j + 1 :], x.shape[-1])
    geometry = [(t.stride(), t.storage_offset()) for t in tensors]
    for outer in itertools.product(*map(range, lead[:j])):
        bases = [offset + sum(i * st for i, st in zip(outer, strides)) for strides, offset in geometry]
        for start in range(0, lead[j], step):
            n = min(step, lead[j] - start)
            # one as_strided view per tensor: a few µs less per piece than select + split
            fn(*(t.as_strided((n, *inner), strides[j:], base + start * strides[j])
                 for t, (strides, _), base in zip(tensors, geometry, bases)))


def rotate(
    x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, transpose: bool = False,
    out: Tensor | None = None,
) -> Tensor:
    """``x*cos + (x @ matrix)*sin`` (``transpose``: ``x*cos + (x*sin) @ matrixᵀ``) in x's dtype.

    Written into ``out`` (x's shape and dtype, not aliasing x) when given, else a new tensor.
    """
    if out is None:
        out = torch.empty_like(x)
    rotate_into([x], [out], cos, sin, matrix, transpose=transpose)
    return out


def rotate_into(
    xs, outs, cos: Tensor, sin: Tensor, matrix: Tensor, *, transpose: bool = False,
    positions: Tensor | None = None, axis: Tensor | None = None, angles: bool = False,
    rounding: str = "exact",
) -> None:
    """``rotate`` of every x in ``xs`` (one dtype, sharing the tables) into its ``outs``.

    With ``positions`` (int ``[..., A]``, broadcasting to x's rows), cos/sin are caches ``[P, D]``
    read at ``positions[..., axis[j]]`` (``rome.positions.gather_rows``): the per-token tables are
    gathered here, once for q and k, so the result is bitwise that of the gathered tables.
    ``angles``: cos is float32 ``[2, D]`` inv_freq (hi + lo), sin the ``[2, D]`` scales; the tables
    come from float64 angles (``rome.positions.angle_rows``). ``rounding``: ``"exact"`` (one
    rounding) or ``"native"`` (the eager chain's, see the module docstring)."""
    if angles:
        cos, sin = angle_rows(cos, sin, positions, axis)
    elif positions is not None:
        cos, sin = rows_of((cos, sin), positions, axis)
    for x, out in zip(xs, outs, strict=True):
        if out.shape != x.shape or out.dtype != x.dtype:
            raise ValueError(
                f"out must have x's shape {list(x.shape)} and dtype {x.dtype}, got "
                f"{list(out.shape)} {out.dtype}"
            )
    live = [(x, out) for x, out in zip(xs, outs) if x.numel()]
    if not live:
        return
    x0 = live[0][0]
    if rounding == "native":
        with no_autocast():
            _native(live, cos, sin, _structure(matrix), transpose)
        return
    dt = torch.float64 if x0.dtype == torch.float64 else compute_dtype(x0)
    with no_autocast(), _Work.get(dt, x0.device) as work:
        info = _structure(matrix)
        if info is None or not info.gather:
            m = matrix.to(dt)
            step = functools.partial(_dense, m=m.mT if transpose else m, transpose=transpose, dt=dt)
            tables = (cos.to(dt), sin.to(dt))
        else:
            index, take, sign = ((info.index_t, info.take_t, info.sign_t) if transpose
                                 else (info.index, info.take, info.sign))
            # (x @ M)[j] = sign[j] x[index[j]];  ((x*s) @ Mᵀ)[i] = sign_t[i] x[index_t[i]] s[index_t[i]]
            # the sin table's columns gathered in its own dtype (gather: ~3x index_select's speed
            # along the last dim on the CPU; multiplying x by sign*sin before gathering x*s
            # instead was measured 10% slower); the tables in dt once a call, into the scratch
            # (never into the caller's tables), signs and dt in one exact product in one dtype
            # (~5x a mixed-dtype product's speed)
            src = torch.gather(sin, -1, index.expand(sin.shape)) if transpose else sin
            c = cos if cos.dtype == dt else work.like(cos, 2).copy_(cos)
            signed = work.like(src, 3)
            torch.mul(src if src.dtype == dt else signed.copy_(src), sign.to(dt), out=signed)
            # take: a zero column gathers its own x (times 0), so a non-finite x stays in its column
            pairs = (info.pairs_t if transpose else info.pairs) if dt == torch.float64 else None
            step = functools.partial(_gathered, index=take, pairs=pairs, dt=dt, work=work)
            tables = (c, signed)
        for x, out in live:
            _chunked(step, x, out, *tables)


NATIVE_GATHER = ("rounding='native' needs a signed permutation matrix (every rotation matrix, partial "
                 "rotary's too): the eager chain it reproduces gathers x, it does not multiply by M")


def _native(live, cos: Tensor, sin: Tensor, info, transpose: bool) -> None:
    """``rounding="native"``: per x, ``R(R(x*c) + R(g*s'))`` with c, s the tables rounded to x's
    dtype, R the rounding to it, each op in float32 (in x's dtype for float32/float64 x), and g
    the gathered x: ``g[j] = x[take[j]]``, ``s'[j] = sign[j]*s[j]`` forward; in the transpose
    ``s'[i] = sign_t[i]*s[take_t[i]]``, so ``R(g*s')`` is the eager backward's rounded ``grad*sin``
    moved by Mᵀ. The kernel's NATIVE epilogue, term by term."""
    if info is None or not info.gather:
        raise ValueError(NATIVE_GATHER)
    dt = live[0][0].dtype
    op = dt if dt in (torch.float32, torch.float64) else torch.float32
    take, sign = (info.take_t, info.sign_t) if transpose else (info.take, info.sign)
    c = cos.to(dt).to(op)
    s = sin.to(dt).to(op)
    if transpose:
        s = torch.gather(s, -1, take.expand(s.shape))
    s = s * sign.to(op)  # (exact)
    for x, out in live:
        xo = x.to(op)
        g = torch.gather(xo, -1, take.expand(xo.shape))
        out.copy_((xo * c).to(dt).to(op) + (g * s).to(dt).to(op))


class _Work:
    """Float64 scratch reused by every chunk of a call and, on the CPU, kept per thread between
    calls up to ``KEEP_ELEMENTS`` a buffer (new temporaries per chunk were measured 8-16% slower
    in a chunk loop on a 2-core CPU: allocation and first-touch page faults)."""

    KEEP_ELEMENTS = 1 << 18  # 2 MiB of float64 a buffer, 8 MiB a thread: a chunk, a 2048 x 128 table
    _kept = threading.local()

    def __init__(self, dt, device):
        self.dt, self.device, self.buffers, self.busy = dt, device, [], False

    @classmethod
    @contextlib.contextmanager
    def get(cls, dt, device):
        """This thread's kept scratch on the CPU (a new one elsewhere, or if it is in use)."""
        work = getattr(cls._kept, "work", None) if device.type == "cpu" else None
        if work is None or work.dt != dt or work.busy:
            work = cls(dt, device)
            if device.type == "cpu" and getattr(cls._kept, "work", None) is None:
                cls._kept.work = work
        work.busy = True
        try:
            yield work
        finally:
            work.busy = False

    def like(self, x: Tensor, i: int) -> Tensor:
        """Scratch ``i``, shaped like ``x`` (contiguous)."""
        # built outside inference mode: a buffer kept from a call under torch.inference_mode()
        # would be an inference tensor, which a later call outside it could not write
        with torch.inference_mode(False):
            while len(self.buffers) <= i:
                self.buffers.append(torch.empty(0, dtype=self.dt, device=self.device))
            n = x.numel()
            buf = self.buffers[i]
            if buf.numel() < n:
                buf = torch.empty(n, dtype=self.dt, device=self.device)
                if n <= self.KEEP_ELEMENTS or self.device.type != "cpu":
                    self.buffers[i] = buf
            return buf[:n].view(x.shape)


def _gathered(x, out, c, signed, *, index, pairs, dt, work: _Work) -> None:
    xd = x if x.dtype == dt else work.like(x, 0).copy_(x)
    g = out if out.dtype == dt else work.like(x, 1)  # float64 x: the result goes into out itself
    views = None if pairs is None else _complex_views(xd, g)
    if views is not None:  # pairs of float64 as one complex128: half the elements to gather
        torch.gather(views[0], -1, pairs.expand(views[0].shape), out=views[1])
    else:
        torch.gather(xd, -1, index.expand(xd.shape), out=g)
    g.mul_(signed).addcmul_(xd, c)  # sign*x[index]*s exact, + x*c exact: one rounding in dt
    if g is not out:
        out.copy_(g)


def _complex_views(*ts: Tensor):
    """The float64 tensors viewed as complex128 along the last dim (two elements each: ~2x a
    float64 gather's speed on the CPU), or None where a stride or offset is odd."""
    try:
        return [t.view(torch.complex128) for t in ts]
    except RuntimeError:
        return None


def _dense(x, out, c, s, *, m, transpose: bool, dt) -> None:
    xd = x.to(dt)
    if transpose:
        t = (xd * s) @ m
    else:
        t = (xd @ m).mul_(s)
    out.copy_(t.addcmul_(xd, c))
