"""The tables: the every-configuration table (one per arch, NVIDIA's and AMD's) and a workload's
launches with the model's figures, as markdown and as ``kernels.json``/``kernels.md``; the
report's kernels section."""

from __future__ import annotations

import json
from pathlib import Path

from .archs import AMD_ARCHS
from .model import GPUS
from .schedule import CLOCKS_GHZ

# --- every configuration, one table per arch -----------------------------------------------


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


def cell(v, fmt: str) -> str:
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


def _table_rows(rows, columns) -> list[str]:
    """The markdown rows of a per-config table; a failed compile's row says why."""
    out = []
    for r in rows:
        if not r["ok"]:
            error = " ".join(r["error"].split()).replace("|", "/")[:300]
            out.append(f"| {r['config']} | compile failed: {error} |" + " |" * (len(columns) - 2))
            continue
        out.append("| " + " | ".join(cell(r.get(k), f) for _, k, f in columns) + " |")
    return out


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


def write(out: Path, section: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(section, indent=1, default=str))
    (out / "kernels.md").write_text("# rome kernels\n\n" + markdown(section, heading="##"))


# --- one workload's launches ---------------------------------------------------------------


WORKLOAD_COLUMNS = [  # (header, key, format)
    ("variant", "variant", ""), ("pass", "pass", ""), ("config", "config", ""), ("grid", "grid", "n"),
    ("regs", "registers", "d"), ("spill B", "spill_bytes", "d"), ("CTAs×warps/SM", "occupancy", ""),
    ("L1 B/elem", "l1_bytes_per_element", "1"), ("instr/DRAM B", "warp_instructions_per_dram_byte", "2"),
    ("in flight KB/SM", "inflight_kb_per_sm", "1"), ("est. H100", "estimate_h100", "%"),
    ("H100 800–600 ns", "range_h100", ""), ("limit", "limit_h100", ""), ("est. H200", "estimate_h200", "%"),
    ("H200 800–600 ns", "range_h200", ""), ("est. µs H100", "time_us_h100", "1"),
]


def estimate_range(r: dict, gpu: str = "h100", clock: float | None = None) -> str:
    """The estimate at 800 ns and at 600 ns (at ``clock``; default the sustained 1.755 GHz) as
    "81–96%"; "n/a" without the schedule."""
    est = r.get(f"estimates_{gpu}")
    if not est:
        return "n/a"
    clock = 1.755 if clock is None else clock
    by = {k: v for k, v in est.items() if k.endswith(f"@{clock:g}GHz")}
    lo = next((v for k, v in by.items() if k.startswith("800ns")), None)
    hi = next((v for k, v in by.items() if k.startswith("600ns")), None)
    if lo is None or hi is None:
        return "n/a"
    return f"{100 * lo:.0f}–{100 * hi:.0f}%"


def workload_cell(r: dict, key: str, fmt: str) -> str:
    if key == "occupancy":
        return f"{r['ctas_per_sm']} × {r['num_warps']}" if r.get("ctas_per_sm") is not None else "n/a"
    if key.startswith("range_"):
        return estimate_range(r, key.removeprefix("range_"))
    if key == "variant" and r.get("closest"):  # (an anchor launched on the shape it can express)
        return f"{r['variant']} (as {r['closest']})"
    v = r.get(key)
    if v is None:
        return "n/a"
    if fmt in ("1", "2"):
        return f"{v:.{fmt}f}"
    return cell(v, fmt)


def workload_markdown(section: dict, heading: str = "##", measured: dict | None = None,
                      at_clock: tuple[str, float] | None = None) -> str:
    """The workload's launches with the model's figures (``measured``: (variant, pass) -> GB/s of
    this run's GPU speed section, set beside the estimate; ``at_clock``: (gpu, GHz), the model's
    800–600 ns range for that GPU at that clock end, the one nearest the run's measured SM clock)."""
    wl = section["workload"]
    cols = list(WORKLOAD_COLUMNS)
    if measured:
        cols.insert(cols.index(("limit", "limit_h100", "")), ("measured GB/s", "measured_gbps", "1"))
    if at_clock:
        gpu, ghz = at_clock
        cols.insert(cols.index(("est. µs H100", "time_us_h100", "1")),
                    (f"{gpu.upper()} 800–600 ns at {ghz:g} GHz (this run's clock)", "model_at_clock", ""))
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
            if at_clock:
                r = r | {"model_at_clock": estimate_range(r, at_clock[0], at_clock[1])}
            lines.append("| " + " | ".join(workload_cell(r, k, f).replace("|", "/") for _, k, f in cols) + " |")
        lines.append("")
    liger = section.get("liger") or {}
    if liger.get("status") != "ok":
        lines += [f"Liger-Kernel: {liger.get('status', 'not run')} ({liger.get('reason', '')}); its rope kernel "
                  "is compiled and modelled beside rome's where `liger_kernel` is importable.", ""]
    if section.get("liger_launches"):
        lines += ["liger-kernel's rows are its RoPE launched on the closest shape it can express (the variant "
                  "column says which): the anchor for what a Triton RoPE reaches on these q/k, not this "
                  "workload's rotation where the workload is another (sections, interleave).", ""]
    lines += ["est.: the loaded memory's share of copy (1 + (copy / rate)^3)^(-1/3) of the idle schedule's rate "
              "(fitted to 32 launches measured on an H100), the worst of 600/800 ns and 1.755/1.98 GHz; 800–600 ns: "
              "at 1.755 GHz; est. µs H100: the launch's bytes at that share of copy (kernel time, no launch overhead). "
              "Static estimates, not measurements.", ""]
    for s in section.get("skipped", []):
        lines.append(f"- {s['variant']}: not captured: {s['reason']}")
    for r in section["launches"] + section["liger_launches"]:
        if r.get("unmodelled"):
            lines.append(f"- {r['variant']} {r['pass']} ({r['arch']}): no estimate: {r['unmodelled']}")
    return "\n".join(lines) + "\n"


def write_workload(out: Path, section: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.json").write_text(json.dumps(section, indent=1, default=str))
    (out / "kernels.md").write_text(f"# rome kernels: {section['workload']['name']}\n\n"
                                    + workload_markdown(section, heading="##"))


# --- the report's section ------------------------------------------------------------------


def _measured_gbps(results: dict) -> dict | None:
    """(variant, pass) -> GB/s of the report's speed section, when it ran on a GPU (None on a CPU:
    those timings say nothing about the kernel)."""
    env = results.get("environment") or {}
    if str(env.get("device", "CPU")).startswith("CPU") or not results.get("speed"):
        return None
    passes = {"fwd": "forward", "bwd": "backward"}
    return {(r["variant"], passes[r["pass"]]): r["gbps"] for r in results["speed"] if r["pass"] in passes}


def measured_sm_mhz(results: dict) -> float | None:
    """The median SM clock a report's speed timings ran at (``results["clocks"]``, written by
    ``profiling.clocks``), None where not sampled."""
    sm = ((results.get("clocks") or {}).get("sm_mhz") or {}).get("median")
    return sm if isinstance(sm, (int, float)) else None


def clock_end(results: dict) -> tuple[str, float] | None:
    """(gpu, GHz): the model's GPU (``model.GPUS``) named in this run's device (an H100 or an H200
    SXM: not a GH200, PCIe or NVL part, whose SMs, clocks and memory are not the model's) and its clock end
    (``schedule.CLOCKS_GHZ``) nearest the SM clock the run measured over its timings
    (``results["clocks"]``, ``profiling.clocks``); None without both."""
    sm = measured_sm_mhz(results)
    device = str((results.get("environment") or {}).get("device", ""))
    named = [] if any(tag in device for tag in ("GH200", "PCIe", "NVL")) else [g for g in GPUS if g in device]
    if sm is None or len(named) != 1:
        return None
    return named[0].lower(), min(CLOCKS_GHZ, key=lambda g: abs(1000 * g - sm))


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
        at_clock = clock_end(results) if measured else None
        text = workload_markdown(section, measured=measured, at_clock=at_clock)
        note = ("The full table of every configuration: `python -m profiling kernels` (all archs); this "
                "section compiles only the launches of the report's workload.")
        if measured:
            note += (" measured GB/s: this run's speed section for the variant and pass (q, k read and written, "
                     "tables read once), beside the estimate as a fraction of copy.")
        if at_clock:
            note += (f" The model's range at {at_clock[1]:g} GHz: its clock end nearest this run's measured SM "
                     f"clock ({measured_sm_mhz(results):.0f} MHz median over the timings).")
        return text + "\n" + note + "\n"
    return markdown(section)
