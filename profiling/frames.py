"""Running Python code where CPython 3.11/3.12's frame stack does not thrash.

CPython keeps frames on a per-thread stack of 16 KB chunks. Up to 3.12 (and 3.13.x before the
fix of gh-142183), a call that returns across the start of a chunk frees that chunk, and the next
call maps a new one: code whose call depth goes up and down around a chunk's start pays an mmap,
a munmap and page faults per call. Triton's interpreter (the kernel's Python functions, a few KB
of frame each, called per op) hits that millions of times: 3.4 million mmap + munmap pairs in one
``tests/test_qknorm.py`` test on CPython 3.11, about a third of the CPU time of the interpreter
tests spent in the kernel.

``call_in_a_wide_frame(fn, *args)`` calls ``fn`` from a frame whose evaluation stack is 512 KB: the
frame gets a 1 MB chunk of its own, which it fills only to its first half (the stack slots are
never touched, so no page of them is faulted in), and every call ``fn`` makes, up to ~512 KB of
frames deep, lives in the second half: no chunk start is crossed. Harmless where CPython caches a
chunk.
"""

from __future__ import annotations

WIDE_STACK_SLOTS = 2**16  # 512 KB of PyObject* slots


def _call(fn, args, kwargs):
    return fn(*args, **kwargs)


_call.__code__ = _call.__code__.replace(co_stacksize=_call.__code__.co_stacksize + WIDE_STACK_SLOTS)


def call_in_a_wide_frame(fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, called from a frame with a 512 KB evaluation stack (see above)."""
    return _call(fn, args, kwargs)
