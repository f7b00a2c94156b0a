"""Autotuning the kernel's launch on a GPU: which of ``rome.launch.candidates`` runs, once per key.

The first launch of a specialisation (``launch.Config``: x dtype, head_dim, pass, tables,
positions) on a device that moves at least ``MIN_ELEMENTS`` elements of q and k times its
candidates with Triton's autotuner (``triton.autotune``: its benchmarker, ``TRITON_PRINT_AUTOTUNING=1``
prints the timings and the choice, ``TRITON_CACHE_AUTOTUNING=1`` keeps them on disk where the
installed Triton has it) and keeps the fastest for every later launch of that key on that device.
The timed runs write into scratch outputs with the real outputs' strides, never into the
caller's tensors, so an in-place launch is not rotated twice and an output aliasing nothing is
not touched before its one real write. Until a key is tuned, a launch takes ``choose``'s config:
smaller launches (a decode step: too short to time, and their config hardly matters), launches
while a CUDA graph is being captured (timing would break the capture; the graph keeps that
config), and every launch with ``ROME_AUTOTUNE=0`` in the environment. Where the scratch outputs
do not fit in memory the key keeps ``choose``'s config, with a warning. Tuning changes no bit
(only specialisations whose results cannot depend on the tile have candidates), so the
environment variable is about time spent, not reproducibility.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings

import torch
import triton
from triton.runtime import Autotuner

from . import launch

ENV = "ROME_AUTOTUNE"
MIN_ELEMENTS = 1 << 22  # x elements of q and k together (8 MiB of bf16): ~5 us of traffic at 3 TB/s

_chosen: dict = {}  # (candidates, device) -> the Config that won
_lock = threading.Lock()


_OFF, _ON = ("0", "false", "off", "no"), ("1", "true", "on", "yes", "")


def enabled() -> bool:
    """False where ``ROME_AUTOTUNE`` is 0/false/off/no (any case): every launch takes ``choose``'s
    config; true unset or 1/true/on/yes. Any other value is a ``ValueError``, not a guess."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value not in _OFF + _ON:
        raise ValueError(f"{ENV}={os.environ[ENV]!r}: expected 0/false/off/no to turn autotuning off, "
                         "or 1/true/on/yes")
    return value not in _OFF


def _triton_config(cfg: launch.Config) -> triton.Config:
    options = launch.target_options(cfg.options)  # (maxnreg where Triton has it, and not on HIP)
    kw = {"maxnreg": options["maxnreg"]} if "maxnreg" in options else {}
    return triton.Config({"BLOCK_R": cfg.block_r}, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **kw)


@functools.lru_cache(maxsize=None)
def tuner(fn, candidates: tuple, do_bench=None):
    """``triton.autotune``'s autotuner over the candidates' tiles (BLOCK_R, warps, stages, maxnreg)
    of ``fn`` (the kernel), keyed on D (Triton adds every tensor argument's dtype); ``do_bench``:
    Triton's benchmarker unless given (tests time on the CPU). Built as the decorator builds it,
    ``Autotuner(fn, arg_names, configs, key, reset_to_zero, restore_value, ...)``, because triton
    3.2's ``autotune()`` drops its ``do_bench`` argument."""
    configs = [_triton_config(c) for c in candidates]
    return Autotuner(fn, fn.arg_names, configs, ["D"], None, None, do_bench=do_bench)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def pick(fn, candidates: tuple, device: torch.device, elements: int, time_candidates, do_bench=None):
    """The config to launch: the tuned choice for (candidates, device), tuning it now if this
    launch may (see the module docstring). ``time_candidates(autotuner)`` launches the autotuner
    on scratch outputs (the caller knows the arguments); the autotuner's pick is remembered."""
    if len(candidates) == 1:
        return candidates[0]
    key = (candidates, device)
    got = _chosen.get(key)
    if got is not None:
        return got
    if not enabled() or elements < MIN_ELEMENTS or _capturing(device):
        return candidates[0]
    with _lock:
        if key not in _chosen:
            autotuner = tuner(fn, candidates, do_bench)
            autotuner.cache.clear()  # its key (D, dtypes) does not hold the device: time again
            try:
                time_candidates(autotuner)
            except torch.cuda.OutOfMemoryError:  # no room for the scratch outputs: never retried
                warnings.warn(f"rome: no memory to time the launch configs of {candidates[0].name} on {device} "
                              f"(scratch outputs of {elements} elements); using {launch.tile_name(candidates[0])}",
                              stacklevel=2)
                _chosen[key] = candidates[0]
                return candidates[0]
            best = autotuner.best_config
            by_tile = {(c.block_r, c.num_warps): c for c in candidates}
            _chosen[key] = by_tile[best.kwargs["BLOCK_R"], best.num_warps]
    return _chosen[key]


def chosen() -> dict[str, str]:
    """What the tuner picked so far: ``{"<config name> on <device>": "BLOCK_R=.. warps=.."}``
    (the report records it next to its timings)."""
    return {f"{cands[0].name} on {device}": launch.tile_name(cfg) for (cands, device), cfg in _chosen.items()}


def reset() -> None:
    """Forget every choice (the next large launch of each key tunes again)."""
    with _lock:
        _chosen.clear()
