"""The static bandwidth model of ``profiling.static.model`` and the schedule behind its estimate
(``profiling.static.schedule``; ``python -m profiling kernels``): control bits, load batches, a
program's path, what each load reads, the SM's schedule on hand-written SASS, the bounds'
arithmetic, two real compiles (a copy kernel and a gather whose second load waits for the first),
and the anchors: Liger-Kernel's rope kernel at 0.95-1.00 of copy, the gather kernel of 70cea0c
within 5 points of issue 27's independent walk (its SASS saved under tests/fixtures/)."""

import dataclasses
import gzip
import json
import math
from pathlib import Path

import pytest
import triton
import triton.language as tl

from profiling.static import archs, configs, launches, model, nvidia, schedule, tables
from profiling.static import compile as aot
from helpers import StaticConfig

# --- control bits -------------------------------------------------------------------------

# triton 3.9, sm_90 (rome's forward): two 128-bit loads, then the first instructions reading them
REAL = """\
        /*16f0*/               @P6 LDG.E.128 R20, desc[UR6][R144.64] ;                         /* 0x0000000690146981 */
                                                                                               /* 0x000ea2000c1e1d00 */
        /*1720*/               @P6 LDG.E.128 R60, desc[UR6][R144.64+0x10] ;                    /* 0x00001006903c6981 */
                                                                                               /* 0x000ee2000c1e1d00 */
        /*1a90*/                   MOV R68, R20 ;                                              /* 0x0000001400447202 */
                                                                                               /* 0x004fc40000000f00 */
        /*1ab0*/                   IMAD.MOV.U32 R70, RZ, RZ, R60 ;                             /* 0x000000ffff467224 */
                                                                                               /* 0x008fe200078e003c */
"""


def test_control_bits_of_real_sass():
    c = model.sass_controls(REAL)
    assert c[0x16F0] == {"stall": 1, "yield": 1, "write": 2, "read": None, "wait": 0, "reuse": 0}
    assert c[0x1720]["write"] == 3
    # the consumer of each load waits on that load's write scoreboard, and only on it
    assert c[0x1A90]["wait"] == 1 << 2 and c[0x1A90]["write"] is None
    assert c[0x1AB0]["wait"] == 1 << 3
    assert model.control_bits(0x000FC40000000F00) == {"stall": 2, "yield": 0, "write": None, "read": None,
                                                        "wait": 0, "reuse": 0}
    # the decoder reads each field from its own bits
    word = (5 << 41) | (1 << 45) | (4 << 46) | (1 << 49) | (0b100001 << 52) | (0b1010 << 58)
    assert model.control_bits(word) == {"stall": 5, "yield": 1, "write": 4, "read": 1, "wait": 0b100001,
                                          "reuse": 0b1010}


# --- hand-written SASS ----------------------------------------------------------------------


def sass(*instrs) -> str:
    """A cuobjdump-style listing: ``(text, write, wait)`` per instruction, 16 bytes apart from 0;
    ``write`` a scoreboard or None, ``wait`` a mask."""
    lines = []
    for n, (text, write, wait) in enumerate(instrs):
        hi = (1 << 41) | ((7 if write is None else write) << 46) | (7 << 49) | (wait << 52)
        lines.append(f"        /*{16 * n:04x}*/                   {text} ;   /* 0x{n:016x} */")
        lines.append(f"                                                   /* 0x{hi:016x} */")
    return "\n".join(lines) + "\n"


def at(n):
    return hex(16 * n)


def _head():
    return [("S2R R0, SR_CTAID.X", None, 0), ("MOV R1, c[0x0][0x28]", None, 0)]


def test_one_batch_copy_loop():
    h = _head()
    loop = len(h)
    text = sass(*h,
                ("LDG.E.128 R4, desc[UR4][R2.64]", 0, 0),
                ("LDG.E.128 R8, desc[UR4][R2.64+0x10]", 1, 0),
                ("LDG.E.64 R12, desc[UR4][R14.64]", 2, 0),
                ("IADD3 R2, R2, 0x200, RZ", None, 0),
                ("FMUL R4, R4, 2", None, 0b111),
                ("STG.E.128 desc[UR4][R16.64], R4", None, 0),
                ("STG.E.128 desc[UR4][R16.64+0x10], R8", None, 0),
                ("ISETP.GE.AND P0, PT, R2, R3, PT", None, 0),
                (f"@!P0 BRA {at(loop)}", None, 0),
                ("EXIT", None, 0))
    region, loops = model.tile_region(text)
    assert region == "innermost loop with stores" and loops == [(16 * loop, 16 * (loop + 8))]
    t = model.tile_figures(text)
    assert t["instructions"] == 9 and t["batches"] == 1 and t["global_loads"] == 3
    # 128-bit: 512 B a warp, 4 wavefronts; 64-bit: 2
    assert t["l1_global_bytes"] == (4 + 4 + 2 + 4 + 4) * 128
    assert t["global_load_bytes"] == 512 + 512 + 256 and t["global_store_bytes"] == 1024
    # in flight after each of the 9 instructions: 512, 1024, 1280, 1280, then nothing
    assert t["inflight_peak_bytes_per_warp"] == 1280
    assert t["inflight_mean_bytes_per_warp"] == pytest.approx((512 + 1024 + 1280 + 1280) / 9)


def test_serialised_loads_are_separate_batches():
    text = sass(*_head(),
                ("LDG.E R4, desc[UR4][R2.64]", 0, 0),
                ("IMAD.WIDE R6, R4, 0x4, R8", None, 0b1),  # the address of the next load needs it
                ("LDG.E R10, desc[UR4][R6.64]", 1, 0),
                ("LDG.E R11, desc[UR4][R6.64+0x4]", 2, 0),
                ("FADD R10, R10, R11", None, 0b110),
                ("STG.E desc[UR4][R12.64], R10", None, 0),
                ("BRA 0x20", None, 0))
    t = model.tile_figures(text)
    assert t["batches"] == 2 and t["global_loads"] == 3
    assert t["l1_global_bytes"] == 4 * 128  # 32-bit accesses: one wavefront each
    assert t["inflight_peak_bytes_per_warp"] == 256


def test_register_prefetch_counts_the_previous_iterations_loads():
    """Loads issued at the end of iteration i and waited on at the top of i + 1: one batch per
    tile, in flight across the whole body (the second pass sees the first's loads)."""
    text = sass(*_head(),
                ("FMUL R20, R4, R5", None, 0b11),  # waits on the loads of the previous iteration
                ("FMUL R21, R8, R5", None, 0),
                ("STG.E.128 desc[UR4][R12.64], R20", None, 0),
                ("LDG.E.128 R4, desc[UR4][R2.64]", 0, 0),
                ("LDG.E.128 R8, desc[UR4][R2.64+0x10]", 1, 0),
                ("@P0 BRA 0x20", None, 0))
    t = model.tile_figures(text)
    assert t["batches"] == 1
    # after each instruction of the second pass: 0, 0, 0, 512, 1024, 1024
    assert t["inflight_peak_bytes_per_warp"] == 1024
    assert t["inflight_mean_bytes_per_warp"] == pytest.approx((512 + 1024 + 1024) / 6)


def test_async_copies_wait_on_depbar_and_shared_traffic_counts():
    text = sass(*_head(),
                ("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]", None, 0),
                ("LDGSTS.E.BYPASS.128 [R3+0x800], desc[UR4][R4.64+0x10]", None, 0),
                ("LDGDEPBAR", None, 0),
                ("DEPBAR.LE SB0, 0x0", None, 0),
                ("BAR.SYNC.DEFER_BLOCKING 0x0", None, 0),
                ("LDS.128 R8, [R3]", 1, 0),
                ("LDSM.16.M88.4 R12, [R3]", 2, 0),
                ("SHFL.BFLY PT, R9, R8, 0x1, 0x1f", None, 0b110),
                ("STG.E.128 desc[UR4][R6.64], R8", None, 0),
                ("@P0 BRA 0x20", None, 0))
    t = model.tile_figures(text)
    assert t["batches"] == 1 and t["global_loads"] == 2 and t["bar"] == 1 and t["shfl"] == 1
    assert t["l1_shared_bytes"] == 4 * 128 + 4 * 128  # LDS.128 and LDSM .x4: 512 B a warp each
    assert t["inflight_peak_bytes_per_warp"] == 1024


def test_tile_path_takes_unconditional_branches_and_runs_inner_loops_once():
    text = sass(*_head(),                          # 0x20: the tile loop
                ("LDG.E R4, desc[UR4][R2.64]", 0, 0),
                ("FADD R5, R5, 1", None, 0),      # 0x30: an inner loop without stores
                ("@P1 BRA 0x30", None, 0),
                ("@P2 BRA 0x70", None, 0),        # conditional: not taken
                ("BRA 0x80", None, 0),            # unconditional: taken over 0x70
                ("FADD R6, R6, 1", None, 0),
                ("FMUL R4, R4, R5", None, 0b1),   # 0x80
                ("STG.E desc[UR4][R8.64], R4", None, 0),
                ("@P0 BRA 0x20", None, 0),
                ("EXIT", None, 0))
    t = model.tile_figures(text)
    assert t["region"] == "innermost loop with stores" and t["loops"] == [[0x20, 0xA0]]
    assert t["instructions"] == 8 and t["inner_loops"] == 1 and t["batches"] == 1


def test_a_loop_that_loads_without_storing_is_named_and_not_estimated():
    """A norm's first sweep (a loop loading a token's heads, no store) before the tile loop: the
    walk runs it once (its trips are not known to it) and names it; the model gives the launch no
    estimate rather than one that leaves the sweep's trips out (the norm-over-heads launches: 100%
    by the model where an H100 measured 65% forward). A loop without loads is not named."""
    text = sass(*_head(),                          # 0x20: a loop that only loads (a first sweep)
                ("LDG.E R4, desc[UR4][R2.64]", 0, 0),
                ("IADD3 R2, R2, 0x200, RZ", None, 0),     # (each trip its own lines)
                ("FADD R5, R5, R4", None, 0b1),
                ("@P1 BRA 0x20", None, 0),
                ("LDG.E R6, desc[UR4][R2.64]", 0, 0),     # 0x60: the tile loop
                ("FMUL R6, R6, R5", None, 0b1),
                ("STG.E desc[UR4][R2.64], R6", None, 0),
                ("IADD3 R2, R2, 0x200, RZ", None, 0),
                ("@P0 BRA 0x60", None, 0),
                ("EXIT", None, 0))
    k = schedule.Kernel(text)
    assert set(k.load_loops) == {0x20} and set(k.tile_loops) == {0x60}
    _, info = schedule.program_path(k, [512.0], elements_per_byte=1 / 4, num_warps=4)
    assert info["load_loops_walked_once"] == ["0x20"] and info["tile_loops"] == [["0x60", 4]]
    m = model.bandwidth_model(text, num_warps=4, elements_per_tile=128, dram_bytes_per_element=8, registers=32,
                              shared_bytes=0, x_bytes=4, programs={"kinds": [[132, [512.0]]], "grid": 132})
    assert m["estimate_h100"] is None and m["estimates_h100"] is None and m["limit_h100"] == "unmodelled"
    assert "0x20" in m["unmodelled"]
    # the launch gives the loops' trips (first-reach order; None: the tile loop's from its work):
    # the sweep runs them, and the lines it read are read again (at the worst end from DRAM);
    # here both loops read at the program's own address
    text = text.replace("MOV R1, c[0x0][0x28]", "IMAD.WIDE R2, R0, 0x200, c[0x0][0x210]")
    k = schedule.Kernel(text)
    path, info = schedule.program_path(k, [512.0], elements_per_byte=1 / 4, num_warps=4, loop_trips=(4, None))
    assert info["load_loops_walked_once"] == [] and info["load_loops"] == [["0x20", 4]]
    assert info["tile_loops"] == [["0x60", 4]] and sum(1 for i in path if i.addr == 0x20) == 4
    m = model.bandwidth_model(text, num_warps=4, elements_per_tile=128, dram_bytes_per_element=8, registers=32,
                              shared_bytes=0, x_bytes=4,
                              programs={"kinds": [[132, [512.0], [4, None]]], "grid": 132})
    # 4 sweep loads of 4 B x 32 lanes x 4 warps = 2048 B against 512 elements x 8 B: half as many again
    assert m["reread_share"] == pytest.approx(0.5)
    assert m["estimate_h100"] <= 1 / 1.5 + 1e-9 and m["estimate_h100_if_l2_hits"] >= m["estimate_h100"]
    assert m["time_us_h100"] >= 132 * 512 * 8 * 1.5 / model.GPUS["H100"].copy_gbps / 1e3 - 1e-9
    if m["estimate_h100_if_l2_hits"] > 1 / 1.5:
        assert m["limit_h100"] == "re-reads"
    row = {"estimates_h100": None, "estimate_h100": None, "limit_h100": "unmodelled"}
    assert tables.workload_cell(row, "estimate_h100", "%") == "n/a" and tables.estimate_range(row) == "n/a"
    # the inner loop of test_tile_path_... (no loads) is walked once and not named
    text = sass(*_head(), ("LDG.E R4, desc[UR4][R2.64]", 0, 0), ("FADD R5, R5, 1", None, 0),
                ("@P1 BRA 0x30", None, 0), ("STG.E desc[UR4][R8.64], R4", None, 0b1), ("@P0 BRA 0x20", None, 0),
                ("EXIT", None, 0))
    assert not schedule.Kernel(text).load_loops


def _tile_loops_of_class_2(text):
    # the tile loops a program of class 2 (the scalar at p_cls, loaded at 0x20) walks, two loops of
    # 64 elements' work (2 iterations each of one 4-byte store a lane)
    k = schedule.Kernel(text)
    known = schedule.known_loads(k, _params("p_cls", "p_x"), {"p_cls": 2})
    assert known == {0x20: 2}
    return schedule.program_path(k, [64, 64], elements_per_byte=1 / 4, num_warps=1, known_loads=known)[1]["tile_loops"]


def test_a_predicate_written_again_is_no_longer_known():
    """The class's predicate, known from the launch's scalar, is overwritten by a carry-out
    (``LEA ..., P2, ...``) before a branch on P2: the walk must not take that branch on the stale
    value (it sent the norm-over-heads forward down k's code, skipping q's loop). Also a register
    holding the known scalar, written again, is no longer known."""
    p_cls, p_x = "c[0x0][0x210]", "c[0x0][0x218]"
    text = sass(("S2R R0, SR_CTAID.X", 0, 0),                  # 0x00
                (f"MOV R2, {p_cls}", None, 0),                # 0x10
                ("LDG.E R9, desc[UR4][R2.64]", 1, 0),         # 0x20: the class (2)
                ("ISETP.NE.AND P2, PT, R9, 0x1, PT", None, 0b10),  # 0x30: P2 = True
                ("@!P2 BRA 0xc0", None, 0),                   # 0x40: class 1 elsewhere
                ("LEA R4, P2, R0, R1, 0x2", None, 0),         # 0x50: P2 now a carry
                ("@P2 BRA 0xa0", None, 0),                    # 0x60: unknown: falls through
                ("STG.E desc[UR4][R4.64], R6", None, 0),      # 0x70: loop A
                ("@P0 BRA 0x70", None, 0),                    # 0x80
                ("NOP", None, 0),                             # 0x90
                ("STG.E desc[UR4][R4.64+0x4], R6", None, 0),  # 0xa0: loop B
                ("@P1 BRA 0xa0", None, 0),                    # 0xb0
                ("EXIT", None, 0))                            # 0xc0
    assert _tile_loops_of_class_2(text) == [["0x70", 2], ["0xa0", 2]]
    text = sass(("S2R R0, SR_CTAID.X", 0, 0),                  # 0x00
                (f"MOV R2, {p_cls}", None, 0),                # 0x10
                ("LDG.E R9, desc[UR4][R2.64]", 1, 0),         # 0x20: the class (2)
                ("MOV R9, R0", None, 0b10),                   # 0x30: R9 written again
                ("ISETP.NE.AND P2, PT, R9, 0x2, PT", None, 0),  # 0x40: unknown now
                ("@!P2 BRA 0x80", None, 0),                   # 0x50
                ("STG.E desc[UR4][R4.64], R6", None, 0),      # 0x60: loop A
                ("@P0 BRA 0x60", None, 0),                    # 0x70
                ("STG.E desc[UR4][R4.64+0x4], R6", None, 0),  # 0x80: loop B
                ("@P1 BRA 0x80", None, 0),                    # 0x90
                ("EXIT", None, 0))                            # 0xa0
    assert _tile_loops_of_class_2(text) == [["0x60", 2], ["0x80", 2]]


def test_an_exit_inside_the_last_loop_waits_for_its_last_trip():
    """ptxas moves the end of a program's last loop into its body (``@!P1 EXIT`` before an
    unconditional back edge): the walk runs the loop its trips before taking that exit (it left
    after one trip, leaving k's heads out of the norm's backward)."""
    text = sass(("S2R R0, SR_CTAID.X", 0, 0),
                ("LDG.E R4, desc[UR4][R2.64]", 0, 0),         # 0x10: the tile loop
                ("STG.E desc[UR4][R8.64], R4", None, 0b1),    # 0x20
                ("@!P1 EXIT", None, 0),                       # 0x30
                ("BRA 0x10", None, 0),                        # 0x40
                ("EXIT", None, 0))
    k = schedule.Kernel(text)
    path, info = schedule.program_path(k, [5 * 32], elements_per_byte=1 / 4, num_warps=1)
    assert info["tile_loops"] == [["0x10", 5]] and sum(1 for i in path if i.base == "STG") == 5


def test_region_falls_back_to_the_whole_kernel():
    text = sass(("LDG.E R4, desc[UR4][R2.64]", 0, 0), ("STG.E desc[UR4][R8.64], R4", None, 0b1), ("EXIT", None, 0))
    region, loops = model.tile_region(text)
    assert region == "whole kernel" and loops == [(0, 0x20)]
    assert model.tile_figures(text)["batches"] == 1


def test_encodings_are_required():
    with pytest.raises(ValueError, match="encodings"):
        model.tile_figures(nvidia.strip_encodings(REAL))


# --- bounds -------------------------------------------------------------------------------


def test_bounds_arithmetic():
    h100 = model.GPUS["H100"]
    clk_sms = h100.clock_ghz * h100.sms  # GHz x SMs
    b = model.bounds(h100, l1_bytes_per_dram_byte=16, warp_instructions_per_dram_byte=0.4,
                       inflight_bytes_per_sm=8192, dram_bytes_per_read_byte=2)
    assert b["gbps"]["l1"] == pytest.approx(128 * clk_sms / 16)  # 1853 GB/s
    assert b["gbps"]["issue"] == pytest.approx(4 * clk_sms / 0.4)  # 2317 GB/s
    assert b["gbps"]["latency"] == pytest.approx(8192 * 132 / 800e-9 * 2 / 1e9)  # 2703 GB/s
    assert b["limit"] == "l1" and b["estimate"] == pytest.approx(128 * clk_sms / 16 / 3000)
    # nothing short of copy: the estimate is 1
    b = model.bounds(h100, l1_bytes_per_dram_byte=1, warp_instructions_per_dram_byte=0.01,
                       inflight_bytes_per_sm=64 * 1024, dram_bytes_per_read_byte=2)
    assert b["limit"] == "copy" and b["estimate"] == 1
    assert model.GPUS["H200"].copy_gbps > h100.copy_gbps


# --- the schedule ---------------------------------------------------------------------------


def _params(*names):
    """Parameters at sm_90's 0x210 on: pointers (``*fp32``) for names starting with "p", else i32."""
    return schedule.Params.layout([(n, "*fp32" if n.startswith("p") else "i32") for n in names], 0x210)


def test_path_takes_the_class_the_launch_gives_and_runs_each_loop_its_heads():
    """A scalar loaded at one address for every program (the class), compared to an immediate,
    picks the body; each tile loop runs the iterations its work asks (2 elements an iteration:
    one 32-bit fp32... store of 2 x 4 B / 4 B a lane over 1 warp = 64 elements); a loop with no
    work is skipped by its guard."""
    p_cls, p_x = "c[0x0][0x210]", "c[0x0][0x218]"
    text = sass(("S2R R0, SR_CTAID.X", 0, 0),                  # 0x00
                (f"MOV R2, {p_cls}", None, 0),                # 0x10
                ("LDG.E R9, desc[UR4][R2.64]", 1, 0),         # 0x20: the class
                ("ISETP.NE.AND P2, PT, R9, 0x1, PT", None, 0b10),  # 0x30
                ("@P2 BRA 0xd0", None, 0),                    # 0x40: class 1 falls through
                (f"IMAD R4, R0, 0x4, {p_x}", None, 0b1),      # 0x50: body of class 1
                ("@P3 BRA 0x90", None, 0),                    # 0x60: the first loop's guard
                ("STG.E.64 desc[UR4][R4.64], R6", None, 0),   # 0x70: loop A
                ("@P0 BRA 0x70", None, 0),                    # 0x80
                ("STG.E.64 desc[UR4][R4.64+0x8], R6", None, 0),  # 0x90: loop B
                ("@P1 BRA 0x90", None, 0),                    # 0xa0
                ("EXIT", None, 0),                            # 0xb0
                ("NOP", None, 0),                             # 0xc0
                ("STG.E desc[UR4][R4.64], R6", None, 0),      # 0xd0: body of the other classes
                ("@P0 BRA 0xd0", None, 0),                    # 0xe0
                ("EXIT", None, 0))                            # 0xf0
    k = schedule.Kernel(text)
    assert sorted(k.tile_loops) == [0x70, 0x90, 0xd0] and k.tile_loops[0x70].store_bytes == 256
    params = _params("p_cls", "p_x")
    known = schedule.known_loads(k, params, {"p_cls": 1})
    assert known == {0x20: 1}
    # one warp, 4-byte elements: an iteration of A or B stores 256 / 4 = 64 elements
    path, info = schedule.program_path(k, [3 * 64, 2 * 64], elements_per_byte=1 / 4, num_warps=1, known_loads=known)
    assert info["tile_loops"] == [["0x70", 3], ["0x90", 2]] and path[-1].base == "EXIT"
    path, info = schedule.program_path(k, [0, 2 * 64], elements_per_byte=1 / 4, num_warps=1, known_loads=known)
    assert info["tile_loops"] == [["0x90", 2]]  # A's guard taken: no work there
    # another class: the other body
    known = schedule.known_loads(k, params, {"p_cls": 2})
    path, info = schedule.program_path(k, [5 * 32], elements_per_byte=1 / 4, num_warps=1, known_loads=known)
    assert info["tile_loops"] == [["0xd0", 5]]


def test_loads_are_classified_by_what_their_address_depends_on():
    """x read directly at the program's rows (DRAM, distinct bytes), its partner at indices loaded
    from src (no bytes of its own: the lines x's load brings; as many wavefronts as that load), src
    itself at the same address for every program (an L2 hit), and a table read at loaded positions
    with no direct read of it (DRAM)."""
    text = sass(("S2R R0, SR_CTAID.X", 0, 0),
                ("S2R R1, SR_TID.X", 1, 0),
                ("IMAD R2, R1, 0x4, c[0x0][0x210]", None, 0b11),      # src + tid
                ("LDG.E R3, desc[UR4][R2.64]", 2, 0),                  # src[j]: every program the same
                ("IMAD R4, R0, 0x100, R1", None, 0),                   # the program's row
                ("IMAD.WIDE R6, R4, 0x2, c[0x0][0x218]", None, 0),     # x + row
                ("LDG.E.128 R8, desc[UR4][R6.64]", 3, 0),              # x: direct
                ("IMAD R5, R0, 0x100, R3", None, 0b100),               # row + src[j]
                ("IMAD.WIDE R12, R5, 0x2, c[0x0][0x218]", None, 0),
                ("LDG.E R14, desc[UR4][R12.64]", 4, 0),                # the partner: gathered
                ("IMAD.WIDE R16, R0, 0x4, c[0x0][0x220]", None, 0),    # positions at the row
                ("LDG.E R18, desc[UR4][R16.64]", 5, 0),
                ("IMAD.WIDE R20, R18, 0x4, c[0x0][0x228]", None, 0b100000),  # the cache at them
                ("LDG.E R22, desc[UR4][R20.64]", 0, 0),
                ("STG.E.128 desc[UR4][R6.64], R8", None, 0b11001),
                ("EXIT", None, 0))
    path = schedule.parse_sass(text)
    loads = schedule.classify(path, _params("p_src", "p_x", "p_pos", "p_cache"))
    by = {path[i].operands.split(",")[0]: li for i, li in loads.items()}
    assert by["R3"].kind == "l2" and by["R3"].distinct_bytes == 0
    assert by["R8"].kind == "dram" and by["R8"].pointers == ("p_x",) and by["R8"].distinct_bytes == 512
    assert by["R14"].kind == "hit" and by["R14"].gathered and by["R14"].distinct_bytes == 0
    assert by["R14"].wavefronts == 4  # the lines of x's 128-bit load, not one 128 B wavefront
    assert by["R18"].kind == "dram" and by["R22"].kind == "dram" and by["R22"].gathered


def test_a_pointer_selected_by_an_offset_into_the_parameters_is_still_that_pointer():
    """Triton 3.9 selects q's or k's pointer (the SEAM build's swap) as a constant read at a
    register offset, ``LDC.64 R, c[0x0][Rn+0x210]`` (or a uniform register's, ``ULDC.64``), Rn a
    ``SEL`` of two offsets moved as immediates (one of them through ``HFMA2.MMA``'s fp16 halves).
    x's loads through it read q's or k's pointer, so x's partner, gathered at src from the same
    pointer, hits x's lines. (Read without the offsets, x had no pointer and the partner counted
    as a DRAM round trip of its own: 11 DRAM loads in a decode step's program where triton 3.6's
    build has 8 and 3 hits.)"""
    names = ["p_src"] + [f"n{k}" for k in range(26)] + ["p_q", "p_k"]  # p_q at +0x70, p_k at +0x78
    params = _params(*names)

    def listing(move, r="R40", u=""):
        return sass(("S2R R0, SR_CTAID.Y", None, 0),
                    ("S2R R1, SR_TID.X", None, 0),
                    (f"{u}ISETP.GE.AND {u}P5, {u}PT, R0, 0x4, {u}PT", None, 0),
                    (move, None, 0),
                    (f"{u}SEL {r}, {r}, 0x78, {u}P5", None, 0),              # q's offset or k's
                    (f"{u}LDC.64 {r}, c[0x0][{r}+0x210]", 0, 0),
                    ("IMAD.WIDE R2, R1, 0x4, c[0x0][0x210]", None, 0b1),  # src + tid
                    ("LDG.E R3, desc[UR4][R2.64]", 1, 0),                  # src[j]
                    ("IMAD R4, R0, 0x100, R1", None, 0),
                    (f"IMAD.WIDE R6, R4, 0x2, {r}", None, 0),              # x + row
                    ("LDG.E.128 R8, desc[UR4][R6.64]", 2, 0),
                    ("IMAD R5, R0, 0x100, R3", None, 0b10),                # row + src[j]
                    (f"IMAD.WIDE R12, R5, 0x2, {r}", None, 0),
                    ("LDG.E.128 R16, desc[UR4][R12.64]", 3, 0),            # the partner
                    ("EXIT", None, 0b1100))

    def loads(text):
        path = schedule.parse_sass(text)
        return {path[i].operands.split(",")[0]: li for i, li in schedule.classify(path, params).items()}

    for text in (listing("HFMA2.MMA R40, -RZ, RZ, 0, 6.67572021484375e-06"),  # 0x70 as two fp16 halves
                 listing("IMAD.MOV.U32 R40, RZ, RZ, 0x70"), listing("MOV R40, 0x70"),
                 listing("UMOV UR6, 0x70", "UR6", "U")):
        by = loads(text)
        assert by["R8"].kind == "dram" and by["R8"].pointers == ("p_q", "p_k"), text
        assert by["R16"].kind == "hit" and by["R16"].gathered and by["R16"].distinct_bytes == 0, text
    # an offset the path cannot name (here a loaded value): no pointer, as before
    by = loads(listing("LDG.E R40, desc[UR4][R2.64]"))
    assert by["R8"].pointers == () and by["R16"].kind == "dram"


def test_a_load_of_an_address_read_before_is_an_l1_hit_or_an_l2_hit_past_l1():
    """Value numbering along the walk: the weights at the program's tensor (program id 1) read
    again, by a second load whose address is recomputed from the program id and on the second trip,
    are re-reads (an L1 hit; an L2 hit when more than ``l1_bytes`` a warp was loaded in between); x
    at the loop's counter is new every trip; a value a load returned is new every time (its gather
    is not a re-read)."""
    text = sass(("S2R R0, SR_CTAID.Y", None, 0),
                ("IMAD.WIDE R2, R0, 0x4, c[0x0][0x210]", None, 0),    # weights + the tensor's row
                ("IMAD R10, R0, 0x1000, c[0x0][0x220]", None, 0),    # the loop's counter
                ("IMAD.WIDE R4, R10, 0x2, c[0x0][0x218]", None, 0),   # (the body:) x at the counter
                ("LDG.E R6, desc[UR4][R4.64]", 0, 0),
                ("LDG.E R7, desc[UR4][R2.64]", 1, 0),                  # the weights, held address
                ("S2R R8, SR_CTAID.Y", None, 0),
                ("IMAD.WIDE R12, R8, 0x4, c[0x0][0x210]", None, 0),  # the weights' address made again
                ("LDG.E R14, desc[UR4][R12.64]", 2, 0),
                ("IMAD.WIDE R16, R6, 0x4, c[0x0][0x228]", None, 0b1),  # a table at x's value
                ("LDG.E R18, desc[UR4][R16.64]", 3, 0),
                ("IADD3 R10, R10, 0x100, RZ", None, 0),
                ("STG.E desc[UR4][R4.64], R7", None, 0b1110))
    listing = schedule.parse_sass(text)
    path = listing[:3] + listing[3:] + listing[3:]
    params = _params("p_w", "p_x", "n", "p_t")
    trip = len(listing) - 3

    def kinds(**kw):
        loads = schedule.classify(path, params, **kw)
        return [loads[i].kind for i in sorted(loads)]

    assert kinds() == ["dram", "dram", "l1", "dram"] + ["dram", "l1", "l1", "dram"]
    again = schedule.reread_distance(path)
    assert sorted(again) == [3 + 5, 3 + trip + 2, 3 + trip + 5]
    assert again[3 + 5] == again[3 + trip + 5] == 0  # right after a read of the address
    assert again[3 + trip + 2] == 2 * 128  # the gather and the next x in between: 128 B each a warp
    assert kinds(l1_bytes=2 * 128) == kinds()
    assert kinds(l1_bytes=2 * 128 - 1) == ["dram", "dram", "l1", "dram", "dram", "l2", "l1", "dram"]
    assert schedule.classify(path, params)[3 + trip + 2].distinct_bytes == 0
    # the share of L1 a warp may load in between: half the L1 beside the shared memory, over the warps
    assert archs.l1_reread_bytes(archs.ARCHS[90], 128, 1, 16) == (256 - 8) * 1024 // 2 // 16
    assert archs.l1_reread_bytes(archs.ARCHS[90], 40 * 1024, 2, 4) == (256 - 128) * 1024 // 2 // 8


def _copy_steps(latency_class="dram"):
    # a program: one 128-bit load, its consumer waiting on it, a store, exit
    return [(1, 0, 0, None, schedule._K_MEM, latency_class, 4, 512, None, None),
            (1, 0b1, None, None, schedule._K_ALU, 0, 0, 0, None, None),
            (1, 0, None, None, schedule._K_STORE, 0, 4, 0, None, None),
            (1, 0, None, None, schedule._K_EXIT, 0, 0, 0, None, None)]


def test_the_sm_overlaps_programs_by_little_law_and_counts_the_last_wave():
    steps = _copy_steps()
    # 2 CTAs of 1 warp, 4 programs: two rounds of one round trip each (+ a few clocks)
    r = schedule.simulate([steps] * 4, ctas_per_sm=2, num_warps=1, dram_cycles=1000)
    assert 2000 < r["cycles"] < 2020
    # 5 programs on 2 slots: a third, partly empty round
    r5 = schedule.simulate([steps] * 5, ctas_per_sm=2, num_warps=1, dram_cycles=1000)
    assert 3000 < r5["cycles"] < 3030
    # in flight: 512 B for the whole round trip, one load per slot
    assert r["inflight_bytes_per_sm"] == pytest.approx(2 * 512 * 1000 * 2 / r["cycles"], rel=0.01)
    # an L2 hit instead: the round trip is the L2's
    r = schedule.simulate([_copy_steps("l2")] * 4, ctas_per_sm=2, num_warps=1, dram_cycles=1000)
    assert r["cycles"] < 2 * schedule.LATENCY["l2"] + 20
    # the trace: each program's load, when issued and when back (the second round after the first)
    trace = []
    schedule.simulate([steps] * 4, ctas_per_sm=2, num_warps=1, dram_cycles=1000, trace=trace)
    assert sorted(p for p, *_ in trace) == [0, 1, 2, 3] and all(x[2] == 0 and x[5] == "dram" for x in trace)
    assert all(1000 <= x[4] - x[3] <= 1010 for x in trace)  # (the L1 path: 4 wavefronts a load)
    first, second = (sorted(x[3] for x in trace if x[0] in ps) for ps in ((0, 1), (2, 3)))
    assert max(first) < 10 and min(second) > 1000


def test_the_l1_path_is_shared_and_the_scheduler_issues_one_a_clock():
    # 64 warps each loading 512 B (4 wavefronts) at once: the L1 path takes 256 clocks for them
    many = [(1, 0, 0, None, schedule._K_MEM, "l1", 4, 0, None, None),
            (1, 0b1, None, None, schedule._K_ALU, 0, 0, 0, None, None),
            (1, 0, None, None, schedule._K_EXIT, 0, 0, 0, None, None)]
    r = schedule.simulate([many], ctas_per_sm=1, num_warps=64, dram_cycles=1000)
    assert r["cycles"] >= 256 and r["l1_busy"] > 0.8
    alu = [(1, 0, None, None, schedule._K_ALU, 0, 0, 0, None, None)] * 100 + [(1, 0, None, None, schedule._K_EXIT, 0, 0, 0, None, None)]
    r = schedule.simulate([alu], ctas_per_sm=1, num_warps=8, dram_cycles=1000)
    assert 200 <= r["cycles"] <= 205 and r["issue_busy"] > 0.95  # 8 warps on 4 schedulers: 2 a clock each


def test_a_gathered_load_waits_for_the_lines_its_direct_load_brings():
    """x's partner (a "hit": the lines x's direct load brings) completes when those lines are in:
    issued with the direct load, one round trip; issued after the direct load's value was waited
    on (the norm's forward reads the partner after the row's statistics), an L1 hit; without a
    direct load of its tensor before it, a round trip of its own (no bytes either way)."""
    direct = (1, 0, 0, None, schedule._K_MEM, "dram", 4, 512, None, ("p_x",))
    hit = (1, 0, 1, None, schedule._K_MEM, "hit", 4, 0, None, ("p_x",))
    wait0 = (1, 0b1, None, None, schedule._K_ALU, 0, 0, 0, None, None)
    wait1 = (1, 0b10, None, None, schedule._K_ALU, 0, 0, 0, None, None)
    end = (1, 0, None, None, schedule._K_EXIT, 0, 0, 0, None, None)
    l1 = schedule.LATENCY["l1"]
    for steps, lo, hi in (([direct, hit, wait1, end], 1000, 1010),             # together: one round trip
                          ([direct, wait0, hit, wait1, end], 1000 + l1, 1015 + l1),  # after: an L1 hit more
                          ([hit, wait1, end], 1000, 1010)):                    # no direct load: its own trip
        trace = []
        r = schedule.simulate([steps], ctas_per_sm=1, num_warps=1, dram_cycles=1000, trace=trace)
        assert lo <= r["cycles"] <= hi, (steps, r["cycles"])
        assert r["dram_bytes_per_sm"] == (512 if steps[0] is direct else 0)
        assert [x[5] for x in trace] == [x[5] for x in steps if x[4] == schedule._K_MEM]


def test_the_walk_finds_a_loop_its_fall_through_skips():
    """A branch the launch does not decide, whose fall-through jumps past the tile loop (ptxas's
    "more than one batch left" guard before the per-head norm's backward loop): the walk takes the
    way into the loop and runs it its trips (it walked past it: a program a tenth of its work,
    Qwen3's fused backward at 99% of copy by the model where an H100 ran it at 78%)."""
    text = sass(("S2R R0, SR_CTAID.X", 0, 0),                  # 0x00
                ("@!P2 BRA 0x30", None, 0),                   # 0x10: not known: the loop's way
                ("BRA 0x60", None, 0),                        # 0x20: the fall-through skips it
                ("LDG.E R4, desc[UR4][R2.64]", 0, 0),         # 0x30: the tile loop
                ("STG.E desc[UR4][R8.64], R4", None, 0b1),    # 0x40
                ("@P0 BRA 0x30", None, 0),                    # 0x50
                ("EXIT", None, 0))                            # 0x60
    k = schedule.Kernel(text)
    assert set(k.tile_loops) == {0x30}
    path, info = schedule.program_path(k, [5 * 32], elements_per_byte=1 / 4, num_warps=1)
    assert info["tile_loops"] == [["0x30", 5]] and sum(1 for i in path if i.base == "STG") == 5


def test_busiest_sm_takes_every_sms_th_program():
    p = schedule.Programs(((3, None), (3, (1.0,))), 6)
    assert p.busiest(4) == [0, 1] and p.busiest(1) == [0, 0, 0, 1, 1, 1]
    assert p.on_sm(2, 4) == [0] and p.on_sm(3, 4) == [1]
    # the SMs' distinct sequences, the most programs then the most work first (SMs 0-1 run two)
    seqs = p.sm_sequences(4)
    assert seqs[0] == [0, 1] and sorted(map(tuple, seqs[1:])) == [(0,), (1,)] and seqs[1] == [1]
    # kinds of equal work are one; SMs running the same work once
    assert schedule.Programs(((2, (8.0,)), (2, (8.0,))), 4).sm_sequences(132) == [[0]]


def test_a_peeled_batch_after_the_loops_is_walked_before_a_predicated_exit():
    """The head groups' SEAM build stores its last batch after the tile loop, and ptxas puts a
    predicated exit before a head past the group: with the program's ``tail`` (the elements it
    stores outside tile loops) the walk takes that exit only once those stores are done."""
    text = sass(*_head(),
                ("LDG.E.128 R4, desc[UR4][R2.64]", 0, 0),
                ("STG.E.128 desc[UR4][R16.64], R4", None, 0b1),
                ("@!P0 EXIT", None, 0),
                ("STG.E.128 desc[UR4][R16.64+0x10], R4", None, 0),
                ("EXIT", None, 0))
    k = schedule.Kernel(text)
    stores = lambda path: sum(1 for i in path if i.base == "STG")  # noqa: E731
    short, _ = schedule.program_path(k, [], elements_per_byte=1 / 4, num_warps=4)
    one, _ = schedule.program_path(k, [], elements_per_byte=1 / 4, num_warps=4, tail=512.0)
    two, _ = schedule.program_path(k, [], elements_per_byte=1 / 4, num_warps=4, tail=1024.0)
    # (a 128-bit store: 4 fp32 elements x 32 lanes x 4 warps = 512 elements)
    assert stores(short) == 1 and stores(one) == 1 and stores(two) == 2


def test_the_launch_ends_with_its_slowest_sm():
    """A launch of fewer programs than SMs ends when its heaviest program does, not SM 0's
    (a decode step: the head group holding q's last heads and k's first walks one more round trip)."""
    text = sass(*_head(),
                ("LDG.E.128 R4, desc[UR4][R2.64]", 0, 0),
                ("FMUL R4, R4, 2", None, 0b1),
                ("STG.E.128 desc[UR4][R16.64], R4", None, 0),
                ("@!P0 BRA 0x20", None, 0))
    def run(kinds):
        grid = sum(n for n, _ in kinds)
        return model.bandwidth_model(text, num_warps=4, elements_per_tile=512, dram_bytes_per_element=8,
                                     registers=32, shared_bytes=0, x_bytes=4, elements=512.0 * grid,
                                     programs={"kinds": kinds, "grid": grid})
    light = run([[2, [512.0]]])  # one trip of the tile loop a program (4 warps x 32 lanes x 4 elements)
    mixed = run([[1, [512.0]], [1, [2048.0]]])  # SM 1's program walks four trips
    heavy = run([[2, [2048.0]]])
    assert mixed["schedule"]["sm_kinds"] == [1] and mixed["schedule"]["sm_sequences"] == 2
    assert mixed["time_us"] == pytest.approx(heavy["time_us"]) and mixed["time_us"] > 1.3 * light["time_us"]


def test_model_per_element_figures():
    """4 warps, a tile of 512 fp32 elements moving 8 B each: the copy loop above."""
    text = sass(*_head(),
                ("LDG.E.128 R4, desc[UR4][R2.64]", 0, 0),
                ("FMUL R4, R4, 2", None, 0b1),
                ("STG.E.128 desc[UR4][R16.64], R4", None, 0),
                ("@!P0 BRA 0x20", None, 0))
    m = model.bandwidth_model(text, num_warps=4, elements_per_tile=512, dram_bytes_per_element=8,
                              registers=32, shared_bytes=0, x_bytes=4)
    assert m["tile_l1_bytes_per_element"] == 8  # 2 x 512 B a warp x 4 warps / 512
    assert m["tile_warp_instructions_per_dram_byte"] == pytest.approx(4 * 4 / 4096)
    assert m["warps_per_sm"] == 64 and m["dram_read_bytes_per_element"] == 4
    assert 0 < m["estimate_h100"] <= 1 and 0 < m["estimate_h200"] <= 1
    assert m["worst_end"] == "800ns@1.755GHz" and m["limit_h100"] in ("copy", "latency")


# --- real compiles ------------------------------------------------------------------------


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _gather(idx, src, dst, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        i = tl.load(idx + offs, mask=mask, other=0)  # the second load's address waits for the first
        tl.store(dst + offs, tl.load(src + i, mask=mask), mask=mask)


BLOCK = 512


def model_configs(cc):
    meta = {"x_dtype": "fp32", "elements_per_tile": BLOCK, "dram_bytes_per_element": 8}  # as rome's configs give it
    return [StaticConfig("copy", _copy, {"src": "*fp32", "dst": "*fp32", "n": "i32"}, {"BLOCK": BLOCK},
                         ("src", "dst", "n"), num_stages=1, meta=meta),
            StaticConfig("gather", _gather, {"idx": "*i32", "src": "*fp32", "dst": "*fp32", "n": "i32"}, {"BLOCK": BLOCK},
                   ("idx", "src", "dst", "n"))]


def test_model_of_real_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    rows, files = configs.inspect_kernels((90,), jobs=2, configs_ref=f"{__name__}:model_configs")
    models = {}
    signatures = {c.name: c.signature for c in model_configs(90)}
    for r, (_, text) in zip(rows, files):
        assert r["ok"], r.get("error")
        dram = 8 if r["config"] == "copy" else 12  # fp32 read and written (+ the int32 index)
        # (the kernel's parameters and x's bytes as the table's row gives them to the model)
        models[r["config"]] = model.bandwidth_model(
            text, num_warps=4, elements_per_tile=BLOCK, dram_bytes_per_element=dram,
            dram_read_bytes_per_element=dram - 4, registers=r["registers"], shared_bytes=r["shared_bytes"],
            arch=archs.ARCHS[90], x_bytes=4, params=list(signatures[r["config"]].items()))
    copy, gather = models["copy"], models["gather"]
    assert copy["tile"]["region"] == "innermost loop with stores"
    # a copy: one 128-bit load per thread, waited on once; 1 B through L1 per DRAM byte
    assert copy["batches"] == 1 and copy["tile"]["global_loads"] == 1
    assert copy["tile_l1_bytes_per_element"] == 8 and copy["tile_warp_instructions_per_dram_byte"] < 0.05
    assert copy["warps_per_sm"] == 64
    assert copy["limit_h100"] in ("copy", "latency") and copy["estimate_h100"] > 0.9  # 1.0 on triton 3.9
    assert not math.isinf(copy["bounds_h100_gbps"]["latency"]) and copy["inflight_kb_per_sm"] > 0
    # the gather's second load waits for the first: two round trips a tile, fewer bytes in flight
    assert gather["batches"] == 2 and gather["tile"]["global_loads"] >= 2
    assert gather["schedule"]["paths"][0]["loads"]["dram"]["loads"] >= 2
    assert gather["estimate_h100"] <= copy["estimate_h100"]
    # the every-configuration table carries the model's columns where the config says what a tile is
    row = next(r for r in rows if r["config"] == "copy")
    assert row["estimate_h100"] == copy["estimate_h100"] and row["batches"] == 1
    assert row["tile_l1_bytes_per_element"] == 8 and row["model"]["dram_bytes_per_element"] == 8
    assert next(r for r in rows if r["config"] == "gather")["model"] is None  # no tile in its meta
    section = {"environment": {"triton": "x", "cuobjdump": "y"}, "wall_s": 1, "method": "m",
               "archs": {"sm_90": dict(dataclasses.asdict(archs.ARCHS[90]), smem_per_block=1)}, "rows": rows}
    md = tables.markdown(section)
    assert "| est. H100 | est. H200 |" in md
    copy_line = next(line for line in md.splitlines() if line.startswith("| copy |"))
    assert copy_line.endswith(f"| {row['l1_bytes_per_element']:.1f} | {row['warp_instructions_per_dram_byte']:.2f} | 1.0 | "
                              f"{row['inflight_kb_per_sm']:.1f} | {row['estimate_h100']:.0%} | "
                              f"{row['estimate_h200']:.0%} |")


def test_report_section_puts_measured_gbps_beside_the_estimate():
    launch = {"variant": "rome.apply_qk", "pass": "forward", "arch": "sm_90", "config": "c", "ok": True, "grid": 10,
              "units": 10, "registers": 64, "spill_bytes": 0, "ctas_per_sm": 8, "num_warps": 4,
              "l1_bytes_per_element": 4.0, "warp_instructions_per_dram_byte": 0.05, "batches": 1.0,
              "inflight_kb_per_sm": 40.0, "estimate_h100": 0.95, "limit_h100": "latency", "estimate_h200": 0.7,
              "estimates_h100": {"600ns@1.755GHz": 0.96, "800ns@1.755GHz": 0.81, "600ns@1.98GHz": 1.0},
              "estimates_h200": {"600ns@1.755GHz": 0.7, "800ns@1.755GHz": 0.6}, "time_us_h100": 0.8}
    section = {"workload": {"name": "default", "q_shape": [1], "k_shape": [1], "dtype": "bfloat16", "mode": "half",
                            "sections": [128]}, "capture": "rome.launcher.capture", "num_sms": 132, "builds": 1,
               "archs": ["sm_90"], "wall_s": 1.0, "environment": {"triton": "3.9"}, "method": "m", "gpu_notes": "g",
               "launches": [launch], "liger_launches": [], "liger": {"status": "not installed", "reason": "r"},
               "skipped": []}
    speed = [{"variant": "rome.apply_qk", "pass": "fwd", "gbps": 2812.5}, {"variant": "rome.apply_qk", "pass": "fwd+bwd",
                                                                           "gbps": 1.0}]
    gpu = tables.kernels_section({"kernels": section, "speed": speed, "environment": {"device": "NVIDIA H100"}})
    assert "measured GB/s" in gpu and "| 95% | 81–96% | 2812.5 | latency | 70% | 60–70% | 0.8 |" in gpu
    cpu = tables.kernels_section({"kernels": section, "speed": speed, "environment": {"device": "CPU: x"}})
    assert "measured GB/s" not in cpu and "| 40.0 | 95% | 81–96% | latency | 70% | 60–70% | 0.8 |" in cpu
    assert "Liger-Kernel: not installed" in cpu
    assert "this run's clock" not in gpu
    # the run's measured SM clock (profiling.clocks): the model's range at the clock end nearest it,
    # for the run's GPU; none without a clock, on a GPU the model does not know, or on a CPU
    clocked = {"kernels": section, "speed": speed, "environment": {"device": "NVIDIA H100 80GB HBM3"},
               "clocks": {"sm_mhz": {"median": 1950.0}}}
    assert tables.clock_end(clocked) == ("h100", 1.98)
    assert tables.clock_end(clocked | {"clocks": {"sm_mhz": {"median": 1800.0}}}) == ("h100", 1.755)
    assert tables.clock_end(clocked | {"environment": {"device": "NVIDIA H200"}}) == ("h200", 1.98)
    for other in ("NVIDIA A100", "NVIDIA GH200 480GB", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL"):
        assert tables.clock_end(clocked | {"environment": {"device": other}}) is None, other
    assert tables.clock_end(clocked | {"clocks": {"error": "no nvidia-smi on PATH"}}) is None
    text = tables.kernels_section(clocked)
    assert "| H100 800–600 ns at 1.98 GHz (this run's clock) |" in text
    assert "| latency | 70% | 60–70% | n/a | 0.8 |" in text  # (its 800 ns end at 1.98 GHz missing: n/a)
    launch["estimates_h100"]["800ns@1.98GHz"] = 0.9
    assert "| latency | 70% | 60–70% | 90–100% | 0.8 |" in tables.kernels_section(clocked)
    assert "nearest this run's measured SM clock (1950 MHz median" in tables.kernels_section(clocked)
    assert "this run's clock" not in tables.kernels_section(clocked | {"environment": {"device": "CPU: x"}})


def _fake_liger(monkeypatch, constexprs):
    """A stand-in ``liger_kernel.ops.rope`` whose ``_triton_rope`` has these constexprs after the
    pointers and ints of the installed Liger (nothing compiled: the launch is only planned)."""
    import sys
    import types

    class Param:
        def __init__(self, name, is_constexpr):
            self.name, self.is_constexpr = name, is_constexpr

    runtime = ["q_ptr", "q_row_stride", "k_ptr", "k_row_stride", "cos", "cos_row_stride", "sin",
               "sin_row_stride", "sl"]
    fn = types.SimpleNamespace(params=[Param(n, False) for n in runtime] + [Param(n, True) for n in constexprs])
    rope = types.ModuleType("liger_kernel.ops.rope")
    rope._triton_rope = fn
    ops = types.ModuleType("liger_kernel.ops")
    ops.rope = rope
    pkg = types.ModuleType("liger_kernel")
    pkg.ops = ops
    for name, mod in (("liger_kernel", pkg), ("liger_kernel.ops", ops), ("liger_kernel.ops.rope", rope)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(aot.Job, "of", staticmethod(lambda cfg, cc: ("job", cfg.name, cc)))


def test_liger_085_signature_is_planned_and_an_unknown_one_is_a_row(monkeypatch):
    w = launches._workload("default")
    # liger-kernel 0.8.5: the rotary dims rd / pad_rd beside the head dim (the whole head here)
    _fake_liger(monkeypatch, ["bs", "cos_bs", "n_qh", "n_kh", "hd", "rd", "pad_n_qh", "pad_n_kh", "pad_hd",
                              "pad_rd", "BLOCK_SIZE", "BACKWARD_PASS"])
    got = launches._liger(w, 90)
    assert got["status"] == "ok" and [L["pass"] for L in got["launches"]] == ["forward", "backward"]
    job = got["launches"][1]["job"]
    assert job[1] == "liger rope bwd D=128 heads=24/24"
    # a constexpr this model does not know: a status saying which, not a KeyError
    _fake_liger(monkeypatch, ["bs", "n_qh", "hd", "mystery", "BACKWARD_PASS"])
    got = launches._liger(w, 90)
    assert got["status"] == "not modelled" and "mystery" in got["reason"] and "launches" not in got


# --- the anchors ------------------------------------------------------------------------------

FIXTURES = Path(__file__).parent / "fixtures" / "anchor_70cea0c"
# issue 27's independent walk of 70cea0c's gather kernel (default workload, rome.apply_qk, H100):
# (800 ns, 600 ns) ends, per compiler and pass
WALK = {("triton39", "forward"): (0.81, 0.96), ("triton39", "backward"): (0.80, 0.95),
        ("triton36", "forward"): (0.69, 0.84), ("triton36", "backward"): (0.59, 0.72)}


@pytest.mark.parametrize("tag,pass_", sorted(WALK))
def test_the_model_places_70cea0c_within_5_points_of_the_independent_walk(tag, pass_):
    """The gather kernel of 70cea0c (measured on an H200 at 52% / 40% of copy under triton 3.6),
    from its saved sm_90 SASS (tests/fixtures/anchor_70cea0c/regenerate.py makes them): the model
    at 800 and 600 ns (1.755 GHz) within 5 points of the independent walk's figure at the same end."""
    launch = json.loads((FIXTURES / f"{tag}-{pass_}.json").read_text())
    sass = gzip.decompress((FIXTURES / f"{tag}-{pass_}.sass.gz").read_bytes()).decode()
    elements, dram, read = model.tile_elements(launch["meta"])
    m = model.bandwidth_model(sass, num_warps=launch["num_warps"], elements_per_tile=elements,
                              dram_bytes_per_element=dram, dram_read_bytes_per_element=read,
                              registers=launch["registers"], shared_bytes=launch["shared_bytes"],
                              grid=launch["grid"], elements=launch["elements"], programs=launch["programs"],
                              params=launch["params"], x_bytes=2, clocks_ghz=(1.755,))  # (the walk's clock)
    slow, fast = WALK[(tag, pass_)]
    # the walk's figures are an idle schedule's (fixed round trips): the model's unloaded ones
    est = m["estimates_h100_unloaded"]
    assert abs(est["800ns@1.755GHz"] - slow) <= 0.05 + 1e-9, est  # 5 points, inclusive
    assert abs(est["600ns@1.755GHz"] - fast) <= 0.05 + 1e-9, est
    assert m["estimate_h100"] == min(m["estimates_h100"].values()) and m["limit_h100"] == "latency"
    for end, e in m["schedule"]["ends"].items():  # the headline: the loaded memory's share (lower)
        assert m["estimates_h100"][end] == pytest.approx(model.loaded(e["gbps"], model.GPUS["H100"].copy_gbps))
        assert m["estimates_h100"][end] < est[end]
    # the program's path: q's 24 heads, then k's, one a loop iteration; the partner's gathered loads
    # are L1 hits on x's lines (no DRAM bytes of their own)
    path = m["schedule"]["paths"][0]
    assert [n for _, n in path["tile_loops"]] == [24, 24]
    assert path["loads"]["hit"]["loads"] > 0 and path["loads"]["hit"]["distinct_bytes"] == 0


MEASURED = Path(__file__).parent / "fixtures" / "measured_h100_f1c73eb" / "launches.json"


def test_the_loaded_model_reproduces_the_h100_measurement():
    """32 launches measured on an H100 under triton 3.6 (the tables, cache, angles and dot forms of
    rome.apply_qk on default, llama-1d, wan and hunyuan-video, forward and backward: kernel time
    beside a copy of the same q/k bytes; the fixture's regenerate.py says where each part comes
    from), each beside the model's idle schedule of the same launch: the model's estimate (the
    loaded memory's share at the worst end) within 9 points of the measured share of copy, 28 of
    them within 4, none biased by more than 2 points on average; the unloaded min(rate, copy) is
    up to 20 points high on the same launches (what the estimate was before).
    (The idle schedules are the fixture's stored ``schedule_gbps``, the model of the commit it was
    made at: this test holds the loaded law, ``model.loaded``, and the copy constants against the
    measurement; a change to the schedule itself is caught by the anchor tests, which schedule
    committed SASS again.)
    """
    rows = json.loads(MEASURED.read_text())["launches"]
    assert len(rows) == 32 and {r["schedule_triton"] for r in rows} == {"3.6.0"}
    copy = model.GPUS["H100"].copy_gbps
    errors, unloaded = [], []
    for r in rows:
        measured = r["dram_bytes"] / r["measured_kernel_us"] / (r["copy_bytes"] / r["copy_kernel_us"])
        worst = min(r["schedule_gbps"].values())
        errors.append(model.loaded(worst, copy) - measured)
        unloaded.append(min(1.0, worst / copy) - measured)
    assert max(map(abs, errors)) <= 0.09, errors
    assert sum(abs(e) <= 0.04 for e in errors) >= 28, errors
    assert abs(sum(errors) / len(errors)) <= 0.02
    assert max(unloaded) > 0.2


MEASURED_H200 = Path(__file__).parent / "fixtures" / "measured_h200_a471782" / "launches.json"


def test_the_loaded_model_reproduces_the_h200_measurement():
    """10 launches of a471782's gather kernel measured on an H200 under triton 3.6 (rome.apply_qk on
    default, llama-1d and wan in bf16, llama-1d and default in fp32, forward and backward: kernel
    time, the autotuner's choice, beside a copy of the same q/k bytes; the fixture's regenerate.py
    says where each part comes from), each beside the model's idle schedule of the same launch
    built on a CPU. As the H100's test measures it (the launch's DRAM bytes, as the model counts
    them, per second against the measured copy's rate), the loaded H200 estimate at the worst end
    is within 9 points of every launch (8.0 the most), within 4 of 8 of them, and low on average (2.3: the
    worst end of its assumptions), the largest misses llama-1d bf16's (-8.0 / -5.8: that copy of
    168 MB ran at 3.8 TB/s, the big shapes' at 4.2, and the model counts the tables twice there).
    As a time (those bytes at the estimate times the model's assumed copy rate, 4.3 TB/s), it is
    within -5.2 / +1.1% of each measured kernel time.
    (The idle schedules are the fixture's stored ``schedule_gbps``, the model of the commit it was
    made at: this test holds the loaded law, ``model.loaded``, and the copy constants against the
    measurement; a change to the schedule itself is caught by the anchor tests, which schedule
    committed SASS again.)
    """
    rows = json.loads(MEASURED_H200.read_text())["launches"]
    assert len(rows) == 10 and {r["schedule_triton"] for r in rows} == {"3.6.0"}
    copy = model.GPUS["H200"].copy_gbps
    errors, times = [], []
    for r in rows:
        est = model.loaded(min(r["schedule_gbps"].values()), copy)
        measured = r["dram_bytes"] / r["measured_kernel_us"] / (r["copy_bytes"] / r["copy_kernel_us"])
        errors.append(est - measured)
        times.append(r["dram_bytes"] / (est * copy * 1e3) / r["measured_kernel_us"])
    assert max(map(abs, errors)) <= 0.09, errors
    assert sum(abs(e) <= 0.04 for e in errors) >= 8, errors
    assert -0.04 <= sum(errors) / len(errors) <= 0.0, errors
    assert all(0.94 <= t <= 1.02 for t in times), times


MEASURED_H200_PAIRS = Path(__file__).parent / "fixtures" / "measured_h200_a8e7b9b" / "launches.json"


def _shares(path):
    """(row, the loaded H200 estimate at the worst end, the measured DRAM share) of each launch of
    a measured fixture: the launch's DRAM bytes as the model counts them, per second, against the
    measured copy's rate (as test_the_loaded_model_reproduces_the_h200_measurement)."""
    copy = model.GPUS["H200"].copy_gbps
    for r in json.loads(path.read_text())["launches"]:
        yield (r, model.loaded(min(r["schedule_gbps"].values()), copy),
               r["dram_bytes"] / r["measured_kernel_us"] / (r["copy_bytes"] / r["copy_kernel_us"]))


def test_the_loaded_model_against_the_h200_measurement_of_both_forms():
    """18 launches of a8e7b9b's gather kernel measured on an H200 under triton 3.6 (device calls L
    and M, the mean of two rounds): default's 44/44/40 in bf16, fp32 and fp16 in the partner form
    and as its pairs (HALVES_RUN), llama-1d bf16 in the whole head's halves, llama-1d fp32 and wan
    bf16, forward and backward, each beside the model's idle schedule of the same kernel at
    choose()'s tile (the GPU's tuner took that tile or half or twice it: call L's rows name it,
    measured_tiles; wan's and llama-1d's changed between the rounds, whose times agree within
    0.2 %). The loaded
    estimate at the worst end is within 8 points of every launch (7.8 the most: default fp16's
    partner form, low), low by 0.9 on average; as a time within -8.7 / +6.8 %.
    (The idle schedules are the fixture's stored ``schedule_gbps``, the model of the commit it was
    made at: this test holds the loaded law, ``model.loaded``, and the copy constants against the
    measurement; a change to the schedule itself is caught by the anchor tests, which schedule
    committed SASS again.)
    """
    rows = list(_shares(MEASURED_H200_PAIRS))
    assert len(rows) == 18 and {r["schedule_triton"] for r, _, _ in rows} == {"3.6.0"}
    errors = [est - got for _, est, got in rows]
    assert max(map(abs, errors)) <= 0.08, errors
    assert -0.02 <= sum(errors) / len(errors) <= 0.0, errors
    copy = model.GPUS["H200"].copy_gbps
    times = [r["dram_bytes"] / (est * copy * 1e3) / r["measured_kernel_us"] for r, est, _ in rows]
    assert all(0.91 <= t <= 1.07 for t in times), times
    halves = [(est, r["copy_kernel_us"] / r["measured_kernel_us"]) for r, est, _ in rows if r["form"] == "halves"]
    assert len(halves) == 2 and all(abs(est - got) <= 0.01 for est, got in halves), halves  # (llama-1d: 96.1-96.9
    # % of copy measured, as a time share; the model's DRAM bytes count its tables twice)


def test_the_measured_fixture_of_both_forms_is_what_its_script_writes(tmp_path):
    """launches.json is regenerate.py's output from the committed results (the device calls' JSON,
    the schedules under triton 3.6): no hand-edited number."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regen", MEASURED_H200_PAIRS.parent / "regenerate.py")
    regen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regen)
    regen.main(tmp_path / "launches.json")
    assert (tmp_path / "launches.json").read_text() == MEASURED_H200_PAIRS.read_text()


@pytest.mark.xfail(strict=True, reason="known model gap, issue 27: the model says the sections' pairs are 2-4 "
                   "points faster than the partner form; measured 1.4-5.6 points slower (the launch takes the "
                   "partner form unless a thread asks: launch.pairs_halves)")
def test_the_model_ranks_the_pairs_against_the_partner_form_as_measured():
    """The change a user would decide on: default's pairs against its partner form, measured in the
    same run on an H200 (triton 3.6). For each dtype and pass the model's difference (pairs minus
    partner, loaded, worst end) has the measured difference's sign and is within 2 points of it.
    Measured (DRAM share): bf16 -1.9 / -1.4, fp32 -5.3 / -5.6, fp16 -4.5 / -4.2; the model: +2.7 /
    +4.1, +1.8 / +2.0, +2.1 / +2.6. Fails today (strict: when the model is fixed this must be
    turned into a plain test)."""
    rows = {(r["workload"], r["pass"], r["form"]): (est, got) for r, est, got in _shares(MEASURED_H200_PAIRS)}
    misses = []
    for w, p, form in rows:
        if form == "pairs":
            (me, mg), (pe, pg) = rows[(w, p, "pairs")], rows[(w, p, "partner")]
            model_diff, measured_diff = me - pe, mg - pg
            if (model_diff > 0) != (measured_diff > 0) or abs(model_diff - measured_diff) > 0.02:
                misses.append((w, p, round(model_diff, 3), round(measured_diff, 3)))
    assert len(rows) == 18 and not misses, misses


def test_norm_over_heads_launches_give_their_loops_trips():
    """wan-qknorm's fused launches (the norm over a token's heads). With 40 q and k heads, the
    token tile: programs (p, 0) walk q's tokens, (p, 1) k's, two tokens a loop iteration and an
    odd count's last after the loop, so the captured programs give each kind's one loop
    floor(tokens / 2) trips (at least one) and the x elements it stores; with 80 (a token past
    rome.launch.TOKEN_MAX_ELEMENTS), the head groups: the first sweeps' trips (kernel.SWEEP heads
    an iteration forward, SWEEP_GRAD both sweeps backward), so the model runs them instead of
    naming the launch unmodelled. RoPE alone gives none."""
    from rome import kernel, launch

    only = {"cc": 90, "variants": ("rome.apply_qk_norm", "rome.apply_qk"), "liger": False}
    with aot.compiler_pool(1) as pool:  # (this process interprets: the capture runs in a worker)
        tok = pool.submit(launches.workload_launches, "wan-qknorm", {"q_heads": 40, "kv_heads": 40}, **only).result()
        big = pool.submit(launches.workload_launches, "wan-qknorm", {"q_heads": 80, "kv_heads": 80}, **only).result()
    rows = {(L["variant"], L["pass"]): L for L in tok["launches"]}
    for pass_ in ("forward", "backward"):
        L = rows[("rome.apply_qk_norm", pass_)]
        kinds, grid = L["programs"]["kinds"], L["programs"]["grid"]
        assert sum(k[0] for k in kinds) == grid and grid % 2 == 0  # q's programs, then k's
        tokens = L["elements"] // 2 // (40 * 128)
        progs = grid // 2
        assert sorted({(k[0], k[2][0]) for k in kinds}) == sorted(
            {(n, max(1, t // 2)) for n, t in ((tokens % progs, tokens // progs + 1),
                                          (progs - tokens % progs, tokens // progs)) if n})
        assert all(k[1][0] % (40 * 128) == 0 for k in kinds)
        assert launch.token_tile(40, 128, backward=pass_ == "backward")[0] == 8
    rows = {(L["variant"], L["pass"]): L for L in big["launches"]}
    sweep, grad = kernel.SWEEP.value, kernel.SWEEP_GRAD.value
    fwd = rows[("rome.apply_qk_norm", "forward")]["programs"]["kinds"]
    assert {tuple(k[2]) for k in fwd} == {(-(-80 // sweep), None, -(-80 // sweep), None)}
    bwd = rows[("rome.apply_qk_norm", "backward")]["programs"]["kinds"]
    assert {tuple(k[2]) for k in bwd} == {(-(-80 // grad), 80, -(-80 // grad), 80)}
    assert all(len(k) == 2 for k in rows[("rome.apply_qk", "forward")]["programs"]["kinds"])


def test_workload_launches_refuses_a_variant_it_does_not_have():
    with pytest.raises(ValueError, match=r"variants: \['rome.nope'\] are not rome variants \(rome.apply"):
        launches.workload_launches("wan-qknorm", variants=("rome.apply_qk", "rome.nope"))



def _sm90_rows(workload, variant):
    """(pass, launch_row) of ``variant``'s forward and backward on ``workload`` (bf16 q/k),
    compiled for sm_90 under the installed triton and modelled; each compiled, without spill."""
    with aot.compiler_pool(1) as pool:  # (this process interprets: the capture runs in a worker)
        cap = pool.submit(launches.workload_launches, workload, {"dtype": "bf16"}, cc=90,
                          variants=(variant,), liger=False).result()["launches"]
        results = aot.compile_all(pool, [L["job"] for L in cap])
    assert sorted(L["pass"] for L in cap) == ["backward", "forward"]
    rows = []
    for L in cap:
        row = launches.launch_row(L, archs.ARCHS[90], results[L["job"]])
        assert row["ok"] and row["spill_bytes"] == 0, (L["pass"], row.get("error"), row.get("spill_bytes"))
        rows.append((L["pass"], row))
    return rows

def test_a_decode_steps_cache_at_positions_is_two_round_trips():
    """Issue 27's decode target: ``rome.apply_qk_at`` of a decode step (Llama's 64 sequences of one
    token, 32 + 8 heads x 128, bf16, one position a sequence into a cache), compiled for sm_90
    under the installed triton, runs within 2.5 us at the worst end (800 ns, 1.755 GHz) forward and
    backward on its slowest SM, by the model: positions -> cache rows, two DRAM round trips, with
    x's loads beside them (three in a row took 2.8 us under triton 3.9, whose build issued the
    positions' load only once x's first batch was in), and no spill."""
    for pass_, row in _sm90_rows("decode", "rome.apply_qk_at"):
        us = row["schedule"]["ends"]["800ns@1.755GHz"]["us"]
        assert us <= 2.5, (pass_, us)



def test_a_videos_positions_on_three_axes_need_no_shared_memory_before_the_heads():
    """Issue 27: ``rome.RoPE`` on the default workload (bf16 q/k, positions on three axes into fp32
    caches, 44/44/40 sections), compiled for sm_90 under the installed triton. The forward's
    walked path has no barrier and no shared-memory access (a row's positions, the columns' axes
    and the cache rows read in x's register layout, the rows as 16-byte runs of four columns:
    ``rome.positions.axis_run``; the columns' axis read as a [D] vector and the rows read element
    by element took 11 barriers and 94 shared-memory accesses a program, both compilers), the
    backward's at most 3 barriers (11 before: it read its positions per element; 3 under triton
    3.6, none under 3.9), no spill, and by the model each pass is at least 0.90 of an H200's copy
    at the worst end (forward 0.896 under triton 3.6 before, backward 0.887)."""
    for pass_, row in _sm90_rows("default", "rome.RoPE"):
        path = row["schedule"]["paths"][0]
        if pass_ == "forward":
            assert path["barriers"] == 0 and path["shared_accesses"] == 0, (path["barriers"], path["shared_accesses"])
        else:
            assert path["barriers"] <= 3, path["barriers"]
        assert row["estimate_h200"] >= 0.90, (pass_, row["estimate_h200"])

def test_the_model_places_liger_kernel_at_copy(tmp_path, monkeypatch):
    """Liger-Kernel's rope kernel (the installed one, compiled for sm_90 as ``liger_rotary_pos_emb``
    launches it on the default workload's shape): 0.95-1.00 of copy at every end (the independent
    walk: 0.96-1.00)."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (the report/test extra)")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    with aot.compiler_pool(2) as pool:  # (this process interprets: Liger's kernel is planned in a worker)
        got = pool.submit(launches.workload_launches, "default", None, cc=90, variants=()).result()["liger"]
        assert got["status"] == "ok", got
        results = aot.compile_all(pool, [L["job"] for L in got["launches"]])
    for L in got["launches"]:
        row = launches.launch_row(L, archs.ARCHS[90], results[L["job"]])
        assert row["ok"], row.get("error")
        est = row["estimates_h100"]
        assert all(0.95 <= v <= 1.0 for v in est.values()), (L["pass"], est)
        assert 0.95 <= row["estimate_h100"] <= 1.0
