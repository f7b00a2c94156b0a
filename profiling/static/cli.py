"""``python -m profiling kernels [--arch sm_80,sm_90,sm_100] [--out DIR] [--jobs N]``: every
configuration compiled ahead of time and read; ``--workload NAME``: that workload's launches with
the static bandwidth model (kernels.json, kernels.md). ``report_section``: the same for
``make report``."""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from .archs import AMD_ARCHS, ARCHS, DEFAULT_ARCHS, parse_arch
from .configs import DEFAULT_CONFIGS, collect
from .launches import DTYPES, WORKLOAD_ARCH, collect_workload
from .tables import AMD_COLUMNS, COLUMNS, WORKLOAD_COLUMNS, cell, workload_cell, write, write_workload


def _overrides(w) -> dict:
    """What the report's workload ``w`` changed of its registry entry (``--shape``, ``--dtype``)."""
    from ..workloads import WORKLOADS

    base = WORKLOADS[w.name]
    out = {k: getattr(w, k) for k in ("batch", "q_heads", "kv_heads", "seq") if getattr(w, k) != getattr(base, k)}
    if w.dtype != base.dtype:
        out["dtype"] = str(w.dtype).removeprefix("torch.")
    return out


def report_section(out: Path, arch: str | None = None, console=None, workload=None) -> dict:
    """results.json's ``kernels`` section for ``make report``: the launches of ``workload`` (a
    ``Workload``, the report's, at its full shape) compiled for ``arch`` (default sm_90) with the
    bandwidth model; without a workload every configuration (``arch`` default sm_80,90,100). Cubins
    and SASS under ``out``; a failure is recorded in the section, not raised."""
    try:
        if workload is not None:
            archs = [parse_arch(a) for a in arch.split(",")] if arch else [WORKLOAD_ARCH]
            if console is not None:
                console.print(f"compiling the {workload.name} launches ahead of time for "
                              f"{', '.join(ARCHS[c].name for c in archs)} (Triton's cache makes a second run quick)")
            section = collect_workload(workload.name, archs, out, overrides=_overrides(workload))
            write_workload(out, section)
            return section
        archs = [parse_arch(a) for a in arch.split(",")] if arch else list(DEFAULT_ARCHS)
        if console is not None:
            console.print(f"compiling the kernel ahead of time for {', '.join(ARCHS[c].name for c in archs)} "
                          "(Triton's cache makes a second run quick)")
        return collect(archs, out)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main(args) -> Path:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=220)
    if getattr(args, "workload", None):
        return main_workload(args, console)
    archs = [parse_arch(a) for a in args.arch.split(",")] if args.arch else list(DEFAULT_ARCHS)
    out = Path(args.out or f"reports/kernels-{dt.datetime.now():%Y%m%d-%H%M%S}")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("compiling", total=None)
        section = collect(archs, out, jobs=args.jobs, configs_ref=args.configs or DEFAULT_CONFIGS,
                          on_done=lambda i, n: progress.update(task, completed=i, total=n,
                                                               description=f"compiled {i}/{n}"))
    write(out, section)
    for name in section["archs"]:
        cols = [c for c in (AMD_COLUMNS if name in AMD_ARCHS else COLUMNS)
                if c[1] not in ("fits_99kb", "fits_lds", "limited_by", "bytes_per_tile", "calls_per_tile")]
        table = Table(title=f"{name} (triton {section['environment']['triton']})")
        for h, _, _ in cols:
            table.add_column(h, no_wrap=h == "config")
        for r in (r for r in section["rows"] if r["arch"] == name):
            table.add_row(*([cell(r.get(k), f) for _, k, f in cols] if r["ok"]
                            else [r["config"], f"[red]{r['error'][-200:]}[/]"] + [""] * (len(cols) - 2)))
        console.print(table)
    console.print(f"{len(section['rows'])} rows in {section['wall_s']:.0f} s; cubins and SASS (AMD: hsaco, amdgcn) under {out}, "
                  f"the full table in {out / 'kernels.md'}; Triton's cache: {section['environment']['cache_dir']}")
    return out


def main_workload(args, console) -> Path:
    """``--workload NAME``: that workload's launches, compiled and modelled; kernels.json/.md."""
    from rich.progress import Progress
    from rich.table import Table

    archs = [parse_arch(a) for a in args.arch.split(",")] if args.arch else [WORKLOAD_ARCH]
    out = Path(args.out or f"reports/kernels-{args.workload}-{dt.datetime.now():%Y%m%d-%H%M%S}")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"capturing the {args.workload} launches", total=None)
        overrides = {"dtype": args.dtype} if args.dtype else None
        section = collect_workload(args.workload, archs, out, jobs=args.jobs, overrides=overrides,
                                   on_done=lambda i, n: progress.update(task, completed=i, total=n,
                                                                        description=f"compiled {i}/{n}"))
    write_workload(out, section)
    for arch in section["archs"]:
        table = Table(title=f"{args.workload} on {arch}: static bandwidth model (triton "
                            f"{section['environment']['triton']}; launches from {section['capture']})")
        for h, _, _ in WORKLOAD_COLUMNS:
            table.add_column(h, no_wrap=h in ("variant", "pass"))
        for r in (r for r in section["launches"] + section["liger_launches"] if r["arch"] == arch):
            table.add_row(*([workload_cell(r, k, f) for _, k, f in WORKLOAD_COLUMNS] if r["ok"] else
                            [r["variant"], r["pass"], r["config"], f"[red]{r['error'][-200:]}[/]"]
                            + [""] * (len(WORKLOAD_COLUMNS) - 4)))
        table.caption = ("Static estimates, not measurements (the model on SASS compiled here). liger-kernel: "
                         "its RoPE on the closest shape it can express, as its variant says.")
        console.print(table)
    liger = section["liger"]
    if liger.get("status") != "ok":
        console.print(f"Liger-Kernel: {liger.get('status')}: {liger.get('reason', '')}")
    for s in section["skipped"]:
        console.print(f"[yellow]{s['variant']}: not captured: {s['reason'][:300]}[/]")
    console.print(f"{len(section['launches'])} launches, {section['builds']} builds in {section['wall_s']:.0f} s; "
                  f"{out / 'kernels.json'}, {out / 'kernels.md'}; cubins in Triton's cache "
                  f"({section['environment']['cache_dir']}) and copied under {out}")
    return out


def arch_list(text: str) -> str:
    """argparse type of ``--arch``: each comma-separated arch known (``parse_arch``), else argparse's
    error naming it; the text itself (parsed again where used)."""
    for a in text.split(","):
        try:
            parse_arch(a)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..workloads import WORKLOADS

    p.add_argument("--workload", choices=sorted(WORKLOADS),
                   help="compile and model just the launches this workload's rome variants make "
                        "(forward and backward; default arch sm_90); writes kernels.json/.md")
    p.add_argument("--arch", type=arch_list, help=f"comma-separated archs (default {','.join(ARCHS[c].name for c in DEFAULT_ARCHS)}; "
                                  f"known: {','.join([a.name for a in ARCHS.values()] + list(AMD_ARCHS))})")
    p.add_argument("--out", help="output folder (default reports/kernels-<timestamp>/)")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="with --workload: q and k in this dtype instead of "
                                                            "the workload's own (e.g. fp32)")
    p.add_argument("--jobs", type=int, help="compile processes (default: one per CPU this process may use, at most 16)")
    p.add_argument("--configs", help="MODULE:FUNCTION listing the KernelConfigs of an arch "
                                     "(default: rome.launch.kernel_configs)")
