"""Reading an NVIDIA cubin with the ``cuobjdump`` that ships with Triton.

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

The SASS's control bits and the bandwidth model built on this reading are in ``model``."""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
import subprocess
import tempfile
from pathlib import Path


def cuobjdump() -> str:
    """The cuobjdump that ships with Triton (``TRITON_CUOBJDUMP_PATH`` overrides)."""
    from triton.tools.disasm import path_to_cuobjdump

    path = path_to_cuobjdump()
    return path[0] if isinstance(path, tuple) else path  # triton < 3.4 returns (path, version)


def run_cuobjdump(flag: str, cubin: bytes) -> str:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kernel.cubin"
        path.write_bytes(cubin)
        return subprocess.run([cuobjdump(), flag, str(path)], capture_output=True, text=True, check=True).stdout


def res_usage(cubin: bytes, name: str | None = None) -> dict:
    """``cuobjdump -res-usage``: REG, STACK, SHARED (static), LOCAL of the kernel ``name``."""
    found = {}
    current = None
    for line in run_cuobjdump("-res-usage", cubin).splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            current = m.group(1)
        elif current and "REG:" in line:
            found[current] = {k.lower(): int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", line)}
    if not found:
        raise RuntimeError("cuobjdump -res-usage reported no function")
    return found.get(name) or next(iter(found.values()))


SASS_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_\w+):")
WIDTH = {"128": 128, "64": 64, "U16": 16, "S16": 16, "U8": 8, "S8": 8}
GLOBAL = {"LDG": "load", "LDGSTS": "load", "STG": "store"}
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

    @functools.cached_property
    def base(self) -> str:  # (cached: the model asks millions of times)
        return self.opcode.split(".")[0]


def parse_sass(text: str) -> list[Instr]:
    """Instructions of a ``cuobjdump -sass`` listing (one kernel), in address order."""
    out = []
    for line in text.splitlines():
        m = SASS_LINE.match(line)
        if m:
            out.append(Instr(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3), m.group(4).strip()))
    return out


def branch_target(ins: Instr, labels: dict) -> int | None:
    if not ins.base.startswith("BRA"):
        return None
    m = re.search(r"0x([0-9a-f]+)", ins.operands)
    if m:
        return int(m.group(1), 16)
    m = re.search(r"(\.L_\w+)", ins.operands)
    return labels.get(m.group(1)) if m else None


def sass_labels(text: str) -> dict:
    labels, pending = {}, []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
        elif pending and SASS_LINE.match(line):
            labels.update({p: int(SASS_LINE.match(line).group(1), 16) for p in pending})
            pending = []
    return labels


def call_target(ins: Instr) -> int | None:
    m = re.search(r"0x([0-9a-f]+)", ins.operands) if ins.base == "CALL" else None
    return int(m.group(1), 16) if m else None


def subroutines(instrs: list[Instr]) -> list[tuple[int, int]]:
    """Address ranges of called subroutines: from a CALL target to the first RET after it, with
    no EXIT between (ptxas also CALLs into the kernel's own code as a predicated jump)."""
    out = []
    for t in sorted({a for a in map(call_target, instrs) if a is not None}):
        after = [i for i in instrs if i.addr >= t and i.base in ("RET", "EXIT")]
        if after and after[0].base == "RET":
            out.append((t, after[0].addr))
    return out


def tile_loops(text: str, instrs: list[Instr] | None = None) -> list[tuple[int, int]]:
    """Address ranges ``[start, end]`` of the outermost loops of the kernel's own code: a
    backward branch from ``end`` to ``start``, outside subroutines."""
    instrs = parse_sass(text) if instrs is None else instrs
    labels, subs = sass_labels(text), subroutines(instrs)
    loops = []
    for ins in instrs:
        target = branch_target(ins, labels)
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
        if base in GLOBAL:
            parts = ins.opcode.split(".")[1:]
            width = next((WIDTH[p] for p in parts if p in WIDTH), 32)
            c["global_" + GLOBAL[base]][width] += 1
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
        elif base == "CALL" and call_target(ins) in sub_starts:
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
