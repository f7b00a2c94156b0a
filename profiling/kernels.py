"""``python -m profiling kernels [--arch sm_80,sm_90,sm_100] [--out DIR] [--jobs N]``: the GPU kernel
compiled ahead of time for NVIDIA architectures, on any machine (no GPU needed), and its cubins read.

For every configuration the launcher can choose (``rome.launch.kernel_configs(arch)``) and every
arch, ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` builds the cubin with the
specialisation a real launch gets: ``tt.divisibility=16`` on the pointers and ints the config marks
divisible by 16, runtime ints equal to 1 as constants, the constexprs, num_warps and num_stages.
``triton.compile`` keeps the result in Triton's own cache (``TRITON_CACHE_DIR``, else
``~/.triton/cache``), under the same key a launch with those argument properties computes.

The wheel's ``cuobjdump`` then reads each cubin:

- ``-res-usage``: registers per thread (REG), stack bytes (STACK: spill), static shared memory;
  the dynamic shared memory a launch requests is Triton's ``metadata.shared``.
- ``-sass``: LDL/STL (local memory: spill), global loads/stores by width (``LDG/STG/LDGSTS`` with
  ``.128/.64/.U16/.U8``, 32-bit otherwise), tensor-core (``*MMA``) and fp32 FFMA/FMUL/FADD
  instructions, subroutine calls. The kernel is persistent, one loop iteration per row tile:
  "per tile" counts the instructions inside the tile loop, i.e. the outermost backward branch of
  the main body (two such loops when q and k share the launch: the mean of the two), without
  the bodies of subroutines called from it (``calls/tile`` counts those calls). "bytes issued per
  tile" is what the tile loop's global loads/stores move with every lane active
  (width × 32 lanes × warps), beside the config's own ``bytes_per_tile``.
- occupancy per arch from registers, shared memory and warps, as CUDA's occupancy calculator
  (``cuda_occupancy.h``) does it: registers allocated per warp in units of 256 and split over 4
  sub-partitions of 16K, shared memory per block + 1 KB reserved in units of 128 bytes; per-arch
  limits from NVIDIA CCCL's ``arch_traits`` (the CUDA programming guide's table).

The compile must not see ``TRITON_INTERPRET=1``: a process that imported triton under it holds
interpreter stand-ins for every ``@triton.jit`` function (triton's own ``tl.cdiv`` included) and
cannot compile. Compiles therefore run in spawned worker processes whose environment says
``TRITON_INTERPRET=0`` from the start (``compiler_pool``), so the tool works from any process, the
CPU test suite included.
"""

from __future__ import annotations

import argparse
import collections
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
import tempfile
import time
from pathlib import Path

# --- per-arch limits ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arch:
    """Per-SM limits of one compute capability (NVIDIA CCCL ``cuda/__device/arch_traits.h``)."""

    cc: int
    smem_per_sm: int  # bytes of shared memory per SM (the largest carveout)
    max_ctas: int  # resident blocks per SM
    max_warps: int  # resident warps per SM
    regs_per_sm: int = 64 * 1024  # 32-bit registers per SM, every arch here
    max_regs_per_thread: int = 255
    reserved_smem: int = 1024  # the driver's per-block reservation, sm_80 on

    @property
    def name(self) -> str:
        return f"sm_{self.cc}"

    @property
    def smem_per_block(self) -> int:
        """Largest shared memory one block may opt in to."""
        return self.smem_per_sm - self.reserved_smem


ARCHS = {a.cc: a for a in (
    Arch(80, 164 * 1024, 32, 64),   # A100
    Arch(86, 100 * 1024, 16, 48),   # RTX 30xx, A10, A40
    Arch(89, 100 * 1024, 24, 48),   # L4, L40, RTX 40xx
    Arch(90, 228 * 1024, 32, 64),   # H100, H200
    Arch(100, 228 * 1024, 32, 64),  # B200
    Arch(120, 100 * 1024, 24, 48),  # RTX 50xx
)}
DEFAULT_ARCHS = (80, 90, 100)
PROJECT_SMEM_LIMIT = 99 * 1024  # the project's target: fit the smallest per-block limit (sm_86/89)
REG_ALLOC_UNIT = 256  # registers, per warp
REG_SUB_PARTITIONS = 4
SMEM_ALLOC_UNIT = 128  # bytes


def parse_arch(text: str) -> int:
    """``"sm_90"``, ``"sm90"``, ``"90"`` or ``"9.0"`` -> 90; only archs in ``ARCHS``."""
    t = text.strip().lower().removeprefix("sm_").removeprefix("sm").rstrip("a")
    cc = int(t.replace(".", "")) if t.replace(".", "").isdigit() else None
    if cc not in ARCHS:
        raise ValueError(f"unknown arch {text!r}: expected one of {', '.join(a.name for a in ARCHS.values())}")
    return cc


def occupancy(arch: Arch, regs: int, smem: int, num_warps: int) -> dict:
    """Resident CTAs and warps per SM for ``num_warps``-warp blocks using ``regs`` registers per
    thread and ``smem`` bytes of shared memory per block (static + dynamic), and what limits it."""
    regs_warp = -(-regs * 32 // REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    warps_alloc = -(-num_warps // REG_SUB_PARTITIONS) * REG_SUB_PARTITIONS
    if regs > arch.max_regs_per_thread or regs_warp * warps_alloc > arch.regs_per_sm:
        by_regs = 0
    elif regs_warp == 0:
        by_regs = arch.max_ctas
    else:
        per_partition = arch.regs_per_sm // REG_SUB_PARTITIONS // regs_warp
        by_regs = per_partition * REG_SUB_PARTITIONS // num_warps
    smem_alloc = -(-(smem + arch.reserved_smem) // SMEM_ALLOC_UNIT) * SMEM_ALLOC_UNIT
    by_smem = 0 if smem > arch.smem_per_block else arch.smem_per_sm // smem_alloc
    limits = {"registers": by_regs, "shared memory": by_smem, "warps": arch.max_warps // num_warps,
              "blocks": arch.max_ctas}
    ctas = min(limits.values())
    return {"ctas_per_sm": ctas, "warps_per_sm": ctas * num_warps,
            "limited_by": ", ".join(k for k, v in limits.items() if v == ctas),
            "ctas_by": limits}


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


def ast_source(fn, signature: dict, constexprs: dict, divisible_by_16=()):
    """The ``ASTSource`` a launch compiles for arguments with these properties.

    ``signature``: every runtime argument -> Triton type (``"*bf16"``, ``"i32"``, ...);
    ``constexprs``: the ``tl.constexpr`` arguments, and runtime ints equal to 1 (which the JIT
    turns into constants); ``divisible_by_16``: argument names marked ``tt.divisibility=16``
    (pointers 16-byte aligned, ints multiples of 16), as the JIT marks them.
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
            elif _triton_version() >= (3, 7):
                attrs[(i,)] = []
            elif isinstance(constexprs[n], str):
                attrs[(i,)] = BaseBackend.parse_attr(constexprs[n])
        return ASTSource(fn, sig, consts, attrs)
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


def compile_kernel(fn, signature, constexprs, divisible_by_16, *, cc: int, num_warps: int, num_stages: int,
                   **options):
    """``triton.compile`` for ``GPUTarget("cuda", cc, 32)``: the CompiledKernel (no GPU needed).
    ``options``: further compile options a launch passes (e.g. ``enable_fp_fusion=False``)."""
    import triton
    from triton.backends.compiler import GPUTarget

    src = ast_source(fn, signature, constexprs, divisible_by_16)
    return triton.compile(src, target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages, **options})


def cached_cubin(kernel) -> str | None:
    """Path of ``kernel``'s cubin in Triton's cache (None for a cache that is not a local folder)."""
    from triton.runtime.cache import get_cache_manager

    getter = getattr(get_cache_manager(kernel.hash), "get_file", None)
    return getter(f"{kernel.metadata.name}.cubin") if getter else None


# --- reading a cubin ----------------------------------------------------------------------


def cuobjdump() -> str:
    """The cuobjdump that ships with Triton (``TRITON_CUOBJDUMP_PATH`` overrides)."""
    from triton.tools.disasm import path_to_cuobjdump

    path = path_to_cuobjdump()
    return path[0] if isinstance(path, tuple) else path  # triton < 3.4 returns (path, version)


def _cuobjdump(flag: str, cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([cuobjdump(), flag, str(path)], capture_output=True, text=True, check=True).stdout


def res_usage(cubin: bytes, name: str | None = None) -> dict:
    """``cuobjdump -res-usage``: REG, STACK, SHARED (static), LOCAL of the kernel ``name``."""
    found = {}
    current = None
    for line in _cuobjdump("-res-usage", cubin).splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            current = m.group(1)
        elif current and "REG:" in line:
            found[current] = {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
    if not found:
        raise RuntimeError("cuobjdump -res-usage reported no function")
    return found.get(name) or next(iter(found.values()))


_SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_\w+):")
_WIDTH = {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}
_GLOBAL = {"LDG": "load", "LDGSTS": "load", "STG": "store"}
_TMA = {"UTMALDG", "UTMASTG", "UBLKCP", "UTMAPF", "UTMAREDG"}


def mma_macs(opcode: str) -> float | None:
    """Multiply-adds one warp's share of a tensor-core instruction does, from its shape:
    ``HMMA.16816`` is m16 n8 k16 per warp, ``HGMMA.64x64x16`` m64 n64 k16 per warpgroup (4 warps);
    None where the opcode carries no shape (sm_100's ``UTC*MMA``)."""
    parts = opcode.split(".")
    for p in parts[1:]:
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", p)
        if m:  # warpgroup MMA
            return int(m.group(1)) * int(m.group(2)) * int(m.group(3)) / 4
        m = re.fullmatch(r"(16)(8)(8|16|32)", p) or re.fullmatch(r"(8)(8)(4|16|32)", p)
        if m:
            return int(m.group(1)) * int(m.group(2)) * int(m.group(3))
    return None


@dataclasses.dataclass
class Instr:
    addr: int
    pred: str
    opcode: str
    operands: str

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]


def parse_sass(text: str) -> list[Instr]:
    """Instructions of a ``cuobjdump -sass`` listing (one kernel), in address order."""
    out = []
    for line in text.splitlines():
        m = _SASS_LINE.match(line)
        if m:
            out.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return out


def _branch_target(ins: Instr, labels: dict) -> int | None:
    if not ins.base.startswith("BRA"):
        return None
    m = re.search(r"0x([0-9a-f]+)", ins.operands)
    if m:
        return int(m.group(1), 16)
    m = re.search(r"(\.L_\w+)", ins.operands)
    return labels.get(m.group(1)) if m else None


def _labels(text: str) -> dict:
    labels, pending = {}, []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
        elif pending and _SASS_LINE.match(line):
            labels.update({p: int(_SASS_LINE.match(line).group(1), 16) for p in pending})
            pending = []
    return labels


def _call_target(ins: Instr) -> int | None:
    m = re.search(r"0x([0-9a-f]+)", ins.operands) if ins.base == "CALL" else None
    return int(m.group(1), 16) if m else None


def subroutines(instrs: list[Instr]) -> list[tuple[int, int]]:
    """Address ranges of called subroutines: from a CALL target to the first RET after it, with
    no EXIT between (ptxas also CALLs into the kernel's own code as a predicated jump)."""
    out = []
    for t in sorted({a for a in map(_call_target, instrs) if a is not None}):
        after = [i for i in instrs if i.addr >= t and i.base in ("RET", "EXIT")]
        if after and after[0].base == "RET":
            out.append((t, after[0].addr))
    return out


def tile_loops(text: str, instrs: list[Instr] | None = None) -> list[tuple[int, int]]:
    """Address ranges ``[start, end]`` of the outermost loops of the kernel's own code: a
    backward branch from ``end`` to ``start``, outside subroutines."""
    instrs = parse_sass(text) if instrs is None else instrs
    labels, subs = _labels(text), subroutines(instrs)
    loops = []
    for ins in instrs:
        target = _branch_target(ins, labels)
        if target is not None and target < ins.addr and not any(a <= ins.addr <= b for a, b in subs):
            loops.append((target, ins.addr))
    return [(s, e) for s, e in loops if not any(s2 <= s and e <= e2 and (s2, e2) != (s, e) for s2, e2 in loops)]


def _count(instrs, sub_starts=frozenset()) -> dict:
    """Instruction classes of interest in ``instrs`` (``sub_starts``: subroutine addresses)."""
    c = {"instructions": 0, "global_load": collections.Counter(), "global_store": collections.Counter(),
         "tma": 0, "local": 0, "mma": 0, "mma_macs_per_warp": 0, "fp32": 0, "calls": 0, "shared": 0, "barriers": 0,
         "global_bytes_per_thread": 0}
    for ins in instrs:
        base = ins.base
        c["instructions"] += 1
        if base in _GLOBAL:
            parts = ins.opcode.split(".")[1:]
            width = next((_WIDTH[p] for p in parts if p in _WIDTH), 32)
            c["global_" + _GLOBAL[base]][width] += 1
            c["global_bytes_per_thread"] += width // 8
        elif base in _TMA:
            c["tma"] += 1
        elif base in ("LDL", "STL"):
            c["local"] += 1
        elif "MMA" in base:
            c["mma"] += 1
            macs = mma_macs(ins.opcode)
            c["mma_macs_per_warp"] = None if macs is None or c["mma_macs_per_warp"] is None else \
                c["mma_macs_per_warp"] + macs
        elif base[:4] in ("FFMA", "FMUL", "FADD"):
            c["fp32"] += 1
        elif base == "CALL" and _call_target(ins) in sub_starts:
            c["calls"] += 1
        elif base in ("LDS", "STS", "LDSM", "STSM"):
            c["shared"] += 1
        elif base.startswith("BAR"):
            c["barriers"] += 1
    return c


def read_sass(text: str) -> dict:
    """Counts over the whole kernel and per tile (the mean over the tile loops)."""
    instrs = parse_sass(text)
    loops = tile_loops(text, instrs)
    starts = frozenset(a for a, _ in subroutines(instrs))
    whole = _count(instrs, starts)
    per_loop = [_count([i for i in instrs if s <= i.addr <= e], starts) for s, e in loops]
    per_tile = None
    if per_loop:
        per_tile = {}
        for key, v in whole.items():
            vals = [p[key] for p in per_loop]
            if any(x is None for x in vals):
                per_tile[key] = None
            elif isinstance(v, collections.Counter):
                keys = sorted(set().union(*vals))
                per_tile[key] = {w: sum(x[w] for x in vals) / len(vals) for w in keys}
            else:
                per_tile[key] = sum(vals) / len(vals)
        per_tile["opcodes"] = dict(collections.Counter(
            i.base for s, e in loops for i in instrs if s <= i.addr <= e).most_common())
        per_tile["opcodes"] = {k: v / len(loops) for k, v in per_tile["opcodes"].items()}
    for part in (whole, per_tile):
        if part:
            for key in ("global_load", "global_store"):
                part[key] = {str(w): n for w, n in sorted(part[key].items(), reverse=True)}
    return {"instructions": whole["instructions"], "tile_loops": [[s, e] for s, e in loops],
            "whole": whole, "per_tile": per_tile}


def strip_encodings(sass: str) -> str:
    """The listing without cuobjdump's ``/* 0x... */`` instruction encodings."""
    lines = (re.sub(r"\s*/\* 0x[0-9a-f]{16} \*/", "", line).rstrip() for line in sass.splitlines())
    return "\n".join(line for line in lines if line) + "\n"


def share_128(counts: dict) -> float | None:
    """Fraction of the global load or store instructions in ``counts`` that move 128 bits."""
    total = sum(counts.values())
    return counts.get("128", 0) / total if total else None


# --- one configuration on one arch --------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Job:
    """A picklable compile request: the kernel by module and name, the rest as the config gives it."""

    module: str
    fn_name: str
    signature: tuple
    constexprs: tuple
    divisible_by_16: tuple
    num_warps: int
    num_stages: int
    options: tuple
    cc: int

    @classmethod
    def of(cls, cfg, cc: int) -> "_Job":
        py = getattr(cfg.fn, "fn", cfg.fn)  # the Python function under a JIT or interpreter wrapper
        return cls(py.__module__, py.__name__, tuple(sorted(cfg.signature.items())),
                   tuple(sorted(cfg.constexprs.items())), tuple(sorted(cfg.divisible_by_16)),
                   cfg.num_warps, cfg.num_stages, tuple(sorted(getattr(cfg, "options", {}).items())), cc)

    def run(self) -> dict:
        """Compile and read the cubin: a dict of numbers, the cubin and its SASS."""
        fn = jit_function(getattr(importlib.import_module(self.module), self.fn_name))
        t0 = time.perf_counter()
        kernel = compile_kernel(fn, dict(self.signature), dict(self.constexprs), self.divisible_by_16,
                                cc=self.cc, num_warps=self.num_warps, num_stages=self.num_stages,
                                **dict(self.options))
        seconds = time.perf_counter() - t0
        cubin = kernel.asm["cubin"]
        md = kernel.metadata
        sass = _cuobjdump("-sass", cubin)
        return {"compile_s": seconds, "triton_hash": kernel.hash, "cache_cubin": cached_cubin(kernel),
                "kernel_name": md.name, "shared_dynamic": md.shared, "num_warps": md.num_warps,
                "num_stages": md.num_stages, "res": res_usage(cubin, md.name), "sass_stats": read_sass(sass),
                "cubin": cubin, "sass": sass}


def _run_job(job: _Job) -> dict:
    try:
        return job.run()
    except Exception as e:  # one config that fails to compile is a row with its error
        return {"error": f"{type(e).__name__}: {e}".strip()[-2000:]}


def row(cfg: dict, arch: Arch, res: dict) -> dict:
    """The report row of config ``cfg`` (a ``_list_configs`` entry) compiled for ``arch``."""
    meta = cfg["meta"]
    r = {"config": cfg["name"], "arch": arch.name, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
         "bytes_per_tile": meta.get("bytes_per_tile"), "meta": meta}
    if "error" in res:
        return r | {"ok": False, "error": res["error"]}
    rs, st = res["res"], res["sass_stats"]
    smem = res["shared_dynamic"] + rs["shared"]
    tile = st["per_tile"] or {}
    r |= {
        "ok": True, "error": None, "registers": rs["reg"], "stack_bytes": rs["stack"], "local_bytes": rs["local"],
        "local_instructions": st["whole"]["local"], "shared_dynamic": res["shared_dynamic"],
        "shared_static": rs["shared"], "shared_bytes": smem, "fits_arch_smem": smem <= arch.smem_per_block,
        "fits_99kb": smem <= PROJECT_SMEM_LIMIT, "spills": rs["stack"] > 0 or st["whole"]["local"] > 0,
        **occupancy(arch, rs["reg"], smem, res["num_warps"]),
        "tile_loops": len(st["tile_loops"]),
        "ld128_share": share_128(tile["global_load"]) if tile else None,
        "st128_share": share_128(tile["global_store"]) if tile else None,
        "mma_per_tile": tile.get("mma"),
        "mma_macs_per_tile": tile["mma_macs_per_warp"] * res["num_warps"]
        if tile.get("mma_macs_per_warp") is not None else None,
        "fp32_per_tile": tile.get("fp32"), "calls_per_tile": tile.get("calls"),
        "instructions_per_tile": tile.get("instructions"),
        "bytes_issued_per_tile": tile["global_bytes_per_thread"] * 32 * res["num_warps"] if tile else None,
        "sass": st, "compile_s": res["compile_s"], "triton_hash": res["triton_hash"],
        "cache_cubin": res["cache_cubin"],
    }
    return r


# --- every configuration ------------------------------------------------------------------

DEFAULT_CONFIGS = "profiling.kernels:configs"


def configs(cc: int | None = None) -> list:
    """``rome.launch.kernel_configs(cc)``: every configuration the launcher can choose."""
    from rome.launch import kernel_configs

    return kernel_configs(cc)


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    if not name:
        raise ValueError(f"configs: expected MODULE:FUNCTION, got {ref!r}")
    return getattr(importlib.import_module(module), name)


def _list_configs(ref: str, cc: int) -> list[dict]:
    """In a worker: the configs ``ref(cc)`` lists, as picklable dicts with their compile jobs."""
    return [{"name": c.name, "meta": dict(c.meta), "num_warps": c.num_warps, "num_stages": c.num_stages,
             "job": _Job.of(c, cc)} for c in _resolve(ref)(cc)]


def inspect_kernels(archs=DEFAULT_ARCHS, *, jobs: int | None = None, configs_ref: str = DEFAULT_CONFIGS,
                    on_done=None, pool: cf.ProcessPoolExecutor | None = None):
    """Compile every config for every arch in ``jobs`` worker processes and read the cubins.

    ``configs_ref``: ``"module:function"``, ``function(cc)`` listing KernelConfigs (it runs in a
    worker, as the kernel must not be an interpreter object). Returns ``(rows, files)``: one row
    per (config, arch), and per row its cubin and SASS text (identical compiles run once).
    ``on_done(n_done, n_total)`` reports progress. ``pool``: a ``start_compiler_pool`` pool to
    use (and shut down when done) instead of starting ``jobs`` workers.
    """
    with pool if pool is not None else compiler_pool(jobs or os.cpu_count() or 1) as pool:
        listed = dict(zip(archs, pool.map(_list_configs, [configs_ref] * len(archs), archs)))
        plan = [(cfg, ARCHS[cc]) for cc in archs for cfg in listed[cc]]
        unique = list(dict.fromkeys(cfg["job"] for cfg, _ in plan))
        futures = {pool.submit(_run_job, job): job for job in unique}
        results = {}
        for i, fut in enumerate(cf.as_completed(futures)):
            results[futures[fut]] = fut.result()
            if on_done:
                on_done(i + 1, len(unique))
    rows, files = [], []
    for cfg, arch in plan:
        res = results[cfg["job"]]
        rows.append(row(cfg, arch, res))
        files.append((res.get("cubin"), res.get("sass")))
    return rows, files


def _slug(text: str) -> str:
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
            "constants+AttrsDescriptor", "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def _cache_dir() -> str:
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")


METHOD = (
    "Each configuration `rome.launch.kernel_configs(arch)` lists is compiled ahead of time with "
    "`triton.compile(ASTSource(...), target=GPUTarget('cuda', cc, 32))` and the specialisation a "
    "launch gets (tt.divisibility=16 on 16-byte-aligned pointers and ints divisible by 16, ints equal "
    "to 1 as constants); cuobjdump (shipped with Triton) reads the cubin. Shared memory = Triton's "
    "dynamic shared memory + the cubin's static shared memory. CTAs/warps per SM from registers, "
    "shared memory (+1 KB reserved per block) and the arch's warp and block limits, as CUDA's "
    "occupancy calculator does. Per tile = instructions inside the persistent tile loop (the mean of "
    "the q and k loops when both share the launch), called subroutines not included; MMA MACs = the "
    "multiply-adds of the tile loop's tensor-core instructions, from their shapes (HMMA.16816 per warp, "
    "HGMMA.64xNx16 per warpgroup), all warps together; FP32 = FFMA/FMUL/FADD instructions per thread; 128-bit % = "
    "share of the loop's global load (LDG, LDGSTS) and store (STG) instructions that move 128 bits; "
    "bytes issued = those instructions' widths x 32 lanes x warps, every lane active; bytes/tile = the "
    "config's own count of the global bytes one tile moves."
)


def collect(archs=DEFAULT_ARCHS, out: Path | None = None, *, jobs: int | None = None,
            configs_ref: str = DEFAULT_CONFIGS, on_done=None) -> dict:
    """Inspect every config for ``archs``; write cubins and SASS under ``out`` if given.

    Returns the ``kernels`` section of results.json: environment, arch limits, method, rows.
    """
    t0 = time.perf_counter()
    rows, files = inspect_kernels(archs, jobs=jobs, configs_ref=configs_ref, on_done=on_done)
    wall = time.perf_counter() - t0
    if out is not None:
        written = {}  # identical compiles (same Triton hash) share their files
        for r, (cubin, sass) in zip(rows, files):
            if cubin is None:
                continue
            key = (r["arch"], r["triton_hash"])
            if key not in written:
                stem = Path(r["arch"]) / _slug(r["config"])
                (Path(out) / r["arch"]).mkdir(parents=True, exist_ok=True)
                (Path(out) / stem).with_suffix(".cubin").write_bytes(cubin)
                (Path(out) / stem).with_suffix(".sass").write_text(strip_encodings(sass))
                written[key] = [str(stem.with_suffix(".cubin")), str(stem.with_suffix(".sass"))]
            r["files"] = written[key]
    return _json_safe({"environment": environment(), "method": METHOD, "wall_s": wall,
            "archs": {ARCHS[cc].name: dataclasses.asdict(ARCHS[cc]) | {"smem_per_block": ARCHS[cc].smem_per_block}
                      for cc in archs},
            "project_smem_limit": PROJECT_SMEM_LIMIT, "rows": rows})


def _json_safe(obj):
    return json.loads(json.dumps(obj, default=str))


# --- output -------------------------------------------------------------------------------

COLUMNS = [  # (header, key, format)
    ("config", "config", ""), ("regs", "registers", "d"), ("stack B", "stack_bytes", "d"),
    ("LDL/STL", "local_instructions", "d"), ("smem B", "shared_bytes", "d"), ("≤ 99 KB", "fits_99kb", ""),
    ("CTAs/SM", "ctas_per_sm", "d"), ("warps/SM", "warps_per_sm", "d"), ("limited by", "limited_by", ""),
    ("ld 128-bit", "ld128_share", "%"), ("st 128-bit", "st128_share", "%"), ("MMA/tile", "mma_per_tile", "n"),
    ("MMA MACs/tile", "mma_macs_per_tile", "n"), ("FP32/tile", "fp32_per_tile", "n"),
    ("calls/tile", "calls_per_tile", "n"), ("bytes/tile", "bytes_per_tile", "n"),
    ("bytes issued/tile", "bytes_issued_per_tile", "n"),
]


def _cell(v, fmt: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if fmt == "%":
        return f"{100 * v:.0f}%"
    if fmt in ("d", "n"):
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"
    return str(v)


def markdown(section: dict, heading: str = "##") -> str:
    """The kernels table(s), one per arch, as markdown."""
    env = section["environment"]
    lines = [f"{heading} Kernels (compiled ahead of time, no GPU needed)", "",
             f"triton {env['triton']}, cuobjdump {env['cuobjdump']}, {len(section['rows'])} rows in "
             f"{section['wall_s']:.0f} s. " + section["method"], ""]
    for name, limits in section["archs"].items():
        rows = [r for r in section["rows"] if r["arch"] == name]
        lines += [f"{heading}# {name}", "",
                  f"Limits: {limits['regs_per_sm'] // 1024}K registers, {limits['smem_per_sm'] // 1024} KB shared "
                  f"memory per SM ({limits['smem_per_block'] // 1024} KB per block), {limits['max_warps']} warps, "
                  f"{limits['max_ctas']} blocks per SM.", "",
                  "| " + " | ".join(h for h, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for r in rows:
            if not r["ok"]:
                error = " ".join(r["error"].split()).replace("|", "/")[:300]
                lines.append(f"| {r['config']} | compile failed: {error} |" + " |" * (len(COLUMNS) - 2))
                continue
            lines.append("| " + " | ".join(_cell(r.get(k), f) for _, k, f in COLUMNS) + " |")
        lines.append("")
    return "\n".join(lines)


def kernels_section(results: dict) -> str:
    """The report's kernels section (markdown) from ``results["kernels"]``; empty if absent."""
    section = results.get("kernels")
    if not section:
        return ""
    if "error" in section:
        return f"## Kernels (compiled ahead of time)\n\nNot measured: {section['error']}\n"
    return markdown(section)


def report_section(out: Path, arch: str | None = None, console=None) -> dict:
    """results.json's ``kernels`` section for ``make report`` (cubins and SASS under ``out``,
    ``arch`` as ``--arch`` takes it); a failure is recorded in the section, not raised."""
    try:
        archs = [parse_arch(a) for a in arch.split(",")] if arch else list(DEFAULT_ARCHS)
        if console is not None:
            console.print(f"compiling the kernel ahead of time for {', '.join(ARCHS[c].name for c in archs)} "
                          "(Triton's cache makes a second run quick)")
        return collect(archs, out)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def write(out: Path, section: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(section, indent=1, default=str))
    (out / "kernels.md").write_text("# rome kernels\n\n" + markdown(section, heading="##"))


def main(args) -> Path:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    archs = [parse_arch(a) for a in args.arch.split(",")] if args.arch else list(DEFAULT_ARCHS)
    out = Path(args.out or f"reports/kernels-{dt.datetime.now():%Y%m%d-%H%M%S}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=220)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("compiling", total=None)
        section = collect(archs, out, jobs=args.jobs, configs_ref=args.configs or DEFAULT_CONFIGS,
                          on_done=lambda i, n: progress.update(task, completed=i, total=n,
                                                               description=f"compiled {i}/{n}"))
    write(out, section)
    cols = [c for c in COLUMNS if c[1] not in ("fits_99kb", "limited_by", "bytes_per_tile", "calls_per_tile")]
    for name in section["archs"]:
        table = Table(title=f"{name} (triton {section['environment']['triton']})")
        for h, _, _ in cols:
            table.add_column(h, no_wrap=h == "config")
        for r in (r for r in section["rows"] if r["arch"] == name):
            table.add_row(*([_cell(r.get(k), f) for _, k, f in cols] if r["ok"]
                            else [r["config"], f"[red]{r['error'][-200:]}[/]"] + [""] * (len(cols) - 2)))
        console.print(table)
    console.print(f"{len(section['rows'])} rows in {section['wall_s']:.0f} s; cubins and SASS under {out}, "
                  f"the full table in {out / 'kernels.md'}; Triton's cache: {section['environment']['cache_dir']}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", help=f"comma-separated archs (default {','.join(ARCHS[c].name for c in DEFAULT_ARCHS)}; "
                                  f"known: {','.join(a.name for a in ARCHS.values())})")
    p.add_argument("--out", help="output folder (default reports/kernels-<timestamp>/)")
    p.add_argument("--jobs", type=int, help="compile processes (default: one per CPU)")
    p.add_argument("--configs", help="MODULE:FUNCTION listing the KernelConfigs of an arch "
                                     "(default: rome.launch.kernel_configs)")
