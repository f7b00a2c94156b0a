"""Ahead-of-time compile of the Triton kernels (no GPU needed) with the specialisation a real
launch gets, in worker processes that never saw ``TRITON_INTERPRET=1``.

For a configuration and an arch, ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc,
32))`` (AMD: ``GPUTarget("hip", arch, 64)``) builds the cubin (hsaco) with ``tt.divisibility=16``
on the pointers and ints the config marks divisible by 16, runtime ints equal to 1 as constants,
the constexprs, num_warps and num_stages. ``triton.compile`` keeps the result in Triton's own
cache (``TRITON_CACHE_DIR``, else ``~/.triton/cache``), under the same key a launch with those
argument properties computes. ``Job`` is one such compile as a picklable request, run in a worker
and read there (``nvidia``: cuobjdump; ``amd``: the code object's metadata).

The compile must not see ``TRITON_INTERPRET=1``: a process that imported triton under it holds
interpreter stand-ins for every ``@triton.jit`` function (triton's own ``tl.cdiv`` included) and
cannot compile. Compiles therefore run in spawned worker processes whose environment says
``TRITON_INTERPRET=0`` from the start (``compiler_pool``), so the tool works from any process, the
CPU test suite included."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import datetime as dt
import importlib
import inspect
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .amd import read_amdgcn
from .archs import AMD_ARCHS
from .nvidia import cuobjdump, read_sass, res_usage, run_cuobjdump

# --- compiling ----------------------------------------------------------------------------


@contextlib.contextmanager
def _environ(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _pid_after(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def default_jobs() -> int:
    """Compile processes when none are asked for: one per CPU this process may run on (a
    container's limit, not the host's count), at most 16 (each worker holds torch and triton)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(16, cpus))


def start_compiler_pool(jobs: int = 1, *, nice: int = 0) -> cf.ProcessPoolExecutor:
    """``jobs`` worker processes (spawned) for ``triton.compile``, all started before this
    returns, whose environment has ``TRITON_INTERPRET=0`` from the start. ``nice``: added to the
    workers' niceness (and so ptxas's), so that compiling in the background takes the CPUs the
    foreground work leaves idle.

    A process that imported triton under ``TRITON_INTERPRET=1`` (the CPU tests, ``python -m
    profiling`` without a GPU) holds interpreter objects for every ``@triton.jit`` function,
    triton's own ``tl.cdiv`` & co. included, and cannot compile; a fresh process can. The parent's
    environment says ``TRITON_INTERPRET=0`` only while the workers start (each busy a moment, so
    every submit starts a new one): afterwards the pool starts no process, and processes the
    parent starts later (e.g. from another thread while the pool compiles) do not see it.
    """
    jobs = max(1, jobs)
    pool = cf.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=os.nice if nice else None, initargs=(nice,) if nice else ())
    try:
        with _environ(TRITON_INTERPRET="0"):
            pids = set()
            while len(pids) < jobs:
                pids |= {f.result() for f in [pool.submit(_pid_after, 0.5) for _ in range(jobs)]}
    except BaseException:
        pool.shutdown(cancel_futures=True)
        raise
    return pool


@contextlib.contextmanager
def compiler_pool(jobs: int = 1):
    """``start_compiler_pool(jobs)``, shut down on exit."""
    with start_compiler_pool(jobs) as pool:
        yield pool


def jit_function(fn):
    """``fn`` checked to be a compilable ``JITFunction`` (not the interpreter's stand-in)."""
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        raise TypeError(f"fn: {type(fn).__name__} is not a compilable @triton.jit function: triton was imported "
                        "under TRITON_INTERPRET=1 in this process. Compile in a compiler_pool() worker; a main "
                        "module that workers re-import must not set TRITON_INTERPRET=1 unconditionally "
                        "(os.environ.setdefault is fine)")
    return fn


def _triton_version() -> tuple[int, int]:
    import triton

    return tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])


def _new_ast_source_api() -> bool:
    """triton >= 3.3: ``ASTSource(fn, signature, constexprs, attrs)``, attrs keyed by arg-index
    paths; triton 3.2: ``ASTSource(fn, signature, constants, AttrsDescriptor)``."""
    from triton.compiler import ASTSource

    return "constexprs" in inspect.signature(ASTSource.__init__).parameters


def ast_source(fn, signature: dict, constexprs: dict, divisible_by_16=(), *, pointer_range_32: bool = False):
    """The ``ASTSource`` a launch compiles for arguments with these properties.

    ``signature``: every runtime argument -> Triton type (``"*bf16"``, ``"i32"``, ...);
    ``constexprs``: the ``tl.constexpr`` arguments, and runtime ints equal to 1 (which the JIT
    turns into constants); ``divisible_by_16``: argument names marked ``tt.divisibility=16``
    (pointers 16-byte aligned, ints multiples of 16), as the JIT marks them; ``pointer_range_32``:
    every pointer also ``tt.pointer_range=32``, as the JIT on HIP marks a tensor whose storage is
    within 2 GiB while buffer ops are on (``AMDGCN_USE_BUFFER_OPS``, on by default).
    """
    fn = jit_function(fn)
    names = list(fn.arg_names)
    declared = {p.name for p in fn.params if p.is_constexpr}
    unknown = sorted((set(signature) | set(constexprs) | set(divisible_by_16)) - set(names))
    missing = sorted(set(names) - set(signature) - set(constexprs))
    if unknown or missing:
        raise ValueError(f"{fn.__name__}: unknown arguments {unknown}, arguments without a type or value {missing}")
    for n in declared - set(constexprs):
        raise ValueError(f"{fn.__name__}: constexpr argument {n!r} needs a value in constexprs")
    ones = [n for n in constexprs if n not in declared]  # runtime ints specialised to 1
    for n in ones:
        if constexprs[n] != 1 or isinstance(constexprs[n], bool):
            raise ValueError(f"{fn.__name__}: runtime argument {n!r} in constexprs = {constexprs[n]!r}; "
                             "a launch turns only an int equal to 1 into a constant")
    params = {p.name: p for p in fn.params}

    def specialised(n):  # the JIT specialises ints and pointers, not floats, bools or do_not_specialize
        return not params[n].do_not_specialize and not re.match(r"(fp|bf|u1$|i1$)", signature[n])

    for n in divisible_by_16:
        if n not in signature:
            raise ValueError(f"{fn.__name__}: {n!r} in divisible_by_16 is not a runtime argument")
        if not specialised(n) or params[n].do_not_specialize_on_alignment:
            raise ValueError(f"{fn.__name__}: a launch never marks {n!r} ({signature[n]}) divisible by 16")
    for n in ones:
        if params[n].do_not_specialize:
            raise ValueError(f"{fn.__name__}: {n!r} is do_not_specialize: a launch keeps it a runtime int")
    from triton.compiler import ASTSource

    if _new_ast_source_api():
        sig = {n: "constexpr" if n in constexprs else signature[n] for n in names}
        consts = {(names.index(n),): v for n, v in constexprs.items()}
        # the JIT's attrs: one entry per specialised runtime argument, in argument order;
        # constexprs get an empty one from triton 3.7 on, before that one only if their value is
        # a string
        from triton.backends.compiler import BaseBackend

        attrs = {}
        for i, n in enumerate(names):
            if n not in constexprs:
                if specialised(n):
                    attrs[(i,)] = [["tt.divisibility", 16]] if n in divisible_by_16 else []
                    if pointer_range_32 and signature[n].startswith("*"):
                        attrs[(i,)] = attrs[(i,)] + [["tt.pointer_range", 32]]
            elif _triton_version() >= (3, 7):
                attrs[(i,)] = []
            elif isinstance(constexprs[n], str):
                attrs[(i,)] = BaseBackend.parse_attr(constexprs[n])
        return ASTSource(fn, sig, consts, attrs)
    if pointer_range_32:
        raise NotImplementedError("AMD targets need triton >= 3.3 (ASTSource with attrs)")
    # triton 3.2: the JIT's AttrsDescriptor(params, values) marks every argument (constexprs
    # included) whose value is a multiple of 16 / equal to 1; the 1s become constants too.
    from triton.backends.compiler import AttrsDescriptor

    hints = {}
    for i, n in enumerate(names):
        if n in divisible_by_16 or (n in declared and AttrsDescriptor.is_divisible_by_16(constexprs[n])):
            hints[i] = 16
        elif n in ones or (n in declared and AttrsDescriptor.is_equal_to_1(constexprs[n])):
            hints[i] = 1
    sig = {n: signature.get(n, "i32") for n in names if n not in declared}
    return ASTSource(fn, sig, dict(constexprs), AttrsDescriptor.from_hints(hints))


def compile_kernel(fn, signature, constexprs, divisible_by_16, *, cc: int | str, num_warps: int, num_stages: int,
                   **options):
    """``triton.compile`` for ``GPUTarget("cuda", cc, 32)`` (``cc`` an int), or for an AMD arch
    (``cc`` = "gfx942", ...) ``GPUTarget("hip", cc, 64)``: the CompiledKernel (no GPU needed).
    ``options``: further compile options a launch passes (e.g. ``enable_fp_fusion=False``); for
    HIP those a HIP launch passes (``rome.launch.target_options``: no ``maxnreg``), and every
    pointer ``tt.pointer_range=32`` as a HIP launch marks a tensor within 2 GiB (buffer ops)."""
    import triton
    from triton.backends.compiler import GPUTarget

    if isinstance(cc, str):
        from rome.launch import target_options

        src = ast_source(fn, signature, constexprs, divisible_by_16, pointer_range_32=_amd_buffer_ops())
        target, options = GPUTarget("hip", cc, AMD_ARCHS[cc].wave_size), target_options(options, "hip")
    else:
        src = ast_source(fn, signature, constexprs, divisible_by_16)
        target = GPUTarget("cuda", cc, 32)
    return triton.compile(src, target=target, options={"num_warps": num_warps, "num_stages": num_stages, **options})


def cached_cubin(kernel, suffix: str = "cubin") -> str | None:
    """Path of ``kernel``'s cubin (``suffix="hsaco"``: AMD code object) in Triton's cache (None for
    a cache that is not a local folder)."""
    from triton.runtime.cache import get_cache_manager

    getter = getattr(get_cache_manager(kernel.hash), "get_file", None)
    return getter(f"{kernel.metadata.name}.{suffix}") if getter else None


def _amd_buffer_ops() -> bool:
    """Whether a HIP launch here would mark tensors within 2 GiB for buffer ops (Triton's knob)."""
    try:
        from triton import knobs

        return bool(knobs.amd.use_buffer_ops)
    except (ImportError, AttributeError):
        return True


# --- one configuration on one arch --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Job:
    """A picklable compile request: the kernel by module and name, the rest as the config gives it."""

    module: str
    fn_name: str
    signature: tuple
    constexprs: tuple
    divisible_by_16: tuple
    num_warps: int
    num_stages: int
    options: tuple
    cc: int | str  # an NVIDIA compute capability, or an AMD arch name ("gfx942")
    sass: bool = True  # NVIDIA: dump and read the SASS (cuobjdump -sass: ~0.7-1.2 s a build)

    @classmethod
    def of(cls, cfg, cc: int | str, sass: bool = True) -> "Job":
        py = getattr(cfg.fn, "fn", cfg.fn)  # the Python function under a JIT or interpreter wrapper
        return cls(py.__module__, py.__name__, tuple(sorted(cfg.signature.items())),
                   tuple(sorted(cfg.constexprs.items())), tuple(sorted(cfg.divisible_by_16)),
                   cfg.num_warps, cfg.num_stages, tuple(sorted(getattr(cfg, "options", {}).items())), cc, sass)

    def run(self) -> dict:
        """Compile and read the cubin: a dict of numbers, the cubin and its SASS (without ``sass``:
        the resource usage alone, SASS and its statistics None; for an AMD arch: the code
        object's metadata, the hsaco and its amdgcn)."""
        fn = jit_function(getattr(importlib.import_module(self.module), self.fn_name))
        t0 = time.perf_counter()
        kernel = compile_kernel(fn, dict(self.signature), dict(self.constexprs), self.divisible_by_16,
                                cc=self.cc, num_warps=self.num_warps, num_stages=self.num_stages,
                                **dict(self.options))
        seconds = time.perf_counter() - t0
        if isinstance(self.cc, str):
            md = kernel.metadata
            return {"compile_s": seconds, "triton_hash": kernel.hash, "cache_cubin": cached_cubin(kernel, "hsaco"),
                    "kernel_name": md.name, "shared_dynamic": md.shared, "num_warps": md.num_warps,
                    "num_stages": md.num_stages, "amd": read_amdgcn(kernel.asm["amdgcn"], md.name),
                    "cubin": kernel.asm["hsaco"], "sass": kernel.asm["amdgcn"]}
        cubin = kernel.asm["cubin"]
        md = kernel.metadata
        sass = run_cuobjdump("-sass", cubin) if self.sass else None
        # the kernel's parameters in order (the constexprs, and ints specialised to 1, are not
        # parameters): where the schedule finds each in constant bank 0
        signature, constexprs = dict(self.signature), dict(self.constexprs)
        params = [(n, signature[n]) for n in fn.arg_names if n not in constexprs and n in signature]
        return {"compile_s": seconds, "triton_hash": kernel.hash, "cache_cubin": cached_cubin(kernel),
                "kernel_name": md.name, "shared_dynamic": md.shared, "num_warps": md.num_warps,
                "num_stages": md.num_stages, "res": res_usage(cubin, md.name),
                "sass_stats": read_sass(sass) if sass is not None else None,
                "cubin": cubin, "sass": sass, "params": params}


def _run_job(job: Job) -> dict:
    try:
        return job.run()
    except Exception as e:  # one config that fails to compile is a row with its error
        return {"error": f"{type(e).__name__}: {e}".strip()[-2000:]}


def compile_all(pool, jobs, on_done=None) -> dict:
    """Each distinct compile job run once in ``pool``: ``{job: result}``; ``on_done(i, n)``."""
    unique = list(dict.fromkeys(jobs))
    futures = {pool.submit(_run_job, job): job for job in unique}
    results = {}
    for i, fut in enumerate(cf.as_completed(futures)):
        results[futures[fut]] = fut.result()
        if on_done:
            on_done(i + 1, len(unique))
    return results


# --- where a build was made, and its files ----------------------------------------------


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


def environment() -> dict:
    import triton

    try:
        version = subprocess.run([cuobjdump(), "--version"], capture_output=True, text=True).stdout
        version = re.search(r"release ([\d.]+)", version).group(1)
    except Exception:
        version = None
    return {"triton": triton.__version__, "cuobjdump": version, "python": sys.version.split()[0],
            "cache_dir": _cache_dir(), "ast_source_api": "constexprs+attrs" if _new_ast_source_api() else
            "constants+AttrsDescriptor", "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            **_git_state()}


def _git_state() -> dict:
    """The commit the kernel was compiled from and whether rome/ differed from it (uncommitted)."""
    root = Path(__file__).resolve().parents[2]
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True, check=True).stdout
        return {"commit": run("rev-parse", "HEAD").strip(),
                "rome_uncommitted": sorted(line[3:] for line in run("status", "--porcelain", "--", "rome").splitlines())}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "rome_uncommitted": None}


def _cache_dir() -> str:
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")


def json_safe(obj):
    return json.loads(json.dumps(obj, default=str))
