"""Every configuration the launcher can choose, compiled for every arch asked for and read: one
row per (configuration, arch), NVIDIA's with the bandwidth model (``python -m profiling kernels``
without ``--workload``; the CI gate in tests/test_kernels_static.py)."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import importlib
import itertools
import math
import os
import time
from pathlib import Path

from .amd import AMD_METHOD
from .archs import AMD_ARCHS, DEFAULT_ARCHS, PROJECT_SMEM_LIMIT, AmdArch, Arch, amd_occupancy, \
    arch_of, occupancy
from .compile import Job, compile_all, compiler_pool, default_jobs, environment, json_safe, slug
from .model import MODEL_METHOD, bandwidth_model, tile_elements
from .nvidia import strip_encodings


# --- every configuration ------------------------------------------------------------------

DEFAULT_CONFIGS = "profiling.static.configs:configs"


def configs(cc: int | None = None) -> list:
    """``rome.launcher.kernel_configs(cc)``: every configuration the launcher can choose."""
    from rome.launcher import kernel_configs

    return kernel_configs(cc)


def amd_ci_configs(cc=None) -> list:
    """The configurations CI compiles for an AMD arch (the full list is the committed table): a
    covering array of them (``covering_configs``), every pair of factor values and every
    (product, pass, positions) triple, the autotuner's candidates among them."""
    return covering_configs(configs(cc), triples=("product", "pass", "positions"))


def wave64_gather_configs(cc=None) -> list:
    """The gather kernel's chosen configs (fp32 tables or one-axis positions, bf16 and fp32, head_dim
    64 and 128) each beside the same launch with twice the rows: ``choose_gather`` sizes a tile for
    ``GATHER_ELEMENTS_PER_THREAD`` elements a thread of a 32-lane warp, so on 64-lane wavefronts a
    lane holds half as many; the doubled tile holds as many as on CUDA (docs/amd.md compares them:
    ``--arch gfx942 --configs profiling.static.configs:wave64_gather_configs``)."""
    out = []
    for c in configs(cc):
        m = c.meta
        if (m["product"] == "gather" and not m.get("tuned_candidate") and m["head_dim"] in (64, 128)
                and m["x_dtype"] in ("bf16", "fp32") and m["positions"] in (0, 1) and not m["angles"]
                and m["table_dtype"] == "fp32" and not m.get("norm")):
            rows = 2 * c.constexprs["BLOCK_R"]
            out += [c, dataclasses.replace(c, name=f"{c.name} rows x2 (BLOCK_R={rows})",
                                           constexprs=c.constexprs | {"BLOCK_R": rows},
                                           meta=dict(m, block_r=rows, elements_per_tile=rows * m["head_dim"]))]
    return out


def gate_configs(cc) -> list:
    """The CI gate's list for ``cc`` (tests/test_kernels_static.py): ``sm90_ci_configs`` for sm_90
    (the GPU machines' arch), ``off_sm90_ci_configs`` for sm_80 and sm_100, ``amd_ci_configs`` for
    an AMD arch; with ``ROME_GATE=full`` in the environment (``make gate``) every configuration
    of each. The committed tables (``python -m profiling kernels``) hold every configuration."""
    if os.environ.get("ROME_GATE", "").lower() == "full":
        return configs(cc)
    if isinstance(cc, str):
        return amd_ci_configs(cc)
    if cc in (80, 100):
        return off_sm90_ci_configs(cc)
    return sm90_ci_configs(cc)


# --- the CI gate: a covering array of the configurations ----------------------------------
#
# Every configuration is ~850 builds an arch, 2-5 s of CPU each from an empty Triton cache: hours
# on CI's two cores. What a build's registers, spills and shared memory depend on is the values
# of a few factors (``config_factors``) and their interactions, so CI compiles a covering array:
# a subset in which every pair of factor values that some configuration has appears together at
# least once, and, on sm_90, every triple of the factors that decide the registers (x dtype,
# pass, product, positions kind, norm, head groups apart: what spilled before was such a triple,
# e.g. fp16 x the SEAM build x three heads). Chosen greedily, the heavier build first where two
# cover as much (fp32 x, larger head_dim, backward).

# the factors whose every triple of values sm_90's gate holds
SM90_TRIPLES = ("x_dtype", "pass", "product", "positions", "norm", "seam")


def config_factors(meta: dict, num_warps: int) -> dict:
    """A configuration's factors: what varies between the launcher's configurations (``meta`` as
    a config or a table row holds it, lists or tuples alike)."""
    heads = meta.get("heads")
    return {"x_dtype": meta["x_dtype"], "tables": "fp32" if meta["table_dtype"] == "fp32" else "x's",
            "head_dim": meta["head_dim"], "pass": meta.get("pass_", meta.get("pass")), "matrix": meta["matrix"],
            "product": f"{meta['product']} split={meta['split']} fp32_dot={bool(meta['fp32_dot'])}",
            "gather_sin": bool(meta["gather_sin"]), "positions": f"{meta['positions']} angles={bool(meta['angles'])}",
            "norm": meta.get("norm"), "seam": bool(meta.get("seam")),
            "heads": tuple(heads) if heads is not None else None, "tuned": bool(meta["tuned_candidate"]),
            "depth": meta.get("gather_depth"), "kept_run": meta.get("kept_run"), "rows": meta["block_r"],
            "halves": bool(meta.get("halves")), "halves_run": meta.get("halves_run", 0),
            "warps": num_warps}


def factor_combinations(factors: dict, triples=()) -> set:
    """Every pair of (factor, value)s of one configuration, and every triple of those named."""
    items = sorted(factors.items(), key=lambda kv: kv[0])
    out = {frozenset(pair) for pair in itertools.combinations(items, 2)}
    out |= {frozenset(t) for t in itertools.combinations([(k, factors[k]) for k in triples], 3)}
    return out


def covering_configs(configs_: list, triples=()) -> list:
    """A subset of ``configs_`` that holds every combination (``factor_combinations``) that one
    of them holds: greedily, the configuration whose uncovered combinations are the rarest (each
    weighted 1 / how many configurations hold it: a combination few hold is taken with the first
    of them, not left to force a row of its own at the end), the heavier on a tie; then every row
    whose combinations the other rows all hold is dropped (fewest combinations, then the lighter, first). The same
    coverage as the plain most-new-combinations greedy, in fewer rows (sm_90: 75 for 80; gfx942:
    58 for 64): CI's minutes."""
    factors = [config_factors(c.meta, c.num_warps) for c in configs_]
    combos = [factor_combinations(f, triples) for f in factors]
    needed, covered, chosen = set().union(*combos), set(), []
    holders = collections.Counter(x for cs in combos for x in cs)
    heavier = lambda i: (factors[i]["x_dtype"] == "fp32", factors[i]["head_dim"], factors[i]["pass"] == "bwd")
    while covered != needed:
        # (fsum: the weights' sum exact, whatever order the set yields them in: the same rows every run)
        i = max(range(len(configs_)), key=lambda i: (math.fsum(1.0 / holders[x] for x in combos[i] - covered), heavier(i)))
        chosen.append(i)
        covered |= combos[i]
    for i in sorted(chosen, key=lambda i: (len(combos[i]), heavier(i))):  # (the lighter build first)
        if combos[i] <= set().union(*(combos[j] for j in chosen if j != i)):
            chosen.remove(i)
    return [configs_[i] for i in sorted(chosen)]


def sm90_ci_configs(cc=90) -> list:
    """The configurations CI compiles for sm_90 (the committed tables hold every one): the
    covering array of every configuration (every head dim and the autotuner's candidates among
    them) with every triple of ``SM90_TRIPLES``'s values."""
    return covering_configs(configs(cc), triples=SM90_TRIPLES)


def off_sm90_ci_configs(cc) -> list:
    """The configurations CI compiles for sm_80 and sm_100 (CI's 20 minutes: the committed tables
    hold every one): where the registers run out first off sm_90, the head-group kernel's chosen
    launches at head_dim 128 in bf16 and fp16 with positions on several axes (gather and dot,
    forward and backward: 8-40 B spilled there before the gather's depth and the fp16 dot's rows
    were chosen by arch, ``rome.launch.gather_depth``), the LayerNorm's backward epilogue
    (8 B on sm_100 before) and the whole head's half rotation as its halves (``HALVES``, bf16,
    fp32 tables, forward and backward), and the general matrix's FMA dot of fp32 x (fp32 tables,
    forward and backward: 8 B of stack reloaded every trip on sm_80 under triton 3.6 and 3.7 at 8
    warps, which ``make gate36`` would see again; profiling/results/cpu/gate-36-39/), and two
    gathers of fp32 x at half sections on sm_100's 128 registers that kept 8-16 B of stack when
    LLVM held src's tile through q's loop (before ``rome.launch.src_again``): the backward at
    44/44/40 with positions (triton 3.6, ``make gate36``) and the tuner's 32-row candidate at
    D = 64 (3.9, CI's)."""
    out = []
    for c in configs(cc):
        m = c.meta
        if m.get("fp32_dot") and m["head_dim"] == 128 and m["x_dtype"] == "fp32" and m["table_dtype"] == "fp32":
            out.append(c)  # (the row-tile kernel's FMA dot)
            continue
        if m["x_dtype"] == "fp32" and m["product"] == "gather" and len(m.get("sections") or ()) > 1 \
                and not m["angles"] and not m.get("seam") and (
                (m["head_dim"] == 128 and m["pass_"] == "bwd" and m["positions"] == 1 and not m.get("tuned_candidate"))
                or (m["head_dim"] == 64 and m["pass_"] == "fwd" and m["positions"] == 0 and m.get("tuned_candidate")
                    and m["block_r"] == 32)):
            out.append(c)  # (k's partner offsets past q's heads: launch.src_again)
            continue
        if m.get("tuned_candidate") or m["head_dim"] != 128 or m["x_dtype"] == "fp32" \
                or m.get("heads", (4, 2)) != (4, 2) or "q alone" in c.name:
            continue
        plain = m.get("norm") is None and m["positions"] == 2 and not m["angles"] and m.get("matrix") == "rotation"
        layer_bwd = m.get("norm") == "layer" and m["pass_"] == "bwd"
        halves = bool(m.get("halves")) and m["table_dtype"] == "fp32"  # (the whole head's half rotation)
        if plain or layer_bwd or halves:
            out.append(c)
    return out


GATE_CONFIGS = "profiling.static.configs:gate_configs"


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    if not name:
        raise ValueError(f"configs: expected MODULE:FUNCTION, got {ref!r}")
    return getattr(importlib.import_module(module), name)


def _list_configs(ref: str, cc: int, sass: bool = True) -> list[dict]:
    """In a worker: the configs ``ref(cc)`` lists, as picklable dicts with their compile jobs."""
    return [{"name": c.name, "meta": dict(c.meta), "num_warps": c.num_warps, "num_stages": c.num_stages,
             "job": Job.of(c, cc, sass)} for c in _resolve(ref)(cc)]


def inspect_kernels(archs=DEFAULT_ARCHS, *, jobs: int | None = None, configs_ref: str = DEFAULT_CONFIGS,
                    on_done=None, pool: cf.ProcessPoolExecutor | None = None, schedule: bool = True,
                    sass: bool = True):
    """Compile every config for every arch in ``jobs`` worker processes and read the cubins.

    ``configs_ref``: ``"module:function"``, ``function(cc)`` listing KernelConfigs (it runs in a
    worker, as the kernel must not be an interpreter object). Returns ``(rows, files)``: one row
    per (config, arch), and per row its cubin and SASS text (identical compiles run once).
    ``on_done(n_done, n_total)`` reports progress. ``pool``: a ``start_compiler_pool`` pool to
    use (and shut down when done) instead of starting ``jobs`` workers. ``schedule``: run the
    scheduled bandwidth model on the sm_90 rows (seconds per config, in this process: the CI gate,
    which checks compiles, spills and fit, leaves it out; the rows keep the static model).
    ``sass=False``: NVIDIA rows from the resource usage alone (registers, stack, local and shared
    memory: what the gate checks), without dumping the SASS (~0.7-1.2 s a build) or modelling it.
    """
    with pool if pool is not None else compiler_pool(jobs or default_jobs()) as pool:
        listed = dict(zip(archs, pool.map(_list_configs, [configs_ref] * len(archs), archs, [sass] * len(archs))))
        plan = [(cfg, arch_of(cc)) for cc in archs for cfg in listed[cc]]
        results = compile_all(pool, [cfg["job"] for cfg, _ in plan], on_done)
    rows, files = [], []
    for cfg, arch in plan:
        res = results[cfg["job"]]
        rows.append(amd_row(cfg, arch, res) if isinstance(arch, AmdArch) else row(cfg, arch, res, schedule))
        files.append((res.get("cubin"), res.get("sass")))
    return rows, files


# --- one row per (configuration, arch) -----------------------------------------------------


def share_128(counts: dict) -> float | None:
    """Fraction of the global load or store instructions in ``counts`` that move 128 bits."""
    total = sum(counts.values())
    return counts.get("128", 0) / total if total else None


def row(cfg: dict, arch: Arch, res: dict, schedule: bool = True) -> dict:
    """The report row of config ``cfg`` (a ``_list_configs`` entry) compiled for ``arch``."""
    meta = cfg["meta"]
    r = {"config": cfg["name"], "arch": arch.name, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
         "bytes_per_tile": meta.get("bytes_per_tile"), "meta": meta}
    if "error" in res:
        return r | {"ok": False, "error": res["error"]}
    rs, st = res["res"], res["sass_stats"]
    smem = res["shared_dynamic"] + rs["shared"]
    # what the resource usage says (all a row without the SASS has: sass=False; LDL/STL need a
    # stack or local memory)
    r |= {
        "ok": True, "error": None, "registers": rs["reg"], "stack_bytes": rs["stack"], "local_bytes": rs["local"],
        "local_instructions": None, "shared_dynamic": res["shared_dynamic"],
        "shared_static": rs["shared"], "shared_bytes": smem, "fits_arch_smem": smem <= arch.smem_per_block,
        "fits_99kb": smem <= PROJECT_SMEM_LIMIT, "spills": rs["stack"] > 0 or rs["local"] > 0,
        **occupancy(arch, rs["reg"], smem, res["num_warps"]), "sass": None, "model": None,
        "compile_s": res["compile_s"], "triton_hash": res["triton_hash"], "cache_cubin": res["cache_cubin"],
    }
    if st is None:
        return r
    tile = st["per_tile"] or {}
    r |= {
        "local_instructions": st["whole"]["local"], "spills": r["spills"] or st["whole"]["local"] > 0,
        "tile_loops": len(st["tile_loops"]),
        "ld128_share": share_128(tile["global_load"]) if tile else None,
        "st128_share": share_128(tile["global_store"]) if tile else None,
        "mma_per_tile": tile.get("mma"),
        "mma_macs_per_tile": tile["mma_macs_per_warp"] * res["num_warps"]
        if tile.get("mma_macs_per_warp") is not None else None,
        "fp32_per_tile": tile.get("fp32"), "calls_per_tile": tile.get("calls"),
        "instructions_per_tile": tile.get("instructions"),
        "bytes_issued_per_tile": tile["global_bytes_per_thread"] * 32 * res["num_warps"] if tile else None,
        "sass": st,
    }
    if "head_dim" in meta or "elements_per_tile" in meta:  # a rome config: the bandwidth model
        try:
            elements, dram, read = tile_elements(meta)
            xb = {"bf16": 2, "fp16": 2, "fp32": 4}.get(meta.get("x_dtype"), 2)
            model = bandwidth_model(res["sass"], num_warps=res["num_warps"], elements_per_tile=elements,
                                    dram_bytes_per_element=dram, dram_read_bytes_per_element=read,
                                    registers=rs["reg"], shared_bytes=smem, arch=arch, x_bytes=xb,
                                    params=res.get("params"), schedule=schedule and arch.cc == 90)
        except Exception as e:  # the table keeps its row; the model says why it has no figures
            r["model"] = {"error": f"{type(e).__name__}: {e}"}
        else:
            r["model"] = model
            r |= {k: model.get(k) for k in MODEL_KEYS}
    return r


MODEL_KEYS = ("l1_bytes_per_element", "warp_instructions_per_dram_byte", "tile_l1_bytes_per_element",
              "tile_warp_instructions_per_dram_byte", "batches", "inflight_mean_bytes_per_sm", "inflight_kb_per_sm",
              "estimate_h100", "limit_h100", "estimate_h200", "limit_h200")


def amd_row(cfg: dict, arch: AmdArch, res: dict) -> dict:
    """The table row of config ``cfg`` compiled for the AMD ``arch``."""
    meta = cfg["meta"]
    r = {"config": cfg["name"], "arch": arch.name, "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
         "bytes_per_tile": meta.get("bytes_per_tile"), "meta": meta}
    if "error" in res:
        return r | {"ok": False, "error": res["error"]}
    a = res["amd"]
    # the code object's .vgpr_count is the unified file's count, AGPRs included (LLVM's TotalNumVgprs:
    # the arch VGPRs rounded up to 4, then the AGPRs; gfx90a's dots reach 275, over the 256 arch VGPRs)
    vgprs = a["vgpr_count"]
    # Triton's shared memory is dynamic LDS, allocated at launch (metadata.shared): LLVM sees none of
    # it (the group segment holds only static LDS, 0 for Triton kernels), nor does its occupancy
    lds = a["group_segment_fixed_size"] + res["shared_dynamic"]
    spills = a["vgpr_spill_count"] + a["sgpr_spill_count"]
    c = a["counts"]
    occ = amd_occupancy(arch, vgprs, a["sgpr_count"], lds, res["num_warps"])
    return r | {
        "ok": True, "error": None, "wavefront_size": a["wavefront_size"], "vgprs": vgprs,
        "llvm_total_vgprs": a["llvm_total_vgprs"], "agprs": a["agpr_count"], "sgprs": a["sgpr_count"],
        "vgpr_spill_count": a["vgpr_spill_count"],
        "sgpr_spill_count": a["sgpr_spill_count"], "scratch_bytes": a["private_segment_fixed_size"],
        "lds_bytes": lds, "lds_metadata_bytes": a["group_segment_fixed_size"], "triton_shared": res["shared_dynamic"],
        "fits_lds": lds <= arch.lds_per_cu, "spills": spills > 0 or a["private_segment_fixed_size"] > 0,
        "max_flat_workgroup_size": a["max_flat_workgroup_size"], **occ, "llvm_occupancy": a["llvm_occupancy"],
        "ld128_share": share_128(c["load"]), "st128_share": share_128(c["store"]), "mfma": c["mfma"],
        "lds_instructions": c["lds"], "scratch_instructions": c["scratch"], "instructions": c["instructions"],
        "loads": c["load"], "stores": c["store"], "compile_s": res["compile_s"], "triton_hash": res["triton_hash"],
        "cache_hsaco": res["cache_cubin"],
    }


# --- the section --------------------------------------------------------------------------


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
    "batches, in flight KB/SM, est. H100/H200: fraction of copy bandwidth) are of sm_90 rows only (H100 and "
    "H200 are sm_90): a steady tile, one wave of programs on an SM whose tile loops run twice (no launch: "
    "the permutation's class unknown, the first branch's code), at the worst end (800 ns, 1.755 GHz); "
    "`python -m profiling kernels --workload NAME` models real launches. Model: " + MODEL_METHOD
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
                stem = Path(r["arch"]) / slug(r["config"])
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
    return json_safe(section)
