"""RoPE's rotate step as a matrix: ``rotate(x) == x @ M`` with M a D×D signed permutation.

- ``interleave`` (GPT-J): pairs (x0, x1) -> (-x1, x0);   M[i, i+1] = 1, M[i+1, i] = -1, i even.
- ``half`` (NeoX/Llama): cat(x1, x2) -> cat(-x2, x1);    M[:h, h:] = I,  M[h:, :h] = -I.
- several sections (multi-axis 2D/3D RoPE): the block-diagonal matrix of one block per section.

These are the seed ROME test's ``get_interleave_matrix``, ``get_half_matrix`` and
``compose_3matrix``; every one satisfies M @ M == -I.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Hashable, MutableMapping, Sequence

import torch

from .types import MODES, Mode


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def check_size(d: int, name: str = "d") -> int:
    try:
        if isinstance(d, bool):
            raise TypeError
        d = operator.index(d)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(d).__name__}") from None
    if d <= 0 or d % 2:
        raise ValueError(f"{name} must be a positive even integer, got {d}")
    return d


def check_sections(sections: int | Sequence[int]) -> tuple[int, ...]:
    """Normalise ``sections`` (one size or a sequence of sizes) to a tuple of positive even ints."""
    if isinstance(sections, int) and not isinstance(sections, bool):
        sections = (sections,)
    if isinstance(sections, torch.Tensor) or not isinstance(sections, Sequence) or not sections:
        raise ValueError(f"sections must be a non-empty sequence of even sizes, got {sections!r}")
    return tuple(check_size(d, f"sections[{i}]") for i, d in enumerate(sections))


def interleave_matrix(d: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """D×D matrix with ``x @ M == rotate_every_two(x)``: pairs (x0, x1) -> (-x1, x0)."""
    check_size(d)
    m = torch.zeros(d, d, dtype=dtype, device=device)
    even = torch.arange(0, d, 2, device=m.device)
    m[even, even + 1] = 1
    m[even + 1, even] = -1
    return m


def half_matrix(d: int, *, dtype=torch.float32, device=None) -> torch.Tensor:
    """D×D matrix with ``x @ M == rotate_half(x) == cat(-x2, x1)``."""
    check_size(d)
    h = d // 2
    m = torch.zeros(d, d, dtype=dtype, device=device)
    eye = torch.eye(h, dtype=dtype, device=m.device)
    m[:h, h:] = eye
    m[h:, :h] = -eye
    return m


_BUILDERS = {"interleave": interleave_matrix, "half": half_matrix}


def rotation_matrix(
    sections: int | Sequence[int], mode: Mode, *, dtype=torch.float32, device=None
) -> torch.Tensor:
    """Block-diagonal D×D matrix (D = sum(sections)), one ``mode`` block per section.

    ``rotation_matrix([44, 44, 40], "half")`` is the seed's ``compose_3matrix`` of three half
    matrices: each axis rotates the two halves of its own section.
    """
    sections = check_sections(sections)
    build = _BUILDERS[check_mode(mode)]
    return torch.block_diag(*(build(d, dtype=dtype, device=device) for d in sections))


KEPT_MATRICES = 256  # matrices the shared memo keeps (a D=128 float32 one is 64 KiB); the oldest go first
_KEPT: dict = {}
_KEPT_LOCK = threading.Lock()


def kept_matrix(key: Hashable, build: Callable[[], torch.Tensor], *,
                memo: MutableMapping | None = None) -> torch.Tensor:
    """``build()``, made once per ``key`` and kept: one tensor per key, so that rome reads its
    structure once (``rome.structure`` caches by identity). ``key`` must name everything the
    matrix depends on (its sizes, mode, dtype and device). ``memo``: a mapping of the caller's
    own (a module's, dropped with it), else a process-wide one of ``KEPT_MATRICES`` entries.

    Built outside inference mode: a matrix first asked for under ``torch.inference_mode()`` is
    an ordinary tensor that a later training call can save for its backward. Neither read nor
    kept while torch.compile traces (a memo filled during tracing fails the guard the trace put
    on it, and the next call recompiles; the graph builds the matrix instead) or under a fake
    tensor mode; a meta or fake result is never kept."""
    if torch.compiler.is_compiling() or _fake_mode():
        return build()
    memo = _KEPT if memo is None else memo
    m = memo.get(key)
    if m is not None:
        return m
    with torch.inference_mode(False):
        m = build()
    if m.device.type == "meta" or torch._subclasses.fake_tensor.is_fake(m):
        return m
    with _KEPT_LOCK:
        if memo is _KEPT and key not in _KEPT:
            while len(_KEPT) >= KEPT_MATRICES:
                del _KEPT[next(iter(_KEPT))]
        return memo.setdefault(key, m)  # another thread's, if it kept one first


def kept_rotation_matrix(d: int, mode: Mode, *, dtype: torch.dtype, device) -> torch.Tensor:
    """``rotation_matrix(d, mode, dtype=dtype, device=device)`` through ``kept_matrix``: one
    tensor per (mode, D, dtype, device)."""
    device = torch.device(device)
    return kept_matrix(("rotation", mode, d, dtype, device),
                       lambda: rotation_matrix(d, mode, dtype=dtype, device=device))


def _fake_mode() -> bool:
    """Whether a fake tensor mode is active (what it builds are fake tensors)."""
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None
