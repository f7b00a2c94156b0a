"""A stand-in for the ``kernels`` package (Hugging Face's hub-kernels library) for
tests/test_hub_kernels.py: no compatible version (transformers 5.23 wants >= 0.18.2, < 0.19) can be
installed here, and without one transformers' decorators are no-ops.

The test copies this file to ``<tmp>/kernels/__init__.py`` (with ``kernels/layer/mode.py``, which
transformers' modeling_utils imports, and a ``kernels-0.18.2.dist-info`` so that
``transformers.utils.import_utils.is_kernels_available()`` is true) and runs a child python with
that directory first on its path: transformers then takes its "kernels installed" branch and
decorates every modeling file's ``apply_rotary_pos_emb`` through the functions below.

What it stands for, read from the kernels repository's source (kernels/src/kernels/layer/layer.py,
kernelize.py, globals.py, repos.py, mode.py of the 0.17.0.dev0 tree; the 0.18.2 release itself was
not available to read), and kept to the same behaviour where rome meets it:

- ``use_kernel_forward_from_hub(name)`` on a function builds ``Func``, an ``nn.Module`` class whose
  ``forward(self, *args, **kwargs)`` closes over the function, gives it ``kernel_layer_name`` and
  returns one instance (``_create_func_module``); on a class it sets ``kernel_layer_name``.
- ``use_kernelized_func(*fns)`` makes a class's ``__init__`` put those instances in
  ``self.__dict__["_kernel_funcs"]`` (not submodules).
- ``register_kernel_mapping`` / ``use_kernel_mapping``: a ContextVar holding
  ``{layer name: {device type: {Mode: repository}}}``; registering a device replaces its modes
  (the CPU/XPU ``DeviceRepos.insert``); ``use_kernel_mapping`` sets a (deep-copied) mapping and
  resets the ContextVar on exit.
- ``kernelize(model, mode=, device=, use_fallback=)``: for each module's ``_kernel_funcs`` and each
  module whose class has ``kernel_layer_name``, the repository for the device type is chosen by
  the real fallback order of modes, its ``load()`` gives a layer class, which must be stateless
  (no ``__init__``, no members beyond ``can_torch_compile``/``has_backward``) with a forward of
  the same number and kinds of parameters; the module's ``forward`` becomes
  ``MethodType(layer.forward, module)`` (an instance attribute), or the class's own forward
  again where no repository matches (fallback).

Not modelled: hub downloads (``LayerRepository.load`` raises), CUDA/ROCm capability ranges,
``Mode`` validation beyond the flag combinations.
"""

from __future__ import annotations

import copy
import enum
import inspect
from contextvars import ContextVar
from dataclasses import dataclass
from inspect import Parameter, Signature
from types import MethodType

__version__ = "0.18.2"
STUB = True  # lets a test check that this file, not a real kernels, was imported


class Mode(enum.Flag):
    _NONE = 0
    FALLBACK = enum.auto()
    TRAINING = enum.auto()
    INFERENCE = enum.auto()
    TORCH_COMPILE = enum.auto()

    def __or__(self, other):
        union = super().__or__(other)
        if Mode.INFERENCE in union and Mode.TRAINING in union:
            raise ValueError("Mode.INFERENCE and Mode.TRAINING are mutually exclusive.")
        if Mode.FALLBACK in union and union != Mode.FALLBACK:
            raise ValueError("Mode.FALLBACK cannot be combined with other modes.")
        return union


_MODE_FALLBACK_PRIORITY = {
    Mode.INFERENCE: [Mode.INFERENCE, Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING,
                     Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK],
    Mode.TRAINING: [Mode.TRAINING, Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK],
    Mode.INFERENCE | Mode.TORCH_COMPILE: [Mode.INFERENCE | Mode.TORCH_COMPILE, Mode.TRAINING | Mode.TORCH_COMPILE,
                                          Mode.FALLBACK],
    Mode.TRAINING | Mode.TORCH_COMPILE: [Mode.TRAINING | Mode.TORCH_COMPILE, Mode.FALLBACK],
}


class KernelizeFallback(enum.IntFlag):
    NONE = 0
    ALL = 1


@dataclass(frozen=True)
class CUDAProperties:
    min_capability: int
    max_capability: int


@dataclass(frozen=True)
class ROCMProperties:
    min_capability: int
    max_capability: int


@dataclass(frozen=True)
class Device:
    type: str
    properties: object = None


class LayerRepository:
    def __init__(self, repo_id, *, layer_name, revision=None, version=None, trust_remote_code=False):
        self._repo_id, self.layer_name, self._revision, self._version = repo_id, layer_name, revision, version

    def load(self):
        raise RuntimeError(f"kernels stub: no hub download ({self._repo_id})")


class LocalLayerRepository:
    def __init__(self, repo_path, *, layer_name):
        self._repo_path, self.layer_name = repo_path, layer_name

    def load(self):
        raise RuntimeError(f"kernels stub: no local kernel loading ({self._repo_path})")


def get_kernel(*args, **kwargs):
    raise RuntimeError("kernels stub: no hub download")


_KERNEL_MAPPING: ContextVar[dict] = ContextVar("_KERNEL_MAPPING", default={})
_CACHED_LAYER: dict = {}


def register_kernel_mapping(mapping, inherit_mapping=True):
    if not inherit_mapping:
        _KERNEL_MAPPING.set({})
    for name, device_repos in mapping.items():
        per_device = _KERNEL_MAPPING.get().setdefault(name, {})
        for device, repo in device_repos.items():
            device = Device(type=device) if isinstance(device, str) else device
            per_device[device.type] = dict(repo) if isinstance(repo, dict) else {Mode.FALLBACK: repo}


def use_kernel_mapping(mapping, *, inherit_mapping=True):
    class ContextManager:
        def __enter__(self):
            self.token = _KERNEL_MAPPING.set(copy.deepcopy(_KERNEL_MAPPING.get()) if inherit_mapping else {})
            register_kernel_mapping(mapping)

        def __exit__(self, exc_type, exc_value, traceback):
            _KERNEL_MAPPING.reset(self.token)

    return ContextManager()


def replace_kernel_forward_from_hub(cls, layer_name):
    cls.kernel_layer_name = layer_name


def _create_func_module(func):
    from torch import nn

    class Func(nn.Module):
        can_torch_compile = getattr(func, "can_torch_compile", False)
        has_backward = getattr(func, "has_backward", True)

        def forward(self, *args, **kwargs):
            return func(*args, **kwargs)

    sig = inspect.signature(func)
    Func.forward.__signature__ = Signature(
        parameters=[Parameter("self", Parameter.POSITIONAL_OR_KEYWORD), *sig.parameters.values()],
        return_annotation=sig.return_annotation)
    return Func


def use_kernel_forward_from_hub(layer_name):
    def decorator(ty):
        if inspect.isfunction(ty):
            Func = _create_func_module(ty)
            replace_kernel_forward_from_hub(Func, layer_name)
            return Func()
        if inspect.isclass(ty):
            replace_kernel_forward_from_hub(ty, layer_name)
            return ty
        raise TypeError("@use_kernel_forward_from_hub can only be applied to classes or functions")

    return decorator


def use_kernelized_func(*fns):
    def decorator(cls):
        for fn in fns:
            if not hasattr(fn, "kernel_layer_name"):
                raise ValueError(f"Function `{fn.__name__}` is not decorated with @use_kernel_forward_from_hub")
        orig_init = cls.__init__

        def new_init(self, *args, **kwargs):
            orig_init(self, *args, **kwargs)
            hidden = self.__dict__.setdefault("_kernel_funcs", {})
            for fn in fns:
                hidden[getattr(fn, "__name__", None) or fn.kernel_layer_name] = fn

        cls.__init__ = new_init
        return cls

    return decorator


def _validate_layer(*, check_cls, cls, repo):
    from torch import nn

    if not issubclass(cls, nn.Module):
        raise TypeError(f"Layer `{cls.__name__}` is not a Torch layer.")
    if cls.__init__ is not nn.Module.__init__:
        raise TypeError(f"{repo} must not override nn.Module constructor.")
    extra = {n for n, _ in inspect.getmembers(cls)} - {n for n, _ in inspect.getmembers(nn.Module)}
    if not extra <= {"can_torch_compile", "has_backward"}:
        raise TypeError(f"{repo} must not contain additional members compared to `{check_cls.__name__}`: {extra}")
    params = inspect.signature(cls.forward).parameters
    ref = inspect.signature(check_cls.forward).parameters
    if len(params) != len(ref) or any(p.kind != r.kind for p, r in zip(params.values(), ref.values())):
        raise TypeError(f"Forward signature of {repo} does not match `{check_cls.__name__}`")


def _replace_forward(module, layer):
    module.forward = MethodType(layer.forward, module)


def _kernelize_layer(module, *, mode, device_type, use_fallback):
    module_class = type(module)
    name = module_class.kernel_layer_name
    repos = _KERNEL_MAPPING.get().get(str(name), {}).get(device_type.type)
    chosen = None
    if repos:
        chosen = next(((repos[m], m) for m in _MODE_FALLBACK_PRIORITY[mode] if m in repos), None)
    if chosen is None:
        if not use_fallback:
            raise ValueError(f"No layer mapping for `{name}` on `{device_type.type}` for mode {mode}")
        _replace_forward(module, module_class)
        return
    repo, repo_mode = chosen
    layer = _CACHED_LAYER.get(repo)
    if layer is None:
        layer = repo.load()
        _validate_layer(check_cls=module_class, cls=layer, repo=repo)
        _CACHED_LAYER[repo] = layer
    if Mode.TRAINING in repo_mode and not getattr(layer, "has_backward", True):
        raise ValueError(f"{repo} does not support backward")
    if Mode.TORCH_COMPILE in repo_mode and not getattr(layer, "can_torch_compile", False):
        raise ValueError(f"{repo} does not support torch.compile")
    fallback = ((Mode.TORCH_COMPILE in mode and not getattr(layer, "can_torch_compile", False))
                or (Mode.TRAINING in mode and not getattr(layer, "has_backward", True)))
    _replace_forward(module, module_class if fallback else layer)


def kernelize(model, *, mode, device=None, use_fallback=True):
    if mode == Mode.FALLBACK:
        raise ValueError("Mode.FALLBACK can only be used to register kernel mappings.")
    if Mode.INFERENCE not in mode and Mode.TRAINING not in mode:
        raise ValueError("kernelize mode must contain Mode.INFERENCE or Mode.TRAINING.")
    if device is None:
        device_type = Device(type=next(model.parameters()).device.type)
    else:
        device_type = Device(type=device if isinstance(device, str) else device.type)
    for _, module in model.named_modules():
        for fn in getattr(module, "_kernel_funcs", {}).values():
            _kernelize_layer(fn, mode=mode, device_type=device_type, use_fallback=use_fallback)
        if hasattr(type(module), "kernel_layer_name"):
            _kernelize_layer(module, mode=mode, device_type=device_type, use_fallback=use_fallback)
    return model
