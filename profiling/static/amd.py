"""Reading an AMD code object: what the amdgcn text of one Triton kernel compiled for an AMD
Instinct arch says (its ``.amdgpu_metadata`` and LLVM's comments), and ``AMD_METHOD``, how the
AMD rows of the every-configuration table are made."""

from __future__ import annotations

import collections
import re

from .archs import AMD_NOTES


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


AMD_METHOD = (
    "AMD rows (gfx*): the same configurations compiled with `GPUTarget('hip', arch, 64)`: a wavefront is "
    "64 lanes, so `num_warps` = 64-wide wavefronts per workgroup (4 warps = 256 threads, twice a CUDA "
    "block's); the options a HIP launch passes (`rome.launch.target_options`: no `maxnreg`, which is "
    "CUDA-only); every pointer `tt.pointer_range=32` as a HIP launch marks a tensor within 2 GiB (buffer "
    "ops, Triton's default). Read from the code object's metadata (`.amdgpu_metadata` of the amdgcn): "
    "VGPRs (arch VGPRs + AGPRs: the unified file), SGPRs, their spill counts, scratch (private segment "
    "bytes per lane: spill and stack) and LDS (group segment bytes) against the arch's LDS per CU. "
    "Occupancy: waves per SIMD the registers allow (min(8, 512 / VGPRs rounded up to 8), 7 above 80 "
    "SGPRs), workgroups per CU = min(registers: waves per SIMD x 4 / waves per workgroup, LDS per CU / "
    "LDS rounded to its block, 16), waves per SIMD = workgroups x waves per workgroup / 4. Triton's shared "
    "memory is dynamic LDS (Triton's `metadata.shared`, allocated at launch): LLVM sees none of it, so its "
    "own figure (the amdgcn's `; Occupancy:` comment) is the waves per SIMD the registers allow, the "
    "column beside it (the CI gate checks the two agree). "
    "Instruction counts are over the whole kernel (no tile-loop analysis on AMD): vector memory loads and "
    "stores (global_/buffer_) by width, MFMA, LDS (ds_) and scratch instructions. Static only: nothing "
    "here ran on an AMD GPU. " + AMD_NOTES)


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
