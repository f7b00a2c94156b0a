"""Model patches: swap a model's RoPE for rome's, in place, and undo it exactly.

    handle = rome.integrations.patch(model)     # finds the model's family
    ...                                         # the model now rotates q and k with rome
    handle.undo()                               # the model is as it was, attribute for attribute

One module per library, imported only when a model of that library is patched, so neither
transformers nor diffusers is a dependency of rome (``pip install rome[models]`` adds them):

- ``rome.integrations.transformers``: Llama family (and the families sharing its
  ``apply_rotary_pos_emb``), Qwen2-VL / Qwen2.5-VL, GPT-NeoX.
- ``rome.integrations.diffusers``: 52 transformer classes of diffusers 0.42, Wan, HunyuanVideo,
  Flux, Qwen-Image, LTX-Video and the rest, and the classes with RoPE it refuses with the reason
  (docs/families.md, generated from its tables).

Each library module defines ``patch(model, *, backend, rounding) -> Patch | None`` (None: not a model
of that library it knows) and ``SUPPORTED`` (the class names it patches). Patches never touch
the kernel: they call rome's public ops and module (Liger-Kernel's convention).

Other libraries' calling conventions, as thin layers over ``rome.apply``/``apply_qk`` (neither
library needed; docs/adapters.md maps their arguments to rome's):

- ``rome.integrations.flash_attn.apply_rotary_emb``: flash-attn's ``apply_rotary_emb``.
- ``rome.integrations.vllm``: vLLM's ``RotaryEmbedding`` and its ``forward(positions, query,
  key)`` as ``rotary_embedding(..., cos_sin_cache=, is_neox_style=)``.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable

from torch import nn

from ..checks import check_rounding
from ..types import Backend, Rounding
from . import flash_attn, flashinfer, liger, vllm  # adapters: no optional dependency

__all__ = ["Patch", "flash_attn", "flashinfer", "liger", "patch", "supported", "vllm"]

_LIBRARIES = ("transformers", "diffusers")


class Patch:
    """The changes one ``patch`` made: ``undo()`` reverts them, last first (also as a context
    manager: ``with patch(model): ...``). Undoing twice is a no-op."""

    def __init__(self, model: nn.Module, family: str):
        self.model = model
        self.family = family
        self._undo: list[Callable[[], None]] = []

    def setattr(self, obj, name: str, value) -> None:
        """``setattr(obj, name, value)``, recorded: undo restores the old value, or removes the
        attribute where ``obj`` had none of its own (an instance attribute shadowing its class's)."""
        missing = object()
        own = hasattr(obj, "__dict__")
        old = obj.__dict__.get(name, missing) if own else getattr(obj, name)
        setattr(obj, name, value)

        def restore():
            if (obj.__dict__.get(name, missing) if own else getattr(obj, name)) is not value:
                # replaced after the patch by something else: left as it is, said
                warnings.warn(f"rome.integrations: {type(obj).__name__}.{name} was replaced after rome's patch; "
                              "undo leaves that value in place", stacklevel=3)
            elif old is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, old)

        self._undo.append(restore)

    def set_forward(self, module: nn.Module, forward) -> None:
        """``module.forward = forward``, recorded. Where a hook already wraps the instance's
        forward and keeps the one it wraps as ``_old_forward`` (accelerate's
        ``add_hook_to_module``: device placement, offloading), rome's forward takes that place, so
        the hook still runs around it. Another forward set on the instance: ValueError (rome's
        would replace it, and whatever it does, silently). Undo puts the module's own forward (or
        what the hook wrapped) back wherever rome's is by then: still where it was put, under a
        hook added since, or the instance's forward again after the hook was removed."""
        d = module.__dict__
        if "forward" in d and "_old_forward" not in d:
            raise ValueError(
                f"{type(module).__name__}.forward is replaced on this instance ({d['forward']!r}), not by a hook "
                "that keeps the original as _old_forward (accelerate's): rome's forward would bypass it; not patched"
            )
        slot = "_old_forward" if "forward" in d else "forward"
        old = d.get(slot)  # (None: the class's forward)
        setattr(module, slot, forward)

        def restore():
            if d.get("forward") is forward:  # the instance's forward (a hook rome sat under removed since)
                if old is None or getattr(old, "__func__", None) is type(module).forward:
                    del module.forward
                else:
                    module.forward = old
            elif d.get("_old_forward") is forward:  # under a hook (there from the start, or added since)
                module._old_forward = type(module).forward.__get__(module) if old is None else old
            else:
                warnings.warn(f"rome.integrations: {type(module).__name__}.forward was replaced after rome's "
                              "patch; undo leaves it in place", stacklevel=3)

        self._undo.append(restore)

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when the patch is undone (after the changes recorded later are reverted)."""
        self._undo.append(fn)

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __repr__(self) -> str:
        state = "active" if self.active else "undone"
        return f"Patch({type(self.model).__name__}, family={self.family!r}, {state})"


def _library_of(model) -> str | None:
    for cls in type(model).__mro__:
        root = cls.__module__.split(".")[0]
        if root in _LIBRARIES:
            return root
    return None


def _outermost_models(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of the transformers/diffusers modules inside a user's ``model`` that no
    other such module holds: the models a wrapper carries (a text encoder and a transformer, say)."""
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if m is model or _library_of(m) is None:
            continue
        if any(name.startswith(f"{outer}.") for outer, _ in found):
            continue
        found.append((name, m))
    return found


def supported() -> dict[str, tuple[str, ...]]:
    """The class names each library module patches (imports those that import)."""
    out = {}
    for lib in _LIBRARIES:
        try:
            out[lib] = tuple(importlib.import_module(f"{__name__}.{lib}").SUPPORTED)
        except ImportError:
            continue
    return out


def patch(model: nn.Module, *, backend: Backend = "auto", rounding: Rounding = "exact") -> Patch:
    """Patch ``model`` (a transformers or diffusers model, or a module of the user's holding such
    models: each is patched, and one ``undo()`` reverts them all) in place to compute its RoPE with
    rome; returns a ``Patch`` whose ``undo()`` restores the model exactly.

    ``rounding``: ``"exact"`` (rome's tables from float64 angles, one rounding: the more accurate)
    or ``"native"``: the patched model's outputs equal the unpatched model's bit for bit (its own
    tables, each rotation rounded as its code rounds it; docs/families.md says which families; a
    family it cannot reproduce raises ValueError).

    Raises TypeError for a model of neither library and ValueError for a model (or a RoPE
    configuration) rome cannot express, naming the class and what is supported.
    """
    check_rounding(rounding)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    lib = _library_of(model)
    if lib is None:
        inner = _outermost_models(model)
        if not inner:
            raise TypeError(
                f"model must be a transformers or diffusers model, or a module holding one, got "
                f"{type(model).__module__}.{type(model).__qualname__} (it holds none)"
            )
        handle = Patch(model, family="+".join(sorted({_library_of(m) for _, m in inner})))
        try:
            for _, m in inner:
                handle.on_undo(patch(m, backend=backend, rounding=rounding).undo)
        except BaseException:
            handle.undo()
            raise
        return handle
    module = importlib.import_module(f"{__name__}.{lib}")
    handle = module.patch(model, backend=backend, rounding=rounding)
    if handle is None:
        raise ValueError(
            f"rome.integrations.patch does not support {type(model).__name__} ({lib}); "
            f"supported: {', '.join(module.SUPPORTED)}"
        )
    return handle
