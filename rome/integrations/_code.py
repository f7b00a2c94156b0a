"""What a model's function calls, and the same function calling something else instead — through
any chain of ``functools.wraps`` decorators.

transformers (5.24 on) wraps attention forwards in decorators such as ``@deprecate_kwarg(...)``:
the class's ``forward`` is then the decorator's wrapper, whose code and globals are the
decorator's, and the modeling file's function is its ``__wrapped__``. ``calls`` reads the innermost
function (``inspect.unwrap``); ``rebound`` rebinds a global of the innermost function and rebuilds
each wrapper around the new function — a copy of the wrapper whose closure cell holding the old
inner function holds the new one — so the decorators still run (a deprecation warning, a renamed
keyword) and nothing of the originals is modified.
"""

from __future__ import annotations

import inspect
import types

__all__ = ["calls", "innermost", "rebound"]


def innermost(fn):
    """The function at the end of ``fn``'s ``__wrapped__`` chain (``fn`` itself when it has none)."""
    return inspect.unwrap(fn)


def calls(fn, name: str) -> bool:
    """Whether the innermost function of ``fn`` reads the global (or attribute) ``name``."""
    code = getattr(innermost(fn), "__code__", None)
    return code is not None and name in code.co_names


def _holds(cell, obj) -> bool:
    try:
        return cell.cell_contents is obj
    except ValueError:  # an empty cell
        return False


def _copy(fn, scope: dict, closure) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    new.__dict__.update(fn.__dict__)
    return new


def rebound(fn, name: str, value):
    """``fn`` with the global ``name`` of its innermost function bound to ``value``: same code,
    defaults and closure at every level of the decorator chain, each wrapper's ``__wrapped__`` the
    new function it wraps (``inspect.unwrap`` of the result is the rebound function). The innermost function's new globals dict has no ``__name__``: torch.compile then
    guards on that dict rather than on the modeling module's attribute of that name.

    ValueError where a wrapper does not hold the function it wraps in its closure (a decorator
    that is a class or keeps the function elsewhere): rome cannot rebuild it faithfully."""
    inner = getattr(fn, "__wrapped__", None)
    if inner is None:
        if not isinstance(fn, types.FunctionType):
            raise ValueError(f"{fn!r} is not a Python function; rome cannot rebind its {name!r}")
        scope = dict(fn.__globals__)
        scope.pop("__name__", None)
        scope[name] = value
        new = _copy(fn, scope, fn.__closure__)
    else:
        cells = fn.__closure__ or ()
        if not isinstance(fn, types.FunctionType) or not any(_holds(c, inner) for c in cells):
            raise ValueError(
                f"{getattr(fn, '__qualname__', fn)!r} wraps {getattr(inner, '__qualname__', inner)!r} "
                f"but does not hold it in its closure; rome cannot rebuild that decorator around its "
                f"own function"
            )
        replaced = rebound(inner, name, value)
        closure = tuple(types.CellType(replaced) if _holds(c, inner) else c for c in cells)
        new = _copy(fn, fn.__globals__, closure)
        new.__wrapped__ = replaced  # as functools.wraps would set it: unwrap finds the new function
    return new
