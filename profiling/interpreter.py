"""Triton's interpreter without two per-call costs of its own.

Under ``TRITON_INTERPRET=1`` a launch points ``triton.language``'s builtins at the interpreter
(``_patch_lang``: ``inspect.getmembers`` over ``tl``, ``tl.core``, ``tl.math`` and the tensor
class) and restores them when its grid is done. Every call of a ``@triton.jit`` helper inside the
launch runs the same scan again (triton 3.6-3.9: ``InterpretedFunction.__call__``), though
everything it would point is already pointed, and discards what it did; and every op asks
``_get_np_dtype``, which builds a 17-entry dict of dtypes (hashing each) per call. rome's kernel
calls a few thousand helpers and a few ten thousand ops a launch: a ``tests/test_qknorm.py`` test
(8 cases) took 61.8 s, 50.9 s without the scans, 39.1 s without both (this 2-core machine).

``speed_up()`` replaces the module's ``_patch_lang`` by one that does nothing while the language
modules the function sees are patched (their ``load`` no longer a builtin: a launch is running)
and patches as before otherwise, and ``_get_np_dtype`` by a memo of it (pointer types, which are
not hashable, still computed): the same state and values, without the work. It installs only
where the interpreter is shaped as described (else returns False and it runs as it is). It also
turns off the integer-overflow checks that the interpreter builds and then drops (its ``debug``
is off): about half of a qknorm launch's interpreted time (``_skip_discarded_overflow_checks``).
"""

from __future__ import annotations

import inspect

_installed = False


def speed_up() -> bool:
    """Install the scan-free ``_patch_lang`` and the memo of ``_get_np_dtype`` (idempotent);
    whether they are installed."""
    global _installed
    if _installed:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    scope = getattr(interpreter, "_LangPatchScope", None)
    call = getattr(getattr(interpreter, "InterpretedFunction", None), "__call__", None)
    if original is None or scope is None or call is None or "_patch_lang(self.fn)" not in inspect.getsource(call):
        return False

    seen = {}

    def patch_lang(fn):
        # the language modules fn sees (as _patch_lang finds them): all patched by the launch?
        langs = seen.get(fn)
        if langs is None:
            langs = seen[fn] = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
        if langs and not any(tl.core.is_builtin(lang.load) for lang in langs):
            return scope()  # a launch has them patched: nothing to do, nothing to restore
        return original(fn)

    patch_lang.original = original
    interpreter._patch_lang = patch_lang
    np_dtype = getattr(interpreter, "_get_np_dtype", None)
    if np_dtype is not None:  # (a pure function of the dtype that builds a 17-entry dict per call)
        known = {}

        def get_np_dtype(tt_dtype):
            try:
                return known[tt_dtype]
            except KeyError:
                known[tt_dtype] = got = np_dtype(tt_dtype)
                return got
            except TypeError:  # (pointer types are not hashable)
                return np_dtype(tt_dtype)

        get_np_dtype.original = np_dtype
        interpreter._get_np_dtype = get_np_dtype
    _skip_discarded_overflow_checks(interpreter)
    _installed = True
    return True


def _skip_discarded_overflow_checks(interpreter) -> bool:
    """The interpreter's options with ``sanitize_overflow`` off where its ``debug`` is off (always:
    nothing sets it); whether they are. Triton builds an integer ``+``, ``-`` or ``*``'s overflow
    check (both operands cast to int64, the op again, two compares, an and) and hands it to
    ``device_assert``, which drops it unless ``debug`` is on: on a GPU the compiler removes the
    dead code, the interpreter computes it in numpy first, over whole blocks, on every op. Only
    where ``device_assert`` is seen to drop it (else the interpreter is left as it is)."""
    import dataclasses

    from triton.language import semantic

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    assert_ = getattr(getattr(semantic, "TritonSemantic", None), "device_assert", None)
    if not (dataclasses.is_dataclass(options) and {"debug", "sanitize_overflow"} <= {
            f.name for f in dataclasses.fields(options)} and assert_ is not None):
        return False
    if options.debug or "if not self.builder.options.debug:\n            return" not in inspect.getsource(assert_):
        return False
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return True
