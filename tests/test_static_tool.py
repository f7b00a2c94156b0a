"""The ahead-of-time compile tool itself (``python -m profiling kernels``), on kernels whose code is
known: a copy kernel's cubin and hsaco read back (loads, stores, registers, no spill, Triton's
cache), the tool's specialisation the one a real launch compiles (same Triton cache key, CUDA and
HIP), occupancy by registers and shared memory/LDS, the SASS reader, the CLI's tables. The gate
that compiles rome's own configurations with it is tests/test_kernels_static.py.
"""
import dataclasses
import importlib
import json

import pytest
import torch
import triton
import triton.language as tl

from profiling.static import archs, configs, nvidia, tables
from profiling.static import compile as aot
from profiling.__main__ import main
from helpers import StaticConfig

ARCHS = (90, 80, 100)  # the specialisation check's (the gate's archs)
AMD_ARCH = "gfx942"


def _pass(meta):
    return meta.get("pass", meta.get("pass_"))


@triton.jit
def _copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    # persistent: program p doubles tiles p, p + P, ... of src into dst
    pid = tl.program_id(0)
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask) * 2.0, mask=mask)


@triton.jit(do_not_specialize=["n"])
def _scale_kernel(src, dst, n, scale, BLOCK: tl.constexpr):
    # n is never specialised (no divisibility, never a constant), scale is a float
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offs, tl.load(src + offs, mask=offs < n) * scale, mask=offs < n)


BLOCK = 512  # fp32 elements: 4 per thread with 4 warps, one 128-bit access each


def copy_config(name="aligned", divisible=("src", "dst", "n")):
    return StaticConfig(name, _copy_kernel, {"src": "*fp32", "dst": "*fp32", "n": "i32"}, {"BLOCK": BLOCK},
                  tuple(divisible), meta={"bytes_per_tile": 2 * BLOCK * 4})


def copy_configs(cc):
    return [copy_config()]


def copy_configs_unaligned(cc):
    return [copy_config(), copy_config("src unaligned", ("dst", "n"))]


def test_reads_a_known_kernel_and_leaves_it_in_tritons_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    rows, files = configs.inspect_kernels((90,), jobs=2, configs_ref=f"{__name__}:copy_configs_unaligned")
    aligned, unaligned = rows
    assert aligned["ok"] and unaligned["ok"], (aligned.get("error"), unaligned.get("error"))
    # one tile loop; a tile is one 128-bit load and one 128-bit store per thread, 2 * 512 * 4 bytes
    assert aligned["tile_loops"] == 1
    assert aligned["sass"]["per_tile"]["global_load"] == {"128": 1} == aligned["sass"]["per_tile"]["global_store"]
    assert aligned["ld128_share"] == aligned["st128_share"] == 1
    assert aligned["bytes_issued_per_tile"] == aligned["bytes_per_tile"] == 4096
    assert aligned["fp32_per_tile"] == 4 and aligned["mma_per_tile"] == 0  # x * 2.0 on 4 elements
    assert aligned["stack_bytes"] == 0 and not aligned["spills"] and aligned["shared_bytes"] == 0
    # without tt.divisibility on src the loads are scalar: the specialisation reaches the compiler
    assert unaligned["sass"]["per_tile"]["global_load"] == {"32": 4} and unaligned["ld128_share"] == 0
    assert unaligned["st128_share"] == 1
    # the cubin read is the one Triton cached, under TRITON_CACHE_DIR
    path = aligned["cache_cubin"]
    assert path and path.startswith(str(tmp_path / "cache"))
    assert open(path, "rb").read() == files[0][0]
    # a row without the SASS (the CI gate's: sass=False, whose jobs dump none) reads the same
    # resource usage; the job's own flag is what the gate's compile passes
    jobs = [dataclasses.replace(aot.Job.of(c, 90), sass=False) for c in copy_configs_unaligned(90)]
    assert all(not j.sass for j in jobs) and aot.Job.of(copy_config(), 90, sass=False) == jobs[0]
    res = {"res": {"reg": aligned["registers"], "stack": 0, "local": 0, "shared": aligned["shared_static"]},
           "sass_stats": None, "shared_dynamic": aligned["shared_dynamic"], "num_warps": aligned["num_warps"],
           "compile_s": 0.0, "triton_hash": aligned["triton_hash"], "cache_cubin": path}
    light = configs.row({"name": "aligned", "meta": aligned["meta"], "num_warps": 4, "num_stages": 3},
                        archs.ARCHS[90], res)
    same = ("registers", "stack_bytes", "local_bytes", "shared_bytes", "ctas_per_sm", "triton_hash", "cache_cubin")
    assert {k: light[k] for k in same} == {k: aligned[k] for k in same}
    assert light["ok"] and light["sass"] is None and light["local_instructions"] is None and light["spills"] is False
    spilled = configs.row({"name": "x", "meta": {}, "num_warps": 4, "num_stages": 3}, archs.ARCHS[90],
                          res | {"res": res["res"] | {"stack": 8}})
    assert spilled["spills"] and spilled["stack_bytes"] == 8


class _StandInDriver:
    """What a warm-up launch asks of a GPU driver: device, stream, target. The device number is
    the arch, so the JIT keeps one binder (and target) per arch in a reused worker."""

    def __init__(self, cc):
        self.cc = cc

    def get_current_device(self):
        return self.cc

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.cc, 32)


_TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "i32": torch.int32,
          "i64": torch.int64, "u8": torch.uint8, "i8": torch.int8, "i1": torch.bool}


def _launch_args(job):
    """The job's JIT function and arguments a real launch would pass for its specialisation: CPU
    tensors for pointers (a 1-element offset makes one unaligned), ints 32 (divisible by 16) or 17."""
    fn = aot.jit_function(getattr(importlib.import_module(job.module), job.fn_name))
    sig, const = dict(job.signature), dict(job.constexprs)
    args = []
    for n in fn.arg_names:
        if n in const:
            args.append(const[n])
        elif sig[n].startswith("*"):
            t = torch.zeros(64, dtype=_TORCH[sig[n][1:]])
            args.append(t if n in job.divisible_by_16 else t[1:])
        elif sig[n].startswith("fp"):
            args.append(0.5)
        else:
            args.append((32 if n in job.divisible_by_16 else 17) + (2**33 if sig[n] == "i64" else 0))
    return fn, args


def _launch_hash(job) -> tuple[str, str]:
    """(the tool's Triton hash, the hash a warm-up launch with matching arguments compiles).

    Runs in a compiler_pool worker. The launch goes through the JIT's own binder: CPU tensors
    stand in for pointers (a 1-element offset makes one unaligned), ints are 32 (divisible by 16)
    or 17, and a stand-in driver names the target.
    """
    from triton.runtime import driver

    fn, args = _launch_args(job)
    tool = job.run()["triton_hash"]
    driver.set_active(_StandInDriver(job.cc))  # this worker process launches nothing for real
    launch = fn.warmup(*args, grid=(1,), num_warps=job.num_warps, num_stages=job.num_stages, **dict(job.options))
    return tool, launch.hash


def _variants(cfg):
    """cfg; cfg with its first i32 argument equal to 1; cfg with its first pointer unaligned."""
    ints = [n for n, t in cfg.signature.items() if t == "i32"]
    ptrs = [n for n in cfg.divisible_by_16 if cfg.signature[n].startswith("*")]
    one = {n: t for n, t in cfg.signature.items() if n != ints[0]}
    return [cfg,
            dataclasses.replace(cfg, signature=one, constexprs=cfg.constexprs | {ints[0]: 1},
                                divisible_by_16=tuple(n for n in cfg.divisible_by_16 if n != ints[0])),
            dataclasses.replace(cfg, divisible_by_16=tuple(n for n in cfg.divisible_by_16 if n != ptrs[0]))]


def _specialisation_jobs(cc):
    """In a worker: for sm_90 (the GPU machines') jobs for bf16 fwd, bf16 bwd, the gather kernel
    forward by tables and backward by positions, the copy kernel and its variants (an int equal to
    1, a pointer unaligned: the tool's specialisation, the same code for any kernel; on the copy
    kernel, not rome's, for CI's minutes: two rome builds fewer, 5-10 s of CPU each) and a kernel
    whose int is never specialised; for sm_80 and sm_100 (the key's target part) the copy kernel
    unaligned (a rome kernel there is the same key's arch part)."""
    if cc != 90:
        return [aot.Job.of(copy_config("unaligned", ("dst",)), cc, sass=False)]
    cfgs = configs.configs(cc)
    fwd, bwd = (next(c for c in cfgs if _pass(c.meta) == p and c.meta["x_dtype"] == "bf16") for p in ("fwd", "bwd"))
    gather = [next(c for c in cfgs if _pass(c.meta) == p and c.meta["x_dtype"] == "bf16" and c.meta["product"] == "gather"
                   and c.meta["positions"] == pos) for p, pos in (("fwd", 0), ("bwd", 1))]
    scale = StaticConfig("scale", _scale_kernel, {"src": "*fp16", "dst": "*fp16", "n": "i32", "scale": "fp32"},
                   {"BLOCK": 256}, ("src", "dst"))
    return [aot.Job.of(c, cc, sass=False)  # (the hash is the compile's: no SASS dumped)
            for c in [fwd, bwd, *gather, *_variants(copy_config()), copy_config("unaligned", ("dst",)), scale]]


def test_specialisation_is_the_one_a_launch_compiles():
    """Same Triton cache key as the JIT's own launch path: the AOT cubins are the launch's."""
    with aot.compiler_pool(2) as pool:
        jobs = [job for listed in pool.map(_specialisation_jobs, ARCHS) for job in listed]
        hashes = list(pool.map(_launch_hash, jobs))
    for job, (tool, launch) in zip(jobs, hashes):
        assert tool == launch, job


def test_occupancy():
    a90, a80, a86 = archs.ARCHS[90], archs.ARCHS[80], archs.ARCHS[86]
    # 255 regs -> 8192 per warp, 2 warps per 16K sub-partition: 8 warps; 84 KB + 1 KB reserved: 2 blocks
    occ = archs.occupancy(a90, 255, 84992, 4)
    assert (occ["ctas_per_sm"], occ["warps_per_sm"], occ["limited_by"]) == (2, 8, "registers, shared memory")
    # 32 regs (16 warps per sub-partition), no shared memory: full occupancy, 64 warps
    occ = archs.occupancy(a80, 32, 0, 4)
    assert (occ["ctas_per_sm"], occ["warps_per_sm"], occ["limited_by"]) == (16, 64, "registers, warps")
    assert archs.occupancy(a80, 24, 0, 4)["limited_by"] == "warps"
    assert archs.occupancy(a86, 32, 0, 1)["ctas_per_sm"] == 16  # sm_86's 16-block limit
    # 200 regs -> 6400 per warp: 2 per sub-partition (not 65536 // 6400 = 10 per SM): 8 warps
    assert archs.occupancy(a90, 200, 0, 4)["warps_per_sm"] == 8
    # over the per-block shared memory limit: the block cannot launch
    assert archs.occupancy(a86, 32, 99 * 1024 + 1, 4)["ctas_per_sm"] == 0
    assert archs.occupancy(a86, 32, 99 * 1024, 4)["ctas_per_sm"] == 1


def test_parse_arch():
    assert [archs.parse_arch(a) for a in ("sm_80", "sm90a", "100", "8.6")] == [80, 90, 100, 86]
    with pytest.raises(ValueError, match="sm_70"):
        archs.parse_arch("sm_70")


SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/              @!P0 BRA 0x80 ;
        /*0020*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
.L_x_1:
        /*0030*/                   LDG.E.U16 R8, desc[UR4][R2.64] ;
        /*0040*/                   HMMA.16816.F32.BF16 R12, R4, R8, R12 ;
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR20].tnspB, R24 ;
        /*0060*/              @P1 BRA 0x40 ;
        /*0070*/                   CALL.REL.NOINC 0x120 ;
        /*0080*/                   STG.E.64 desc[UR4][R2.64], R4 ;
        /*0090*/                   FFMA R1, R2, R3, R4 ;
        /*00a0*/              @P3 CALL.REL.NOINC 0xc0 ;
        /*00b0*/               @P2 BRA `(.L_x_1) ;
        /*00c0*/               @P4 EXIT ;
        /*00d0*/                   LDG.E.64 R4, desc[UR4][R2.64] ;
        /*00e0*/                   CALL.REL.NOINC 0x120 ;
        /*00f0*/               @P5 EXIT ;
        /*0100*/                   BRA 0xd0 ;
        /*0110*/                   EXIT ;
        /*0120*/                   BRA 0x120 ;
        /*0130*/                   RET.REL.NODEC R20 0x0 ;
"""


def test_sass_reading():
    st = nvidia.read_sass(SASS)
    # two loops of the kernel's own code: 0x30..0xb0 (holding the inner 0x40..0x60) and 0xd0..0x100,
    # whose exit is an EXIT inside it; 0xc0 is CALLed as a jump (an EXIT follows it before any RET),
    # 0x120..0x130 is a subroutine and its self-branch no loop
    assert nvidia.subroutines(nvidia.parse_sass(SASS)) == [(0x120, 0x130)]
    assert st["tile_loops"] == [[0x30, 0xB0], [0xD0, 0x100]]
    tile = st["per_tile"]  # the mean of the two loops
    assert tile["global_load"] == {"64": 0.5, "16": 0.5} and tile["global_store"] == {"64": 0.5}
    assert tile["mma"] == 1 and tile["mma_macs_per_warp"] == (16 * 8 * 16 + 64 * 128 * 16 / 4) / 2
    assert tile["fp32"] == 0.5 and tile["calls"] == 1 and tile["instructions"] == (9 + 4) / 2
    assert tile["global_bytes_per_thread"] == (2 + 8 + 8) / 2
    assert st["whole"]["global_load"] == {"128": 1, "64": 1, "16": 1} and st["whole"]["calls"] == 2
    assert configs.share_128(st["whole"]["global_load"]) == 1 / 3
    assert "0x" not in nvidia.strip_encodings("  /*0000*/  LDC R1, c[0x0][0x28] ; /* 0x00000a00ff017b82 */\n"
                                              "  /* 0x000fe20000000800 */").replace("c[0x0][0x28]", "")


def test_cli_writes_tables_cubins_and_sass(tmp_path):
    out = tmp_path / "out"
    main(["kernels", "--arch", "sm_80,sm_90", "--out", str(out), "--jobs", "2",
          "--configs", f"{__name__}:copy_configs"])
    section = json.loads((out / "kernels.json").read_text())
    assert [(r["config"], r["arch"]) for r in section["rows"]] == [("aligned", "sm_80"), ("aligned", "sm_90")]
    assert all(r["ok"] for r in section["rows"])
    for r in section["rows"]:
        cubin, sass = (out / f for f in r["files"])
        assert cubin.read_bytes()[:4] == b"\x7fELF" and "LDG.E.128" in sass.read_text()
    md = (out / "kernels.md").read_text()
    assert "### sm_80" in md and "### sm_90" in md and "| aligned |" in md
    assert "| aligned |" in tables.kernels_section({"kernels": section})
    assert tables.kernels_section({}) == ""


def test_amd_occupancy():
    a942, a950 = archs.AMD_ARCHS["gfx942"], archs.AMD_ARCHS["gfx950"]
    # 128 VGPRs: 512 / 128 = 4 waves per SIMD; 4-wave workgroups: 4 per CU, 16 waves, 4 per SIMD
    occ = archs.amd_occupancy(a942, 128, 40, 0, 4)
    assert (occ["workgroups_per_cu"], occ["waves_per_simd"], occ["limited_by"]) == (4, 4, "registers")
    # 39 VGPRs round up to 40: 12 waves by the file, 8 by the slots; 8 workgroups of 4 waves
    assert archs.amd_occupancy(a942, 39, 40, 0, 4)["waves_per_simd"] == 8
    # 8-wave workgroups, 129 VGPRs (136 allocated): 3 waves per SIMD -> 12 per CU -> 1 workgroup
    occ = archs.amd_occupancy(a942, 129, 40, 0, 8)
    assert (occ["waves_per_simd_by_registers"], occ["workgroups_per_cu"], occ["waves_per_simd"]) == (3, 1, 2)
    # 32 KiB of LDS: two workgroups on gfx942 (64 KiB); on gfx950 (160 KiB in 1280-byte blocks) 32 KiB
    # takes 26 blocks (33,280 B): four, and 32,000 B (25 blocks) five
    occ = archs.amd_occupancy(a942, 64, 40, 32 * 1024, 4)
    assert (occ["workgroups_per_cu"], occ["waves_per_simd"], occ["limited_by"]) == (2, 2, "LDS")
    assert archs.amd_occupancy(a950, 64, 40, 32 * 1024, 4)["workgroups_per_cu"] == 4
    assert archs.amd_occupancy(a950, 64, 40, 32000, 4)["workgroups_per_cu"] == 5
    # one byte over a 512-byte LDS block costs a block; over the CU's LDS: no workgroup
    assert archs.amd_occupancy(a942, 64, 40, 16 * 1024 + 1, 4)["workgroups_by"]["LDS"] == 3
    assert archs.amd_occupancy(a942, 64, 40, 64 * 1024 + 1, 4)["workgroups_per_cu"] == 0
    # more than 80 SGPRs (the code object's count, before LLVM's extra ones): 7 waves per SIMD
    assert archs.amd_occupancy(a942, 32, 84, 0, 1)["waves_per_simd_by_registers"] == 7
    assert archs.amd_occupancy(a942, 32, 79, 0, 1)["waves_per_simd_by_registers"] == 8
    # more than 96: 6 (98 SGPRs with 58 VGPRs: LLVM's 6 for the norm-over-heads backward)
    assert archs.amd_occupancy(a942, 58, 98, 0, 2)["waves_per_simd_by_registers"] == 6
    assert archs.amd_occupancy(a942, 58, 96, 0, 2)["waves_per_simd_by_registers"] == 7


def test_amd_row_takes_the_code_objects_vgpr_count_as_the_unified_total():
    """The code object's ``.vgpr_count`` already holds the AGPRs (LLVM's ``TotalNumVgprs``: the arch
    VGPRs rounded up to 4, then the AGPRs). Triton 3.6's gfx942 build of the general bf16 matrix's
    backward dot: ``; NumVgprs: 74``, ``; NumAgprs: 4``, ``; TotalNumVgprs: 80``, ``.vgpr_count: 80``,
    ``.agpr_count: 4``, 89 SGPRs, ``; Occupancy: 6``: the row's 80 VGPRs give LLVM's 6 waves (adding
    the AGPRs again, 84 -> 88 allocated, gave 5)."""
    amd = {"vgpr_count": 80, "agpr_count": 4, "sgpr_count": 89, "vgpr_spill_count": 0, "sgpr_spill_count": 0,
           "private_segment_fixed_size": 0, "group_segment_fixed_size": 0, "wavefront_size": 64,
           "max_flat_workgroup_size": 256, "llvm_occupancy": 6, "llvm_total_vgprs": 80,
           "counts": {"load": {}, "store": {}, "mfma": 0, "lds": 0, "scratch": 0, "instructions": 0}}
    res = {"amd": amd, "shared_dynamic": 0, "num_warps": 4, "compile_s": 0.0, "triton_hash": "", "cache_cubin": ""}
    cfg = {"name": "bf16 bwd D=64 tables=bf16 dot=3xbf16 M=general bf16-exact", "num_warps": 4, "num_stages": 1,
           "meta": {}}
    row = configs.amd_row(cfg, archs.AMD_ARCHS["gfx942"], res)
    assert (row["vgprs"], row["agprs"], row["llvm_total_vgprs"]) == (80, 4, 80)
    assert row["waves_per_simd_by_registers"] == 6 == row["llvm_occupancy"]


def test_reads_a_known_kernel_for_amd(tmp_path, monkeypatch):
    """The copy kernel for gfx942: a 512-element fp32 tile over 4 waves of 64 lanes is 2 elements a
    lane (one 64-bit buffer load and store, where CUDA's 128 threads take one 128-bit access each);
    without 16-byte alignment on src its loads are 32-bit. No spill, no LDS, the hsaco in Triton's
    cache under TRITON_CACHE_DIR."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    rows, files = configs.inspect_kernels(("gfx942",), jobs=2, configs_ref=f"{__name__}:copy_configs_unaligned")
    aligned, unaligned = rows
    assert aligned["ok"] and unaligned["ok"], (aligned.get("error"), unaligned.get("error"))
    assert aligned["wavefront_size"] == 64 and aligned["max_flat_workgroup_size"] == 256
    assert aligned["loads"] == {"64": 1} and aligned["stores"] == {"64": 1}
    assert aligned["ld128_share"] == 0 and unaligned["loads"] == {"32": 2} and unaligned["stores"] == {"64": 1}
    assert not aligned["spills"] and aligned["scratch_bytes"] == 0 and aligned["lds_bytes"] == 0
    assert aligned["mfma"] == 0 and aligned["waves_per_simd"] == 8 == aligned["llvm_occupancy"]
    path = aligned["cache_hsaco"]
    assert path and path.startswith(str(tmp_path / "cache"))
    assert open(path, "rb").read() == files[0][0] and files[0][0][:4] == b"\x7fELF"
    assert ".amdgpu_metadata" in files[0][1]


class _StandInHipDriver(_StandInDriver):
    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("hip", self.cc, 64)


def _hip_launch_hash(job) -> tuple[str, str, str]:
    """(the tool's hash, a HIP warm-up launch's hash, the error of a launch passing the CUDA
    options as they are): ``_launch_hash`` with a stand-in HIP driver (tensors on the CPU are
    within 2 GiB: the JIT marks them for buffer ops, as it does a GPU tensor's)."""
    from triton.runtime import driver

    from rome.launch import target_options

    fn, args = _launch_args(job)
    tool = job.run()["triton_hash"]
    driver.set_active(_StandInHipDriver(job.cc))
    launch = fn.warmup(*args, grid=(1,), num_warps=job.num_warps, num_stages=job.num_stages,
                       **target_options(dict(job.options), "hip"))
    error = ""
    if "maxnreg" in dict(job.options):
        try:
            fn.warmup(*args, grid=(1,), num_warps=job.num_warps, num_stages=job.num_stages, **dict(job.options))
        except KeyError as e:
            error = str(e)
    return tool, launch.hash, error


def _hip_specialisation_jobs(cc):
    """In a worker: the gather kernel's bf16 forward and backward, and a dot kernel, for ``cc``;
    the copy kernel and its variants (``_specialisation_jobs``)."""
    cfgs = configs.configs(cc)
    pick = [next(c for c in cfgs if _pass(c.meta) == p and c.meta["x_dtype"] == "bf16" and c.meta["product"] == prod)
            for p in ("fwd", "bwd") for prod in ("gather", "dot")]
    return [aot.Job.of(c, cc) for c in [*pick, *_variants(copy_config()), copy_config("unaligned", ("dst",))]]


def test_amd_specialisation_is_the_one_a_hip_launch_compiles():
    """Same Triton cache key as the JIT's own HIP launch path (the options rome passes on HIP, the
    buffer-ops pointer range), and the CUDA options as they are would not launch there."""
    with aot.compiler_pool(2) as pool:
        jobs = pool.submit(_hip_specialisation_jobs, AMD_ARCH).result()
        got = list(pool.map(_hip_launch_hash, jobs))
    for job, (tool, launch_hash, error) in zip(jobs, got):
        assert tool == launch_hash, job
        if "maxnreg" in dict(job.options):
            assert "maxnreg" in error, (job, error)
    assert any("maxnreg" in dict(job.options) for job in jobs)


def test_cli_amd_table(tmp_path):
    out = tmp_path / "out"
    main(["kernels", "--arch", "gfx942,sm_90", "--out", str(out), "--jobs", "2", "--configs", f"{__name__}:copy_configs"])
    section = json.loads((out / "kernels.json").read_text())
    assert [(r["config"], r["arch"]) for r in section["rows"]] == [("aligned", "gfx942"), ("aligned", "sm_90")]
    assert section["archs"]["gfx942"]["lds_per_cu"] == 64 * 1024 and section["amd_method"]
    hsaco, amdgcn = (out / f for f in section["rows"][0]["files"])
    assert hsaco.suffix == ".hsaco" and hsaco.read_bytes()[:4] == b"\x7fELF" and "buffer_load" in amdgcn.read_text()
    md = (out / "kernels.md").read_text()
    assert "### gfx942: MI300X" in md and "### sm_90" in md and "1 configurations: 1 compile, 0 spill" in md
    assert section["environment"]["commit"]


def test_parse_amd_arch():
    assert [archs.parse_arch(a) for a in ("gfx942", "GFX90A", "gfx950:sramecc+:xnack-")] == \
        ["gfx942", "gfx90a", "gfx950"]
    with pytest.raises(ValueError, match="gfx1100"):
        archs.parse_arch("gfx1100")
    with pytest.raises(ValueError, match="gfx942"):
        archs.parse_arch("sm_70")

