"""``make report``: speed, kernels per call, memory and precision of every variant, and the model
workload (a Wan block and a Llama layer, unpatched vs rome-patched), written to
``reports/<workload>-<timestamp>/`` as report.md, results.json, CSV, PNG plots and traces."""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import os
import platform
import subprocess
from pathlib import Path

import torch

import rome

from . import accuracy, clocks, models, speed
from .static.cli import report_section as kernels_report_section
from .static.tables import kernels_section
from .variants import VARIANTS, Setup, Unavailable, Unsupported
from .workloads import WORKLOADS, Workload, qk, scaled_for_cpu, tables

ROOT = Path(__file__).resolve().parents[1]
GPU_LINE = "GPU speed needs a GPU: the timings here are CPU timings of a scaled-down shape."


# --- environment -------------------------------------------------------------------------


def _run(cmd) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def environment(device: torch.device) -> dict:
    import triton

    env = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        # a tree copied to a lent GPU machine names its commit (make gpu's ROME_COMMIT): the .git
        # that travels with it need not be that tree's (seen on the H100 and the H200)
        "commit": os.environ.get("ROME_COMMIT") or _run(["git", "rev-parse", "HEAD"]) or "unknown",
        "dirty": False if os.environ.get("ROME_COMMIT") else
        bool(_run(["git", "status", "--porcelain", "--untracked-files=no"])),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
        "cpu": f"{_cpu_name()} ({os.cpu_count()} logical cores)",
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {"device": props.name, "sms": props.multi_processor_count, "cuda": torch.version.cuda,
                "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) or "unknown"}
    else:
        env |= {"device": f"CPU: {env['cpu']}", "driver": None}
    return env


# --- the two parts ------------------------------------------------------------------------


def _autotuned() -> dict:
    from rome import tuning  # (imported late: rome's kernel modules load after the report set up Triton)

    return tuning.chosen()


def run_speed(w: Workload, device, trace_dir: Path, on_step=None):
    """Speed, memory and kernels of every variant on ``w`` (the workload as run)."""
    backend = "triton" if device.type == "cuda" else "torch"
    q, k = qk(w, device=device)
    t = tables(w, device=device)
    matrix = rome.rotation_matrix(w.sections, w.mode, dtype=w.dtype, device=device)
    setup = Setup(w, w.mode, t.cos, t.sin, t.angles, matrix, backend, t.positions)
    graphs = device.type == "cuda" and w.decode
    # the GPU's clocks while the copies and the variants are timed (profiling.clocks: sampled
    # through the section, kept inside the timing calls): which end of the static model's clocks a
    # measurement is to be read against
    sampler = clocks.Clocks(device) if device.type == "cuda" else clocks.NotSampled()
    with sampler:
        # (the samples kept: those taken while a call times kernels, each call warmed first)
        copy = speed.copy_bandwidth(q, k, device, cudagraph=graphs, window=sampler.window)
        try:  # (the reference, not a variant: a copy that fails is a line in the report, not the end)
            copy["triton"] = speed.triton_copy_bandwidth(q, k, device, cudagraph=graphs, window=sampler.window)
        except Exception as e:  # noqa: BLE001
            copy["triton"] = {"error": f"{type(e).__name__}: {e}"[:500]}
        moved = speed.io_bytes(q, k, t.cos, t.sin)
        statuses, records = [], []
        default_method = ("do_bench_cudagraph" if graphs else "do_bench") if device.type == "cuda" else \
            "perf_counter (CPU), interleaved rounds"

        def jobs():
            for v in VARIANTS.values():
                status = {"variant": v.name, "kind": v.kind, "description": v.description, "status": "ok", "reason": None}
                statuses.append(status)
                try:
                    run = v.build(setup)
                    passes = speed.Passes(run, v.prepare(q), v.prepare(k), differentiable=v.differentiable)
                except (Unsupported, Unavailable) as e:
                    status |= {"status": type(e).__name__.lower(), "reason": str(e)}
                    continue
                if not v.differentiable:
                    status["reason"] = "no backward: bwd and fwd+bwd not timed"
                for name, fn in passes.passes.items():
                    yield v, status, name, fn, passes.leaves()

        timed = failed = None
        if device.type == "cpu":  # every variant and pass timed in shared rounds: a drifting CPU
            all_jobs = list(jobs())  # shifts them alike (speed.bench_interleaved)
            if on_step:
                on_step("speed: every variant, interleaved rounds")
            timed, failed = speed.bench_interleaved({i: job[3] for i, job in enumerate(all_jobs)})
        for i, (v, status, name, fn, leaves) in enumerate(all_jobs if timed is not None else jobs()):
            if on_step:
                on_step(f"speed {v.name} {name}")
            try:
                method = default_method
                if timed is not None:
                    if i in failed:
                        raise failed[i]
                    timing = timed[i]
                else:
                    fn()  # (a first call outside the clocks' window: a compile or an autotune idles the GPU)
                    torch.cuda.synchronize(device)
                    try:
                        with sampler.window():
                            timing = speed.bench(fn, device, cudagraph=graphs, grad_to_none=leaves)
                    except Exception:
                        if not graphs:
                            raise
                        method = "do_bench (CUDA graph capture failed)"
                        with sampler.window():
                            timing = speed.bench(fn, device, grad_to_none=leaves)
                mem = speed.peak_memory(fn, device)
                kern = speed.kernels_per_call(fn, device, f"{v.name} {name}", trace_dir)
            except Exception as e:  # one broken variant must not sink the report
                status |= {"status": "error", "reason": f"{name}: {type(e).__name__}: {e}"}
                continue
            nbytes = moved * (2 if name == "fwd+bwd" else 1)
            gbps = nbytes / (timing["median_ms"] * 1e-3) / 1e9
            records.append({
                "variant": v.name, "pass": name, "backend": backend if v.kind == "rome" else v.kind,
                **timing, "method": method, "bytes": nbytes, "gbps": gbps,
                **speed.copy_shares(gbps, copy), "peak_mem_bytes": mem, **kern,
            })
    for r in records:
        for ref, field in (("v1 slice+concat", "speedup_vs_v1"), ("v3 torch.compile", "speedup_vs_compiled")):
            base = next((b for b in records if b["variant"] == ref and b["pass"] == r["pass"]), None)
            r[field] = base["median_ms"] / r["median_ms"] if base else None
    return records, statuses, copy, sampler.summary()


# --- writing ------------------------------------------------------------------------------


def _fmt(v, spec=".3g"):
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def _table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    """Markdown table of ``rows``; cols are (header, key, format spec)."""
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(k), f) for _, k, f in cols) + " |")
    return "\n".join(lines)


def _write_csv(path: Path, rows: list[dict]):
    if not rows:
        return
    flat = [{k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()} for r in rows]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(flat[0]))
        writer.writeheader()
        writer.writerows(flat)


def _speed_plot(results: dict) -> str:
    """The speed plot's file: GB/s against copy on a GPU, speed relative to v1 on a CPU."""
    return "speed_vs_v1.png" if str(results["environment"]["device"]).startswith("CPU") else "gbps.png"


def _plots(out: Path, results: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speed_rows = results["speed"]
    if speed_rows:
        # on a GPU: GB/s against the copy bandwidth measured in the same run. On a CPU a bandwidth
        # line says nothing (the op is compute- and dispatch-bound there, bars of a few GB/s under a
        # copy line of hundreds): the plot is each variant's speed relative to v1, the seed's
        # slice-and-concat chain, measured in the same rounds (>1 faster than v1)
        names = list(dict.fromkeys(r["variant"] for r in speed_rows))
        on_gpu = _speed_plot(results) == "gbps.png"
        field = "gbps" if on_gpu else "speedup_vs_v1"
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / len(speed.PASSES)
        for i, p in enumerate(speed.PASSES):
            vals = [next((r[field] or 0 for r in speed_rows if r["variant"] == n and r["pass"] == p), 0) for n in names]
            ax.bar([j + i * width for j in range(len(names))], vals, width, label=p)
        if on_gpu:
            ax.axhline(results["copy_bandwidth"]["gbps"], color="k", ls="--", label="copy bandwidth")
            if (results["copy_bandwidth"].get("triton") or {}).get("gbps"):
                ax.axhline(results["copy_bandwidth"]["triton"]["gbps"], color="0.45", ls=":",
                           label="plain Triton copy")
            ax.set_ylabel("GB/s (bytes the op must move / median time)")
        else:
            ax.axhline(1.0, color="k", ls="--", label="v1 slice+concat")
            ax.set_ylabel("speed relative to v1 (v1 median time / median time)")
        ax.set_xticks([j + width for j in range(len(names))], names, rotation=20, ha="right")
        shape = results["speed_shape"]
        ax.set_title(f"{results['workload']['name']}: q {shape['q']}, k {shape['k']} on {results['environment']['device']}",
                     fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / _speed_plot(results), dpi=120)
        plt.close(fig)

    w = results["workload"]
    rows = _hist_rows(results)
    if rows:
        table_dtypes = list(dict.fromkeys(r["table_dtype"] for r in rows))
        fig, axes = plt.subplots(1, len(table_dtypes), figsize=(6 * len(table_dtypes), 4), squeeze=False)
        for ax, tdt in zip(axes[0], table_dtypes):
            sub = [r for r in rows if r["table_dtype"] == tdt]
            bins = list(sub[0]["ulp_hist"])
            width = 0.8 / len(sub)
            colours = plt.get_cmap("tab20").colors  # (20 distinct: the default cycle repeats after 10)
            for i, r in enumerate(sub):
                total = max(1, r["elements"])
                ax.bar([j + i * width for j in range(len(bins))], [r["ulp_hist"][b] / total for b in bins], width,
                       label=f"{r['variant']}{'' if r.get('ok', True) else ' (past its bound)'}",
                       color=colours[i % len(colours)], hatch=None if r.get("ok", True) else "//")
            ax.set_xticks([j + 0.4 for j in range(len(bins))], bins)
            ax.set_yscale("log")
            ax.set_xlabel(f"ulp error of {w['dtype']} output vs float64 oracle")
            ax.set_ylabel("fraction of elements")
            ax.set_title(f"{w['mode']} mode, {tdt} tables", fontsize=9)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "ulp_hist.png", dpi=120)
        plt.close(fig)


def angles_section(r: dict) -> str:
    a = r.get("angles")
    if not a:
        return ""
    return "\n".join([
        "## Tables against float64: angles in the kernel",
        "",
        f"Max |table - float64| of the cos/sin the op applies (read off its output), Llama-3 "
        f"frequencies (D={a['head_dim']}, theta {a['theta']:g}), {a['positions']} positions spread "
        f"over 0..{a['max_position']:,} ({a['backend']} backend):",
        "",
        "| kernel angles (`apply_qk_angles`) | float64-derived fp32 cache (`apply_qk_at`) | fp32 angles (HF, diffusers) |",
        "|---|---|---|",
        f"| {a['kernel_angles_max_abs']:.3g} | {a['fp32_cache_max_abs']:.3g} | {a['fp32_angles_max_abs']:.3g} |",
        "",
    ])


def models_section(r: dict) -> str:
    """The "Models" part of report.md from ``results["models"]`` (None: not run)."""
    m = r.get("models")
    lines = ["## Models", ""]
    if m is None:
        return "\n".join(lines + ["Not run (--skip-models).", ""])
    lines += ["One Wan block and one Llama layer, forward and forward+backward, with the model's own RoPE "
              "(unpatched) and with `rome.integrations.patch` (patched, undone afterwards). RoPE ms: the "
              "RoPE call alone on the q, k and tables the layer passes it (captured from one forward); "
              "share = RoPE ms / model ms of the same pass. Where the patch fuses the model's q/k norm into "
              "the rotation (Wan), RoPE ms after is rome's call with that norm, RoPE ms before the model's "
              "RoPE without its norm: not like for like. Method: " + m["method"], ""]
    for c in m["cases"]:
        lines += [f"- **{c['model']}**: {c['description']}. Built: {c['built']} ({c['dtype']}"
                  f"{'' if c['full_size'] else ', scaled down for the CPU'}). Before: {c['rope_before']}. "
                  f"After: {c['rope_after']}. Patched output vs unpatched: max |diff| / max |out| = "
                  f"{c['patched_vs_unpatched_rel']:.2g}."]
    lines += [f"- {s['model']}: not measured ({s['status']}): {s['reason']}" for s in m["skipped"]]
    lines += [""]
    if m["cases"]:
        lines += [_table(models.rows(m), [
            ("model", "model", ""), ("pass", "pass", ""), ("unpatched ms", "unpatched_ms", ".4g"),
            ("patched ms", "patched_ms", ".4g"), ("speedup", "speedup", ".3f"),
            ("RoPE ms before", "rope_ms_before", ".4g"), ("RoPE share before", "rope_share_before", ".2%"),
            ("RoPE ms after", "rope_ms_after", ".4g"), ("RoPE share after", "rope_share_after", ".2%"),
        ]), ""]
    return "\n".join(lines)


def failures(results: dict) -> list[str]:
    """What of the run failed, one line each: a variant or model that raised (not one that is
    unsupported or not installed), and a rome precision row past its bound. The report says them
    first and the command exits non-zero (``results["failed"]``)."""
    out = [f"speed: {s['variant']}: {s['reason']}" for s in results.get("variants", []) if s.get("status") == "error"]
    out += [f"precision: {s['variant']} ({s.get('dtype')}, {s.get('mode')}, tables {s.get('table_dtype')}): "
            f"{s['reason']}" for s in results.get("precision_skipped", []) if s.get("status") == "error"]
    out += [f"precision: {p['variant']} ({p.get('dtype')}, {p.get('mode')}, tables {p.get('table_dtype')}): "
            f"max {p.get('max_ulp')} ulp, past its bound" for p in results.get("precision", [])
            if p.get("ok") is False and str(p.get("variant", "")).startswith("rome")]
    models_ = results.get("models") or {}
    out += [f"models: {s['model']}: {s['reason']}" for s in models_.get("skipped", []) if s.get("status") == "error"]
    if (results.get("kernels") or {}).get("error"):
        out += [f"kernels: {results['kernels']['error']}"]
    return out


def write_report(out: Path, results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    _write_csv(out / "speed.csv", results["speed"])
    if results.get("models"):
        _write_csv(out / "models.csv", models.rows(results["models"]))
    _write_csv(out / "precision.csv", results["precision"])
    _plots(out, results)
    (out / "report.md").write_text(markdown(results))


def markdown(r: dict) -> str:
    env, w = r["environment"], r["workload"]
    cpu = env["driver"] is None
    lines = [f"# rome report: {w['name']}", ""]
    if r.get("failed"):
        lines += ["**FAILED: parts of this run raised or missed their bound (the command exited 1):**", ""]
        lines += [f"- {f}" for f in r["failed"]] + [""]
    if cpu:
        lines += [f"**{GPU_LINE}**", ""]
    lines += [
        f"{w['description']}. q {w['q_shape']}, k {w['k_shape']} ({w['dtype']}, BNSD), sections "
        f"{w['sections']} {w['mode']}, theta {w['theta']}.",
        "",
        "## Environment",
        "",
        _table([env], [("device", "device", ""), ("driver", "driver", ""), ("torch", "torch", ""),
                       ("triton", "triton", ""), ("python", "python", ""), ("commit", "commit", ""),
                       ("dirty tree", "dirty", ""), ("when (UTC)", "timestamp", "")]),
        "",
        "## Speed",
        "",
    ]
    ran = r.get("parts_run", {})
    if ran.get("speed") is False:
        lines += ["Not run (--skip-speed).", ""]
    else:
        lines += [f"Shape timed: q {r['speed_shape']['q']}, k {r['speed_shape']['k']}. Method: {r['method']['speed']}", ""]
        copy_ = r["copy_bandwidth"]
        if cpu:  # (the variants' rounds do not include it; and q, k fit in cache there)
            lines += [f"Host memory copy of q's and k's bytes, timed before the rounds: {copy_['gbps']:.1f} GB/s "
                      f"({copy_['median_ms']:.4g} ms median): cache bandwidth, not a device's. No row is put "
                      "against it on a CPU.", ""]
        else:
            lines += [f"Copy bandwidth, measured in this run: {copy_['gbps']:.1f} GB/s (a device-to-device copy "
                      f"of q's and k's bytes, {copy_['median_ms']:.4g} ms median).", ""]
    if r.get("clocks") is not None:  # (a GPU run: its clocks, sampled or why not)
        lines += [clocks.line(r["clocks"]), ""]
    tc = r["copy_bandwidth"].get("triton")
    if tc and "error" in tc:
        lines += [f"The plain Triton copy of the same bytes failed: {tc['error']}", ""]
        tc = None
    if tc:
        lines += [f"A plain Triton copy of the same bytes (`profiling.speed.triton_copy`: one program per "
                  f"{tc['block']} elements, {tc['num_warps']} warps, no arithmetic): {tc['gbps']:.1f} GB/s, "
                  f"{100 * tc['gbps'] / r['copy_bandwidth']['gbps']:.1f} % of the copy's. It is the rate a "
                  "Triton kernel's loads and stores reach here; `% Triton copy` is each row against it.", ""]
    if r["speed"]:
        lines += [_table(r["speed"], [
            ("variant", "variant", ""), ("pass", "pass", ""), ("backend", "backend", ""),
            ("median ms", "median_ms", ".4g"), ("min ms", "min_ms", ".4g"), ("max ms", "max_ms", ".4g"),
            *([] if cpu else [("GB/s", "gbps", ".1f"), ("% copy BW", "pct_copy_bw", ".1f")]),
            *([("% Triton copy", "pct_triton_copy_bw", ".1f")] if tc else []), ("x v1", "speedup_vs_v1", ".2f"),
            ("x compiled", "speedup_vs_compiled", ".2f"), ("kernels/call", "kernels_per_call", ".3g"),
            ("kernel µs/call", "kernel_time_us", ".4g"), ("peak mem B", "peak_mem_bytes", ""),
        ]), ""]
        kinds = sorted({s["kernel_kind"] for s in r["speed"]})
        lines += [f"kernels/call counts {' and '.join(kinds)} seen by torch.profiler per call "
                  "(CPU: aten ops with no aten op above them, each one pass over memory; a compiled "
                  "variant's inductor kernels are not aten ops, so it counts 0 there)." if cpu else
                  f"kernels/call counts {' and '.join(kinds)} seen by torch.profiler per call.", ""]
    if r.get("autotuned"):
        lines += ["Tiles rome's autotuner picked in this run (`rome.tuning`: timed once per specialisation, "
                  "at its first launch of at least 4M elements):", ""]
        lines += [f"- {name}: {tile}" for name, tile in sorted(r["autotuned"].items())] + [""]
    lines += ["## Variants", "", _table(r["variants"], [("variant", "variant", ""), ("kind", "kind", ""),
              ("status", "status", ""), ("reason", "reason", ""), ("what", "description", "")]), ""]
    if ran.get("precision") is False:
        lines += ["## Precision", "", "Not run (--skip-precision).", ""]
    else:
        lines += _precision_lines(r)
    lines += [angles_section(r)]
    lines += [models_section(r)]
    lines += [kernels_section(r)]
    lines += ["Files: " + ", ".join(_files(r)) + ".", ""]
    return "\n".join(lines)


def _files(r: dict) -> list[str]:
    """What write_report wrote for this run."""
    files = ["results.json (all numbers)"]
    if r["speed"]:
        files += ["speed.csv", _speed_plot(r),
                  "traces/ (Chrome traces, one per variant and pass; open in chrome://tracing or Perfetto)"]
    if r["precision"]:
        files += ["precision.csv"]
    if _hist_rows(r):
        files += ["ulp_hist.png"]
    if (r.get("models") or {}).get("cases"):
        files += ["models.csv"]
    if r.get("kernels"):
        files += ["kernels/ (the static table's files)"]
    return files


def _hist_rows(r: dict) -> list[dict]:
    w = r["workload"]
    return [p for p in r["precision"] if p["dtype"] == w["dtype"] and p["mode"] == w["mode"]]


def _precision_lines(r: dict) -> list[str]:
    lines = [
        "## Precision",
        "",
        f"Against a float64 oracle (index-gather formula) on {r['precision_shape']}, tables from "
        "float64 angles rounded once to the table dtype. " + r["method"]["precision"],
        "",
        "Tolerance (`ok`): |out - exact| <= 1 ulp(exact) in the output dtype + 4·2⁻²⁴·(|x·cos| + "
        "|rot(x)·sin|), i.e. fp32 math rounded once. `seed metric` is seed 004's max(min(abs, rel)) "
        "of |out| vs |exact| (sign-blind, as the seed wrote it) and `seed count` its elements > 0. "
        "`max ulp` is the op's error with the tables it was given; `total ulp` is the error against the "
        "float64-table oracle, the op's and the tables' quantisation together (which can partly cancel: "
        "it may be below `max ulp`).",
        "",
        _table(r["precision"], [
            ("variant", "variant", ""), ("dtype", "dtype", ""), ("mode", "mode", ""), ("tables", "table_dtype", ""),
            ("backend", "backend", ""), ("max abs", "max_abs", ".3g"), ("max rel", "max_rel", ".3g"),
            ("seed metric", "seed_metric", ".3g"), ("seed count", "seed_count", ""), ("max ulp", "max_ulp", ".3g"),
            ("total ulp", "total_max_ulp", ".3g"), ("ok", "ok", ""),
        ]),
        "",
        "### Error of the quantised tables alone",
        "",
        _table(r["table_error"], [("dtype", "dtype", ""), ("mode", "mode", ""), ("tables", "table_dtype", ""),
                                  ("max abs", "max_abs", ".3g"), ("max ulp of output", "max_ulp", ".3g")]),
        "",
    ]
    if r["precision_skipped"]:
        reasons = {}
        for s in r["precision_skipped"]:
            reasons.setdefault((s["variant"], s["status"], s["reason"]), []).append(f"{s['dtype']}/{s['mode']}")
        lines += ["### Not measured", ""]
        lines += [f"- {v}: {st}: {why} ({', '.join(dict.fromkeys(c))})" for (v, st, why), c in reasons.items()]
        lines += [""]
    return lines


# --- driver -------------------------------------------------------------------------------


def build(args) -> tuple[Workload, Workload]:
    w = WORKLOADS[args.workload]
    if args.dtype:
        w = w.replace(dtype={"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype])
    if args.shape:
        parts = args.shape.split(",")
        dims = [int(v) for v in parts if v.strip().isdigit()]
        if len(dims) != len(parts) or len(dims) not in (4, 5) or min(dims) <= 0:
            raise SystemExit(f"--shape takes positive ints B,N,S,D or B,Nq,Nk,S,D, got {args.shape}")
        b, nq, nk, s, d = dims if len(dims) == 5 else (dims[0], dims[1], dims[1], dims[2], dims[3])
        if d != w.head_dim:
            raise SystemExit(f"--shape D={d} must be the workload's head_dim {w.head_dim} (sections {w.sections})")
        grid_len = None if w.grid is None else math.prod(w.grid)
        if grid_len is not None and s > grid_len:
            raise SystemExit(f"--shape S={s} exceeds the {w.name} grid {w.grid} ({grid_len} tokens)")
        try:
            w = w.replace(batch=b, q_heads=nq, kv_heads=nk, seq=s if not w.decode else 1)
        except ValueError as e:  # (the workload's own rule for the shape, e.g. varlen's)
            raise SystemExit(f"--shape {args.shape}: {e}") from None
    run_w = w if torch.cuda.is_available() else scaled_for_cpu(w)
    return w, run_w


def report(args) -> Path:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    console = Console()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w, run_w = build(args)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else ROOT / "reports" / f"{w.name}-{stamp}"
    if device.type == "cpu":
        console.print(f"[bold yellow]{GPU_LINE}[/]")
    tokens = accuracy.sample_tokens(w, None if device.type == "cuda" else args.precision_tokens)
    prec_w = w.replace(batch=min(w.batch, 2 if not w.decode else 8), q_heads=min(w.q_heads, 4 if device.type == "cuda" else 2),
                       kv_heads=min(w.kv_heads, 2 if device.type == "cuda" else 1))
    prec_backend = "triton"  # the kernel itself: on a GPU, or through the interpreter on the CPU
    n_speed = 0 if args.skip_speed else 3 * len(VARIANTS) + (device.type == "cpu")  # + the interleaved timing
    n_prec = 0 if args.skip_precision else 10 * len(VARIANTS) + 1  # + the angles measurement
    skip_models = getattr(args, "skip_models", False)
    n_models = 0 if skip_models else models.STEPS * len(models.MODELS)
    with Progress(TextColumn("{task.description:<58}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("starting", total=n_speed + n_prec + n_models)

        def step(text):
            progress.update(task, description=text[:58], advance=1)

        speed_rows, statuses, copy, clock = ([], [], {"gbps": None, "median_ms": None}, None)  # (None: not run)
        if not args.skip_speed:
            speed_rows, statuses, copy, clock = run_speed(run_w, device, out / "traces", step)
        prec, table_err, skipped = ([], [], [])
        if not args.skip_precision:
            prec, table_err, skipped = accuracy.run_precision(VARIANTS.values(), prec_w, device, backend=prec_backend,
                                                              tokens=tokens, on_step=step)
        angles = None
        if not args.skip_precision:
            step("precision: angles in the kernel against float64")
            angles = accuracy.angles_accuracy(device, backend=prec_backend,
                                              samples=2048 if device.type == "cuda" else 64)
        model_results = None if skip_models else models.run_models(device, on_step=step)
        progress.update(task, completed=n_speed + n_prec + n_models, description="done")

    seq_p = prec_w.seq if tokens is None else len(tokens)
    results = {
        "environment": environment(device),
        "workload": {"name": w.name, "description": w.description, "q_shape": list(w.shape(w.q_heads)),
                     "k_shape": list(w.shape(w.kv_heads)), "sections": list(w.sections), "mode": w.mode,
                     "theta": w.theta, "grid": list(w.grid) if w.grid else None,
                     "dtype": accuracy.dtype_name(w.dtype)},
        "speed_shape": {"q": list(run_w.shape(run_w.q_heads)), "k": list(run_w.shape(run_w.kv_heads)),
                        "scaled_for_cpu": run_w != w},
        "precision_shape": f"q [{prec_w.batch}, {prec_w.q_heads}, {seq_p}, {w.head_dim}], k [{prec_w.batch}, "
                           f"{prec_w.kv_heads}, {seq_p}, {w.head_dim}]"
                           + (f" ({seq_p} tokens spread over all {w.seq})" if tokens is not None else ""),
        "method": {
            "speed": ("triton.testing.do_bench (CUDA events, L2 flushed), min/median/max; GB/s = bytes the op "
                      "must move (q, k read and written once, cos, sin read once; twice that for fwd+bwd) / "
                      "median; % copy BW against the copy in this run, % Triton copy against the plain Triton copy "
                      "in this run." if device.type == "cuda" else
                      f"{GPU_LINE} time.perf_counter around repeated calls after {speed.CPU_WARMUP_S} s of warm-up, "
                      f"every variant and pass timed in {speed.cpu_rounds()} shared rounds (shuffled order, "
                      f"~{speed.CPU_BURST_S * 1e3:g} ms per visit, ~{speed.CPU_MEASURE_S} s each in all), so the "
                      "machine's drift lands on all alike; "
                      "rome variants on the torch backend (the Triton kernel on the CPU would be timing Triton's "
                      "interpreter). On a CPU the scaled-down q and k fit in cache, so 'copy bandwidth' is cache "
                      "bandwidth, and a shared machine makes these timings noisy: they say nothing about the GPU "
                      "kernel."),
            "precision": (f"rome variants run the Triton kernel ({'on the GPU' if device.type == 'cuda' else 'through TRITON_INTERPRET=1 on the CPU'}); "
                          "each q and k element counts once."),
        },
        "parts_run": {"speed": not args.skip_speed, "precision": not args.skip_precision},
        "copy_bandwidth": copy,
        "clocks": clock,  # (GPU: profiling.clocks' summary over the speed timings; None on a CPU or without speed)
        "variants": statuses,
        "speed": speed_rows,
        "precision": prec,
        "table_error": table_err,
        "precision_skipped": skipped,
        "angles": angles,
        "models": model_results,
        # the tiles rome's autotuner picked in this run (GPU; empty on the CPU or ROME_AUTOTUNE=0)
        "autotuned": _autotuned(),
    }
    if not getattr(args, "skip_kernels", False):
        results["kernels"] = kernels_report_section(out / "kernels", getattr(args, "arch", None), console, workload=w)
    results["failed"] = failures(results)
    write_report(out, results)

    summary = Table(title=f"rome report: {w.name} on {results['environment']['device']}")
    # readable in an 80-column log: short headers, variant names folded rather than cut, and on a
    # CPU no bandwidth columns (a copy line means nothing there: the plot shows x v1 instead)
    cols = [("variant", "variant", None), ("pass", "pass", None), ("ms", "median_ms", ".4g"),
            ("GB/s", "gbps", ".1f"), ("%copy", "pct_copy_bw", ".1f"), ("x v1", "speedup_vs_v1", ".2f"),
            ("x comp", "speedup_vs_compiled", ".2f"), ("kern", "kernels_per_call", ".3g")]
    if device.type != "cuda":
        cols = [c for c in cols if c[1] not in ("gbps", "pct_copy_bw")]
    for head, _, _ in cols:
        summary.add_column(head, overflow="fold", min_width=12 if head == "variant" else None)
    for row in speed_rows:
        summary.add_row(*(row[f] if fmt is None else _fmt(row[f], fmt) for _, f, fmt in cols))
    summary.caption = ("ms: median; x v1 / x comp: speed relative to v1 slice+concat / v3 torch.compile; "
                       "kern: kernels per call")
    console.print(summary)
    ptab = Table(title=f"precision, {w.dtype} {w.mode} (max ulp vs float64 oracle, per table dtype)")
    for col in ("variant", "backend", "fp32 tables", "ok", f"{accuracy.dtype_name(w.dtype)} tables", "ok "):
        ptab.add_column(col)
    for name in dict.fromkeys(r["variant"] for r in prec):
        rows = {r["table_dtype"]: r for r in prec if r["variant"] == name and r["dtype"] == accuracy.dtype_name(w.dtype) and r["mode"] == w.mode}
        f32, own = rows.get("float32"), rows.get(accuracy.dtype_name(w.dtype))
        ptab.add_row(name, (f32 or own or {}).get("backend", ""), _fmt(f32 and f32["max_ulp"]), _fmt(f32 and f32["ok"]),
                     _fmt(own and own["max_ulp"]), _fmt(own and own["ok"]))
    console.print(ptab)
    if model_results and model_results["cases"]:
        mtab = Table(title="models: unpatched vs rome-patched (median ms; RoPE share of the pass)")
        for col in ("model", "pass", "unpatched ms", "patched ms", "speedup", "RoPE share before", "after"):
            mtab.add_column(col)
        for row in models.rows(model_results):
            mtab.add_row(row["model"], row["pass"], _fmt(row["unpatched_ms"], ".4g"), _fmt(row["patched_ms"], ".4g"),
                         _fmt(row["speedup"], ".3f"), _fmt(row["rope_share_before"], ".2%"),
                         _fmt(row["rope_share_after"], ".2%"))
        console.print(mtab)
    if device.type == "cpu":
        console.print(f"[bold yellow]{GPU_LINE}[/]")
    for f in results["failed"]:
        console.print(f"[bold red]FAILED[/] {f}")
    console.print(f"report: {out / 'report.md'}")
    return out
