"""Token positions for ``rome.RoPE``: every accepted layout brought to one, checked.

A RoPE with A position axes (1 for text, 3 for mRoPE/video) reads one position per token and
axis. ``normalize_positions`` takes what callers have and returns ``[B', S, A]`` (``B'`` 1 or B)
for BNSD inputs, or ``[T, A]`` for packed (THD) tokens:

- ``None``: ``0..S-1`` (packed: each sequence's own ``0..len-1``) on every axis.
- ``[S]`` or ``[B, S]`` (transformers' ``position_ids``): the same position on every axis (what
  Qwen2-VL does with text-only ids).
- ``[S, A]`` or ``[B, S, A]``; ``[A, B, S]`` (transformers' mRoPE ``position_ids``, axes first).
  A shape that fits two readings (``[3, 3, 3]`` with B = S = A = 3; ``[3, 3]`` with B = S = A)
  is a ValueError unless ``axes_dim`` names the dimension of the axes: never a guess.
- Packed tokens (``cu_seqlens``): as above with B = 1 and S = T (``[T]``, ``[1, T]``,
  ``[T, A]``, ``[A, 1, T]``, ...).

``offsets`` (an int, or one per sequence: ``[B]``, or ``[len(cu_seqlens) - 1]``) are added to
every axis of the sequence's tokens: chunked prefill and decode with positions relative to the
chunk (``positions=None, offsets=cache_lengths``). Integer positions come out int64,
floating positions (fractional grids) float64.
"""

from __future__ import annotations

import numbers
import operator
import weakref
from collections.abc import Sequence

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake

__all__ = ["angle_frequencies", "angle_rows", "cache_index", "check_cu_seqlens", "check_range",
           "gather_rows", "normalize_positions", "scatter_rows", "token_mask"]


def _shape(t) -> list[int]:
    return list(t.shape)


def check_cu_seqlens(cu_seqlens, total: int) -> Tensor:
    """int64 ``[n + 1]`` sequence boundaries of ``total`` packed tokens: 0 first, non-decreasing,
    ``total`` last (flash-attn's ``cu_seqlens``)."""
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"cu_seqlens must be an integer tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype == torch.bool or cu_seqlens.is_floating_point() or cu_seqlens.is_complex():
        raise TypeError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D [n_sequences + 1] with at least 2 entries, got shape "
            f"{_shape(cu_seqlens)}"
        )
    values = cu_seqlens.tolist()
    if values[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {values[:8]}")
    steps = [b - a for a, b in zip(values, values[1:])]
    if min(steps) < 0:
        i = next(i for i, s in enumerate(steps) if s < 0)
        raise ValueError(
            f"cu_seqlens must be non-decreasing, got cu_seqlens[{i}] = {values[i]} > "
            f"cu_seqlens[{i + 1}] = {values[i + 1]}"
        )
    if values[-1] != total:
        raise ValueError(
            f"cu_seqlens must end at the number of packed tokens T = {total}, got "
            f"cu_seqlens[-1] = {values[-1]}"
        )
    return cu_seqlens.to(torch.int64)


def _check_dtype(positions: Tensor) -> None:
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer or floating tensor, got {positions.dtype}")


def axes_last(positions: Tensor, n_axes: int, axes_dim) -> Tensor:
    """``positions`` with dimension ``axes_dim`` (the one that indexes the ``n_axes`` position
    axes, e.g. 0 for transformers' mRoPE ``[3, B, S]``) moved last; ValueError when it is not a
    dimension of positions or does not have ``n_axes`` entries."""
    shape = _shape(positions)
    if isinstance(axes_dim, bool) or not isinstance(axes_dim, numbers.Integral) \
            or not -positions.ndim <= axes_dim < positions.ndim:
        raise ValueError(f"axes_dim must be a dimension of positions {shape}, got {axes_dim!r}")
    if shape[axes_dim] != n_axes:
        raise ValueError(f"positions {shape} must have {n_axes} axes (the layout's n_axes) at axes_dim={axes_dim}")
    return positions.movedim(axes_dim, -1)


def _to_bsa(positions: Tensor, n_axes: int, batch: int, seq: int, axes_dim: int | None = None) -> Tensor:
    """Read positions as ``[B', S, A]`` (B' in {1, batch}) given the tokens' batch and length;
    ``axes_dim``: the dimension that indexes the axes (None: inferred from the shape)."""
    shape, a = _shape(positions), n_axes
    batches = {1, batch}
    b = "B" if batch == 1 else f"B={batch} (or 1)"
    if axes_dim is not None:
        moved = axes_last(positions, a, axes_dim)
        if moved.ndim == 2 and _shape(moved) == [seq, a]:
            return moved[None]
        if moved.ndim == 3 and _shape(moved)[1:] == [seq, a] and moved.shape[0] in batches:
            return moved
        raise ValueError(
            f"positions with the axes at axes_dim={axes_dim} must be [S, A] or [{b}, S, A] once "
            f"that dimension is moved last, with S={seq} and A={a}, got {shape}"
        )
    readings = {}  # every form the shape fits (views): two would be a guess, so that is an error
    if positions.ndim == 1 and shape == [seq]:
        readings["[S]"] = positions[None, :, None].expand(1, seq, a)
    if positions.ndim == 2:
        if shape == [seq, a]:
            readings["[S, A]"] = positions[None]
        if shape[1] == seq and shape[0] in batches:
            readings["[B, S]"] = positions[..., None].expand(*shape, a)
    if positions.ndim == 3:
        if shape[0] == a and shape[2] == seq and shape[1] in batches:
            readings["[A, B, S]"] = positions.movedim(0, -1)
        if shape[1:] == [seq, a] and shape[0] in batches:
            readings["[B, S, A]"] = positions
    if len(readings) == 1 or (readings and a == 1):  # one axis: the readings hold the same values
        return next(iter(readings.values()))
    if readings:
        raise ValueError(
            f"positions {shape} are ambiguous with B={batch}, S={seq} and A={a}: they read as "
            f"{' and as '.join(readings)}; pass axes_dim (the dimension that indexes the axes: 0 "
            f"for transformers' [A, B, S], -1 for [.., S, A])"
        )
    raise ValueError(
        f"positions must be [S], [{b}, S], [S, A], [{b}, S, A] or [A, {b}, S] with S={seq} and "
        f"A={a} (the layout's n_axes), got {shape}"
    )


OFFSET_MAX = 2**53


def check_int_offset(value: int) -> int:
    """An int offset itself, ValueError past +-2**53 (int64 would overflow, or positions pass
    float64's integers)."""
    if abs(value) > OFFSET_MAX:
        raise ValueError(f"offsets must be within +-2**53 (positions exact in float64), got {value}")
    return value


def _offsets(offsets, n: int, what: str, device) -> Tensor:
    """int64 ``[n]`` offsets from an int or a tensor of ``n`` (``what`` names n)."""
    if isinstance(offsets, Tensor):
        if offsets.dtype == torch.bool or offsets.is_floating_point() or offsets.is_complex():
            raise TypeError(f"offsets must be an int or an integer tensor, got {offsets.dtype}")
        if offsets.ndim == 0:
            offsets = offsets.reshape(1)
        if offsets.ndim != 1 or offsets.numel() not in (1, n):
            raise ValueError(
                f"offsets must be an int or one per sequence ([{n}], {what}), got shape "
                f"{_shape(offsets)}"
            )
        return offsets.to(device, torch.int64).expand(n)
    if isinstance(offsets, bool):
        raise TypeError("offsets must be an int or an integer tensor, got bool")
    try:
        value = operator.index(offsets)
    except TypeError:
        raise TypeError(
            f"offsets must be an int or an integer tensor, got {type(offsets).__name__}"
        ) from None
    return torch.full((n,), check_int_offset(value), dtype=torch.int64, device=device)


def normalize_positions(
    positions: Tensor | None,
    *,
    n_axes: int,
    batch: int,
    seq: int,
    offsets=None,
    cu_seqlens: Tensor | None = None,
    device=None,
    axes_dim: int | None = None,
) -> Tensor:
    """Positions as ``[B', S, A]`` (BNSD tokens, ``B'`` 1 or ``batch``) or ``[T, A]`` (packed).
    ``axes_dim``: the dimension of ``positions`` that indexes the axes, where the shape alone
    cannot tell (e.g. ``[3, 3, 3]`` for B = S = A = 3: ValueError without it).

    For packed tokens pass ``cu_seqlens`` (checked with ``check_cu_seqlens``; ``seq`` is T and
    ``batch`` is ignored). ``offsets`` are added per sequence; see the module docstring.
    """
    packed = cu_seqlens is not None
    if packed:
        cu_seqlens = check_cu_seqlens(cu_seqlens, seq)
        n_seq = cu_seqlens.numel() - 1
        lengths = cu_seqlens.diff().to(device if device is not None else cu_seqlens.device)
        batch = 1
    if positions is None:
        if packed:
            token = torch.arange(seq, device=lengths.device)
            starts = torch.repeat_interleave(cu_seqlens.to(lengths.device)[:-1], lengths)
            pos = (token - starts)[None, :, None].expand(1, seq, n_axes)
        else:
            pos = torch.arange(seq, device=device)[None, :, None].expand(1, seq, n_axes)
    else:
        if not isinstance(positions, Tensor):
            raise TypeError(f"positions must be a tensor or None, got {type(positions).__name__}")
        _check_dtype(positions)
        pos = _to_bsa(positions, n_axes, batch, seq, axes_dim)
        if device is not None and positions.device.type == "meta" and torch.device(device).type != "meta":
            raise ValueError(
                f"positions on {positions.device} cannot be used with q on {device}: a meta tensor "
                f"has no values to copy (put positions and q on one device; all-meta works)"
            )
        if device is not None:
            pos = pos.to(device)
        pos = pos.to(torch.float64 if pos.is_floating_point() else torch.int64)
    if offsets is not None:
        if packed:
            off = _offsets(offsets, n_seq, "len(cu_seqlens) - 1 sequences", pos.device)
            pos = pos + torch.repeat_interleave(off, lengths.to(pos.device))[None, :, None]
        else:
            off = _offsets(offsets, batch, "the batch size of q", pos.device)
            pos = pos + off[:, None, None]
    return pos[0] if packed else pos


def check_finite_positions(positions: Tensor) -> None:
    """ValueError for floating positions holding inf or nan (one host read: integer positions,
    the usual, need none); not while torch.compile traces (no values)."""
    if positions.is_floating_point() and positions.device.type != "meta" \
            and not torch.compiler.is_compiling() and not bool(torch.isfinite(positions).all()):
        raise ValueError("positions must be finite, got inf or nan")


def check_range(
    positions: Tensor, limit: int | None = None, *, name: str = "max_positions"
) -> tuple[float, float] | None:
    """``(min, max)`` of the positions (one host sync) after checking ``0 <= p < limit``
    (``name`` names the limit in the message); None for no positions, and for positions on the
    meta device (no values: the caller reads none either)."""
    if positions.numel() == 0 or positions.device.type == "meta":
        return None
    check_finite_positions(positions)
    lo, hi = torch.stack(torch.aminmax(positions)).tolist()  # one host sync
    if lo < 0:
        raise ValueError(f"positions must be >= 0, got min {lo}")
    if limit is not None and hi >= limit:
        raise ValueError(f"positions must be < {name}={limit}, got max {hi}")
    return lo, hi


def token_mask(unrotated, *, batch: int, seq: int, device=None) -> Tensor | None:
    """bool ``[B', S]`` (B' 1 or ``batch``) marking the tokens left unrotated, or None.

    ``unrotated``: a slice of token indices, a sequence of slices, or a bool tensor ``[S]`` /
    ``[B, S]`` (packed tokens: B = 1, S = T).
    """
    if unrotated is None:
        return None
    if isinstance(unrotated, slice):
        unrotated = [unrotated]
    if isinstance(unrotated, Tensor):
        if unrotated.dtype != torch.bool:
            raise TypeError(f"unrotated must be a slice, slices or a bool tensor, got {unrotated.dtype}")
        shape = _shape(unrotated)
        if unrotated.ndim == 1 and shape == [seq]:
            return unrotated[None].to(device)
        if unrotated.ndim == 2 and shape[1] == seq and shape[0] in (1, batch):
            return unrotated.to(device)
        raise ValueError(f"unrotated mask must be [S] or [B, S] with S={seq}, B={batch}, got {shape}")
    if isinstance(unrotated, Sequence) and all(isinstance(s, slice) for s in unrotated):
        mask = torch.zeros(1, seq, dtype=torch.bool)
        for s in unrotated:
            if s.step not in (None, 1):
                raise ValueError(f"unrotated slices must have step 1, got {s}")
            mask[0, s] = True
        return mask.to(device)
    raise TypeError(
        f"unrotated must be a slice, a sequence of slices or a bool tensor, got "
        f"{type(unrotated).__name__}"
    )


# --- a cache read by position: what the kernel does with positions, in torch ------------------


def cache_index(positions: Tensor, axis: Tensor | None, head_dim: int) -> Tensor:
    """int64 ``[..., D]``: the cache row of each element, ``positions[..., axis[j]]`` for
    positions ``[..., A]`` (``positions[..., 0]`` on every column for A = 1 without axis)."""
    if axis is None:
        return positions[..., :1].expand(*positions.shape[:-1], head_dim).long()
    # a gather along the last dim: ~3.5x advanced indexing's speed on the CPU ([2048, 3] -> 128)
    axis = axis.to(positions.device, torch.int64).expand(*positions.shape[:-1], head_dim)
    return torch.gather(positions.long(), -1, axis)


def gather_rows(cache: Tensor, positions: Tensor, axis: Tensor | None = None) -> Tensor:
    """Per-token tables ``[..., D]`` from a cache ``[P, D]``: ``out[..., j] = cache[index[..., j], j]``
    with ``index = cache_index(positions, axis, D)`` (differentiable in the cache)."""
    return rows_of((cache,), positions, axis)[0]


RUNS = 8  # at most this many runs of columns reading one axis: rows copied per run


def rows_of(caches, positions: Tensor, axis: Tensor | None = None) -> list[Tensor]:
    """``gather_rows`` of each cache (one shape ``[P, D]``), sharing the work on the positions.

    Where the columns fall in at most ``RUNS`` runs of one axis (1D: one run; a video's sections:
    one a section), whole rows are copied per run (``index_select``: ~10x an element gather on
    the CPU) and the runs concatenated; else one element gather (``take``) by flat index."""
    d = caches[0].shape[-1]
    lead = positions.shape[:-1]
    runs = [(0, 0)]  # (first column, axis) of each run
    if axis is not None:  # the runs need axis's values: read only where that costs no sync or trace
        readable = axis.device.type == "cpu" and not is_fake(axis) and not torch.compiler.is_compiling()
        runs = _runs(axis) if readable else None
    if runs is not None and len(runs) <= RUNS:
        flat = positions.reshape(-1, positions.shape[-1]).to(caches[0].device, torch.int64)
        ends = [j for j, _ in runs[1:]] + [d]
        return [torch.cat([c[:, j:e].index_select(0, flat[:, a]) for (j, a), e in zip(runs, ends)], -1)
                .view(*lead, d) for c in caches]
    index = cache_index(positions, axis, d).to(caches[0].device)
    flat = index * d + torch.arange(d, device=index.device)  # row-major offsets into the cache
    return [torch.take(c, flat) for c in caches]


AXIS_RUNS = (4, 2)  # the runs axis_run looks for (4 fp32 cache columns: 16 B, one load)


def axis_run(axis: Sequence[int]) -> int:
    """The longest run n of ``AXIS_RUNS`` over which the position axis of the columns, ``axis``
    (D ints, read on the host), stays the same: ``axis[j] == axis[j - j % n]`` for every j and D a
    multiple of n; else 1. The gather kernel's forward on several axes reads its cache rows as
    vectors of that many columns (``rome.launch.launch_axis_run``). Video RoPE's sections give
    such runs where their sizes are multiples of them (default's 44/44/40: 4; hunyuan-video's
    16/56/56: 8, taken as 4; wan's 44/42/42: 2)."""
    d = len(axis)
    for n in AXIS_RUNS:
        if d % n == 0 and all(axis[j] == axis[j - j % n] for j in range(d)):
            return n
    return 1


_RUNS: dict = {}  # id(axis) -> (weakref(axis), version, data_ptr, runs): axis read once per tensor


def _runs(axis: Tensor):
    """``[(first column, axis)]`` of each run of columns reading one axis (None for none), read
    from a CPU ``axis`` once per tensor (again after an in-place write)."""
    try:  # (a functorch-wrapped or fake axis has no storage: read each time)
        key = None if axis.is_inference() or type(axis) is not Tensor else (axis._version, axis.data_ptr())
    except RuntimeError:
        key = None
    entry = _RUNS.get(id(axis))
    if key is not None and entry is not None and entry[0]() is axis and entry[1] == key:
        return entry[2]
    ax = axis.tolist()
    runs = [(j, a) for j, a in enumerate(ax) if j == 0 or a != ax[j - 1]] or None
    if key is not None:
        if len(_RUNS) >= 64:
            _RUNS.clear()
        _RUNS[id(axis)] = (weakref.ref(axis), key, runs)
    return runs


def scatter_rows(grad: Tensor, positions: Tensor, axis: Tensor | None, rows: int) -> Tensor:
    """The adjoint of ``gather_rows``: ``[rows, D]`` with ``grad[..., j]`` added into row
    ``index[..., j]`` of column j (an accumulating ``index_put``, as the gather's autograd)."""
    d = grad.shape[-1]
    columns = torch.arange(d, device=grad.device)
    index = cache_index(positions, axis, d).to(grad.device)
    zeros = torch.zeros(rows, d, dtype=grad.dtype, device=grad.device)
    return zeros.index_put((index, columns), grad, accumulate=True)


# --- angles from positions and frequencies (no cache): the kernel's ANGLES mode ------------------


def check_angle_frequencies(inv_freq: Tensor) -> None:
    """ValueError unless every inverse frequency is in [0, 1] (where it has values): the kernel reduces angles
    ``p * inv_freq`` of positions below 2**24 by pi/2 in double-float, exact only for angles below
    2**24 (a linear scaling's factor below 1 raises frequencies past 1). One host read; none while
    torch.compile traces."""
    if torch.compiler.is_compiling() or inv_freq.numel() == 0 or inv_freq.device.type == "meta" \
            or is_fake(inv_freq):
        return  # (no values to read)
    inv = inv_freq.detach().to(torch.float64)
    if not bool(((inv >= 0) & (inv <= 1)).all()):
        raise ValueError(
            f"the kernel's angles (angles='kernel', apply_qk_angles) need inverse frequencies in [0, 1], got "
            f"min {inv.min().item()!r}, max {inv.max().item()!r}: use the cos/sin cache (angles='cache', "
            f"apply_qk_at)")


def angle_frequencies(inv_freq: Tensor, scale=1.0) -> tuple[Tensor, Tensor]:
    """``(freqs, scales)`` for the angles mode, both float32 pairs ``[2, D]`` whose two rows sum to
    the float64 value to 2**-48 relative: ``inv_freq`` ``[D]`` (in [0, 1]:
    ``check_angle_frequencies``), and ``scale`` on rotated columns (1 on pass-through ones,
    ``inv_freq == 0``). The scale as a pair keeps ``scale * cos`` one rounding from float64 (an
    fp32 scale such as 0.9 alone costs up to 0.4 ulp more)."""
    check_angle_frequencies(inv_freq)
    inv = inv_freq.to(torch.float64)
    scales = torch.where(inv != 0, torch.as_tensor(scale, dtype=torch.float64, device=inv.device), 1.0)
    return _pair(inv), _pair(scales)


def _pair(v: Tensor) -> Tensor:
    hi = v.to(torch.float32)
    return torch.stack([hi, (v - hi.to(torch.float64)).to(torch.float32)])


def angle_rows(freqs: Tensor, scales: Tensor, positions: Tensor, axis: Tensor | None = None,
               dtype=torch.float32) -> tuple[Tensor, Tensor]:
    """Per-token ``(cos, sin)`` ``[..., D]`` of the angles mode in float64, rounded once to
    ``dtype``: ``(scales[0] + scales[1]) * cos(p * (freqs[0] + freqs[1]))`` with ``p = positions[..., axis[j]]``
    (the torch backend's tables and the tests' oracle); pass-through columns 1 and 0."""
    d = freqs.shape[-1]
    inv = freqs[0].to(torch.float64) + freqs[1].to(torch.float64)
    s = scales[0].to(torch.float64) + scales[1].to(torch.float64)
    if inv.device.type != "cpu":  # (unique syncs a GPU: there every element is computed)
        return _angle_tables(cache_index(positions, axis, d).to(inv.device, torch.float64), inv, s, dtype)
    # On the CPU the float64 cos/sin are computed once per distinct value, bitwise the same as
    # for every element at a fraction of the transcendentals. Where positions repeat (a video's
    # axes take a few dozen values) the tables are a cache [V, D] of the distinct positions read
    # at the positions; else per token. Either way once per distinct column: columns sharing
    # (frequency, scale), and the axis when per token, share their tables (every pair of a
    # half or interleave rotation).
    values, rows = torch.unique(positions, return_inverse=True)
    if 2 * values.numel() <= positions[..., 0].numel():
        (inv, s), columns = _distinct_columns(inv, s)
        cos, sin = (t[:, columns] for t in _angle_tables(values.to(torch.float64)[:, None], inv, s, dtype))
        return tuple(rows_of((cos, sin), rows, axis))
    ax = torch.zeros(d, dtype=torch.float64) if axis is None else axis.to(torch.float64)
    (ax, inv, s), columns = _distinct_columns(ax, inv, s)
    p = cache_index(positions, None if axis is None else ax.long(), inv.shape[-1]).to(torch.float64)
    cos, sin = _angle_tables(p, inv, s, dtype)
    columns = columns.expand(*cos.shape[:-1], d)
    return torch.gather(cos, -1, columns), torch.gather(sin, -1, columns)


def _distinct_columns(*columns: Tensor) -> tuple[list[Tensor], Tensor]:
    """The distinct columns of ``[D]`` vectors read together, in order of first appearance, and
    each column's index among them (on the host: torch.unique along a dim took ~0.4 ms here)."""
    first: dict = {}
    reps, inverse = [], []
    for j, key in enumerate(zip(*(c.tolist() for c in columns))):
        if key not in first:
            first[key] = len(reps)
            reps.append(j)
        inverse.append(first[key])
    reps = torch.tensor(reps, dtype=torch.int64)
    return [c[reps] for c in columns], torch.tensor(inverse, dtype=torch.int64)


def _angle_tables(p: Tensor, inv: Tensor, s: Tensor, dtype) -> tuple[Tensor, Tensor]:
    """``(s*cos(p*inv), s*sin(p*inv))`` in float64 rounded once to dtype; 1 and 0 where inv is 0."""
    angles = p * inv
    rotated = inv != 0
    return (torch.where(rotated, angles.cos() * s, 1.0).to(dtype),
            torch.where(rotated, angles.sin() * s, 0.0).to(dtype))
