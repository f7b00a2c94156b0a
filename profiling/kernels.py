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
import math
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


def parse_arch(text: str) -> int | str:
    """``"sm_90"``, ``"sm90"``, ``"90"`` or ``"9.0"`` -> 90; only archs in ``ARCHS``. An AMD arch
    (``"gfx942"``, ``"gfx942:sramecc+:xnack-"``) -> its name, only archs in ``AMD_ARCHS``."""
    t = text.strip().lower()
    if t.startswith("gfx"):
        name = t.split(":")[0]
        if name not in AMD_ARCHS:
            raise ValueError(f"unknown arch {text!r}: expected one of {', '.join(AMD_ARCHS)}")
        return name
    t = t.removeprefix("sm_").removeprefix("sm").rstrip("a")
    cc = int(t.replace(".", "")) if t.replace(".", "").isdigit() else None
    if cc not in ARCHS:
        raise ValueError(f"unknown arch {text!r}: expected one of "
                         f"{', '.join([a.name for a in ARCHS.values()] + list(AMD_ARCHS))}")
    return cc


def arch_of(cc: int | str):
    """The ``Arch`` (NVIDIA, int compute capability) or ``AmdArch`` (name) of ``cc``."""
    return AMD_ARCHS[cc] if isinstance(cc, str) else ARCHS[cc]


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


# --- a static bandwidth model -------------------------------------------------------------
#
# From a cubin's SASS, one tile of the kernel (one iteration of the innermost loop of the kernel's
# own code that stores to global memory), what each on-chip path allows in DRAM bytes per second,
# the estimate being the least of them as a fraction of copy bandwidth. What it reads:
#
# - every global load/store (LDG/STG/LDGSTS) and shared-memory access (LDS/STS/LDSM/STSM), their
#   widths from the opcode (.128/.64/.U16/.U8, 32 bits otherwise; LDSM/STSM .x1/.x2/.x4 move 32,
#   64, 128 bits a thread), as L1 wavefronts: max(1, ceil(32 lanes × width / 128 B)), 128 B each.
#   Assumed: a warp's access touches one 128 B line per 128 B it moves (coalesced, no bank
#   conflicts); scattered accesses cost more, and the model cannot see that.
# - the control bits of each instruction (Volta and later: bits 41-61 of the second 64-bit word of
#   its 128-bit encoding, which cuobjdump prints on the line after the instruction): stall 41-44,
#   yield 45, write scoreboard 46-48 (7: none), read scoreboard 49-51, wait mask 52-57, reuse
#   58-61. A global load sets a write scoreboard; the first instruction that reads its destination
#   has that scoreboard's bit in its wait mask (checked on triton 3.9 sm_90 SASS).
# - the tile's path: its instructions in address order, an unconditional forward branch taken, a
#   conditional one not, inner loops once (their trip count is not in the SASS: a lower bound on
#   the instructions where a tile has inner loops), a called subroutine's body counted where the
#   CALL is.

@dataclasses.dataclass(frozen=True)
class Gpu:
    """What the model assumes of one GPU (sources and assumptions in ``GPU_NOTES``)."""

    name: str
    cc: int
    sms: int
    clock_ghz: float  # SM clock under a memory-bound load
    l1_bytes_per_clk: int  # per SM, the L1/shared-memory data path
    issue_per_clk: int  # warp-instructions issued per clock per SM (4 sub-partitions x 1)
    dram_latency_ns: float  # a global load's round trip to DRAM, loaded
    copy_gbps: float  # what a device-to-device copy reaches (GB/s, 1e9 B/s)
    peak_gbps: float  # the memory's data-sheet peak


GPUS = {g.name: g for g in (
    Gpu("H100", 90, 132, 1.755, 128, 4, 800.0, 3000.0, 3350.0),
    Gpu("H200", 90, 132, 1.755, 128, 4, 800.0, 4300.0, 4800.0),
)}
GPU_NOTES = (
    "H100 SXM5 and H200 SXM: 132 SMs each (both GH100); SM clock 1.755 GHz for both (their boost "
    "clock is 1.98 GHz; a sustained memory-bound kernel runs lower: 1.755 GHz assumed, not measured); "
    "L1/shared-memory path 128 B/clk/SM and 4 warp-instructions issued per clock per SM (one per "
    "sub-partition), from NVIDIA's Hopper tuning guide and microbenchmarks; DRAM latency 800 ns "
    "under load (600-800 ns idle-to-loaded, microbenchmarks: the upper end assumed); copy bandwidth "
    "3.0 TB/s on H100 SXM (HBM3, 3.35 TB/s peak) and 4.3 TB/s on H200 (HBM3e, 4.8 TB/s peak): "
    "assumed, about 90% of peak, until a GPU run measures them (the report's speed section does)."
)
MODEL_METHOD = (
    "One tile = one iteration of the innermost loop of the kernel's own code holding a global store "
    "(else the outermost loop, else the whole kernel), walked in address order: unconditional forward "
    "branches taken, conditional ones not, inner loops once (their trip count is not in the SASS), called "
    "subroutines in place. L1 B/elem: every global (LDG/STG/LDGSTS) and shared-memory (LDS/STS/LDSM/STSM) "
    "access as 128 B L1 wavefronts, max(1, ceil(32 lanes x width / 128 B)), all warps, per x element: a "
    "warp's access is assumed to touch one 128 B line per 128 B it moves (scattered accesses cost more; the "
    "model cannot see that). instr/DRAM B: the tile's warp-instructions / the DRAM bytes its elements must "
    "move (x read and written, tables amortised). Batches: control bits (Volta+ encoding: write scoreboard "
    "bits 46-48, wait mask 52-57 of the second word): the global loads issued before the first instruction "
    "that waits on one of their scoreboards; the loop body walked twice, the second pass measured (a load "
    "of the previous iteration waited on in this one counts). In flight: global-load bytes (width x 32 "
    "lanes) issued and not yet waited on, mean (and peak) over the tile's instructions, x resident warps per "
    "SM. Bounds: L1 = 128 B/clk x clock x SMs / (L1 bytes per DRAM byte); issue = 4 warp-instructions/clk x "
    "clock x SMs / (instructions per DRAM byte); latency (Little's law) = mean in-flight bytes per SM x SMs / "
    "DRAM latency x (DRAM bytes / DRAM bytes read); estimate = min(bounds, copy) / copy. Latency view "
    "(small launches): waves x ceil(units / grid) x batches x DRAM latency. ")
L1_WAVEFRONT = 128  # bytes
_SHARED = {"LDS", "STS", "LDSM", "STSM"}
_NO_SCOREBOARD = 7


def control_bits(word: int) -> dict:
    """The scheduling control bits of a Volta+ instruction from the second (high) 64-bit word of
    its encoding: ``stall`` cycles, ``yield``, ``write``/``read`` scoreboard (None for 7: none),
    ``wait`` (a mask of scoreboards 0-5 waited on before it issues), ``reuse`` (operand cache)."""
    wb, rb = (word >> 46) & 7, (word >> 49) & 7
    return {"stall": (word >> 41) & 15, "yield": (word >> 45) & 1,
            "write": None if wb == _NO_SCOREBOARD else wb, "read": None if rb == _NO_SCOREBOARD else rb,
            "wait": (word >> 52) & 63, "reuse": (word >> 58) & 15}


_HI_WORD = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")


def sass_controls(text: str) -> dict[int, dict]:
    """Address -> ``control_bits`` of every instruction of a ``cuobjdump -sass`` listing that
    kept its encodings (the second word is the ``/* 0x... */`` line after the instruction)."""
    out, pending = {}, None
    for line in text.splitlines():
        m = _SASS_LINE.match(line)
        if m:
            pending = int(m.group(1), 16)
            continue
        h = _HI_WORD.match(line)
        if h and pending is not None:
            out[pending] = control_bits(int(h.group(1), 16))
        pending = None
    return out


def access_bits(ins: Instr) -> int | None:
    """Bits one thread moves in a global or shared-memory access (None: not one)."""
    base, parts = ins.base, ins.opcode.split(".")[1:]
    if base in ("LDSM", "STSM"):  # .x1/.x2/.x4: 8x8 16-bit matrices, one 32-bit register each a thread
        n = next((int(p) for p in reversed(parts) if p in ("1", "2", "4")), 1)
        return 32 * n
    if base in _GLOBAL or base in _SHARED:
        return next((_WIDTH[p] for p in parts if p in _WIDTH), 32)
    return None


def wavefronts(bits: int) -> int:
    """L1 wavefronts (128 B each) one warp's access of ``bits`` a lane takes, coalesced."""
    return max(1, -(-bits * 32 // 8 // L1_WAVEFRONT))


def _all_loops(instrs: list[Instr], labels: dict, subs) -> list[tuple[int, int]]:
    out = []
    for ins in instrs:
        target = _branch_target(ins, labels)
        if target is not None and target < ins.addr and not any(a <= ins.addr <= b for a, b in subs):
            out.append((target, ins.addr))
    return sorted(set(out))


def tile_region(text: str, instrs: list[Instr] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """What one tile is: ``("innermost loop with stores", loops)`` (the innermost loops of the
    kernel's own code that hold a global store; several where q and k have a loop each), else
    ``("outermost loop", tile_loops)``, else ``("whole kernel", [(first, last)])``."""
    instrs = parse_sass(text) if instrs is None else instrs
    labels, subs = _labels(text), subroutines(instrs)
    loops = _all_loops(instrs, labels, subs)
    stores = [i.addr for i in instrs if i.base == "STG" and not any(a <= i.addr <= b for a, b in subs)]
    with_stores = [(s, e) for s, e in loops if any(s <= a <= e for a in stores)]
    inner = [(s, e) for s, e in with_stores
             if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in with_stores)]
    if inner:
        return "innermost loop with stores", inner
    outer = tile_loops(text, instrs)
    if outer:
        return "outermost loop", outer
    return "whole kernel", [(instrs[0].addr, instrs[-1].addr)] if instrs else []


def tile_path(instrs: list[Instr], labels: dict, subs, start: int, end: int) -> tuple[list[Instr], int]:
    """The instructions one iteration of the loop ``[start, end]`` issues, in order: unconditional
    forward branches taken, conditional ones not, inner loops once, a called subroutine's body in
    place of the CALL (in address order, up to its RET). Also returns how many inner loops it
    passed through (each counted once)."""
    index = {ins.addr: n for n, ins in enumerate(instrs)}
    sub_body = {a: [i for i in instrs if a <= i.addr <= b] for a, b in subs}
    path, inner, n = [], 0, index.get(start)
    steps = 0
    while n is not None and n < len(instrs) and instrs[n].addr <= end and steps < 100_000:
        ins, steps = instrs[n], steps + 1
        path.append(ins)
        if ins.base == "CALL" and _call_target(ins) in sub_body:
            path.extend(sub_body[_call_target(ins)])
        always = ins.pred in ("", "@PT")
        target = _branch_target(ins, labels)
        if ins.addr == end or (ins.base == "EXIT" and always):
            break
        if target is not None and target < ins.addr:
            inner += 1  # an inner loop's closing branch: fall through (once)
        elif target is not None and always:
            if target > end:
                break
            n = index.get(target)
            continue
        n += 1
    return path, inner


def _depbar(ins: Instr) -> tuple[int, int] | None:
    """``DEPBAR.LE SBk, N`` -> (k, N)."""
    if ins.base != "DEPBAR":
        return None
    m = re.search(r"SB(\d)\s*,\s*(0x[0-9a-f]+|\d+)", ins.operands)
    return (int(m.group(1)), int(m.group(2), 0)) if m else None


def load_batches(path: list[Instr], controls: dict[int, dict], passes: int = 2) -> dict:
    """Walk ``path`` (one tile's instructions) ``passes`` times and measure the last pass.

    A global load (LDG) waits on nothing until an instruction's wait mask names its write
    scoreboard (every load on that scoreboard is then complete); an async copy (LDGSTS) joins the
    open group that LDGDEPBAR commits, complete when ``DEPBAR.LE SB0, N`` leaves fewer than its
    place. A batch: the global loads issued before the first instruction that waits on any of
    them; ``batches`` counts those the last pass closes (loads of the previous pass waited on in
    this one count here: a register prefetch across iterations); 1 where the pass loads but waits
    inside the tile on none. In flight: bytes of global loads one warp has issued (width x 32
    lanes) and not yet waited on, after each instruction: peak and mean over the last pass.
    """
    pending = []  # [scoreboard, bytes, batch]
    open_group, groups = [], []  # async copies: uncommitted [bytes, batch], committed groups
    batch, closed, loads, peak, total, count = 0, 0, 0, 0, 0, 0
    for p in range(passes):
        last = p == passes - 1
        for ins in path:
            c = controls.get(ins.addr) or {}
            done = []
            mask = c.get("wait", 0)
            if mask:
                done += [e for e in pending if mask >> e[0] & 1]
                pending = [e for e in pending if not mask >> e[0] & 1]
            dep = _depbar(ins)
            if dep is not None:
                sb, keep = dep
                if sb == 0 and len(groups) > keep:
                    for g in groups[:len(groups) - keep]:
                        done += g
                    groups = groups[len(groups) - keep:]
                on_sb = [e for e in pending if e[0] == sb]
                if len(on_sb) > keep:  # a counting wait on ordinary loads: the oldest complete
                    gone = on_sb[:len(on_sb) - keep]
                    done += gone
                    pending = [e for e in pending if not any(e is g for g in gone)]
            if any(e[-1] == batch for e in done):
                batch += 1
                closed += last
            bits = access_bits(ins)
            if ins.base == "LDG":
                loads += last
                if c.get("write") is not None:
                    pending.append([c["write"], bits * 32 // 8, batch])
            elif ins.base == "LDGSTS":
                loads += last
                open_group.append([None, bits * 32 // 8, batch])
            elif ins.base == "LDGDEPBAR":
                groups.append(open_group)
                open_group = []
            if last:
                now = sum(e[1] for e in pending) + sum(e[1] for g in groups for e in g) + \
                    sum(e[1] for e in open_group)
                peak, total, count = max(peak, now), total + now, count + 1
    return {"batches": closed or (1 if loads else 0), "global_loads": loads,
            "inflight_peak_bytes_per_warp": peak, "inflight_mean_bytes_per_warp": total / count if count else 0.0}


def tile_figures(text: str) -> dict:
    """Per-warp figures of one tile of the kernel in ``text`` (``cuobjdump -sass`` with encodings),
    the mean over the tile's loops where there are several (q and k)."""
    instrs = parse_sass(text)
    controls = sass_controls(text)
    if instrs and not controls:
        raise ValueError("the SASS has no instruction encodings (cuobjdump -sass prints them; "
                         "strip_encodings removed them): the control bits are needed")
    region, loops = tile_region(text, instrs)
    labels, subs = _labels(text), subroutines(instrs)
    per = []
    for s, e in loops:
        path, inner = tile_path(instrs, labels, subs, s, e)
        f = {"instructions": len(path), "inner_loops": inner, "shfl": 0, "bar": 0,
             "l1_global_bytes": 0, "l1_shared_bytes": 0, "global_load_bytes": 0, "global_store_bytes": 0}
        for ins in path:
            bits = access_bits(ins)
            if bits is not None:
                key = "l1_shared_bytes" if ins.base in _SHARED else "l1_global_bytes"
                f[key] += wavefronts(bits) * L1_WAVEFRONT
                if ins.base in _GLOBAL:
                    f[f"global_{_GLOBAL[ins.base]}_bytes"] += bits * 32 // 8
            if ins.base == "SHFL":
                f["shfl"] += 1
            elif ins.base.startswith("BAR") and ins.opcode not in ("BAR.ARV",):
                f["bar"] += 1
        f |= load_batches(path, controls)
        per.append(f)
    mean = {k: sum(p[k] for p in per) / len(per) for k in per[0]} if per else {}
    return {"region": region, "loops": [[s, e] for s, e in loops], **mean}


def bounds(gpu: Gpu, *, l1_bytes_per_dram_byte: float, warp_instructions_per_dram_byte: float,
           inflight_bytes_per_sm: float, dram_bytes_per_read_byte: float) -> dict:
    """GB/s of DRAM traffic each path allows on ``gpu``: the L1/shared-memory path
    (``l1_bytes_per_clk`` x clock x SMs / L1 bytes per DRAM byte), instruction issue (``issue_per_clk``
    x clock x SMs / warp-instructions per DRAM byte), latency by Little's law (load bytes in flight
    per SM x SMs / DRAM latency, scaled from bytes read to all DRAM bytes), and copy. ``estimate``:
    the least of them / copy (0-1); ``limit``: which."""
    clk = gpu.clock_ghz * 1e9
    def per(rate, cost):  # GB/s of DRAM traffic a path of ``rate`` units/s allows at ``cost`` units a byte
        return rate / cost / 1e9 if cost else math.inf

    b = {"l1": per(gpu.l1_bytes_per_clk * clk * gpu.sms, l1_bytes_per_dram_byte),
         "issue": per(gpu.issue_per_clk * clk * gpu.sms, warp_instructions_per_dram_byte),
         "latency": inflight_bytes_per_sm * gpu.sms / (gpu.dram_latency_ns * 1e-9) * dram_bytes_per_read_byte / 1e9,
         "copy": gpu.copy_gbps}
    limit = min(b, key=b.get)
    return {"gbps": b, "limit": limit, "estimate": b[limit] / gpu.copy_gbps}


def latency_view_us(*, grid: int, units: int, batches: float, ctas_per_sm: int, sms: int,
                    latency_ns: float) -> dict:
    """A small launch (decode) as a chain of DRAM round trips: the busiest program runs
    ``ceil(units / grid)`` work units one after another, each ``batches`` load->wait batches of one
    latency, in ``ceil(grid / (SMs x resident CTAs))`` waves. Compute, issue and launch overhead
    (≈ 2-4 µs on its own) not counted."""
    per_program = -(-units // grid) if grid else 0
    waves = -(-grid // max(1, sms * ctas_per_sm)) if grid else 0
    return {"units_per_program": per_program, "waves": waves,
            "us": waves * per_program * batches * latency_ns / 1e3}


def bandwidth_model(sass: str, *, num_warps: int, elements_per_tile: float, dram_bytes_per_element: float,
                    dram_read_bytes_per_element: float | None = None, registers: int, shared_bytes: int,
                    arch: Arch = ARCHS[90], grid: int | None = None, units: int | None = None,
                    gpus=tuple(GPUS.values())) -> dict:
    """The static bandwidth model of one kernel build (see the section's comment).

    ``sass``: ``cuobjdump -sass`` of the cubin with its encodings; ``num_warps``: the launch's;
    ``elements_per_tile``: x elements one tile (one iteration of the tile loop) rotates;
    ``dram_bytes_per_element``: the DRAM bytes the op must move per x element (x read and written,
    tables amortised over what shares them), ``dram_read_bytes_per_element`` of them read (default:
    all but the x element written, which is half of ``dram_bytes_per_element`` where unknown);
    ``registers``, ``shared_bytes``: the build's, for the resident CTAs and warps on ``arch``;
    ``grid``, ``units``: a launch's programs and work units, for the latency view.
    """
    t = tile_figures(sass)
    occ = occupancy(arch, registers, shared_bytes, num_warps)
    read = dram_read_bytes_per_element if dram_read_bytes_per_element is not None else dram_bytes_per_element / 2
    dram_tile = elements_per_tile * dram_bytes_per_element
    l1 = (t.get("l1_global_bytes", 0) + t.get("l1_shared_bytes", 0)) * num_warps
    out = {
        "tile": t, "num_warps": num_warps, "elements_per_tile": elements_per_tile,
        "dram_bytes_per_element": dram_bytes_per_element, "dram_read_bytes_per_element": read,
        "ctas_per_sm": occ["ctas_per_sm"], "warps_per_sm": occ["warps_per_sm"],
        "occupancy_limited_by": occ["limited_by"],
        "l1_bytes_per_element": l1 / elements_per_tile,
        "l1_global_bytes_per_element": t.get("l1_global_bytes", 0) * num_warps / elements_per_tile,
        "l1_shared_bytes_per_element": t.get("l1_shared_bytes", 0) * num_warps / elements_per_tile,
        "warp_instructions_per_dram_byte": t.get("instructions", 0) * num_warps / dram_tile,
        "batches": t.get("batches"), "shfl_per_tile": t.get("shfl", 0) * num_warps,
        "bar_per_tile": t.get("bar", 0) * num_warps,
        "inflight_peak_bytes_per_sm": t.get("inflight_peak_bytes_per_warp", 0) * occ["warps_per_sm"],
        "inflight_mean_bytes_per_sm": t.get("inflight_mean_bytes_per_warp", 0) * occ["warps_per_sm"],
    }
    for g in gpus:
        b = bounds(g, l1_bytes_per_dram_byte=out["l1_bytes_per_element"] / dram_bytes_per_element,
                   warp_instructions_per_dram_byte=out["warp_instructions_per_dram_byte"],
                   inflight_bytes_per_sm=out["inflight_mean_bytes_per_sm"],
                   dram_bytes_per_read_byte=dram_bytes_per_element / read)
        key = g.name.lower()
        out[f"bounds_{key}_gbps"] = b["gbps"]
        out[f"estimate_{key}"] = b["estimate"]
        out[f"limit_{key}"] = b["limit"]
        if grid is not None and units is not None:
            out[f"latency_view_{key}"] = latency_view_us(
                grid=grid, units=units, batches=t.get("batches") or 0, ctas_per_sm=occ["ctas_per_sm"],
                sms=g.sms, latency_ns=g.dram_latency_ns)
    return out


def tile_elements(meta: dict) -> tuple[float, float, float]:
    """(x elements one tile rotates, DRAM bytes per element, of them read) from a config's meta:
    the launcher's ``elements_per_tile``, ``dram_bytes_per_element`` (and
    ``dram_read_bytes_per_element``) where it gives them, else ``block_r x head_dim`` and x read and
    written once with the tables read from L2 (amortised to nothing: many heads share them)."""
    xb = {"bf16": 2, "fp16": 2, "fp32": 4}.get(meta.get("x_dtype"), 2)
    elements = meta.get("elements_per_tile") or meta["block_r"] * meta["head_dim"]
    dram = meta.get("dram_bytes_per_element") or 2 * xb
    read = meta.get("dram_read_bytes_per_element") or dram - xb
    return elements, dram, read


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
    cc: int | str  # an NVIDIA compute capability, or an AMD arch name ("gfx942")

    @classmethod
    def of(cls, cfg, cc: int | str) -> "_Job":
        py = getattr(cfg.fn, "fn", cfg.fn)  # the Python function under a JIT or interpreter wrapper
        return cls(py.__module__, py.__name__, tuple(sorted(cfg.signature.items())),
                   tuple(sorted(cfg.constexprs.items())), tuple(sorted(cfg.divisible_by_16)),
                   cfg.num_warps, cfg.num_stages, tuple(sorted(getattr(cfg, "options", {}).items())), cc)

    def run(self) -> dict:
        """Compile and read the cubin: a dict of numbers, the cubin and its SASS (for an AMD
        arch: the code object's metadata, the hsaco and its amdgcn)."""
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
    r["model"] = None
    if "head_dim" in meta or "elements_per_tile" in meta:  # a rome config: the bandwidth model
        try:
            elements, dram, read = tile_elements(meta)
            model = bandwidth_model(res["sass"], num_warps=res["num_warps"], elements_per_tile=elements,
                                    dram_bytes_per_element=dram, dram_read_bytes_per_element=read,
                                    registers=rs["reg"], shared_bytes=smem, arch=arch)
        except Exception as e:  # the table keeps its row; the model says why it has no figures
            r["model"] = {"error": f"{type(e).__name__}: {e}"}
        else:
            r["model"] = model
            r |= {k: model[k] for k in MODEL_KEYS}
            r["inflight_kb_per_sm"] = model["inflight_mean_bytes_per_sm"] / 1024
    return r


MODEL_KEYS = ("l1_bytes_per_element", "warp_instructions_per_dram_byte", "batches", "inflight_mean_bytes_per_sm",
              "inflight_peak_bytes_per_sm", "estimate_h100", "limit_h100", "estimate_h200", "limit_h200")


# --- AMD Instinct (CDNA): the same configurations compiled for HIP -------------------------
#
# ``--arch gfx942,gfx90a,gfx950``: each configuration compiled with ``GPUTarget("hip", arch, 64)``
# (a wavefront is 64 lanes: ``num_warps`` = wavefronts per workgroup), the options a HIP launch
# passes (``rome.launch.target_options``) and the specialisation a HIP launch gets (pointers
# ``tt.pointer_range=32``: buffer ops on tensors within 2 GiB). The code object's metadata (the
# ``.amdgpu_metadata`` block of the amdgcn text, YAML) gives VGPRs, AGPRs, SGPRs, their spill
# counts, scratch (private segment) and static LDS (group segment) bytes; Triton's own shared
# memory is dynamic LDS (``metadata.shared``). LLVM's occupancy (the amdgcn text's ``; Occupancy:``
# comment, which sees registers only) is kept beside the one computed here.


@dataclasses.dataclass(frozen=True)
class AmdArch:
    """Per-CU limits of one AMD Instinct arch, as LLVM's AMDGPU backend models them
    (``AMDGPUBaseInfo.cpp`` / ``GCNSubtarget``; docs: llvm.org/docs/AMDGPUUsage.html)."""

    name: str
    products: str
    lds_per_cu: int  # bytes of LDS one CU has (and one workgroup may allocate)
    lds_granule: int  # bytes an LDS allocation is rounded up to (AMDGPUUsage: GRANULATED_LDS_SIZE)
    simds_per_cu: int = 4  # execution units (SIMDs) per CU
    max_waves_per_simd: int = 8  # wave slots per SIMD, gfx90a on (10 on gfx900/gfx908)
    vgprs_per_lane: int = 512  # per SIMD lane: arch VGPRs and AGPRs in one unified file (gfx90a on)
    vgpr_granule: int = 8  # VGPRs are allocated in blocks of 8 (gfx90a on)
    max_sgprs_for_8_waves: int = 100  # gfx9: above 100 SGPRs (VCC etc. included) a SIMD holds 7 waves
    max_workgroups_per_cu: int = 16  # barrier resources of a CU: multi-wave workgroups
    wave_size: int = 64

    @property
    def max_waves_per_cu(self) -> int:
        return self.simds_per_cu * self.max_waves_per_simd


AMD_ARCHS = {a.name: a for a in (
    AmdArch("gfx90a", "MI210, MI250, MI250X (CDNA2)", 64 * 1024, 128 * 4),
    AmdArch("gfx942", "MI300X, MI300A, MI325X (CDNA3)", 64 * 1024, 128 * 4),
    AmdArch("gfx950", "MI350X, MI355X (CDNA4)", 160 * 1024, 320 * 4),
)}
AMD_DEFAULT_ARCHS = ("gfx942", "gfx90a", "gfx950")
AMD_NOTES = (
    "Constants per arch, from LLVM's AMDGPU backend (the compiler in Triton's wheel) and "
    "llvm.org/docs/AMDGPUUsage.html: 4 SIMDs per CU; 8 wave slots per SIMD (getMaxWavesPerEU: 8 for the "
    "gfx90a family, gfx90a/gfx942/gfx950); 512 VGPRs per lane per SIMD, arch VGPRs and AGPRs in one file, "
    "allocated in blocks of 8, AGPRs after the arch VGPRs rounded up to 4 (gfx90a family); SGPRs: more "
    "than 100 leave 7 waves (gfx9); at most 16 multi-wave workgroups per CU (barriers); LDS 64 KiB per CU "
    "on gfx90a and gfx942, 160 KiB on gfx950 (FeatureAddressableLocalMemorySize163840), allocated in "
    "512-byte (gfx9) / 1280-byte (gfx950) blocks.")
AMD_METHOD = (
    "AMD rows (gfx*): the same configurations compiled with `GPUTarget('hip', arch, 64)`: a wavefront is "
    "64 lanes, so `num_warps` = 64-wide wavefronts per workgroup (4 warps = 256 threads, twice a CUDA "
    "block's); the options a HIP launch passes (`rome.launch.target_options`: no `maxnreg`, which is "
    "CUDA-only); every pointer `tt.pointer_range=32` as a HIP launch marks a tensor within 2 GiB (buffer "
    "ops, Triton's default). Read from the code object's metadata (`.amdgpu_metadata` of the amdgcn): "
    "VGPRs (arch VGPRs + AGPRs: the unified file), SGPRs, their spill counts, scratch (private segment "
    "bytes per lane: spill and stack) and LDS (group segment bytes) against the arch's LDS per CU. "
    "Occupancy: waves per SIMD the registers allow (min(8, 512 / VGPRs rounded up to 8), 7 above 100 "
    "SGPRs), workgroups per CU = min(registers: waves per SIMD x 4 / waves per workgroup, LDS per CU / "
    "LDS rounded to its block, 16), waves per SIMD = workgroups x waves per workgroup / 4. Triton's shared "
    "memory is dynamic LDS (Triton's `metadata.shared`, allocated at launch): LLVM sees none of it, so its "
    "own figure (the amdgcn's `; Occupancy:` comment) is the waves per SIMD the registers allow, the "
    "column beside it (the CI gate checks the two agree). "
    "Instruction counts are over the whole kernel (no tile-loop analysis on AMD): vector memory loads and "
    "stores (global_/buffer_) by width, MFMA, LDS (ds_) and scratch instructions. Static only: nothing "
    "here ran on an AMD GPU. " + AMD_NOTES)


def _amd_buffer_ops() -> bool:
    """Whether a HIP launch here would mark tensors within 2 GiB for buffer ops (Triton's knob)."""
    try:
        from triton import knobs

        return bool(knobs.amd.use_buffer_ops)
    except (ImportError, AttributeError):
        return True


_AMD_LINE = re.compile(r"^\s+([sv]_\w+|global_\w+|buffer_\w+|ds_\w+|scratch_\w+|flat_\w+)\b")
_AMD_WIDTH = {"dwordx4": 128, "b128": 128, "dwordx3": 96, "b96": 96, "dwordx2": 64, "b64": 64, "dword": 32,
              "b32": 32, "short": 16, "ushort": 16, "sshort": 16, "b16": 16, "d16": 16, "byte": 8, "ubyte": 8,
              "sbyte": 8, "b8": 8, "u16": 16, "i16": 16, "u8": 8, "i8": 8}


def _amd_width(op: str) -> int:
    for part in reversed(op.split("_")[2:]):
        if part in _AMD_WIDTH:
            return _AMD_WIDTH[part]
    return 32


def read_amdgcn(text: str, name: str | None = None) -> dict:
    """What the amdgcn text of one Triton kernel says: its code object metadata (``.amdgpu_metadata``,
    YAML: the kernel ``name``'s entry, else the only one) and LLVM's comments (``; Occupancy:``,
    ``; ScratchSize:``), and instruction counts over the whole kernel."""
    import yaml

    m = re.search(r"^\s*\.amdgpu_metadata\s*$(.*?)^\s*\.end_amdgpu_metadata", text, re.S | re.M)
    if not m:
        raise ValueError("no .amdgpu_metadata block in the amdgcn text")
    kernels_md = yaml.safe_load(m.group(1))["amdhsa.kernels"]
    md = next((k for k in kernels_md if k.get(".name") == name), kernels_md[0] if len(kernels_md) == 1 else None)
    if md is None:
        raise ValueError(f"kernel {name!r} not in the code object's metadata ({[k.get('.name') for k in kernels_md]})")

    def comment(key):
        found = re.search(rf"^\s*;\s*{key}:\s*(\d+)", text, re.M)
        return int(found.group(1)) if found else None

    counts = {"instructions": 0, "load": collections.Counter(), "store": collections.Counter(), "mfma": 0,
              "lds": 0, "scratch": 0}
    for line in text.splitlines():
        ins = _AMD_LINE.match(line)
        if not ins:
            continue
        op = ins.group(1)
        counts["instructions"] += 1
        if op.startswith(("global_load", "buffer_load", "flat_load")):
            counts["load"][_amd_width(op)] += 1
        elif op.startswith(("global_store", "buffer_store", "flat_store")):
            counts["store"][_amd_width(op)] += 1
        elif op.startswith("v_mfma"):
            counts["mfma"] += 1
        elif op.startswith("ds_"):
            counts["lds"] += 1
        elif op.startswith("scratch_"):
            counts["scratch"] += 1
    for key in ("load", "store"):
        counts[key] = {str(w): n for w, n in sorted(counts[key].items(), reverse=True)}
    get = lambda key: int(md.get(key, 0) or 0)
    return {"vgpr_count": get(".vgpr_count"), "agpr_count": get(".agpr_count"), "sgpr_count": get(".sgpr_count"),
            "vgpr_spill_count": get(".vgpr_spill_count"), "sgpr_spill_count": get(".sgpr_spill_count"),
            "private_segment_fixed_size": get(".private_segment_fixed_size"),
            "group_segment_fixed_size": get(".group_segment_fixed_size"), "wavefront_size": get(".wavefront_size"),
            "max_flat_workgroup_size": get(".max_flat_workgroup_size"),
            "llvm_occupancy": comment("Occupancy"), "llvm_total_vgprs": comment("TotalNumVgprs"),
            "llvm_scratch_size": comment("ScratchSize"), "counts": counts}


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def amd_total_vgprs(vgprs: int, agprs: int) -> int:
    """VGPRs one lane holds in the unified file (gfx90a on): the arch VGPRs rounded up to 4, then the
    AGPRs (just the VGPRs where there are no AGPRs)."""
    return _round_up(vgprs, 4) + agprs if agprs else vgprs


def amd_occupancy(arch: AmdArch, vgprs: int, sgprs: int, lds: int, waves_per_workgroup: int) -> dict:
    """Resident workgroups per CU and waves per SIMD for workgroups of ``waves_per_workgroup``
    wavefronts using ``vgprs`` (unified: ``amd_total_vgprs``) and ``sgprs`` per wave and ``lds``
    bytes of LDS per workgroup on ``arch``."""
    alloc = _round_up(max(vgprs, 1), arch.vgpr_granule)
    by_vgprs = 0 if vgprs > arch.vgprs_per_lane else min(arch.max_waves_per_simd, arch.vgprs_per_lane // alloc)
    by_sgprs = arch.max_waves_per_simd if sgprs <= arch.max_sgprs_for_8_waves else arch.max_waves_per_simd - 1
    waves_regs = min(by_vgprs, by_sgprs)
    lds_alloc = _round_up(lds, arch.lds_granule)
    limits = {"registers": waves_regs * arch.simds_per_cu // waves_per_workgroup,
              "LDS": arch.lds_per_cu // lds_alloc if lds_alloc else arch.max_workgroups_per_cu,
              "workgroups": arch.max_workgroups_per_cu if waves_per_workgroup > 1 else arch.max_waves_per_cu}
    if lds > arch.lds_per_cu:
        limits["LDS"] = 0
    wgs = min(limits.values())
    return {"workgroups_per_cu": wgs, "waves_per_cu": wgs * waves_per_workgroup,
            "waves_per_simd": wgs * waves_per_workgroup / arch.simds_per_cu,
            "waves_per_simd_by_registers": waves_regs,
            "limited_by": ", ".join(k for k, v in limits.items() if v == wgs), "workgroups_by": limits}


def amd_row(cfg: dict, arch: AmdArch, res: dict) -> dict:
    """The table row of config ``cfg`` compiled for the AMD ``arch``."""
    meta = cfg["meta"]
    r = {"config": cfg["name"], "arch": arch.name, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
         "bytes_per_tile": meta.get("bytes_per_tile"), "meta": meta}
    if "error" in res:
        return r | {"ok": False, "error": res["error"]}
    a = res["amd"]
    vgprs = amd_total_vgprs(a["vgpr_count"], a["agpr_count"])
    # Triton's shared memory is dynamic LDS, allocated at launch (metadata.shared): LLVM sees none of
    # it (the group segment holds only static LDS, 0 for Triton kernels), nor does its occupancy
    lds = a["group_segment_fixed_size"] + res["shared_dynamic"]
    spills = a["vgpr_spill_count"] + a["sgpr_spill_count"]
    c = a["counts"]
    occ = amd_occupancy(arch, vgprs, a["sgpr_count"], lds, res["num_warps"])
    return r | {
        "ok": True, "error": None, "wavefront_size": a["wavefront_size"], "vgprs": vgprs, "arch_vgprs": a["vgpr_count"],
        "agprs": a["agpr_count"], "sgprs": a["sgpr_count"], "vgpr_spill_count": a["vgpr_spill_count"],
        "sgpr_spill_count": a["sgpr_spill_count"], "scratch_bytes": a["private_segment_fixed_size"],
        "lds_bytes": lds, "lds_metadata_bytes": a["group_segment_fixed_size"], "triton_shared": res["shared_dynamic"],
        "fits_lds": lds <= arch.lds_per_cu, "spills": spills > 0 or a["private_segment_fixed_size"] > 0,
        "max_flat_workgroup_size": a["max_flat_workgroup_size"], **occ, "llvm_occupancy": a["llvm_occupancy"],
        "ld128_share": share_128(c["load"]), "st128_share": share_128(c["store"]), "mfma": c["mfma"],
        "lds_instructions": c["lds"], "scratch_instructions": c["scratch"], "instructions": c["instructions"],
        "loads": c["load"], "stores": c["store"], "compile_s": res["compile_s"], "triton_hash": res["triton_hash"],
        "cache_hsaco": res["cache_cubin"],
    }


AMD_COLUMNS = [  # (header, key, format)
    ("config", "config", ""), ("waves/WG", "num_warps", "d"), ("VGPRs", "vgprs", "d"), ("AGPRs", "agprs", "d"),
    ("SGPRs", "sgprs", "d"), ("VGPR spill", "vgpr_spill_count", "d"), ("SGPR spill", "sgpr_spill_count", "d"),
    ("scratch B", "scratch_bytes", "d"), ("LDS B", "lds_bytes", "d"), ("fits LDS", "fits_lds", ""),
    ("WGs/CU", "workgroups_per_cu", "d"), ("waves/SIMD", "waves_per_simd", "n"),
    ("waves/SIMD (regs)", "waves_per_simd_by_registers", "d"), ("LLVM occupancy", "llvm_occupancy", "d"),
    ("limited by", "limited_by", ""), ("ld 128-bit", "ld128_share", "%"), ("st 128-bit", "st128_share", "%"),
    ("MFMA", "mfma", "d"), ("LDS instr", "lds_instructions", "d"), ("instr", "instructions", "d"),
    ("bytes/tile", "bytes_per_tile", "n"),
]


def amd_markdown(name: str, limits: dict, rows: list[dict], heading: str = "##") -> list[str]:
    """The table of one AMD arch (markdown lines), with a summary line of the gate's checks."""
    ok = [r for r in rows if r["ok"]]
    spill = [r for r in ok if r["spills"]]
    over = [r for r in ok if not r["fits_lds"]]
    lines = [f"{heading}# {name}: {limits['products']}", "",
             f"Limits: {limits['simds_per_cu']} SIMDs per CU, {limits['max_waves_per_simd']} waves per SIMD, "
             f"{limits['vgprs_per_lane']} VGPRs per lane (VGPRs + AGPRs, blocks of {limits['vgpr_granule']}), "
             f"{limits['lds_per_cu'] // 1024} KiB LDS per CU, {limits['max_workgroups_per_cu']} workgroups per CU, "
             f"wavefront {limits['wave_size']}.", "",
             f"{len(rows)} configurations: {len(ok)} compile, {len(spill)} spill (VGPR/SGPR spill or scratch), "
             f"{len(over)} over the LDS; most VGPRs {max((r['vgprs'] for r in ok), default=0)}, most LDS "
             f"{max((r['lds_bytes'] for r in ok), default=0):,} B, fewest waves per SIMD "
             f"{min((r['waves_per_simd'] for r in ok), default=0):g}.", "",
             "| " + " | ".join(h for h, _, _ in AMD_COLUMNS) + " |", "|" + "---|" * len(AMD_COLUMNS)]
    return lines + _table_rows(rows, AMD_COLUMNS) + [""]


def _table_rows(rows, columns) -> list[str]:
    """The markdown rows of a per-config table; a failed compile's row says why."""
    out = []
    for r in rows:
        if not r["ok"]:
            error = " ".join(r["error"].split()).replace("|", "/")[:300]
            out.append(f"| {r['config']} | compile failed: {error} |" + " |" * (len(columns) - 2))
            continue
        out.append("| " + " | ".join(_cell(r.get(k), f) for _, k, f in columns) + " |")
    return out


# --- every configuration ------------------------------------------------------------------

DEFAULT_CONFIGS = "profiling.kernels:configs"


def configs(cc: int | None = None) -> list:
    """``rome.launcher.kernel_configs(cc)``: every configuration the launcher can choose."""
    from rome.launcher import kernel_configs

    return kernel_configs(cc)


def amd_ci_configs(cc=None) -> list:
    """The configurations CI compiles for gfx942 (the full list is the committed table): head_dim
    256 (the largest tiles and register use) for every pass, product and tables/positions kind in
    bf16 and fp32, and the gather kernel's in fp16 (fp16's dot kernel compiles as bf16's does:
    a third of the compile time, nothing new), without the autotuner's candidates; and bf16 at
    head_dim 64 with them (the candidates' 8-row and 8-warp tiles)."""
    return [c for c in configs(cc) if (c.meta["head_dim"] == 256 and not c.meta.get("tuned_candidate")
                                       and (c.meta["x_dtype"] != "fp16" or c.meta["product"] == "gather"))
            or (c.meta["head_dim"] == 64 and c.meta["x_dtype"] == "bf16")]


def wave64_gather_configs(cc=None) -> list:
    """The gather kernel's chosen configs (fp32 tables or one-axis positions, bf16 and fp32, head_dim
    64 and 128) each beside the same launch with twice the rows: ``choose_gather`` sizes a tile for
    ``GATHER_ELEMENTS_PER_THREAD`` elements a thread of a 32-lane warp, so on 64-lane wavefronts a
    lane holds half as many; the doubled tile holds as many as on CUDA (docs/amd.md compares them:
    ``--arch gfx942 --configs profiling.kernels:wave64_gather_configs``)."""
    out = []
    for c in configs(cc):
        m = c.meta
        if (m["product"] == "gather" and not m.get("tuned_candidate") and m["head_dim"] in (64, 128)
                and m["x_dtype"] in ("bf16", "fp32") and m["positions"] in (0, 1) and not m["angles"]
                and m["table_dtype"] == "fp32"):
            rows = 2 * c.constexprs["BLOCK_R"]
            out += [c, dataclasses.replace(c, name=f"{c.name} rows x2 (BLOCK_R={rows})",
                                           constexprs=c.constexprs | {"BLOCK_R": rows},
                                           meta=dict(m, block_r=rows, elements_per_tile=rows * m["head_dim"]))]
    return out


def gate_configs(cc) -> list:
    """The CI gate's list for ``cc``: every configuration for an NVIDIA arch, ``amd_ci_configs``
    for an AMD one (tests/test_kernels_static.py)."""
    return amd_ci_configs(cc) if isinstance(cc, str) else configs(cc)


GATE_CONFIGS = "profiling.kernels:gate_configs"


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    if not name:
        raise ValueError(f"configs: expected MODULE:FUNCTION, got {ref!r}")
    return getattr(importlib.import_module(module), name)


def _list_configs(ref: str, cc: int) -> list[dict]:
    """In a worker: the configs ``ref(cc)`` lists, as picklable dicts with their compile jobs."""
    return [{"name": c.name, "meta": dict(c.meta), "num_warps": c.num_warps, "num_stages": c.num_stages,
             "job": _Job.of(c, cc)} for c in _resolve(ref)(cc)]


def _compile_all(pool, jobs, on_done=None) -> dict:
    """Each distinct compile job run once in ``pool``: ``{job: result}``; ``on_done(i, n)``."""
    unique = list(dict.fromkeys(jobs))
    futures = {pool.submit(_run_job, job): job for job in unique}
    results = {}
    for i, fut in enumerate(cf.as_completed(futures)):
        results[futures[fut]] = fut.result()
        if on_done:
            on_done(i + 1, len(unique))
    return results


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
        plan = [(cfg, arch_of(cc)) for cc in archs for cfg in listed[cc]]
        results = _compile_all(pool, [cfg["job"] for cfg, _ in plan], on_done)
    rows, files = [], []
    for cfg, arch in plan:
        res = results[cfg["job"]]
        rows.append(amd_row(cfg, arch, res) if isinstance(arch, AmdArch) else row(cfg, arch, res))
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
            "constants+AttrsDescriptor", "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            **_git_state()}


def _git_state() -> dict:
    """The commit the kernel was compiled from and whether rome/ differed from it (uncommitted)."""
    root = Path(__file__).resolve().parent.parent
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
    "config's own count of the global bytes one tile moves. The model's columns (L1 B/elem, instr/DRAM B, "
    "batches, in flight KB/SM: the mean, est. H100/H200: fraction of copy bandwidth) take a tile of the "
    "config's rows x head_dim whose x is read and written once, tables amortised to nothing (the launcher's "
    "own elements_per_tile / dram_bytes_per_element where its meta has them); the SASS of the arch of the "
    "row with the H100/H200 constants. Model: " + MODEL_METHOD
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
                amd = r["arch"] in AMD_ARCHS
                binary, text = (".hsaco", ".amdgcn") if amd else (".cubin", ".sass")
                (Path(out) / stem).with_suffix(binary).write_bytes(cubin)
                (Path(out) / stem).with_suffix(text).write_text(sass if amd else strip_encodings(sass))
                written[key] = [str(stem.with_suffix(binary)), str(stem.with_suffix(text))]
            r["files"] = written[key]
    archs_info = {}
    for cc in archs:
        a = arch_of(cc)
        archs_info[a.name] = dataclasses.asdict(a) | (
            {"max_waves_per_cu": a.max_waves_per_cu} if isinstance(a, AmdArch) else {"smem_per_block": a.smem_per_block})
    section = {"environment": environment(), "method": METHOD, "wall_s": wall, "archs": archs_info,
               "project_smem_limit": PROJECT_SMEM_LIMIT, "rows": rows}
    if any(isinstance(cc, str) for cc in archs):
        section["amd_method"] = AMD_METHOD
    return _json_safe(section)


def _json_safe(obj):
    return json.loads(json.dumps(obj, default=str))


# --- one workload's launches (python -m profiling kernels --workload NAME) ------------------

def rome_variants() -> tuple[str, ...]:
    """The report's rome variants (``profiling.variants``, kind "rome"), in its order."""
    return tuple(v.name for v in _variants().values() if v.kind == "rome")


WORKLOAD_ARCH = 90
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _workload(name: str, overrides: dict | None = None):
    """The workload ``name`` with ``overrides`` (batch, q_heads, kv_heads, seq; dtype as "bf16")."""
    import torch

    from .workloads import WORKLOADS

    w = WORKLOADS[name]
    changes = dict(overrides or {})
    if "dtype" in changes:
        changes["dtype"] = getattr(torch, _DTYPES.get(changes["dtype"], changes["dtype"]))
    return w.replace(**changes) if changes else w


def _setup(w):
    import rome

    from .variants import Setup
    from .workloads import tables

    t = tables(w)
    matrix = rome.rotation_matrix(w.sections, w.mode, dtype=w.dtype)
    return Setup(w, w.mode, t.cos, t.sin, t.angles, matrix, "triton", t.positions)


def _launch_dict(variant: str, kernel_config, cc: int, **fields) -> dict:
    return {"variant": variant, "config": kernel_config.name, "meta": dict(kernel_config.meta),
            "num_warps": kernel_config.num_warps, "num_stages": kernel_config.num_stages,
            "job": _Job.of(kernel_config, cc), **fields}


def _captured(w, setup, variant, cc: int, num_sms: int) -> list[dict]:
    """The launches ``variant`` makes on ``w`` (forward, then backward) as ``rome.launcher.capture``
    records them: real shapes, CPU tensors, nothing run."""
    import torch

    from rome import launcher

    v = _variants()[variant]
    run = v.build(setup)
    q = torch.empty(w.shape(w.q_heads), dtype=w.dtype).requires_grad_()
    k = torch.empty(w.shape(w.kv_heads), dtype=w.dtype).requires_grad_()
    with launcher.capture(num_sms=num_sms) as launches:
        outs = run(v.prepare(q), v.prepare(k))
        torch.autograd.backward(outs, [torch.empty_like(o) for o in outs])
    return [_launch_dict(variant, L.kernel_config, cc, **{"pass": "backward" if L.transpose else "forward"},
                         grid=L.grid, units=L.units, elements=L.elements) for L in launches]


def _torch():
    import torch

    return torch


def _variants():
    from .variants import VARIANTS

    return VARIANTS


def _liger(w, cc: int) -> dict:
    """``_liger_launches``, or where the installed Liger-Kernel cannot be modelled (a signature
    this model does not know, a failure to build its launch) a status saying why: a row of the
    table, never the end of it."""
    try:
        return _liger_launches(w, cc)
    except Exception as e:
        return {"status": "not modelled", "reason": f"{type(e).__name__}: {e}"[:2000],
                "version": _liger_version()}


def _liger_version():
    try:
        from importlib.metadata import version

        return version("liger-kernel")
    except Exception:
        return None


def _liger_launches(w, cc: int) -> dict:
    """Liger-Kernel's rope kernel (``liger_kernel.ops.rope._triton_rope``) compiled as
    ``liger_rotary_pos_emb`` launches it on the closest shape it can express: a 1D half rotation of
    the whole head (it has neither sections nor interleave), q and k BSND, tables in q's dtype
    ``[1, S, D]``; one program per token, no loop (the tile: the whole kernel, every head of one
    token)."""
    try:
        from liger_kernel.ops import rope as liger_rope
    except ImportError as e:
        return {"status": "not installed", "reason": f"liger-kernel is not importable here ({e})"}
    import triton

    fn = liger_rope._triton_rope
    pow2 = triton.next_power_of_2
    hd, nq, nk = w.head_dim, w.q_heads, w.kv_heads
    # the whole head rotated: rd (0.8.5's rotary dims) = hd
    values = {"bs": w.batch, "cos_bs": 1, "n_qh": nq, "n_kh": nk, "hd": hd, "rd": hd, "pad_n_qh": pow2(nq),
              "pad_n_kh": pow2(nk), "pad_hd": pow2(hd), "pad_rd": pow2(hd), "BLOCK_SIZE": max(pow2(nq), pow2(nk))}
    unknown = [p.name for p in fn.params if p.is_constexpr and p.name != "BACKWARD_PASS" and p.name not in values]
    if unknown:
        return {"status": "not modelled", "version": _liger_version(),
                "reason": f"liger_kernel.ops.rope._triton_rope has constexprs this model does not know: {unknown}"}
    xt = {2: "*bf16" if w.dtype == _torch().bfloat16 else "*fp16", 4: "*fp32"}[w.dtype.itemsize]
    out = []
    for backward in (False, True):
        constexprs, signature = {}, {}
        for p in fn.params:
            if p.is_constexpr:
                constexprs[p.name] = backward if p.name == "BACKWARD_PASS" else values[p.name]
            elif p.name in ("q_ptr", "k_ptr", "cos", "sin"):
                signature[p.name] = xt
            else:
                signature[p.name] = "i32"
        divisible = tuple(n for n in signature if n != "sl" and (n in ("q_ptr", "k_ptr", "cos", "sin")
                                                                  or hd % 16 == 0))
        cfg = _LigerConfig(f"liger rope {'bwd' if backward else 'fwd'} D={hd} heads={nq}/{nk}", fn, signature,
                           constexprs, divisible, 4, 3, {}, {})
        xb = w.dtype.itemsize
        elements = w.batch * w.seq * (nq + nk) * hd
        tables = 2 * w.seq * hd * xb / elements
        meta = {"x_dtype": {2: "bf16", 4: "fp32"}[xb], "head_dim": hd, "elements_per_tile": (nq + nk) * hd,
                "dram_bytes_per_element": 2 * xb + tables, "dram_read_bytes_per_element": xb + tables}
        out.append({"variant": "liger-kernel", "config": cfg.name, "meta": meta, "num_warps": 4, "num_stages": 3,
                    "job": _Job.of(cfg, cc), "pass": "backward" if backward else "forward",
                    "grid": w.batch * w.seq, "units": w.batch * w.seq, "elements": elements,
                    "closest": "1D half rotation of the whole head, tables in q's dtype"})
    return {"status": "ok", "launches": out, "version": _liger_version()}


@dataclasses.dataclass(frozen=True)
class _LigerConfig:
    name: str
    fn: object
    signature: dict
    constexprs: dict
    divisible_by_16: tuple
    num_warps: int
    num_stages: int
    meta: dict
    options: dict


def workload_launches(name: str, overrides: dict | None = None, *, cc: int = WORKLOAD_ARCH,
                      num_sms: int = 132) -> dict:
    """In a worker (no TRITON_INTERPRET=1): every launch the workload's rome variants make, forward
    and backward, as picklable dicts with their compile jobs; Liger-Kernel's beside them where
    importable. ``rome.launcher.capture`` records them (the launch's own specialisation, grid and
    work units, with the bytes an element must move in its meta)."""
    from .variants import Unavailable, Unsupported

    w = _workload(name, overrides)
    setup = _setup(w)
    how = "rome.launcher.capture"
    launches, skipped = [], []
    for variant in rome_variants():
        try:
            launches += _captured(w, setup, variant, cc, num_sms)
        except (Unsupported, Unavailable) as e:
            skipped.append({"variant": variant, "reason": f"{type(e).__name__}: {e}"})
        except Exception as e:  # one variant that cannot be captured is a line, not the end
            skipped.append({"variant": variant, "reason": f"{type(e).__name__}: {e}"[:2000]})
    workload = {"name": w.name, "q_shape": list(w.shape(w.q_heads)), "k_shape": list(w.shape(w.kv_heads)),
                "dtype": str(w.dtype).removeprefix("torch."), "sections": list(w.sections), "mode": w.mode}
    return {"workload": workload, "capture": how, "num_sms": num_sms, "launches": launches, "skipped": skipped,
            "liger": _liger(w, cc)}


def launch_row(launch: dict, arch: Arch, res: dict) -> dict:
    """One ``kernels.json`` launch: the contract's fields (variant, pass, arch, config, cubin,
    registers, spill_bytes, estimate_h100, estimate_h200) and the model's other figures."""
    r = {"variant": launch["variant"], "pass": launch["pass"], "arch": arch.name, "config": launch["config"],
         "cubin": None, "registers": None, "spill_bytes": None, "estimate_h100": None, "estimate_h200": None,
         "grid": launch.get("grid"), "units": launch.get("units"), "elements": launch.get("elements"),
         "num_warps": launch["num_warps"], "num_stages": launch["num_stages"], "meta": launch["meta"]}
    if launch.get("closest"):
        r["closest"] = launch["closest"]
    if "error" in res:
        return r | {"ok": False, "error": res["error"]}
    rs = res["res"]
    smem = res["shared_dynamic"] + rs["shared"]
    elements, dram, read = tile_elements(launch["meta"])
    model = bandwidth_model(res["sass"], num_warps=res["num_warps"], elements_per_tile=elements,
                            dram_bytes_per_element=dram, dram_read_bytes_per_element=read,
                            registers=rs["reg"], shared_bytes=smem, arch=arch,
                            grid=launch.get("grid"), units=launch.get("units"))
    local = res["sass_stats"]["whole"]["local"]
    return r | {"ok": True, "error": None, "cubin": res["cache_cubin"], "registers": rs["reg"],
                "spill_bytes": rs["stack"], "local_instructions": local, "spills": rs["stack"] > 0 or local > 0,
                "shared_bytes": smem, "triton_hash": res["triton_hash"], **model}




def _write_files(out: Path, rows: list[dict], files: list) -> None:
    """Each build's cubin and SASS under ``out/<arch>/`` (identical builds once)."""
    written = {}
    for r, (cubin, sass) in zip(rows, files):
        if cubin is None:
            continue
        key = (r["arch"], r["triton_hash"])
        if key not in written:
            stem = Path(r["arch"]) / _slug(f"{r['variant']} {r['config']}")
            (Path(out) / r["arch"]).mkdir(parents=True, exist_ok=True)
            (Path(out) / stem).with_suffix(".cubin").write_bytes(cubin)
            (Path(out) / stem).with_suffix(".sass").write_text(sass)
            written[key] = [str(stem.with_suffix(".cubin")), str(stem.with_suffix(".sass"))]
        r["files"] = written[key]
        if r.get("cubin") is None:
            r["cubin"] = str((Path(out) / written[key][0]).resolve())


def collect_workload(name: str, archs=(WORKLOAD_ARCH,), out: Path | None = None, *, overrides: dict | None = None,
                     jobs: int | None = None, num_sms: int = 132, pool: cf.ProcessPoolExecutor | None = None,
                     on_done=None) -> dict:
    """``kernels.json`` of workload ``name``: its rome variants' launches (and Liger-Kernel's where
    installed) compiled for ``archs`` into Triton's cache, each with the bandwidth model.
    Captures in a worker; ``out``: where the cubins and SASS (with encodings) are copied."""
    t0 = time.perf_counter()
    with pool if pool is not None else compiler_pool(jobs or min(2, os.cpu_count() or 1)) as pool:
        captured = {cc: pool.submit(workload_launches, name, overrides, cc=cc, num_sms=num_sms).result()
                    for cc in archs}
        plan = []
        for cc in archs:
            liger = captured[cc]["liger"]
            plan += [(L, ARCHS[cc]) for L in captured[cc]["launches"] + liger.get("launches", [])]
        results = _compile_all(pool, [L["job"] for L, _ in plan], on_done)
    rows = [launch_row(L, arch, results[L["job"]]) for L, arch in plan]
    files = [(results[L["job"]].get("cubin"), results[L["job"]].get("sass")) for L, _ in plan]
    if out is not None:
        _write_files(out, rows, files)
    first = captured[archs[0]]
    liger = first["liger"]
    return _json_safe({
        "environment": environment(), "workload": first["workload"], "capture": first["capture"],
        "num_sms": num_sms, "archs": [ARCHS[cc].name for cc in archs], "wall_s": time.perf_counter() - t0,
        "builds": len(results), "method": MODEL_METHOD, "gpus": {g.name: dataclasses.asdict(g) for g in GPUS.values()},
        "gpu_notes": GPU_NOTES, "skipped": first["skipped"],
        "liger": {k: v for k, v in liger.items() if k != "launches"},
        "launches": [r for r in rows if r["variant"] != "liger-kernel"],
        "liger_launches": [r for r in rows if r["variant"] == "liger-kernel"],
    })


WORKLOAD_COLUMNS = [  # (header, key, format)
    ("variant", "variant", ""), ("pass", "pass", ""), ("config", "config", ""), ("grid", "grid", "n"),
    ("units", "units", "n"), ("regs", "registers", "d"), ("spill B", "spill_bytes", "d"),
    ("CTAs×warps/SM", "occupancy", ""), ("L1 B/elem", "l1_bytes_per_element", "1"),
    ("instr/DRAM B", "warp_instructions_per_dram_byte", "2"), ("batches", "batches", "1"),
    ("in flight KB/SM", "inflight", ""), ("est. H100", "estimate_h100", "%"), ("limit", "limit_h100", ""),
    ("est. H200", "estimate_h200", "%"), ("latency view µs", "latency_us", "1"),
]


def _workload_cell(r: dict, key: str, fmt: str) -> str:
    if key == "occupancy":
        return f"{r['ctas_per_sm']} × {r['num_warps']}" if r.get("ctas_per_sm") is not None else "n/a"
    if key == "inflight":
        if r.get("inflight_mean_bytes_per_sm") is None:
            return "n/a"
        return f"{r['inflight_mean_bytes_per_sm'] / 1024:.1f} (peak {r['inflight_peak_bytes_per_sm'] / 1024:.0f})"
    if key == "latency_us":
        v = r.get("latency_view_h100")
        return "n/a" if not v else f"{v['us']:.1f}"
    v = r.get(key)
    if v is None:
        return "n/a"
    if fmt in ("1", "2"):
        return f"{v:.{fmt}f}"
    return _cell(v, fmt)


def workload_markdown(section: dict, heading: str = "##", measured: dict | None = None) -> str:
    """The workload's launches with the model's figures (``measured``: (variant, pass) -> GB/s of
    this run's GPU speed section, set beside the estimate)."""
    wl = section["workload"]
    cols = list(WORKLOAD_COLUMNS)
    if measured:
        cols.insert(cols.index(("limit", "limit_h100", "")), ("measured GB/s", "measured_gbps", "1"))
    lines = [f"{heading} Kernels of the `{wl['name']}` workload: static bandwidth model", "",
             f"q {wl['q_shape']}, k {wl['k_shape']} {wl['dtype']}, {wl['mode']} {wl['sections']}; launches from "
             f"{section['capture']} ({section['num_sms']} SMs); {section['builds']} builds for "
             f"{', '.join(section['archs'])} in {section['wall_s']:.0f} s (triton {section['environment']['triton']}).",
             "", section["method"], "", "Constants: " + section["gpu_notes"], ""]
    for arch in section["archs"]:
        rows = [r for r in section["launches"] + section["liger_launches"] if r["arch"] == arch]
        lines += [f"{heading}# {arch}", "", "| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            if not r["ok"]:
                error = " ".join(r["error"].split()).replace("|", "/")[:300]
                lines.append(f"| {r['variant']} | {r['pass']} | {r['config']} | compile failed: {error} |"
                             + " |" * (len(cols) - 4))
                continue
            if measured:
                r = r | {"measured_gbps": measured.get((r["variant"], r["pass"]))}
            lines.append("| " + " | ".join(_workload_cell(r, k, f).replace("|", "/") for _, k, f in cols) + " |")
        lines.append("")
    liger = section.get("liger") or {}
    if liger.get("status") != "ok":
        lines += [f"Liger-Kernel: {liger.get('status', 'not run')} ({liger.get('reason', '')}); its rope kernel "
                  "is compiled and modelled beside rome's where `liger_kernel` is importable.", ""]
    for s in section.get("skipped", []):
        lines.append(f"- {s['variant']}: not captured: {s['reason']}")
    return "\n".join(lines) + "\n"


def write_workload(out: Path, section: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(section, indent=1, default=str))
    (out / "kernels.md").write_text(f"# rome kernels: {section['workload']['name']}\n\n"
                                    + workload_markdown(section, heading="##"))


# --- output -------------------------------------------------------------------------------

COLUMNS = [  # (header, key, format)
    ("config", "config", ""), ("regs", "registers", "d"), ("stack B", "stack_bytes", "d"),
    ("LDL/STL", "local_instructions", "d"), ("smem B", "shared_bytes", "d"), ("≤ 99 KB", "fits_99kb", ""),
    ("CTAs/SM", "ctas_per_sm", "d"), ("warps/SM", "warps_per_sm", "d"), ("limited by", "limited_by", ""),
    ("ld 128-bit", "ld128_share", "%"), ("st 128-bit", "st128_share", "%"), ("MMA/tile", "mma_per_tile", "n"),
    ("MMA MACs/tile", "mma_macs_per_tile", "n"), ("FP32/tile", "fp32_per_tile", "n"),
    ("calls/tile", "calls_per_tile", "n"), ("bytes/tile", "bytes_per_tile", "n"),
    ("bytes issued/tile", "bytes_issued_per_tile", "n"),
    # the bandwidth model (per tile of the config's own rows x head_dim, x read and written once)
    ("L1 B/elem", "l1_bytes_per_element", "1"), ("instr/DRAM B", "warp_instructions_per_dram_byte", "2"),
    ("batches", "batches", "1"), ("in flight KB/SM", "inflight_kb_per_sm", "1"),
    ("est. H100", "estimate_h100", "%"), ("est. H200", "estimate_h200", "%"),
]


def _cell(v, fmt: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if fmt == "%":
        return f"{100 * v:.0f}%"
    if fmt in ("1", "2"):
        return f"{v:.{fmt}f}"
    if fmt in ("d", "n"):
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"
    return str(v)


def markdown(section: dict, heading: str = "##") -> str:
    """The kernels table(s), one per arch, as markdown."""
    env = section["environment"]
    lines = [f"{heading} Kernels (compiled ahead of time, no GPU needed)", "",
             f"triton {env['triton']}, cuobjdump {env['cuobjdump']}, {len(section['rows'])} rows in "
             f"{section['wall_s']:.0f} s. " + section["method"], ""]
    if section.get("amd_method"):
        lines += [section["amd_method"], ""]
    for name, limits in section["archs"].items():
        rows = [r for r in section["rows"] if r["arch"] == name]
        if name in AMD_ARCHS:
            lines += amd_markdown(name, limits, rows, heading)
            continue
        lines += [f"{heading}# {name}", "",
                  f"Limits: {limits['regs_per_sm'] // 1024}K registers, {limits['smem_per_sm'] // 1024} KB shared "
                  f"memory per SM ({limits['smem_per_block'] // 1024} KB per block), {limits['max_warps']} warps, "
                  f"{limits['max_ctas']} blocks per SM.", "",
                  "| " + " | ".join(h for h, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += _table_rows(rows, COLUMNS) + [""]
    return "\n".join(lines)


def _measured_gbps(results: dict) -> dict | None:
    """(variant, pass) -> GB/s of the report's speed section, when it ran on a GPU (None on a CPU:
    those timings say nothing about the kernel)."""
    env = results.get("environment") or {}
    if str(env.get("device", "CPU")).startswith("CPU") or not results.get("speed"):
        return None
    passes = {"fwd": "forward", "bwd": "backward"}
    return {(r["variant"], passes[r["pass"]]): r["gbps"] for r in results["speed"] if r["pass"] in passes}


def kernels_section(results: dict) -> str:
    """The report's kernels section (markdown) from ``results["kernels"]``; empty if absent. The
    report workload's launches with the model's estimate (and, on a GPU, the measured GB/s beside
    it); an older results.json's every-configuration table as it was."""
    section = results.get("kernels")
    if not section:
        return ""
    if "error" in section:
        return f"## Kernels (compiled ahead of time)\n\nNot measured: {section['error']}\n"
    if "launches" in section:
        measured = _measured_gbps(results)
        text = workload_markdown(section, measured=measured)
        note = ("The full table of every configuration: `python -m profiling kernels` (all archs); this "
                "section compiles only the launches of the report's workload.")
        if measured:
            note += (" measured GB/s: this run's speed section for the variant and pass (q, k read and written, "
                     "tables read once), beside the estimate as a fraction of copy.")
        return text + "\n" + note + "\n"
    return markdown(section)


def _overrides(w) -> dict:
    """What the report's workload ``w`` changed of its registry entry (``--shape``, ``--dtype``)."""
    from .workloads import WORKLOADS

    base = WORKLOADS[w.name]
    out = {k: getattr(w, k) for k in ("batch", "q_heads", "kv_heads", "seq") if getattr(w, k) != getattr(base, k)}
    if w.dtype != base.dtype:
        out["dtype"] = str(w.dtype).removeprefix("torch.")
    return out


def report_section(out: Path, arch: str | None = None, console=None, workload=None) -> dict:
    """results.json's ``kernels`` section for ``make report``: the launches of ``workload`` (a
    ``Workload``, the report's, at its full shape) compiled for ``arch`` (default sm_90) with the
    bandwidth model; without a workload every configuration (``arch`` default sm_80,90,100). Cubins
    and SASS under ``out``; a failure is recorded in the section, not raised."""
    try:
        if workload is not None:
            archs = [parse_arch(a) for a in arch.split(",")] if arch else [WORKLOAD_ARCH]
            if console is not None:
                console.print(f"compiling the {workload.name} launches ahead of time for "
                              f"{', '.join(ARCHS[c].name for c in archs)} (Triton's cache makes a second run quick)")
            section = collect_workload(workload.name, archs, out, overrides=_overrides(workload))
            write_workload(out, section)
            return section
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

    console = Console()
    if not console.is_terminal:
        console = Console(width=220)
    if getattr(args, "workload", None):
        return main_workload(args, console)
    archs = [parse_arch(a) for a in args.arch.split(",")] if args.arch else list(DEFAULT_ARCHS)
    out = Path(args.out or f"reports/kernels-{dt.datetime.now():%Y%m%d-%H%M%S}")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("compiling", total=None)
        section = collect(archs, out, jobs=args.jobs, configs_ref=args.configs or DEFAULT_CONFIGS,
                          on_done=lambda i, n: progress.update(task, completed=i, total=n,
                                                               description=f"compiled {i}/{n}"))
    write(out, section)
    for name in section["archs"]:
        cols = [c for c in (AMD_COLUMNS if name in AMD_ARCHS else COLUMNS)
                if c[1] not in ("fits_99kb", "fits_lds", "limited_by", "bytes_per_tile", "calls_per_tile")]
        table = Table(title=f"{name} (triton {section['environment']['triton']})")
        for h, _, _ in cols:
            table.add_column(h, no_wrap=h == "config")
        for r in (r for r in section["rows"] if r["arch"] == name):
            table.add_row(*([_cell(r.get(k), f) for _, k, f in cols] if r["ok"]
                            else [r["config"], f"[red]{r['error'][-200:]}[/]"] + [""] * (len(cols) - 2)))
        console.print(table)
    console.print(f"{len(section['rows'])} rows in {section['wall_s']:.0f} s; cubins and SASS (AMD: hsaco, amdgcn) under {out}, "
                  f"the full table in {out / 'kernels.md'}; Triton's cache: {section['environment']['cache_dir']}")
    return out


def main_workload(args, console) -> Path:
    """``--workload NAME``: that workload's launches, compiled and modelled; kernels.json/.md."""
    from rich.progress import Progress
    from rich.table import Table

    archs = [parse_arch(a) for a in args.arch.split(",")] if args.arch else [WORKLOAD_ARCH]
    out = Path(args.out or f"reports/kernels-{args.workload}-{dt.datetime.now():%Y%m%d-%H%M%S}")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"capturing the {args.workload} launches", total=None)
        overrides = {"dtype": args.dtype} if args.dtype else None
        section = collect_workload(args.workload, archs, out, jobs=args.jobs, overrides=overrides,
                                   on_done=lambda i, n: progress.update(task, completed=i, total=n,
                                                                        description=f"compiled {i}/{n}"))
    write_workload(out, section)
    for arch in section["archs"]:
        table = Table(title=f"{args.workload} on {arch}: static bandwidth model (triton "
                            f"{section['environment']['triton']}; launches from {section['capture']})")
        for h, _, _ in WORKLOAD_COLUMNS:
            table.add_column(h, no_wrap=h in ("variant", "pass"))
        for r in (r for r in section["launches"] + section["liger_launches"] if r["arch"] == arch):
            table.add_row(*([_workload_cell(r, k, f) for _, k, f in WORKLOAD_COLUMNS] if r["ok"] else
                            [r["variant"], r["pass"], r["config"], f"[red]{r['error'][-200:]}[/]"]
                            + [""] * (len(WORKLOAD_COLUMNS) - 4)))
        console.print(table)
    liger = section["liger"]
    if liger.get("status") != "ok":
        console.print(f"Liger-Kernel: {liger.get('status')}: {liger.get('reason', '')}")
    for s in section["skipped"]:
        console.print(f"[yellow]{s['variant']}: not captured: {s['reason'][:300]}[/]")
    console.print(f"{len(section['launches'])} launches, {section['builds']} builds in {section['wall_s']:.0f} s; "
                  f"{out / 'kernels.json'}, {out / 'kernels.md'}; cubins in Triton's cache "
                  f"({section['environment']['cache_dir']}) and copied under {out}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", help="compile and model just the launches this workload's rome variants make "
                                      "(forward and backward; default arch sm_90); writes kernels.json/.md")
    p.add_argument("--arch", help=f"comma-separated archs (default {','.join(ARCHS[c].name for c in DEFAULT_ARCHS)}; "
                                  f"known: {','.join([a.name for a in ARCHS.values()] + list(AMD_ARCHS))})")
    p.add_argument("--out", help="output folder (default reports/kernels-<timestamp>/)")
    p.add_argument("--dtype", choices=sorted(_DTYPES), help="with --workload: q and k in this dtype instead of "
                                                            "the workload's own (e.g. fp32)")
    p.add_argument("--jobs", type=int, help="compile processes (default: one per CPU)")
    p.add_argument("--configs", help="MODULE:FUNCTION listing the KernelConfigs of an arch "
                                     "(default: rome.launch.kernel_configs)")
