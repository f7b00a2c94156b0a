"""Timing, bytes moved, copy bandwidth, peak memory, and the profiler's kernels per call.

GPU: ``triton.testing.do_bench`` (CUDA events, L2 flushed before every run) or
``do_bench_cudagraph`` (for launch-bound shapes such as decode), min/median/max.
CPU: ``time.perf_counter`` around repeated calls, after warm-up; the report's speed table times
all its callables interleaved (``bench_interleaved``); labelled CPU in the report.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

PASSES = ("fwd", "bwd", "fwd+bwd")
_PROFILE_STEPS = 3
CPU_WARMUP_S, CPU_MEASURE_S = 0.25, 0.5


def bench(fn, device: torch.device, *, cudagraph=False, grad_to_none=None) -> dict:
    """min / median / max milliseconds of ``fn()``."""
    if device.type == "cuda":
        import triton.testing

        q = [0.0, 0.5, 1.0]
        if cudagraph:
            ms = triton.testing.do_bench_cudagraph(fn, grad_to_none=grad_to_none, quantiles=q)
        else:
            ms = triton.testing.do_bench(fn, grad_to_none=grad_to_none, quantiles=q)
        return dict(zip(("min_ms", "median_ms", "max_ms"), ms))
    # CPU: warm up (allocator, thread pool, caches settle), then time for CPU_MEASURE_S
    _cpu_warmup(fn)
    times, start = [], time.perf_counter()
    while len(times) < 10 or (time.perf_counter() - start < CPU_MEASURE_S and len(times) < 200):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return _summary(times)


def _cpu_warmup(fn) -> float:
    """Call ``fn`` for ``CPU_WARMUP_S`` (at least 3, at most 1000 calls); seconds per call."""
    start, calls = time.perf_counter(), 0
    while calls < 3 or (time.perf_counter() - start < CPU_WARMUP_S and calls < 1000):
        fn()
        calls += 1
    return (time.perf_counter() - start) / calls


def _summary(times_ms: list[float]) -> dict:
    return {"min_ms": min(times_ms), "median_ms": statistics.median(times_ms), "max_ms": max(times_ms)}


CPU_BURST_S = 0.02  # one visit of a callable in an interleaved round


def cpu_rounds() -> int:
    return max(1, round(CPU_MEASURE_S / CPU_BURST_S))


def bench_interleaved(fns: dict, *, seed: int = 0) -> tuple[dict, dict]:
    """CPU: min / median / max milliseconds of every ``fns[key]()``, timed in rounds.

    A shared CPU's speed drifts during a run (this project's 2-core machine: the same call 2-3x
    slower from one minute to the next), so timing one callable after another makes their ratios
    depend on when each ran. Here each round visits every callable, in an order shuffled per round,
    for a burst of about ``CPU_BURST_S`` (``CPU_MEASURE_S / CPU_BURST_S`` rounds: each callable
    gets about ``CPU_MEASURE_S`` of timed calls, and at least 10), so a slow stretch lands on all
    of them alike. Warm-up as in ``bench``. Returns ``(timings, errors)``: a callable that raises
    is left out of the rounds and its exception returned under its key."""
    rng = random.Random(seed)
    times, per_call, errors = {}, {}, {}
    for key, fn in fns.items():  # warm-up, and each call's cost for its burst size
        try:
            per_call[key] = _cpu_warmup(fn)
        except Exception as e:  # noqa: BLE001 -- reported per callable by the caller
            errors[key] = e
            continue
        times[key] = []
    rounds = cpu_rounds()
    burst = {k: max(-(-10 // rounds), round(CPU_BURST_S / c)) for k, c in per_call.items()}
    for _ in range(rounds):
        order = list(times)
        rng.shuffle(order)
        for key in order:
            try:
                for _ in range(burst[key]):
                    t = time.perf_counter()
                    fns[key]()
                    times[key].append((time.perf_counter() - t) * 1e3)
            except Exception as e:  # noqa: BLE001
                errors[key] = e
                del times[key]
    return {k: _summary(v) for k, v in times.items()}, errors


def io_bytes(q, k, cos, sin) -> int:
    """Bytes one pass must move: q and k read and written once, cos and sin read once."""
    qk = 2 * (q.numel() * q.element_size() + k.numel() * k.element_size())
    return qk + cos.numel() * cos.element_size() + sin.numel() * sin.element_size()


def copy_bandwidth(q, k, device, *, cudagraph=False, copy=None, window=contextlib.nullcontext) -> dict:
    """GB/s of a copy of q's and k's bytes (read + write counted): a device-to-device copy, or
    ``copy(src, dst)`` (``triton_copy``) where given. One call first (a Triton copy's compile),
    then the timing inside ``window()`` (``profiling.clocks.Clocks.window``)."""
    src = torch.empty(q.numel() + k.numel(), dtype=q.dtype, device=device)
    dst = torch.empty_like(src)
    fn = (lambda: dst.copy_(src)) if copy is None else (lambda: copy(src, dst))
    fn()
    with window():
        t = bench(fn, device, cudagraph=cudagraph)
    moved = 2 * src.numel() * src.element_size()
    return {**t, "bytes": moved, "gbps": moved / (t["median_ms"] * 1e-3) / 1e9}


TRITON_COPY_BLOCK, TRITON_COPY_WARPS = 4096, 8  # elements a program (16-byte vectors), warps


@functools.cache  # (built on first use: importing profiling.speed compiles nothing)
def _triton_copy_kernel():
    """The plain Triton copy: one program per TRITON_COPY_BLOCK contiguous elements, loaded and
    stored as they are, no arithmetic, no second tensor, so its rate is what a Triton kernel's
    loads and stores reach on the GPU, the ceiling a Triton RoPE kernel can meet (on an H200 with
    triton 3.6 it measured 0.96 of a device copy's rate in fp32 and 0.97 in bf16:
    profiling/results/h200/next-f06c2d3/)."""
    import triton
    import triton.language as tl

    @triton.jit
    def triton_copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)

    return triton_copy


def triton_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst.copy_(src)`` for contiguous tensors of one dtype and size, by the plain Triton copy."""
    if not (src.is_contiguous() and dst.is_contiguous() and src.dtype == dst.dtype and src.numel() == dst.numel()):
        raise ValueError(f"triton_copy: src and dst must be contiguous, of one dtype and size; got "
                         f"{tuple(src.shape)} {src.dtype} and {tuple(dst.shape)} {dst.dtype}")
    n = src.numel()
    _triton_copy_kernel()[(-(-n // TRITON_COPY_BLOCK),)](src, dst, n, BLOCK=TRITON_COPY_BLOCK,
                                                          num_warps=TRITON_COPY_WARPS)


def triton_copy_bandwidth(q, k, device, *, cudagraph=False, window=contextlib.nullcontext) -> dict | None:
    """GB/s of the plain Triton copy (``triton_copy``) of q's and k's bytes, read + write counted,
    as ``copy_bandwidth`` times the device copy; None off a GPU (no bandwidth there)."""
    if device.type != "cuda":
        return None
    return {**copy_bandwidth(q, k, device, cudagraph=cudagraph, copy=triton_copy, window=window),
            "block": TRITON_COPY_BLOCK, "num_warps": TRITON_COPY_WARPS}


def copy_shares(gbps: float, copy: dict) -> dict:
    """A timed row's percentages: of the device copy's rate (``copy_bandwidth``) and of the plain
    Triton copy's (``copy["triton"]``, None where it was not measured or failed)."""
    triton_gbps = (copy.get("triton") or {}).get("gbps")
    return {"pct_copy_bw": 100 * gbps / copy["gbps"],
            "pct_triton_copy_bw": 100 * gbps / triton_gbps if triton_gbps else None}


class Passes:
    """The three timed passes of one variant: fn() callables on prepared leaf tensors."""

    def __init__(self, run, q, k, *, differentiable: bool):
        self.run, self.q, self.k = run, q, k
        self.passes = {"fwd": self._fwd}
        if differentiable:
            self.ql = q.detach().requires_grad_()
            self.kl = k.detach().requires_grad_()
            self.grads = None
            self.outs = None
            self.passes |= {"bwd": self._bwd, "fwd+bwd": self._fwd_bwd}

    def _fwd(self):
        with torch.no_grad():
            return self.run(self.q, self.k)

    def _graph(self):
        outs = self.run(self.ql, self.kl)
        if self.grads is None:
            self.grads = [torch.randn_like(o) for o in outs]
        return outs

    def _bwd(self):
        if self.outs is None:
            self.outs = self._graph()
        self.ql.grad = self.kl.grad = None  # no accumulate op in what is timed
        torch.autograd.backward(self.outs, self.grads, retain_graph=True)

    def _fwd_bwd(self):
        self.ql.grad = self.kl.grad = None
        torch.autograd.backward(self._graph(), self.grads)

    def leaves(self):
        return [self.ql, self.kl] if "bwd" in self.passes else None


def peak_memory(fn, device) -> int | None:
    """Bytes allocated at the peak of one call, above what was allocated before it (GPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - base


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Send file descriptor 2 (kineto's C++ logging) to ``path`` for the block."""
    if path != Path(os.devnull):
        path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "a") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def kernels_per_call(fn, device, label: str, trace_dir: Path | None) -> dict:
    """Profile ``fn`` for a few steps: device kernels per call and their device time.

    On a GPU these are the CUDA kernels the call launched. On the CPU there are no device
    kernels; the count is of the aten ops the call ran at top level (each one pass over memory).
    """
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def export(prof):
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace_dir / f"{_slug(label)}.json"))

    sched = schedule(wait=1, warmup=1, active=_PROFILE_STEPS, repeat=1)
    log = trace_dir / "profiler.log" if trace_dir is not None else Path(os.devnull)
    with _stderr_to(log), profile(activities=activities, schedule=sched, on_trace_ready=export) as prof:
        for _ in range(2 + _PROFILE_STEPS):
            with record_function(label):
                fn()
            if cuda:
                torch.cuda.synchronize()
            prof.step()
    events = prof.events()
    if cuda:
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        time_us = sum(getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0) for e in kernels)
        return {"kernels_per_call": len(kernels) / _PROFILE_STEPS,
                "kernel_time_us": time_us / _PROFILE_STEPS, "kernel_kind": "cuda kernels"}
    ranges = [e for e in events if e.name == label]
    ops = [e for e in events if e.name.startswith("aten::") and _outermost_aten_in(e, label)]
    per_call = len(ops) / max(1, len(ranges))
    return {"kernels_per_call": per_call, "kernel_time_us": None, "kernel_kind": "cpu aten ops"}


def _outermost_aten_in(event, label: str) -> bool:
    """No aten op above ``event``, and the ``label`` range somewhere above it."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        if parent.name == label:
            return True
        parent = parent.cpu_parent
    return False
