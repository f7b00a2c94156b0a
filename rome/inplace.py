"""In-place, packed-QKV and ``out=`` forms of ``rome.apply``: the same rotation, written into
caller-given memory.

    apply_(x)                  x   <- x*cos + (x @ M)*sin                     returns x
    apply_qk_(q, k)            q, k rotated in place, one launch               returns (q, k)
    apply_qkv_(qkv)            q and k parts of a packed buffer, one launch    returns qkv
    apply_out(x, out=o)        o   <- x*cos + (x @ M)*sin                     returns o
    apply_qk_out(q, k, out=(qo, ko))                                           returns (qo, ko)

Packed layouts of ``qkv`` (q, k and v are views; v is never written):
``"stacked"`` ``[..., 3, N, D]`` (q = ``qkv[..., 0, :, :]``) and ``"concat"``
``[..., N_q + 2*N_kv, D]`` (q = ``qkv[..., :N_q, :]``, k the next N_kv heads, v the last).
cos/sin broadcast to the q and k views, e.g. ``[S, 1, D]`` for ``qkv`` ``[B, S, 3, N, D]``.

Every op is a torch.library custom op with ``mutates_args`` (``torch.ops.rome.apply_`` ...),
generated with its fake impl from one table of specs (``SPECS``); all of them and the
functional ops share one launcher (``ops._rotate`` with caller-given outputs). The results are
bitwise those of ``rome.apply``.

When writing over the input is safe. The torch backend reads each chunk of x into float64
(or float32) before writing it, so it rotates in place directly, except where x already has the
compute dtype (float64 x; there ``x.to`` is x itself). The Triton head-group kernel (every signed
permutation, so every rotation matrix; its gather, and its dot under ``rome.launch.product("dot")``
for D <= 128) loads a head's whole rows before it stores them, and prefetches only other heads'
rows: in place is always direct. The row-tile dot kernel (general matrices, and rotation matrices
with D > 128 under ``product("dot")``) computes a row tile panel by panel
(``BLOCK_N`` columns) and stores each output panel n before it loads the input panels of panel
n + 1; output panel n reads input panels k with block (k, n) of M nonzero. In
place is therefore safe exactly when no panel reads an earlier one (no nonzero block (k, n) with
k < n): one panel (D <= 64 for a rotation matrix), or interleave mode (pairs inside a panel).
Otherwise (half mode at D = 256, a general matrix with a nonzero block (k, n), k < n) the kernel writes a
temporary that is copied back: one more read and write of q and k (``_direct_ok``). The same copy serves an ``out`` whose last stride
is not 1 (the kernel writes rows of D).

Overlap. A written tensor that overlaps itself (expanded, or strides that collide), a written
tensor sharing memory with another written one or with cos/sin/matrix, and an ``out`` that
shares memory with an input other than by being that input exactly: ``ValueError``. The check
is exact; it costs nothing unless two tensors share a storage with intersecting byte ranges
(e.g. q and k sliced from one packed buffer), where it sorts the rows' offsets on the host.

Autograd: these ops are not differentiable (torch.library cannot register a backward for an op
that mutates its inputs, and ``out=`` ops are not differentiable in torch either). With grad
mode on, an input that requires grad raises ``RuntimeError`` pointing to ``rome.apply`` /
``apply_qk``; under ``torch.no_grad()`` / ``inference_mode()`` they run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from . import ops, torch_backend
from .checks import check_rounding, check_types
from .types import QKV_LAYOUTS, Backend, QkvLayout, Rounding


# --- packed QKV views ---------------------------------------------------------------------


def _heads(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def qkv_split(
    qkv: Tensor, *, num_heads: int | None = None, num_kv_heads: int | None = None, layout: QkvLayout = "stacked"
) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, k, v)``, views of a packed ``qkv`` (see the module docstring for the layouts).

    ``"stacked"``: ``[..., 3, N, D]``, each ``[..., N, D]``; num_heads/num_kv_heads default to
    (and must equal) N. ``"concat"``: ``[..., N_q + 2*N_kv, D]``, q ``[..., N_q, D]``, k and v
    ``[..., N_kv, D]``; num_heads required, num_kv_heads defaults to num_heads.
    """
    if not isinstance(qkv, Tensor):
        raise TypeError(f"qkv must be a torch.Tensor, got {type(qkv).__name__}")
    if not isinstance(layout, str) or layout not in QKV_LAYOUTS:
        raise ValueError(f"layout must be one of {QKV_LAYOUTS}, got {layout!r}")
    shape = list(qkv.shape)
    if layout == "stacked":
        if qkv.ndim < 3 or shape[-3] != 3:
            raise ValueError(f"qkv with layout='stacked' must be [..., 3, N, D], got {shape}")
        n = shape[-2]
        for name, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
            if value is not None and _heads(name, value, 1) != n:
                raise ValueError(f"{name}={value} does not match qkv {shape} ([..., 3, N, D], N={n}); "
                                 "layout='stacked' has one head count (use layout='concat' for GQA)")
        q, k, v = qkv.unbind(-3)
        return q, k, v
    if num_heads is None:
        raise ValueError("layout='concat' ([..., N_q + 2*N_kv, D]) needs num_heads (and num_kv_heads for GQA)")
    nq = _heads("num_heads", num_heads, 1)
    nkv = nq if num_kv_heads is None else _heads("num_kv_heads", num_kv_heads, 1)
    if qkv.ndim < 2 or shape[-2] != nq + 2 * nkv:
        raise ValueError(
            f"qkv with layout='concat' must be [..., N_q + 2*N_kv, D] = [..., {nq} + 2*{nkv} = "
            f"{nq + 2 * nkv}, D] for num_heads={nq}, num_kv_heads={nkv}, got {shape}"
        )
    q, k, v = qkv.split([nq, nkv, nkv], dim=-2)
    return q, k, v


# --- overlap ------------------------------------------------------------------------------


def _checkable(t: Tensor) -> bool:
    """Real memory to inspect (not a fake/meta tensor under tracing, not empty)."""
    return t.numel() > 0 and t.device.type != "meta" and not isinstance(t, torch._subclasses.FakeTensor)


_ADDRESSED = ("cpu", "cuda")  # devices whose data_ptr() is a memory address (MPS's is a buffer's handle)


def _base(t: Tensor) -> int:
    """t's first element: its address where the device has addresses (two storages may hold the
    same memory: ``torch.from_numpy`` of overlapping numpy views, ``torch.frombuffer`` at an
    offset), else its byte offset in its storage."""
    return t.data_ptr() if t.device.type in _ADDRESSED else t.storage_offset() * t.element_size()


def _byte_range(t: Tensor) -> tuple[int, int]:
    lo = _base(t)
    return lo, lo + (sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * t.element_size()


def _same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether a and b may share memory: intersecting address ranges on one device (on a device
    without addresses: one storage and intersecting ranges in it)."""
    if not (_checkable(a) and _checkable(b)) or a.device != b.device:
        return False
    if a.device.type not in _ADDRESSED and a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (alo, ahi), (blo, bhi) = _byte_range(a), _byte_range(b)
    return alo < bhi and blo < ahi


def _same_view(a: Tensor, b: Tensor) -> bool:
    """a and b are the same elements in the same order (b is a, or an identical view)."""
    if a is b:
        return True
    return (
        _same_memory(a, b) and a.dtype == b.dtype and a.shape == b.shape
        and a.stride() == b.stride() and _base(a) == _base(b)
    )


def _pieces(t: Tensor) -> tuple[Tensor, int]:
    """Sorted addresses of t's rows (unit last stride) or elements, and each one's length in bytes."""
    unit_rows = t.ndim > 0 and t.shape[-1] > 1 and t.stride(-1) == 1
    dims = range(t.ndim - 1) if unit_rows else range(t.ndim)
    offsets = torch.tensor(0, dtype=torch.int64)
    for i in dims:
        offsets = (offsets[..., None] + torch.arange(t.shape[i]) * t.stride(i))
    item = t.element_size()
    return (offsets.flatten() * item + _base(t)).sort().values, (t.shape[-1] if unit_rows else 1) * item


def _overlaps_itself(t: Tensor) -> bool:
    if not _checkable(t):
        return False
    reach = 0  # strides sorted ascending, each beyond the reach of the smaller ones: no overlap
    for s, n in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1):
        if s <= reach:
            break
        reach += s * (n - 1)
    else:
        return False
    starts, length = _pieces(t)  # exact: consecutive starts closer than one piece's length
    return bool((starts.diff() < length).any())


def _overlap(a: Tensor, b: Tensor) -> bool:
    """Whether any element of a shares memory with one of b (exact)."""
    if not _same_memory(a, b):
        return False
    sa, la = _pieces(a)
    sb, lb = _pieces(b)
    idx = torch.searchsorted(sb, sa - lb, right=True)  # first piece of b ending after a's start
    hit = idx < len(sb)
    return bool((sb[idx[hit]] < sa[hit] + la).any())


def _describe(t: Tensor) -> str:
    return f"{list(t.shape)} strides {list(t.stride())} at address {t.data_ptr():#x}"


def _check_memory(written: dict[str, Tensor], read: dict[str, Tensor], may_equal: dict[str, str]) -> None:
    """written tensors: no self-overlap, pairwise disjoint, disjoint from every read tensor
    except the one named by ``may_equal[name]``, which they may be exactly (in place)."""
    for name, t in written.items():
        if _overlaps_itself(t):
            raise ValueError(
                f"{name} {_describe(t)} overlaps itself (an expanded or overlapping view): it "
                f"cannot be written in place; pass {name}.contiguous() or use the functional rome.apply"
            )
    names = list(written)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if _overlap(written[a], written[b]):
                raise ValueError(f"{a} and {b} share memory ({a} {_describe(written[a])}, {b} "
                                 f"{_describe(written[b])}): written tensors must be disjoint")
        for b, t in read.items():
            if may_equal.get(a) == b and _same_view(written[a], t):
                continue
            if _overlap(written[a], t):
                pair = f"({a} {_describe(written[a])}, {b} {_describe(t)})"
                if may_equal.get(a) == b:
                    raise ValueError(f"{a} partially overlaps {b} {pair}: {a} must be {b} itself "
                                     "(in place) or disjoint from it")
                raise ValueError(f"{a} shares memory with {b} {pair}: a written tensor must not alias an input")


# --- checks and the launcher ------------------------------------------------------------


def _check_no_grad(op: str, named: dict[str, Tensor]) -> None:
    if not torch.is_grad_enabled():
        return
    for name, t in named.items():
        if t.requires_grad:
            raise RuntimeError(
                f"rome.{op}: {name} requires grad, and in-place / out= ops are not differentiable "
                "(torch.library has no autograd for ops that mutate their inputs); use the "
                "functional rome.apply / rome.apply_qk, or call under torch.no_grad()"
            )


def _check_outs(xs: dict[str, Tensor], outs: dict[str, Tensor]) -> None:
    for (xn, x), (on, out) in zip(xs.items(), outs.items()):
        if not isinstance(out, Tensor):
            raise TypeError(f"{on} must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype != x.dtype:
            raise TypeError(f"{on} must have {xn}'s dtype {x.dtype}, got {out.dtype}")
        if out.shape != x.shape:
            raise ValueError(f"{on} must have {xn}'s shape {list(x.shape)}, got {list(out.shape)}")
        if out.device != x.device:
            raise ValueError(f"{on} must be on {xn}'s device {x.device}, got {out.device}")
        if out.layout != torch.strided or out.is_nested:
            raise TypeError(f"{on} must be a dense (strided) tensor, got layout {out.layout}")


def _direct_ok(backend: str, x: Tensor, out: Tensor, cos: Tensor, matrix: Tensor) -> bool:
    """Whether the backend may write ``out`` directly (see the module docstring)."""
    in_place = _same_view(x, out)
    if backend == "torch":
        dt = torch.float64 if x.dtype == torch.float64 else torch_backend.compute_dtype(x)
        return not in_place or x.dtype != dt
    if out.shape[-1] > 1 and out.stride(-1) != 1:
        return False
    if not in_place:
        return True
    launcher = ops._kernel()
    plan = launcher.launch.plan(matrix, x.dtype, cos.dtype, transpose=False, interpret=launcher.INTERPRET)
    if plan.config.heads:  # a head's whole rows are loaded before they are stored
        return True
    np_ = plan.config.block_d // plan.config.block_n
    return not any(plan.reads(n, k) for n in range(np_) for k in range(n))


def _launch(xs: list[Tensor], outs: list[Tensor], cos, sin, matrix, backend: str, rounding: str = "exact") -> None:
    """One launch of the functional op's launcher into ``outs``, through temporaries where the
    backend cannot write an out directly (then copied back)."""
    targets, copies = [], []
    for x, out in zip(xs, outs):
        if x.numel() == 0 or _direct_ok(backend, x, out, cos, matrix):
            targets.append(out)
        else:
            tmp = ops._out_like(x)
            targets.append(tmp)
            copies.append((out, tmp))
    ops._rotate(xs, cos, sin, matrix, backend, transpose=False, outs=targets, **ops._native(rounding))
    for out, tmp in copies:
        out.copy_(tmp)


# --- the ops, from one table ---------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One call's tensors by role: xs (rotated), outs (written, one per x), written (the tensors
    the op mutates, for the overlap checks), may_equal (out name -> the x it may be)."""

    xs: dict[str, Tensor]
    outs: dict[str, Tensor]
    written: dict[str, Tensor]
    may_equal: dict[str, str]
    cos: Tensor
    sin: Tensor
    matrix: Tensor
    backend: str
    rounding: str = "exact"


def _inplace_call(names):
    def parts(*args):
        *xs, cos, sin, matrix, backend, rounding = args
        named = dict(zip(names, xs))
        return _Call(named, named, named, {}, cos, sin, matrix, backend, rounding)

    return parts


def _qkv_call(qkv, cos, sin, matrix, num_heads, num_kv_heads, layout, backend, rounding="exact"):
    q, k, _ = qkv_split(qkv, num_heads=num_heads, num_kv_heads=num_kv_heads, layout=layout)
    xs = {f"q (qkv[{layout}])": q, f"k (qkv[{layout}])": k}
    return _Call(xs, xs, {"qkv": qkv}, {}, cos, sin, matrix, backend, rounding)


def _out_call(names):
    def parts(*args):
        n = len(names)
        xs = dict(zip(names, args[:n]))
        cos, sin, matrix, *outs, backend, rounding = args[n:]
        outs = dict(zip((f"{x}_out" if n > 1 else "out" for x in names), outs))
        may_equal = dict(zip(outs, names))
        return _Call(xs, outs, outs, may_equal, cos, sin, matrix, backend, rounding)

    return parts


@dataclass(frozen=True)
class Spec:
    """One op: its name (``rome::<name>``), schema, mutated args, and how its args split into roles."""

    name: str
    schema: str
    mutates: tuple[str, ...]
    parts: Callable[..., _Call]


_T = "Tensor cos, Tensor sin, Tensor matrix"
_B = 'str backend, str rounding="exact"'
SPECS = (
    Spec("apply_", f"(Tensor(a!) x, {_T}, {_B}) -> ()", ("x",), _inplace_call(("x",))),
    Spec("apply_qk_", f"(Tensor(a!) q, Tensor(b!) k, {_T}, {_B}) -> ()", ("q", "k"),
         _inplace_call(("q", "k"))),
    Spec("apply_qkv_", f"(Tensor(a!) qkv, {_T}, int num_heads, int num_kv_heads, str layout, "
         f"{_B}) -> ()", ("qkv",), _qkv_call),
    Spec("apply_out", f"(Tensor x, {_T}, Tensor(a!) out, {_B}) -> ()", ("out",), _out_call(("x",))),
    Spec("apply_qk_out", f"(Tensor q, Tensor k, {_T}, Tensor(a!) q_out, Tensor(b!) k_out, {_B}) -> ()",
         ("q_out", "k_out"), _out_call(("q", "k"))),
)


def _run(spec: Spec, args, *, real: bool) -> None:
    """Validate (real and fake alike; memory only for real tensors), then launch."""
    c = spec.parts(*args)
    tables = {"cos": c.cos, "sin": c.sin, "matrix": c.matrix}
    check_types(c.xs, c.cos, c.sin, c.matrix, c.backend)
    check_rounding(c.rounding)
    _check_outs(c.xs, c.outs)
    backend = ops._check(c.xs, c.cos, c.sin, c.matrix, c.backend)
    if real:
        read = {**{n: x for n, x in c.xs.items() if n not in c.outs}, **tables}
        _check_memory(c.written, read, c.may_equal)
        _launch(list(c.xs.values()), list(c.outs.values()), c.cos, c.sin, c.matrix, backend, c.rounding)


def _register(spec: Spec):
    def full(args):  # the trailing defaults a call left out (rounding), filled in
        return args if len(args) == len(defaults) else (*args, *defaults[len(args):])

    def impl(*args):
        _run(spec, full(args), real=True)

    def fake(*args):
        _run(spec, full(args), real=False)

    op = torch.library.custom_op(f"rome::{spec.name}", impl, mutates_args=spec.mutates, schema=spec.schema)
    op.register_fake(fake)
    overload = getattr(torch.ops.rome, spec.name).default
    names = [a.name for a in overload._schema.arguments]
    defaults = [a.default_value for a in overload._schema.arguments]

    def autograd(keyset, *args):
        # replaces custom_op's generated Autograd kernel, which runs a mutating op with no
        # formula silently; grad mode is only visible here (it is off in impl and fake). No
        # tensor ops here: under tracing they would be recorded into the graph.
        _check_no_grad(spec.name, {n: a for n, a in zip(names, args) if isinstance(a, Tensor)})
        with torch._C._AutoDispatchBelowAutograd():
            return overload.redispatch(keyset & torch._C._after_autograd_keyset, *args)

    # custom_op registered its own Autograd kernel just above; torch < 2.13 refuses a second
    # registration for the same key unless told this one replaces it (2.11 defaults allow_override
    # to False; 2.13 to True)
    _LIB.impl(spec.name, autograd, "Autograd", with_keyset=True, allow_override=True)
    return op


_LIB = torch.library.Library("rome", "IMPL")


OPS = {spec.name: _register(spec) for spec in SPECS}


# --- public API ---------------------------------------------------------------------------


def _check_args(xs: dict, cos, sin, matrix, backend, outs: dict | None = None, rounding="exact") -> None:
    """The types the ops' schemas take, checked before the dispatcher (whose own message for a
    list or an int is a RuntimeError): TypeError / ValueError as ``rome.apply`` raises them."""
    check_types(xs, cos, sin, matrix, backend)
    check_rounding(rounding)
    for name, out in (outs or {}).items():
        if not isinstance(out, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(out).__name__}")
    for name, t in (xs if outs is None else outs).items():  # the tensors the op writes (dynamo
        # cannot trace is_neg(); a traced graph's tensors are functionalised)
        if not torch.compiler.is_compiling() and t.is_neg():
            raise TypeError(
                f"{name} is a lazily negated view (is_neg(), e.g. z.conj().imag): rome cannot write "
                f"it in place; write into {name}.resolve_neg() or use the functional rome.apply"
            )


def apply_(x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, backend: Backend = "auto",
           rounding: Rounding = "exact") -> Tensor:
    """``x <- x*cos + (x @ matrix)*sin`` in place; returns x. Bitwise ``rome.apply``'s result
    (``rounding`` as there).

    Shapes, dtypes and backends as ``rome.apply``. Not differentiable (see the module docstring);
    x must not overlap itself nor share memory with cos/sin/matrix.
    """
    _check_args({"x": x}, cos, sin, matrix, backend, rounding=rounding)
    torch.ops.rome.apply_(x, cos, sin, matrix, backend, *_extra(rounding))
    return x


def _extra(rounding: str) -> tuple:
    """The ops' trailing rounding argument, passed only where it is not the default (a traced
    graph keeps the ops' old calls)."""
    return () if rounding == "exact" else (rounding,)


def apply_qk_(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """q and k rotated in place in one launch (``rome.apply_qk``'s rules); returns (q, k).
    q and k may be views of one buffer, but must not share memory."""
    _check_args({"q": q, "k": k}, cos, sin, matrix, backend, rounding=rounding)
    torch.ops.rome.apply_qk_(q, k, cos, sin, matrix, backend, *_extra(rounding))
    return q, k


def apply_qkv_(
    qkv: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, num_heads: int | None = None,
    num_kv_heads: int | None = None, layout: QkvLayout = "stacked", backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> Tensor:
    """The q and k parts of a packed ``qkv`` rotated in place in one launch; v is not touched.
    Returns qkv (``qkv_split`` gives the views).

    layout ``"stacked"``: ``[..., 3, N, D]``; ``"concat"``: ``[..., N_q + 2*N_kv, D]`` with
    ``num_heads=N_q`` (required) and ``num_kv_heads=N_kv`` (default N_q). cos/sin broadcast to
    the q and k views (``[S, 1, D]`` for ``[B, S, 3, N, D]`` or ``[B, S, N_q + 2 N_kv, D]``).
    """
    q, k, _ = qkv_split(qkv, num_heads=num_heads, num_kv_heads=num_kv_heads, layout=layout)
    _check_args({"qkv": qkv}, cos, sin, matrix, backend, rounding=rounding)
    torch.ops.rome.apply_qkv_(qkv, cos, sin, matrix, q.shape[-2], k.shape[-2], layout, backend, *_extra(rounding))
    return qkv


def apply_out(
    x: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, out: Tensor, backend: Backend = "auto",
    rounding: Rounding = "exact",
) -> Tensor:
    """``out <- x*cos + (x @ matrix)*sin``; returns out. out: x's shape and dtype, any strides;
    it is x itself (in place) or disjoint from x and the tables."""
    _check_args({"x": x}, cos, sin, matrix, backend, {"out": out}, rounding)
    torch.ops.rome.apply_out(x, cos, sin, matrix, out, backend, *_extra(rounding))
    return out


def apply_qk_out(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, matrix: Tensor, *, out: tuple[Tensor, Tensor],
    backend: Backend = "auto", rounding: Rounding = "exact",
) -> tuple[Tensor, Tensor]:
    """``rome.apply_qk`` into ``out = (q_out, k_out)`` in one launch; returns out."""
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out must be a (q_out, k_out) pair of tensors, got {type(out).__name__}")
    q_out, k_out = out
    _check_args({"q": q, "k": k}, cos, sin, matrix, backend, {"q_out": q_out, "k_out": k_out}, rounding)
    torch.ops.rome.apply_qk_out(q, k, cos, sin, matrix, q_out, k_out, backend, *_extra(rounding))
    return q_out, k_out
