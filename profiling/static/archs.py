"""The targets: per-arch limits of NVIDIA GPUs (per SM) and AMD Instinct GPUs (per CU), the
occupancy those limits allow a build, and ``parse_arch`` for the CLI's ``--arch``.

NVIDIA occupancy as CUDA's occupancy calculator (``cuda_occupancy.h``) does it: registers
allocated per warp in units of 256 and split over 4 sub-partitions of 16K, shared memory per
block + 1 KB reserved in units of 128 bytes; per-arch limits from NVIDIA CCCL's ``arch_traits``
(the CUDA programming guide's table). AMD occupancy as LLVM's AMDGPU backend models it
(``AMD_NOTES``)."""

from __future__ import annotations

import dataclasses

# --- NVIDIA: per-SM limits ----------------------------------------------------------------


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
    l1_smem_per_sm: int = 128 * 1024  # the unified L1 / shared-memory array per SM

    @property
    def name(self) -> str:
        return f"sm_{self.cc}"

    @property
    def smem_per_block(self) -> int:
        """Largest shared memory one block may opt in to."""
        return self.smem_per_sm - self.reserved_smem


ARCHS = {a.cc: a for a in (
    Arch(80, 164 * 1024, 32, 64, l1_smem_per_sm=192 * 1024),   # A100
    Arch(86, 100 * 1024, 16, 48),   # RTX 30xx, A10, A40
    Arch(89, 100 * 1024, 24, 48),   # L4, L40, RTX 40xx
    Arch(90, 228 * 1024, 32, 64, l1_smem_per_sm=256 * 1024),   # H100, H200
    Arch(100, 228 * 1024, 32, 64, l1_smem_per_sm=256 * 1024),  # B200
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


def l1_reread_bytes(arch: Arch, smem: int, ctas: int, num_warps: int) -> int:
    """What one warp may load between two reads of an address for the second to be counted an L1
    hit: half the L1 left beside the shared-memory carveout (the resident CTAs' shared memory,
    rounded up to a power of two of at least 8 KB: at or above the driver's carveout for them),
    over the SM's warps. Half: the lines in between are not all distinct, but an LRU cache that
    streams evicts early (the worse end)."""
    used = max(8 * 1024, (smem + arch.reserved_smem) * max(ctas, 1))
    carve = min(arch.smem_per_sm, 1 << (used - 1).bit_length())
    return max(0, arch.l1_smem_per_sm - carve) // 2 // max(1, ctas * num_warps)


# --- AMD Instinct (CDNA): per-CU limits ----------------------------------------------------


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
    # gfx9: more SGPRs than this (the code object's sgpr_count, without the VCC / flat-scratch /
    # XNACK / trap SGPRs LLVM adds before its <= 100 rule) leave a SIMD 7 waves. Measured on
    # gfx942 against LLVM's own '; Occupancy:' over the CI gate's configurations: 79 SGPRs gave 8
    # waves, 84-86 gave 7 (with <= 64 VGPRs); 80 is the bound taken, 81-83 unseen. More than
    # max_sgprs_for_7_waves leave 6: 98 SGPRs gave 6 (58-62 VGPRs: the norm-over-heads backward at
    # 2 waves a workgroup); 96 is the bound taken, 87-97 unseen
    max_sgprs_for_8_waves: int = 80
    max_sgprs_for_7_waves: int = 96
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
    "than 80 (the code object's count; LLVM adds its own before its bound of 100) leave 7 waves (gfx9); at most 16 multi-wave workgroups per CU (barriers); LDS 64 KiB per CU "
    "on gfx90a and gfx942, 160 KiB on gfx950 (FeatureAddressableLocalMemorySize163840), allocated in "
    "512-byte (gfx9) / 1280-byte (gfx950) blocks.")


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def amd_occupancy(arch: AmdArch, vgprs: int, sgprs: int, lds: int, waves_per_workgroup: int) -> dict:
    """Resident workgroups per CU and waves per SIMD for workgroups of ``waves_per_workgroup``
    wavefronts using ``vgprs`` (the unified file's: the code object's ``.vgpr_count``, LLVM's
    ``TotalNumVgprs``, AGPRs included) and ``sgprs`` per wave and ``lds``
    bytes of LDS per workgroup on ``arch``."""
    alloc = _round_up(max(vgprs, 1), arch.vgpr_granule)
    by_vgprs = 0 if vgprs > arch.vgprs_per_lane else min(arch.max_waves_per_simd, arch.vgprs_per_lane // alloc)
    by_sgprs = arch.max_waves_per_simd if sgprs <= arch.max_sgprs_for_8_waves else \
        arch.max_waves_per_simd - 1 if sgprs <= arch.max_sgprs_for_7_waves else arch.max_waves_per_simd - 2
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
