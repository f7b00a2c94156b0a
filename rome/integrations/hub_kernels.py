"""rome as transformers' ``rotary_pos_emb`` kernel: one registration for every family whose
modeling file marks the standard ``apply_rotary_pos_emb`` as replaceable.

transformers (5.x) decorates ``apply_rotary_pos_emb`` in about a hundred modeling files with
``use_kernel_forward_from_hub("rotary_pos_emb")`` and the attention classes that call it with
``use_kernelized_func(apply_rotary_pos_emb)``. With the ``kernels`` package (the version range
transformers names: 0.18.2 <= version < 0.19 for 5.23), ``kernels.kernelize`` replaces that
function's forward by the layer registered for ``"rotary_pos_emb"`` on the model's device.
Without it the decorators are no-ops and there is nothing to register with.

Two ways in, both a thin layer over ``rome.apply_qk`` with the half rotation's matrix:

- ``register(backend="auto")``: where transformers' kernels support is active, registers rome
  (``RomeRepository``: a local repository, nothing downloaded) as the ``rotary_pos_emb`` layer
  for every device type and mode (inference, training, either with torch.compile); then
  ``transformers.integrations.hub_kernels.kernelize(model)`` or
  ``kernels.kernelize(model, mode=..., device=...)`` picks it. ``mapping(backend)`` is the same
  mapping for ``kernels.use_kernel_mapping``. Where it is not active, ``register`` raises
  RuntimeError saying what is missing.
- ``kernelize(model, backend="auto")``: the same replacement without ``kernels``, on the model's
  own attention instances: each module whose class's forward calls its modeling file's standard
  ``apply_rotary_pos_emb`` gets that forward with rome's function bound in its place (the
  mechanism of ``rome.integrations.transformers``: nothing process-wide, ``Patch.undo()``
  restores it, the model pickles and deep-copies patched).

Either way transformers' rotary module still makes the tables (as with the hub's own
``kernels-community/rotary``); rome applies them: ``q*cos + rotate_half(q)*sin`` for q and k in
one launch, computed in fp32 and rounded once, with autograd. "Standard" means the function's
code and its ``rotate_half`` are those of Llama's modeling file (bytecode and constants equal):
105 of the 120 decorated functions in transformers 5.23. The other 15 (OLMo's and ModernBERT's
casts, GPT-OSS's half-width tables, nanochat's opposite sign, ...) keep their own code: the
registered layer calls the original function for them, ``kernelize`` leaves their layers alone.
"""

from __future__ import annotations

import importlib
import weakref

import torch
from torch import Tensor, nn

from ..matrices import kept_rotation_matrix
from ..ops import BACKENDS, apply_qk
from . import Patch
from ._code import calls, innermost

__all__ = ["LAYER_NAME", "RomeRepository", "apply_rotary_transformers", "is_standard", "kernelize",
           "layer", "mapping", "register", "unregister"]

LAYER_NAME = "rotary_pos_emb"
FUNCTION = "apply_rotary_pos_emb"


def _check_backend(backend) -> None:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def apply_rotary_transformers(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1, *,
                              backend: str = "auto") -> tuple[Tensor, Tensor]:
    """transformers' standard ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)`` as one
    ``rome.apply_qk``: ``cos``/``sin`` ``[B, S, D]`` from the model's rotary module, unsqueezed at
    ``unsqueeze_dim`` to broadcast to q ``[B, Nq, S, D]`` and k ``[B, Nk, S, D]``."""
    _check_backend(backend)
    for name, t in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    m = kept_rotation_matrix(q.shape[-1], "half", dtype=q.dtype, device=q.device)
    return apply_qk(q, k, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim), m, backend=backend)


# --- which functions are the standard one ----------------------------------------------------


def _original(fn):
    """The Python function behind ``fn``: itself, or the one a kernels ``Func`` module wraps
    (``use_kernel_forward_from_hub`` on a function makes an ``nn.Module`` whose class's forward
    closes over it). None where there is none to be found."""
    if isinstance(fn, nn.Module):
        forward = type(fn).__dict__.get("forward")
        cells = getattr(forward, "__closure__", None) or ()
        found = [c.cell_contents for c in cells if hasattr(c.cell_contents, "__code__")]
        return found[0] if len(found) == 1 else None
    return fn if hasattr(fn, "__code__") else None


def _code_key(fn):
    c = fn.__code__
    return (c.co_code, c.co_consts, c.co_names, c.co_varnames, fn.__defaults__)


_REFERENCE: list = []  # (apply_rotary_pos_emb key, rotate_half key) of Llama's modeling file
_STANDARD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_standard(fn) -> bool:
    """Whether ``fn`` (a modeling file's ``apply_rotary_pos_emb``, or the kernels module wrapping
    it) is transformers' standard one: the code and constants of Llama's, with a ``rotate_half``
    whose code is Llama's too (nanochat's has the other sign)."""
    fn = _original(fn)
    if fn is None:
        return False
    known = _STANDARD.get(fn)
    if known is not None:
        return known
    if not _REFERENCE:
        llama = importlib.import_module("transformers.models.llama.modeling_llama")
        _REFERENCE.append((_code_key(_original(llama.apply_rotary_pos_emb)), _code_key(llama.rotate_half)))
    ref_fn, ref_rotate = _REFERENCE[0]
    rotate = fn.__globals__.get("rotate_half")
    ok = _code_key(fn) == ref_fn and hasattr(rotate, "__code__") and _code_key(rotate) == ref_rotate
    _STANDARD[fn] = ok
    return ok


# --- the kernels route -----------------------------------------------------------------------

_LAYERS: dict[str, type] = {}


def layer(backend: str = "auto") -> type[nn.Module]:
    """The kernels layer class for ``"rotary_pos_emb"``: stateless, ``forward`` with the
    decorated function's signature. On a standard function it runs ``apply_rotary_transformers``;
    on another (see the module doc) it calls that function itself."""
    _check_backend(backend)
    if backend in _LAYERS:
        return _LAYERS[backend]

    class RomeRotaryPosEmb(nn.Module):
        can_torch_compile = True
        has_backward = True

        def forward(self, q, k, cos, sin, unsqueeze_dim=1):
            original = _original(self)
            if original is None:
                raise RuntimeError(
                    f"rome's {LAYER_NAME} layer replaced {type(self).__qualname__}, whose original function it "
                    f"cannot find (a kernels version whose function modules rome does not know)"
                )
            if not is_standard(original):
                return original(q, k, cos, sin, unsqueeze_dim)
            return apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim, backend=backend)

    RomeRotaryPosEmb.__qualname__ = RomeRotaryPosEmb.__name__ = f"RomeRotaryPosEmb_{backend}"
    _LAYERS[backend] = RomeRotaryPosEmb
    return RomeRotaryPosEmb


class RomeRepository:
    """A kernels repository (``load() -> layer class``) that is rome itself: nothing to fetch."""

    def __init__(self, backend: str = "auto"):
        _check_backend(backend)
        self.backend = backend

    def load(self) -> type[nn.Module]:
        return layer(self.backend)

    def __eq__(self, other):
        return isinstance(other, RomeRepository) and other.backend == self.backend

    def __hash__(self):
        return hash(("rome", self.backend))

    def __str__(self):
        return f"rome (local, backend={self.backend!r})"

    __repr__ = __str__


DEVICES = ("cuda", "rocm", "xpu", "cpu")


def _kernels_or_why():
    """``(kernels module, None)`` where transformers' kernels support is active, else
    ``(None, what is missing)``."""
    try:
        hub = importlib.import_module("transformers.integrations.hub_kernels")
    except ImportError as e:
        return None, f"transformers' hub kernels module is not importable ({e})"
    from transformers.utils.import_utils import KERNELS_MAX_VERSION, KERNELS_MIN_VERSION, is_kernels_available

    if not is_kernels_available():
        try:
            from importlib.metadata import version

            have = f"kernels {version('kernels')} is installed"
        except Exception:  # noqa: BLE001 - PackageNotFoundError
            have = "kernels is not installed"
        return None, (f"transformers needs kernels >= {KERNELS_MIN_VERSION}, < {KERNELS_MAX_VERSION} for its "
                      f"hub-kernel hooks, and {have}: its decorators are no-ops. Without it, "
                      f"rome.integrations.hub_kernels.kernelize(model) replaces the same function")
    if not getattr(hub, "_kernels_enabled", False):
        return None, "transformers' hub kernels are disabled (USE_HUB_KERNELS is not a true value)"
    return importlib.import_module("kernels"), None


def mapping(backend: str = "auto", devices=DEVICES) -> dict:
    """The kernels mapping ``{"rotary_pos_emb": {device: {mode: RomeRepository}}}`` for every
    mode (inference, training, each with torch.compile): for ``kernels.register_kernel_mapping``
    or ``kernels.use_kernel_mapping``. RuntimeError where kernels support is not active."""
    kernels, why = _kernels_or_why()
    if kernels is None:
        raise RuntimeError(why)
    repo = RomeRepository(backend)
    Mode = kernels.Mode
    modes = {Mode.INFERENCE: repo, Mode.TRAINING: repo, Mode.INFERENCE | Mode.TORCH_COMPILE: repo,
             Mode.TRAINING | Mode.TORCH_COMPILE: repo}
    return {LAYER_NAME: {device: dict(modes) for device in devices}}


_REGISTERED: list = []  # the kernels.use_kernel_mapping contexts register() entered, newest last


def register(backend: str = "auto", devices=DEVICES) -> None:
    """Register rome as the ``rotary_pos_emb`` layer in kernels' mapping (over whatever was
    registered for it, transformers' hub default included, on ``devices``). Then
    ``transformers.integrations.hub_kernels.kernelize(model)`` uses rome. Note that
    ``model.set_use_kernels(True)`` / ``from_pretrained(use_kernels=True)`` registers
    transformers' own default mapping again (its hub kernel for CUDA), so call ``register``
    after those, or kernelize directly. RuntimeError where kernels support is not active.

    The mapping is kernels' ``use_kernel_mapping(..., inherit_mapping=True)`` entered and left
    open: the current mapping plus rome's, for this thread's context (kernels keeps its mapping
    in a ContextVar), until ``unregister()`` puts the previous one back."""
    kernels, why = _kernels_or_why()
    if kernels is None:
        raise RuntimeError(why)
    context = kernels.use_kernel_mapping(mapping(backend, devices), inherit_mapping=True)
    context.__enter__()
    _REGISTERED.append(context)


def unregister() -> bool:
    """Undo the newest ``register()``: kernels' mapping is again the one before it (what was
    registered after it, in this context, goes with it). Layers already kernelized keep rome
    until ``kernelize`` runs again. False where there is no registration to undo."""
    if not _REGISTERED:
        return False
    _REGISTERED.pop().__exit__(None, None, None)
    return True


# --- without kernels: the same replacement on the model's instances ---------------------------


class _Rotate:
    """``apply_rotary_pos_emb`` bound into a patched attention forward (pickles as its backend)."""

    def __init__(self, backend: str):
        self.backend = backend

    def __getstate__(self):
        return {"backend": self.backend}

    def __call__(self, q, k, cos, sin, unsqueeze_dim=1):
        return apply_rotary_transformers(q, k, cos, sin, unsqueeze_dim, backend=self.backend)


def kernelize(model: nn.Module, *, backend: str = "auto") -> Patch | None:
    """Replace the standard ``apply_rotary_pos_emb`` by rome's in every layer of ``model`` that
    calls it (see the module doc), without the kernels package. None for a model without RoPE;
    ValueError for a model with a rotary module but no layer calling the standard function (never
    a silent no-op), and for a model (or a layer of it) already patched by rome."""
    from .transformers import _PATCHED, _Forward

    _check_backend(backend)
    name = type(model).__name__
    layers = []
    for module in model.modules():
        cls = type(module)
        forward = cls.__dict__.get("forward") or getattr(cls, "forward", None)
        if forward is None or not calls(forward, FUNCTION):  # through its decorators
            continue
        fn = innermost(forward).__globals__.get(FUNCTION)  # the modeling file's function it calls
        if fn is None or not is_standard(fn):
            continue
        if module in _PATCHED:
            raise ValueError(
                f"{name} is already patched by rome (its {cls.__name__} is part of the patch of a "
                f"{_PATCHED[module]}): undo that patch first"
            )
        layers.append(module)
    if not layers:
        rotary = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")})
        if rotary:  # RoPE that this route cannot swap: said, never a silent None
            raise ValueError(
                f"rome.integrations.hub_kernels.kernelize({name}): it has {', '.join(rotary)} but no layer "
                f"calls the standard {FUNCTION} (rome.integrations.patch handles other rotations)"
            )
        return None
    handle = Patch(model, family=LAYER_NAME)
    rotate = _Rotate(backend)
    try:
        for module in layers:
            patched = _Forward(module, (type(module), FUNCTION, rotate), name)
            handle.on_undo(lambda m=module: _PATCHED.pop(m, None))
            handle.set_forward(module, patched)
    except BaseException:
        handle.undo()
        raise
    return handle
