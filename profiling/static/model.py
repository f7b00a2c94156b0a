"""The static bandwidth model: from a cubin's SASS, what each on-chip path of an H100/H200 allows
one tile of the kernel in DRAM bytes per second (see the comment below, and docs/kernels.md)."""

from __future__ import annotations

import dataclasses
import math
import re

from .archs import ARCHS, Arch, l1_reread_bytes, occupancy
from .nvidia import GLOBAL, Instr, branch_target, call_target, parse_sass, sass_labels, subroutines, tile_loops
from .schedule import (_back_edges, CLOCKS_GHZ, LATENCIES_NS, SHARED, Params, PARAM_BASE, Programs, access_bits, control_bits,
                       end_name, sass_controls, schedule_launch, wavefronts)

# The estimate (``bandwidth_model``) is ``schedule``'s: one launch's programs scheduled on its slowest
# SM from the SASS at a fixed DRAM latency, at both ends of the latency range and both clocks, the
# rate capped at copy; the worst end is the headline. Beside it, what one tile (one iteration of the
# innermost loop holding a global store) issues, read from its SASS in address order (``tile_figures``):
# L1 wavefronts, instructions, load->wait batches from the control bits (bits 41-61 of the second
# 64-bit word of each instruction: stall 41-44, yield 45, write scoreboard 46-48 (7: none), read
# scoreboard 49-51, wait mask 52-57, reuse 58-61).


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
    "H100 SXM5 and H200 SXM: 132 SMs each (both GH100); SM clock 1.755 GHz (the sustained clock the "
    "issue names, the worst end) and 1.98 GHz (boost); L1/shared-memory path 128 B/clk/SM (one 128 B "
    "wavefront a clock) and 4 warp-instructions issued per clock per SM (one per sub-partition), from "
    "NVIDIA's Hopper tuning guide and microbenchmarks; DRAM round trip 600 and 800 ns (idle to loaded, "
    "microbenchmarks: both ends reported, the worse the headline); an L2 hit 270 clocks, shared memory 33, "
    "constant and special registers 20, MUFU-class results 20, SHFL 25; copy bandwidth 3.0 TB/s on H100 SXM "
    "(HBM3, 3.35 TB/s peak) and 4.3 TB/s on H200 (HBM3e, 4.8 TB/s peak): assumed, about 90% of peak (the "
    "H200 run of profiling/results/h200/final-6d523e5 measured copy at 4.3-4.4 TB/s)."
)
MODEL_METHOD = (
    "Estimate: the launch's programs scheduled on its slowest SM (each SM's programs in dispatch order, the slowest of their distinct sequences; profiling/static/schedule.py): a program's "
    "path through the SASS (branches on a scalar the launch gives resolved, e.g. the permutation's class; "
    "each tile loop run the iterations its heads ask; the prologue, the q->k seam and the epilogue "
    "included), ceil(grid / SMs) programs over the resident CTAs (wave quantisation: the last wave's "
    "empty slots count), every warp on four schedulers issuing one instruction a clock, each waiting its "
    "stall count and the scoreboards of its wait mask; a global load whose address depends on the program "
    "is a DRAM round trip (600 or 800 ns), one every program reads an L2 hit, one the warp read before an L1 "
    "hit (an L2 hit when more than its share of half the L1 was loaded in between); every access holds the L1 "
    "path one clock per 128 B wavefront, a gathered load (address from a loaded index) of a tensor the "
    "program also reads directly touching every line of that direct load (no DRAM bytes of its own) and "
    "completing when the warp's last direct load of that tensor does (after it: an L1 hit). "
    "Rate = the launch's DRAM bytes / the slowest SM's time at 600 and 800 ns, 1.755 and 1.98 GHz; "
    "estimate = the loaded memory's share of copy, (1 + (copy / rate)^3)^(-1/3) (a smooth minimum: a "
    "launch whose idle schedule just reaches copy waits on a loaded memory's queues; the exponent fits "
    "32 launches measured on an H100, profiling/results/h100/forms-f1c73eb), the worst end the headline; "
    "unloaded: min(rate, copy) / copy, the idle schedule's figure. In flight: distinct DRAM bytes outstanding per SM, "
    "averaged over time. L1 B/elem and instr/DRAM B: of the program's whole path (prologue included), per "
    "element it stores. Static figures, not measurements. ")
L1_WAVEFRONT = 128  # bytes
_SHARED = SHARED


_all_loops = _back_edges  # every backward branch outside subroutines: schedule's one reading


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
           inflight_bytes_per_sm: float, dram_bytes_per_read_byte: float,
           dram_bytes_per_moved_byte: float = 1.0) -> dict:
    """GB/s of DRAM traffic each path allows on ``gpu``: the L1/shared-memory path
    (``l1_bytes_per_clk`` x clock x SMs / L1 bytes per DRAM byte), instruction issue (``issue_per_clk``
    x clock x SMs / warp-instructions per DRAM byte), latency by Little's law (load bytes in flight
    per SM x SMs / DRAM latency, scaled from bytes read to all DRAM bytes), and copy (of the op's
    bytes: ``dram_bytes_per_moved_byte`` of what the launch moves, < 1 where it reads lines
    twice). ``estimate``:
    the least of them / copy (0-1); ``limit``: which."""
    clk = gpu.clock_ghz * 1e9
    def per(rate, cost):  # GB/s of DRAM traffic a path of ``rate`` units/s allows at ``cost`` units a byte
        return rate / cost / 1e9 if cost else math.inf

    b = {"l1": per(gpu.l1_bytes_per_clk * clk * gpu.sms, l1_bytes_per_dram_byte),
         "issue": per(gpu.issue_per_clk * clk * gpu.sms, warp_instructions_per_dram_byte),
         "latency": inflight_bytes_per_sm * gpu.sms / (gpu.dram_latency_ns * 1e-9) * dram_bytes_per_read_byte / 1e9,
         "copy": gpu.copy_gbps * dram_bytes_per_moved_byte}
    limit = min(b, key=b.get)
    return {"gbps": b, "limit": limit, "estimate": b[limit] / gpu.copy_gbps}


# The loaded memory: an idle schedule (fixed round trips) that reaches copy's rate R_c at rate R
# is read as R_c (1 + (R_c / R)^K)^(-1/K) of copy, not min(R, R_c): near saturation the round trips
# grow with the queues, so a launch with its bytes in flight just enough for copy at 800 ns gets
# ~2^(-1/K) of it, and one with twice that ~96%. K = 3 fits the 32 launches measured on an H100
# under triton 3.6 (profiling/results/h100/forms-f1c73eb: tables, cache, angles and dot forms of
# four workloads, fwd and bwd, against the model's schedules of the same launches): 28 within 4
# points, all within 9 (the unloaded min(): up to 21 points high); tests/test_bandwidth_model.py
# holds the model to them.
LOADED_K = 3.0


def loaded(rate_gbps: float, copy_gbps: float, k: float = LOADED_K) -> float:
    """Share of ``copy_gbps`` a launch whose idle schedule moves ``rate_gbps`` gets from a loaded
    memory: ``(1 + (copy / rate)^k)^(-1/k)`` (0 for no rate)."""
    if rate_gbps <= 0:
        return 0.0
    return (1.0 + (copy_gbps / rate_gbps) ** k) ** (-1.0 / k)


def limit_of(end: dict, copy_gbps: float) -> str:
    """What bounds the schedule at one end: ``copy`` where it reaches copy, else ``issue`` or ``l1``
    where that path is busy >= 85% of the time, else ``latency`` (too few bytes in flight)."""
    if end["gbps"] >= copy_gbps:
        return "copy"
    if end["issue_busy"] >= 0.85:
        return "issue"
    if end["l1_busy"] >= 0.85:
        return "l1"
    return "latency"


def launch_programs(programs: dict) -> Programs:
    """``launches.launch_programs``' dict as the schedule's ``Programs``: each kind (count, work[,
    loop trips[, tail]]) as hashable tuples."""
    def kind(n, w, *rest):
        out = [int(n), None if w is None else tuple(float(x) for x in w)]
        if rest:
            out.append(None if rest[0] is None else tuple(None if t is None else int(t) for t in rest[0]))
        if len(rest) > 1:
            out.append(None if rest[1] is None else float(rest[1]))
        return tuple(out)
    return Programs(tuple(kind(*k) for k in programs["kinds"]), int(programs["grid"]),
                    tuple(sorted((programs.get("uniform") or {}).items())))


def bandwidth_model(sass: str, *, num_warps: int, elements_per_tile: float, dram_bytes_per_element: float,
                    dram_read_bytes_per_element: float | None = None, registers: int, shared_bytes: int,
                    arch: Arch = ARCHS[90], grid: int | None = None, units: int | None = None,
                    elements: float | None = None, programs: dict | None = None, params: list | None = None,
                    x_bytes: float = 2, gpus=tuple(GPUS.values()), clocks_ghz=CLOCKS_GHZ,
                    latencies_ns=LATENCIES_NS, schedule: bool = True) -> dict:
    """The static bandwidth model of one kernel build (see ``MODEL_METHOD`` and docs/kernels.md).

    ``sass``: ``cuobjdump -sass`` of the cubin with its encodings; ``num_warps``: the launch's;
    ``elements_per_tile``: x elements one tile (one iteration of the tile loop) rotates;
    ``dram_bytes_per_element``: the DRAM bytes the op must move per x element (x read and written,
    the tables' share), ``dram_read_bytes_per_element`` of them read; ``registers``,
    ``shared_bytes``: the build's, for the resident CTAs on ``arch``; ``grid``, ``elements``,
    ``programs`` (``launches.launch_programs``), ``params`` (the kernel's parameters in order, (name,
    type)): the launch, for the schedule. Without ``programs``: a steady tile, one wave of programs
    whose tile loops run twice, at the worst end only (the every-configuration table); ``schedule``
    False: the tile's figures only.
    Returns the tile's figures, occupancy, and per GPU ``estimate_<gpu>`` (the worst end),
    ``estimates_<gpu>`` (every end), ``limit_<gpu>``, ``time_us`` (the worst end's)."""
    t = tile_figures(sass)
    occ = occupancy(arch, registers, shared_bytes, num_warps)
    read = dram_read_bytes_per_element if dram_read_bytes_per_element is not None else dram_bytes_per_element / 2
    dram_tile = elements_per_tile * dram_bytes_per_element
    out = {
        "tile": t, "num_warps": num_warps, "elements_per_tile": elements_per_tile,
        "dram_bytes_per_element": dram_bytes_per_element, "dram_read_bytes_per_element": read,
        "ctas_per_sm": occ["ctas_per_sm"], "warps_per_sm": occ["warps_per_sm"],
        "occupancy_limited_by": occ["limited_by"],
        "batches": t.get("batches"), "shfl_per_tile": t.get("shfl", 0) * num_warps,
        "bar_per_tile": t.get("bar", 0) * num_warps,
        # one tile, as read in address order (coalesced wavefronts; instructions of the loop body)
        "tile_l1_bytes_per_element": (t.get("l1_global_bytes", 0) + t.get("l1_shared_bytes", 0)) * num_warps
        / elements_per_tile,
        "tile_warp_instructions_per_dram_byte": t.get("instructions", 0) * num_warps / dram_tile,
    }
    if not schedule:  # (the every-configuration table off sm_90: H100/H200 are sm_90)
        return out | {f"estimate_{g.name.lower()}": None for g in gpus}
    if occ["ctas_per_sm"] == 0:
        return out | {f"estimate_{g.name.lower()}": 0.0 for g in gpus}
    sms = gpus[0].sms
    layout = Params.layout(params, PARAM_BASE[arch.cc]) if params and arch.cc in PARAM_BASE else None
    if programs is not None:
        progs = launch_programs(programs)
        ends_ns, clocks = latencies_ns, clocks_ghz
    else:
        n = sms * occ["ctas_per_sm"]
        progs, elements = Programs(((n, None),), n, (), iterations=2), None
        ends_ns, clocks = (max(latencies_ns),), (min(clocks_ghz),)
    s = schedule_launch(sass, progs, params=layout, ctas_per_sm=occ["ctas_per_sm"], num_warps=num_warps,
                        l1_bytes=l1_reread_bytes(arch, shared_bytes, occ["ctas_per_sm"], num_warps),
                        x_bytes=x_bytes, dram_bytes_per_element=dram_bytes_per_element, launch_elements=elements,
                        sms=sms, clocks_ghz=clocks, latencies_ns=ends_ns)
    worst_name = min(s["ends"], key=lambda k: s["ends"][k]["gbps"])
    worst = s["ends"][worst_name]
    first = s["paths"][0]
    per_program = first["elements_stored"] or 1
    out |= {
        "schedule": s, "worst_end": worst_name, "time_us": worst["us"],
        "programs_on_busiest_sm": s["programs_on_busiest_sm"],
        "inflight_kb_per_sm": worst["inflight_kb_per_sm"],
        "inflight_mean_bytes_per_sm": worst["inflight_kb_per_sm"] * 1024,
        "issue_busy": worst["issue_busy"], "l1_busy": worst["l1_busy"],
        # the program's whole path (prologue, seam, epilogue; gathered loads at their lines), per element
        "l1_bytes_per_element": first["wavefronts"] * L1_WAVEFRONT * num_warps / per_program,
        "warp_instructions_per_dram_byte": first["instructions"] * num_warps / (per_program * dram_bytes_per_element),
    }
    once = sorted({a for p in s["paths"] for a in p.get("load_loops_walked_once", [])})
    if once:  # a loop without stores that loads (a norm's first sweep over a token's heads): its
        # trips are unknown to the walk, which ran it once; no estimate rather than one without them
        out["unmodelled"] = (f"loops without stores that load ({', '.join(once)}) were walked once: "
                             "their trips are unknown to the model")
        return out | {k: None for g in gpus for k in (f"estimates_{g.name.lower()}", f"estimate_{g.name.lower()}",
                                                      f"time_us_{g.name.lower()}", f"bounds_{g.name.lower()}_gbps")} \
            | {f"limit_{g.name.lower()}": "unmodelled" for g in gpus}
    # bytes a sweep reads and the program reads again: at the worst end DRAM bytes on top of the
    # op's (second reads missing L2), so copy's rate of all the launch moves bounds the op's bytes
    # to 1 / (1 + share) of copy
    share = s.get("reread_share", 0.0)
    out["reread_share"] = share
    cap = 1.0 / (1.0 + share)
    for g in gpus:
        key = g.name.lower()
        # (a sweep's re-reads: copy's rate of the op's bytes is cap x copy)
        est = {k: cap * loaded(e["gbps"], cap * g.copy_gbps) for k, e in s["ends"].items()}
        out[f"estimates_{key}"] = est
        out[f"estimate_{key}"] = est[worst_name]
        out[f"estimates_{key}_unloaded"] = {k: min(cap, e["gbps"] / g.copy_gbps) for k, e in s["ends"].items()}
        out[f"limit_{key}"] = "re-reads" if share and worst["gbps"] / g.copy_gbps >= cap \
            else limit_of(worst, g.copy_gbps)
        if share:  # (with the second reads L2 hits: the schedule's figure alone)
            out[f"estimate_{key}_if_l2_hits"] = loaded(worst["gbps"], g.copy_gbps)
        # the launch's time at the worst end from the loaded estimate (kernel time, no launch
        # overhead; no faster than copy moves its bytes, a sweep's bytes read again among them)
        out[f"time_us_{key}"] = s["dram_bytes"] / (est[worst_name] * g.copy_gbps) / 1e3 if est[worst_name] else math.inf
        out[f"bounds_{key}_gbps"] = bounds(g, l1_bytes_per_dram_byte=out["l1_bytes_per_element"] / dram_bytes_per_element,
                                           warp_instructions_per_dram_byte=out["warp_instructions_per_dram_byte"],
                                           inflight_bytes_per_sm=out["inflight_mean_bytes_per_sm"],
                                           dram_bytes_per_read_byte=dram_bytes_per_element / read,
                                           dram_bytes_per_moved_byte=cap)["gbps"]
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
