"""The static bandwidth model of ``profiling.static.model`` (``python -m profiling kernels``): control
bits, load batches and bytes in flight on hand-written SASS, the bounds' arithmetic, and two real
compiles (a copy kernel and a gather whose second load waits for the first)."""

import dataclasses
import math

import pytest
import triton
import triton.language as tl

from profiling.static import archs, configs, launches, model, nvidia, tables
from profiling.static import compile as aot

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


def test_latency_view():
    v = model.latency_view_us(grid=64, units=80, batches=2, ctas_per_sm=3, sms=132, latency_ns=800)
    assert v == {"units_per_program": 2, "waves": 1, "us": pytest.approx(3.2)}
    v = model.latency_view_us(grid=132 * 3 + 1, units=132 * 3 + 1, batches=1, ctas_per_sm=3, sms=132,
                                latency_ns=800)
    assert v["waves"] == 2 and v["us"] == pytest.approx(1.6)


def test_model_per_element_figures():
    """4 warps, a tile of 512 fp32 elements moving 8 B each: the copy loop above."""
    text = sass(*_head(),
                ("LDG.E.128 R4, desc[UR4][R2.64]", 0, 0),
                ("FMUL R4, R4, 2", None, 0b1),
                ("STG.E.128 desc[UR4][R16.64], R4", None, 0),
                ("@!P0 BRA 0x20", None, 0))
    m = model.bandwidth_model(text, num_warps=4, elements_per_tile=512, dram_bytes_per_element=8,
                                registers=32, shared_bytes=0, grid=132, units=1000)
    assert m["l1_bytes_per_element"] == 8  # 2 x 512 B a warp x 4 warps / 512
    assert m["warp_instructions_per_dram_byte"] == pytest.approx(4 * 4 / 4096)
    assert m["warps_per_sm"] == 64 and m["dram_read_bytes_per_element"] == 4
    assert m["inflight_mean_bytes_per_sm"] == pytest.approx(512 / 4 * 64)
    assert 0 < m["estimate_h100"] <= 1 and 0 < m["estimate_h200"] <= 1
    assert m["latency_view_h100"]["units_per_program"] == 8


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


@dataclasses.dataclass(frozen=True)
class Config:  # the shape of rome.launch.KernelConfig
    name: str
    fn: object
    signature: dict
    constexprs: dict
    divisible_by_16: tuple
    num_warps: int = 4
    num_stages: int = 1
    meta: dict = dataclasses.field(default_factory=dict)


BLOCK = 512


def model_configs(cc):
    meta = {"x_dtype": "fp32", "elements_per_tile": BLOCK, "dram_bytes_per_element": 8}  # as rome's configs give it
    return [Config("copy", _copy, {"src": "*fp32", "dst": "*fp32", "n": "i32"}, {"BLOCK": BLOCK}, ("src", "dst", "n"),
                   meta=meta),
            Config("gather", _gather, {"idx": "*i32", "src": "*fp32", "dst": "*fp32", "n": "i32"}, {"BLOCK": BLOCK},
                   ("idx", "src", "dst", "n"))]


def test_model_of_real_compiles(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    rows, files = configs.inspect_kernels((90,), jobs=2, configs_ref=f"{__name__}:model_configs")
    models = {}
    for r, (_, text) in zip(rows, files):
        assert r["ok"], r.get("error")
        dram = 8 if r["config"] == "copy" else 12  # fp32 read and written (+ the int32 index)
        models[r["config"]] = model.bandwidth_model(
            text, num_warps=4, elements_per_tile=BLOCK, dram_bytes_per_element=dram,
            dram_read_bytes_per_element=dram - 4, registers=r["registers"], shared_bytes=r["shared_bytes"],
            arch=archs.ARCHS[90])
    copy, gather = models["copy"], models["gather"]
    assert copy["tile"]["region"] == "innermost loop with stores"
    # a copy: one 128-bit load per thread, waited on once; 1 B through L1 per DRAM byte
    assert copy["batches"] == 1 and copy["tile"]["global_loads"] == 1
    assert copy["l1_bytes_per_element"] == 8 and copy["warp_instructions_per_dram_byte"] < 0.05
    assert copy["warps_per_sm"] == 64
    assert copy["limit_h100"] in ("copy", "latency") and copy["estimate_h100"] > 0.9  # 1.0 on triton 3.9
    assert not math.isinf(copy["bounds_h100_gbps"]["latency"])
    # the gather's second load waits for the first
    assert gather["batches"] == 2 and gather["tile"]["global_loads"] >= 2
    assert gather["bounds_h100_gbps"]["latency"] < copy["bounds_h100_gbps"]["latency"]
    # the every-configuration table carries the model's columns where the config says what a tile is
    row = next(r for r in rows if r["config"] == "copy")
    assert row["estimate_h100"] == copy["estimate_h100"] and row["batches"] == 1
    assert row["l1_bytes_per_element"] == 8 and row["model"]["dram_bytes_per_element"] == 8
    assert next(r for r in rows if r["config"] == "gather")["model"] is None  # no tile in its meta
    section = {"environment": {"triton": "x", "cuobjdump": "y"}, "wall_s": 1, "method": "m",
               "archs": {"sm_90": dict(dataclasses.asdict(archs.ARCHS[90]), smem_per_block=1)}, "rows": rows}
    md = tables.markdown(section)
    assert "| est. H100 | est. H200 |" in md
    copy_line = next(line for line in md.splitlines() if line.startswith("| copy |"))
    assert copy_line.endswith(f"| 8.0 | {row['warp_instructions_per_dram_byte']:.2f} | 1.0 | "
                              f"{row['inflight_kb_per_sm']:.1f} | {row['estimate_h100']:.0%} | "
                              f"{row['estimate_h200']:.0%} |")


def test_report_section_puts_measured_gbps_beside_the_estimate():
    launch = {"variant": "rome.apply_qk", "pass": "forward", "arch": "sm_90", "config": "c", "ok": True, "grid": 10,
              "units": 10, "registers": 64, "spill_bytes": 0, "ctas_per_sm": 8, "num_warps": 4,
              "l1_bytes_per_element": 4.0, "warp_instructions_per_dram_byte": 0.05, "batches": 1.0,
              "inflight_mean_bytes_per_sm": 40960.0, "inflight_peak_bytes_per_sm": 65536.0, "estimate_h100": 0.95,
              "limit_h100": "latency", "estimate_h200": 0.7, "latency_view_h100": {"us": 0.8}}
    section = {"workload": {"name": "default", "q_shape": [1], "k_shape": [1], "dtype": "bfloat16", "mode": "half",
                            "sections": [128]}, "capture": "rome.launcher.capture", "num_sms": 132, "builds": 1,
               "archs": ["sm_90"], "wall_s": 1.0, "environment": {"triton": "3.9"}, "method": "m", "gpu_notes": "g",
               "launches": [launch], "liger_launches": [], "liger": {"status": "not installed", "reason": "r"},
               "skipped": []}
    speed = [{"variant": "rome.apply_qk", "pass": "fwd", "gbps": 2812.5}, {"variant": "rome.apply_qk", "pass": "fwd+bwd",
                                                                           "gbps": 1.0}]
    gpu = tables.kernels_section({"kernels": section, "speed": speed, "environment": {"device": "NVIDIA H100"}})
    assert "measured GB/s" in gpu and "| 95% | 2812.5 | latency | 70% | 0.8 |" in gpu
    cpu = tables.kernels_section({"kernels": section, "speed": speed, "environment": {"device": "CPU: x"}})
    assert "measured GB/s" not in cpu and "| 40.0 (peak 64) | 95% | latency | 70% | 0.8 |" in cpu
    assert "Liger-Kernel: not installed" in cpu


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
