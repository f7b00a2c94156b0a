"""The static bandwidth model: from a cubin's SASS, what each on-chip path of an H100/H200 allows
one tile of the kernel in DRAM bytes per second (see the comment below, and docs/kernels.md)."""

from __future__ import annotations

import dataclasses
import math
import re

from .archs import ARCHS, Arch, occupancy
from .nvidia import (GLOBAL, SASS_LINE, WIDTH, Instr, branch_target, call_target, parse_sass, sass_labels,
                     subroutines, tile_loops)

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
        m = SASS_LINE.match(line)
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
    if base in GLOBAL or base in _SHARED:
        return next((WIDTH[p] for p in parts if p in WIDTH), 32)
    return None


def wavefronts(bits: int) -> int:
    """L1 wavefronts (128 B each) one warp's access of ``bits`` a lane takes, coalesced."""
    return max(1, -(-bits * 32 // 8 // L1_WAVEFRONT))


def _all_loops(instrs: list[Instr], labels: dict, subs) -> list[tuple[int, int]]:
    out = []
    for ins in instrs:
        target = branch_target(ins, labels)
        if target is not None and target < ins.addr and not any(a <= ins.addr <= b for a, b in subs):
            out.append((target, ins.addr))
    return sorted(set(out))


def tile_region(text: str, instrs: list[Instr] | None = None) -> tuple[str, list[tuple[int, int]]]:
    """What one tile is: ``("innermost loop with stores", loops)`` (the innermost loops of the
    kernel's own code that hold a global store; several where q and k have a loop each), else
    ``("outermost loop", tile_loops)``, else ``("whole kernel", [(first, last)])``."""
    instrs = parse_sass(text) if instrs is None else instrs
    labels, subs = sass_labels(text), subroutines(instrs)
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
        if ins.base == "CALL" and call_target(ins) in sub_body:
            path.extend(sub_body[call_target(ins)])
        always = ins.pred in ("", "@PT")
        target = branch_target(ins, labels)
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
    labels, subs = sass_labels(text), subroutines(instrs)
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
                if ins.base in GLOBAL:
                    f[f"global_{GLOBAL[ins.base]}_bytes"] += bits * 32 // 8
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
