"""``make gpu``: the first contact with a GPU, in one command under ten minutes.

``python -m profiling.gpu [--out DIR] [--budget S] [--only PART,...] [--skip PART,...] [--archive F] [--list]``

Writes ``profiling/results/<gpu>/`` (``h100``, ``h200``, ``a100``, ... from the device's name;
without a CUDA device in torch, a rehearsal: ``reports/gpu-rehearsal-<gpu>-<stamp>/``):

- ``environment.json``, ``nvidia-smi.txt``: device, driver, torch / triton / CUDA versions, commit;
- ``speed/<workload>/``: ``make report``'s speed part for default, llama-1d, decode and varlen
  (and, asked for with ``--only``, flux-qknorm and wan-qknorm: the fused QK-norm's comparison)
  (against copy bandwidth, torch.compile and the anchors installed here; the autotuner's choices;
  on default also the kernels section: its launches compiled for this device's arch, the
  bandwidth model's estimate beside the measured GB/s);
- ``tests-gpu.log``: ``tests/test_gpu.py``; ``tests-suite.log``: every other module on CUDA;
- ``precision/<workload>/``: the report's precision part (and the model workload on default);
- ``ncu/``: Nsight Compute metrics of rome's forward and backward on default (``ncu
  --clock-control none``): DRAM throughput as % of peak, DRAM bytes read against the bytes the op
  must read, achieved occupancy, L2 hit rate;
- ``sanitizer-memcheck.log``, ``sanitizer-racecheck.log``: ``compute-sanitizer`` on small launches
  of every entry point, forward and backward;
- ``summary.json`` and ``README.md``: every part's status, time, limit and log, and the numbers.

Every part runs in its own process with its own time limit, inside one budget (``--budget``,
default 540 s, so the whole stays under a 10-minute command); a part that fails or runs out of
time is recorded as such and the next one runs. The summary is rewritten after each part, so an
interrupted run leaves what it measured. The order puts the speed reports first. A later run
with ``--only`` (e.g. ``--only suite --budget 540``) adds its parts to the same folder's summary.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ("default", "llama-1d", "decode", "varlen")
QKNORM_WORKLOADS = ("flux-qknorm", "wan-qknorm")  # make gpu --only speed-flux-qknorm,speed-wan-qknorm
BUDGET_S = 540.0
MIN_PART_S = 15.0  # a part is not started with less time than this left in the budget

# Nsight Compute: the sections give DRAM throughput (% of peak), occupancy and the L2 hit rate by
# their own metric names; the metrics add the byte counts. Kept small: each metric group is a replay.
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "MemoryWorkloadAnalysis")
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct",
               "lts__t_sector_op_read_hit_rate.pct", "sm__warps_active.avg.pct_of_peak_sustained_active",
               "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum")
NCU_KEEP = {  # raw-page column -> name in ncu.json
    "Kernel Name": "kernel",
    "gpu__time_duration.sum": "duration_ns",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct_of_peak",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_throughput_pct_of_peak",
    "dram__bytes_read.sum": "dram_bytes_read",
    "dram__bytes_write.sum": "dram_bytes_write",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_rate_pct",
    "lts__t_sector_op_read_hit_rate.pct": "l2_read_hit_rate_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__grid_size": "grid_size",
    "launch__block_size": "block_size",
}


# --- naming -----------------------------------------------------------------------------------


def folder_name(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA A100-SXM4-80GB`` -> ``a100``, ``NVIDIA
    GeForce RTX 4090`` -> ``rtx-4090``, ``AMD Instinct MI300X`` -> ``mi300x``: the words up to the
    first with a digit, less the vendor and brand."""
    words = [w for w in re.split(r"[\s\-_/]+", device_name.lower()) if w]
    words = [w for w in words if w not in ("nvidia", "geforce", "tesla", "quadro", "amd", "instinct", "radeon")]
    picked = []
    for w in words:
        picked.append(re.sub(r"[^a-z0-9.]", "", w))
        if any(c.isdigit() for c in w):
            break
    name = "-".join(p for p in picked if p)
    return name or "unknown-gpu"


# --- running parts ----------------------------------------------------------------------------


@dataclass
class Part:
    name: str
    limit_s: float
    what: str
    run: object  # (ctx, part, seconds) -> (status, detail)
    default: bool = True


@dataclass
class Context:
    out: Path
    python: str
    env: dict
    deadline: float
    summary: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # environment.json
    archive: Path | None = None  # --archive: the folder as one .tar.gz, rewritten after every part

    def left(self) -> float:
        return self.deadline - time.monotonic()


def run_cmd(cmd, log: Path, seconds: float, env=None, cwd=ROOT) -> tuple[str, int | None]:
    """Run ``cmd`` in a process group with its output in ``log``; kill the group after
    ``seconds``. ``(status, returncode)``: status ok / failed / timeout / missing."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        f.write(f"$ {' '.join(map(str, cmd))}   (limit {seconds:.0f} s)\n".encode())
        f.flush()
        try:
            p = subprocess.Popen([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                                 env=env, start_new_session=True)
        except FileNotFoundError as e:
            f.write(f"not found: {e}\n".encode())
            return "missing", None
        try:
            rc = p.wait(timeout=max(1.0, seconds))
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            f.write(f"\n[make gpu] time limit: stopped after {seconds:.0f} s\n".encode())
            return "timeout", None
    return ("ok" if rc == 0 else "failed"), rc


def _tail(path: Path, n=3, skip=()) -> str:
    """The last lines the part's process wrote (not the command line or the limit's notice)."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines()
                 if line.strip() and not line.startswith(("$ ", "[make gpu]", *skip))]
    except OSError:
        return ""
    return " | ".join(lines[-n:])[-400:]


def _pytest_counts(log: Path) -> str:
    """pytest's closing line (e.g. '3 failed, 120 passed, 5 skipped in 80.1s'), or the progress so far."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    found = re.findall(r"^=*\s*((?:\d+ \w+(?:, )?)+ in [\d.]+s.*?)=*$", text, re.M)
    if found:
        return found[-1].strip()
    counts = {k: len(re.findall(rf" {k.upper()}", text)) for k in ("passed", "failed", "skipped", "error")}
    return "stopped before the end; so far " + ", ".join(f"{v} {k}" for k, v in counts.items() if v)


# --- parts ------------------------------------------------------------------------------------


def part_report(workload: str, kind: str):
    def run(ctx: Context, part: Part, seconds: float):
        out = ctx.out / kind / workload
        if out.exists():
            shutil.rmtree(out)
        cmd = [ctx.python, "-m", "profiling", "report", "--workload", workload, "--out", out]
        if kind == "speed" and workload == "default":
            # the kernels section: default's launches compiled for this device's arch, the
            # bandwidth model's estimate beside this run's measured GB/s
            cmd += ["--arch", ctx.info["capability"]] if ctx.info.get("capability") else []
        else:
            cmd += ["--skip-kernels"]
        if kind == "speed":
            cmd += ["--skip-precision", "--skip-models"]
        else:
            cmd += ["--skip-speed"] + ([] if workload == "default" else ["--skip-models"])
        log = ctx.out / "logs" / f"{part.name}.log"
        status, rc = run_cmd(cmd, log, seconds, env=ctx.env)
        if status == "ok":
            return status, _report_numbers(out, kind)
        return status, (f"stopped at {seconds:.0f} s; " if status == "timeout" else f"exit {rc}; ") + _tail(log)
    return run


def _report_numbers(out: Path, kind: str) -> str:
    try:
        r = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return "no results.json"
    if kind == "speed":
        if "environment" in r and r["environment"].get("driver") is None:  # a report run on a CPU: no GPU figure
            return "CPU run (torch backend timings, no GPU figures): see its report.md"
        rows = [s for s in r.get("speed", []) if s.get("variant", "").startswith("rome")]
        best = {}
        for s in rows:
            if s.get("pass") == "fwd" and isinstance(s.get("pct_copy_bw"), (int, float)):
                best[s["variant"]] = s["pct_copy_bw"]
        copy = r.get("copy_bandwidth", {}).get("gbps")
        tcopy = (r.get("copy_bandwidth", {}).get("triton") or {}).get("gbps")  # (None where it failed)
        parts = [f"copy {copy:.0f} GB/s" if isinstance(copy, (int, float)) else ""]
        if isinstance(copy, (int, float)) and isinstance(tcopy, (int, float)) and copy > 0:
            parts.append(f"plain Triton copy {tcopy:.0f} GB/s ({100 * tcopy / copy:.1f}% of copy)")
        from .static.tables import measured_sm_mhz

        sm = measured_sm_mhz(r)
        if sm is not None:
            parts.append(f"SM clock median {sm:.0f} MHz")
        parts += [f"{k} fwd {v:.0f}% copy" for k, v in list(best.items())[:4]]
        ms = {(s.get("variant"), s.get("pass")): s.get("median_ms") for s in r.get("speed", [])}
        for p in ("fwd", "bwd"):  # a QK-norm workload: the fused op against the unfused pair
            fused, pair = ms.get(("rome.apply_qk_norm", p)), ms.get(("q/k norm, then rome.apply_qk", p))
            if isinstance(fused, (int, float)) and isinstance(pair, (int, float)) and fused > 0:
                parts.append(f"fused QK-norm {p} {fused:.3g} ms, unfused pair {pair:.3g} ms ({pair / fused:.2f}x)")
        tuned = r.get("autotuned") or {}
        parts.append(f"{len(tuned)} autotuned key(s)")
        return "; ".join(p for p in parts if p)
    prec = r.get("precision", [])
    bad = [p for p in prec if p.get("ok") is False and str(p.get("variant", "")).startswith("rome")]
    return f"{len(prec)} precision rows, rome rows not ok: {len(bad)}"


def part_pytest(name: str, args: list[str]):
    def run(ctx: Context, part: Part, seconds: float):
        log = ctx.out / f"{name}.log"
        if log.exists():
            log.unlink()
        cmd = [ctx.python, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider", "--junitxml",
               ctx.out / f"{name}.xml", *args]
        status, _ = run_cmd(cmd, log, seconds, env=ctx.env)
        counts = _pytest_counts(log)
        if status == "ok" and " skipped" in counts and " passed" not in counts:
            status = "skipped"  # e.g. tests/test_gpu.py without CUDA: nothing ran
        return status, counts
    return run


def part_ncu(ctx: Context, part: Part, seconds: float):
    ncu = shutil.which("ncu")
    if ncu is None:
        return "missing", "ncu is not on the PATH"
    out = ctx.out / "ncu"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    end = time.monotonic() + seconds
    results, statuses = {}, []
    for pass_ in ("forward", "backward"):
        rep = out / f"rome-default-{pass_}"
        log = out / f"{pass_}.log"
        base = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
                "-f", "-o", rep]
        target = [ctx.python, "-m", "profiling.gpu", "_ncu_target", pass_, out / f"{pass_}-needed.json"]
        sections = [a for s in NCU_SECTIONS for a in ("--section", s)]
        status, rc = run_cmd(base + sections + ["--metrics", ",".join(NCU_METRICS)] + target, log,
                             end - time.monotonic(), env=ctx.env)
        if status == "failed":  # an unknown metric name fails the whole run: the sections alone
            status, rc = run_cmd(base + sections + target, log, end - time.monotonic(), env=ctx.env)
        statuses.append(status)
        if status != "ok":
            results[pass_] = {"status": status, "log": str(log.relative_to(ctx.out)), "why": _tail(log, 1)}
            continue
        raw = subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--csv", "--page", "raw", "--print-units", "base"],
                             capture_output=True, text=True, timeout=max(5, end - time.monotonic()))
        (out / f"{pass_}-raw.csv").write_text(raw.stdout)
        results[pass_] = ncu_summary(raw.stdout, out / f"{pass_}-needed.json")
    (out / "ncu.json").write_text(json.dumps(results, indent=1))
    status = "ok" if all(s == "ok" for s in statuses) else next(s for s in statuses if s != "ok")
    return status, _ncu_line(results)


def ncu_summary(raw_csv: str, needed_path: Path) -> dict:
    """The kernels ncu profiled in the range (rome's launches of one pass) with the kept
    metrics, and DRAM bytes read against the bytes the op must read."""
    rows = list(csv.reader(io.StringIO(raw_csv)))
    header_at = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    kernels = []
    if header_at is not None:
        header = rows[header_at]
        for r in rows[header_at + 1:]:
            if len(r) != len(header) or ("ID" in header and not r[header.index("ID")].strip().isdigit()):
                continue  # the units row
            row = {}
            for col, key in NCU_KEEP.items():
                if col in header and key not in row:
                    v = r[header.index(col)]
                    try:
                        row[key] = float(v.replace(",", "")) if key != "kernel" else v
                    except ValueError:
                        row[key] = v
            kernels.append(row)
    try:
        needed = json.loads(needed_path.read_text())
    except (OSError, ValueError):
        needed = {}
    total = {"kernels": len(kernels)}
    read = sum(k.get("dram_bytes_read", 0) for k in kernels if isinstance(k.get("dram_bytes_read"), float))
    if read and needed.get("bytes_must_read"):
        total["dram_bytes_read"] = read
        total["dram_read_over_needed"] = read / needed["bytes_must_read"]
        if needed.get("table_bytes"):
            total["extra_read_in_tables"] = (read - needed["bytes_must_read"]) / needed["table_bytes"]
    return {"status": "ok", "needed": needed, "total": total, "kernels": kernels}


def _ncu_line(results: dict) -> str:
    parts = []
    for pass_, r in results.items():
        if r.get("status") != "ok":
            parts.append(f"{pass_}: {r.get('status')} ({r.get('why', '')})")
            continue
        k = max(r["kernels"], key=lambda k: k.get("duration_ns", 0) if isinstance(k.get("duration_ns"), float) else 0,
                default={})
        bits = [f"{pass_}: {r['total']['kernels']} kernel(s)"]
        for key, fmt in (("dram_throughput_pct_of_peak", "DRAM {:.0f}% of peak"), ("achieved_occupancy_pct", "occupancy {:.0f}%"),
                         ("l2_hit_rate_pct", "L2 hit {:.0f}%")):
            if isinstance(k.get(key), float):
                bits.append(fmt.format(k[key]))
        if "dram_read_over_needed" in r["total"]:
            bits.append(f"DRAM read {r['total']['dram_read_over_needed']:.3f}x needed")
        parts.append(", ".join(bits))
    return "; ".join(parts)


def part_sanitizer(tool: str):
    def run(ctx: Context, part: Part, seconds: float):
        cs = shutil.which("compute-sanitizer")
        if cs is None:
            return "missing", "compute-sanitizer is not on the PATH"
        log = ctx.out / f"sanitizer-{tool}.log"
        if log.exists():
            log.unlink()
        # one allocation per tensor, so memcheck sees an access past a tensor's end (torch's
        # caching allocator would hide it inside a larger block)
        env = {**ctx.env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
        cmd = [cs, "--tool", tool, "--error-exitcode", "99", "--target-processes", "all",
               ctx.python, "-m", "profiling.gpu", "_entry_points", "cuda"]
        status, rc = run_cmd(cmd, log, seconds, env=env)
        text = log.read_text(errors="replace") if log.exists() else ""
        m = re.search(r"ERROR SUMMARY: (\d+) error", text)
        calls = len(re.findall(r"^ok ", text, re.M))
        errors = len(re.findall(r"^error ", text, re.M))
        detail = f"{calls} calls ok, {errors} raised" + (f"; sanitizer: {m.group(1)} error(s)" if m else "")
        if status == "failed" and rc == 99:
            detail = "sanitizer errors: " + detail
        elif status != "ok" and not calls and not errors:
            detail += "; " + _tail(log, 1, skip=("=====",))  # the target stopped before its first call
        return status, detail
    return run


def part_environment(ctx: Context, part: Part, seconds: float):
    log = ctx.out / "logs" / "environment.log"
    status, _ = run_cmd([ctx.python, "-m", "profiling.gpu", "_env", ctx.out / "environment.json"], log, seconds,
                        env=ctx.env)
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            text = subprocess.run([smi], capture_output=True, text=True, timeout=30).stdout
            text += subprocess.run([smi, "-q"], capture_output=True, text=True, timeout=30).stdout
            (ctx.out / "nvidia-smi.txt").write_text(text)
        except (OSError, subprocess.SubprocessError) as e:
            (ctx.out / "nvidia-smi.txt").write_text(f"nvidia-smi: {e}\n")
    try:
        env = json.loads((ctx.out / "environment.json").read_text())
        detail = f"{env.get('device')}, driver {env.get('driver')}, torch {env.get('torch')} (CUDA {env.get('cuda')}), triton {env.get('triton')}"
    except (OSError, ValueError):
        detail = _tail(log)
    return status, detail


PARTS = [
    Part("environment", 45, "device, driver, versions, commit", part_environment),
    # (the order is the priority: on 2026-12-04's cold H200, f06c2d3, speed-default's timings took
    # 1 min 43 s and its kernels section, compiled by two processes after them, was stopped at the
    # 180 s limit; gpu-tests stopped at 75 s with 16 of 19 passed, precision-default at 75 s. The
    # compile now takes the machine's CPUs, and the limits are 240 / 150 / 150 s)
    Part("speed-default", 240, "make report's speed part, default (and its kernels section)",
         part_report("default", "speed")),
    Part("gpu-tests", 150, "tests/test_gpu.py", part_pytest("tests-gpu", ["tests/test_gpu.py"])),
    Part("precision-default", 150, "make report's precision part and the model workload, default",
         part_report("default", "precision")),
    *[Part(f"speed-{w}", 70, f"make report's speed part, {w}", part_report(w, "speed")) for w in WORKLOADS[1:]],
    Part("ncu", 100, "Nsight Compute, rome's forward and backward on default", part_ncu),
    Part("memcheck", 75, "compute-sanitizer memcheck, every entry point", part_sanitizer("memcheck")),
    Part("racecheck", 60, "compute-sanitizer racecheck, every entry point", part_sanitizer("racecheck")),
    *[Part(f"precision-{w}", 40, f"make report's precision part, {w}", part_report(w, "precision"))
      for w in WORKLOADS[1:]],
    # issue 29: the fused QK-norm against the unfused pair (norm, then rome.apply_qk), the eager
    # chain and its torch.compile, by the report's own method (after the parts above: --only)
    *[Part(f"speed-{w}", 120, f"make report's speed part, {w} (the fused QK-norm against the unfused pair, "
           "the eager chain and its torch.compile)", part_report(w, "speed"), default=False)
      for w in QKNORM_WORKLOADS],
    Part("suite", 540, "every other test module on CUDA (bounded by what is left of the budget)",
         part_pytest("tests-suite", ["tests", "--ignore", "tests/test_gpu.py", "--ignore",
                                      "tests/test_kernels_static.py", "--ignore", "tests/test_static_tool.py"])),
    Part("static", 540, "tests/test_kernels_static.py and test_static_tool.py: the ahead-of-time compile gate "
         "and its tool with this machine's triton (CPU work; not by default)",
         part_pytest("tests-static", ["tests/test_kernels_static.py", "tests/test_static_tool.py"]),
         default=False),
]


# --- the targets run in their own processes -------------------------------------------------


def _env(path: str) -> None:
    import platform

    info = {"python": platform.python_version(), "platform": platform.platform(), "executable": sys.executable}
    try:
        import torch

        info |= {"torch": torch.__version__, "cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            info |= {"device": p.name, "capability": f"{p.major}.{p.minor}", "sms": p.multi_processor_count,
                     "memory_gib": round(p.total_memory / 2**30, 1), "devices": torch.cuda.device_count(),
                     "l2_bytes": getattr(p, "L2_cache_size", None)}
    except Exception as e:  # noqa: BLE001 - record it, the other parts still run
        info["torch_error"] = f"{type(e).__name__}: {e}"
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        info["triton_error"] = f"{type(e).__name__}: {e}"
    smi = _quiet(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if smi:
        name, _, driver = smi.splitlines()[0].partition(",")
        info["driver"] = driver.strip()
        info.setdefault("device", name.strip())
    info.setdefault("device", None)
    # a copy of the tree sent to a lent GPU machine names its commit in ROME_COMMIT: the .git that
    # travels with it can be the session's first clone, not the tree's commit (seen on the H200)
    named = os.environ.get("ROME_COMMIT")
    info["commit"] = named or _quiet(["git", "rev-parse", "HEAD"]) or "unknown"
    info["dirty"] = False if named else bool(_quiet(["git", "status", "--porcelain", "--untracked-files=no"]))
    for tool in ("ncu", "compute-sanitizer"):
        text = _quiet([tool, "--version"])
        info[tool] = text.splitlines()[-1] if text else None
    import importlib.metadata as md

    info["packages"] = {}
    for pkg in ("numpy", "transformers", "diffusers", "rotary-embedding-torch", "liger-kernel", "flash-attn",
                "flashinfer-python", "transformer-engine", "einops", "hypothesis", "pytest"):
        try:
            info["packages"][pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info["packages"][pkg] = None
    info["timestamp"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    Path(path).write_text(json.dumps(info, indent=1))


def _quiet(cmd) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _ncu_target(pass_: str, needed_path: str) -> None:
    """rome.apply_qk on the default workload (q, k [1, 24, 28800, 128] bf16, fp32 tables), warmed
    up (compile, autotune), then one forward, or one backward, between cudaProfilerStart/Stop."""
    import torch

    import rome

    from .workloads import WORKLOADS as ALL, qk, tables

    w = ALL["default"]
    q, k = qk(w, device="cuda")
    t = tables(w, device="cuda")
    m = rome.rotation_matrix(w.sections, w.mode, dtype=q.dtype, device="cuda")
    gq, gk = torch.randn_like(q), torch.randn_like(k)
    q.requires_grad_(pass_ == "backward")
    k.requires_grad_(pass_ == "backward")

    def step():
        out = rome.apply_qk(q, k, t.cos, t.sin, m)
        if pass_ == "backward":
            torch.autograd.backward(out, (gq, gk))
        return out

    for _ in range(3):
        out = step()
        del out
        q.grad = k.grad = None
    torch.cuda.synchronize()
    if pass_ == "backward":  # the forward outside the range, the backward inside
        out = rome.apply_qk(q, k, t.cos, t.sin, m)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        torch.autograd.backward(out, (gq, gk))
    else:
        torch.cuda.profiler.start()
        out = rome.apply_qk(q, k, t.cos, t.sin, m)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    xb = (q.numel() + k.numel()) * q.element_size()
    tb = t.cos.numel() * t.cos.element_size() + t.sin.numel() * t.sin.element_size()
    Path(needed_path).write_text(json.dumps({
        "pass": pass_, "q": list(q.shape), "k": list(k.shape), "dtype": str(q.dtype), "tables": list(t.cos.shape),
        "table_dtype": str(t.cos.dtype),
        # forward reads q, k and both tables once and writes q', k'; backward the same with the grads
        "bytes_must_read": xb + tb, "bytes_must_write": xb, "table_bytes": tb,
    }, indent=1))


def entry_point_calls(device: str):
    """(name, thunk) for small launches of every public entry point, forward and backward, on the
    Triton backend: the tables path, positions into a cache, angles in the kernel, in place, out=,
    qkv, rome.RoPE (1D, video grid, packed varlen, decode)."""
    import torch

    import rome
    from rome.frequencies import rope_frequencies
    from rome.layouts import cos_sin_cache, rope_layout, section_layout
    from rome.positions import angle_frequencies

    g = torch.Generator().manual_seed(0)
    calls, first = [], []  # first: one call of each entry point, so a time limit cuts repeats only
    cases = [((44, 44, 40), "half"), ((16, 24, 24), "interleave"), ((64,), "half")]
    for dtype in (torch.bfloat16, torch.float32):
        for sections, mode in cases:
            d, n_axes, s, p = sum(sections), len(sections), 37, 64  # 37 tokens: a partial tile
            tag = f"{str(dtype)[6:]} {'/'.join(map(str, sections))} {mode}"

            def rnd(*shape, dtype=dtype):
                return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

            q, k = rnd(2, 3, s, d), rnd(2, 1, s, d)
            pos = (torch.arange(s)[:, None] * torch.tensor([1, 3, 5][:n_axes])) % p
            cos, sin = rome.rope_cos_sin(pos, sections, mode=mode, device=device)
            m = rome.rotation_matrix(sections, mode, dtype=dtype, device=device)
            layout = section_layout(sections, mode=mode)
            cc, sc = cos_sin_cache(layout, p, device=device)
            cpos = torch.randint(0, p, (2, 1, s, n_axes), generator=g).to(device)
            axis = layout.axis.to(device) if n_axes > 1 else None
            freqs, scales = (x.to(device) for x in angle_frequencies(layout.inv_freq, 1.0))

            def grad(fn, *xs):
                def thunk():
                    leaves = [x.detach().clone().requires_grad_() for x in xs]
                    out = fn(*leaves)
                    outs = out if isinstance(out, tuple) else (out,)
                    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
                    return [x.grad for x in leaves]
                return thunk

            bk = dict(backend="triton")
            (first if not calls and not first else calls).extend([
                (f"apply {tag}", lambda q=q, cos=cos, sin=sin, m=m: rome.apply(q, cos, sin, m, **bk)),
                (f"apply backward (q, cos, sin) {tag}",
                 grad(lambda x, c, s_, m=m: rome.apply(x, c, s_, m, **bk), q, cos, sin)),
                (f"apply_qk {tag}", lambda q=q, k=k, cos=cos, sin=sin, m=m: rome.apply_qk(q, k, cos, sin, m, **bk)),
                (f"apply_qk backward {tag}",
                 grad(lambda a, b, cos=cos, sin=sin, m=m: rome.apply_qk(a, b, cos, sin, m, **bk), q, k)),
                (f"apply_at {tag}", lambda q=q, cc=cc, sc=sc, m=m, cpos=cpos, axis=axis:
                    rome.apply_at(q, cc, sc, m, cpos, axis=axis, **bk)),
                (f"apply_qk_at {tag}", lambda q=q, k=k, cc=cc, sc=sc, m=m, cpos=cpos, axis=axis:
                    rome.apply_qk_at(q, k, cc, sc, m, cpos, axis=axis, **bk)),
                (f"apply_qk_at backward (q, k, caches) {tag}",
                 grad(lambda a, b, c, s_, m=m, cpos=cpos, axis=axis: rome.apply_qk_at(a, b, c, s_, m, cpos, axis=axis, **bk),
                      q, k, cc, sc)),
                (f"apply_qk_angles {tag}", lambda q=q, k=k, m=m, cpos=cpos, axis=axis, f=freqs, sc_=scales:
                    rome.apply_qk_angles(q, k, f, sc_, m, cpos, axis=axis, **bk)),
                (f"apply_qk_angles backward {tag}",
                 grad(lambda a, b, m=m, cpos=cpos, axis=axis, f=freqs, sc_=scales:
                      rome.apply_qk_angles(a, b, f, sc_, m, cpos, axis=axis, **bk), q, k)),
                (f"apply_qk_norm {tag}", lambda q=q, k=k, cos=cos, sin=sin, m=m:
                    rome.apply_qk_norm(q, k, cos, sin, m, torch.ones(q.shape[-1], device=q.device),
                                       torch.ones(q.shape[-1], device=q.device), **bk)),
                (f"apply_qk_norm backward {tag}",
                 grad(lambda a, b, cos=cos, sin=sin, m=m: rome.apply_qk_norm(
                     a, b, cos, sin, m, torch.ones(a.shape[-1], device=a.device),
                     torch.ones(a.shape[-1], device=a.device), norm="layer", **bk),
                      q, k)),
                (f"apply_qk_norm_at over heads {tag}", lambda q=q, k=k, cc=cc, sc=sc, m=m, cpos=cpos, axis=axis:
                    rome.apply_qk_norm_at(q, k, cc, sc, m, cpos, torch.ones(q.shape[1] * q.shape[-1], device=q.device),
                                          torch.ones(k.shape[1] * k.shape[-1], device=k.device), axis=axis,
                                          over="heads", **bk)),
                (f"apply_ {tag}", lambda q=q, cos=cos, sin=sin, m=m: rome.apply_(q.clone(), cos, sin, m, **bk)),
                (f"apply_qk_ {tag}", lambda q=q, k=k, cos=cos, sin=sin, m=m:
                    rome.apply_qk_(q.clone(), k.clone(), cos, sin, m, **bk)),
                (f"apply_out {tag}", lambda q=q, cos=cos, sin=sin, m=m:
                    rome.apply_out(q, cos, sin, m, out=torch.empty_like(q), **bk)),
                (f"apply_qk_out {tag}", lambda q=q, k=k, cos=cos, sin=sin, m=m:
                    rome.apply_qk_out(q, k, cos, sin, m, out=(torch.empty_like(q), torch.empty_like(k)), **bk)),
                (f"apply_qkv_ {tag}", lambda s=s, d=d, cos=cos, sin=sin, m=m:
                    rome.apply_qkv_(rnd(2, s, 3, 4, d), cos[:, None], sin[:, None], m, **bk)),
            ])
    for dtype in (torch.bfloat16, torch.float32):
        tag = str(dtype)[6:]
        llama = rope_layout(rope_frequencies(128, theta=500000.0))
        video = section_layout((44, 44, 40), mode="half")

        def rnd(*shape, dtype=dtype):
            return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

        for angles in ("cache", "kernel"):
            rope, vrope = rome.RoPE(llama, backend="triton", angles=angles), rome.RoPE(video, backend="triton", angles=angles)
            q, k = rnd(2, 4, 33, 128), rnd(2, 2, 33, 128)
            grid = rome.grid_positions([3, 4, 5]).to(device)
            vq, vk = rnd(1, 2, 60, 128), rnd(1, 2, 60, 128)
            tq, tk = rnd(50, 4, 128), rnd(50, 2, 128)
            cu = torch.tensor([0, 17, 18, 50], dtype=torch.int32, device=device)
            dq, dk = rnd(8, 4, 1, 128), rnd(8, 2, 1, 128)
            dpos = torch.arange(8, device=device)[:, None] * 37 + 5
            (first if dtype == torch.bfloat16 and angles == "cache" else calls).extend([
                (f"RoPE 1d {angles} {tag}", lambda rope=rope, q=q, k=k: rope(q, k)),
                (f"RoPE 1d {angles} backward {tag}", grad(lambda a, b, rope=rope: rope(a, b), q, k)),
                (f"RoPE video grid {angles} {tag}", lambda r=vrope, vq=vq, vk=vk, grid=grid: r(vq, vk, grid)),
                (f"RoPE video grid {angles} backward {tag}", grad(lambda a, b, r=vrope, grid=grid: r(a, b, grid), vq, vk)),
                (f"RoPE varlen {angles} {tag}", lambda rope=rope, tq=tq, tk=tk, cu=cu: rope(tq, tk, cu_seqlens=cu)),
                (f"RoPE decode {angles} {tag}", lambda rope=rope, dq=dq, dk=dk, dpos=dpos: rope(dq, dk, dpos)),
            ])
    return first + calls


def _entry_points(device: str) -> None:
    """Each call once, with a line ``ok NAME`` or ``error NAME: ...``; exit 2 if any raised
    (compute-sanitizer's own errors exit with --error-exitcode)."""
    import traceback

    if device == "cpu":  # a rehearsal: the kernel through Triton's interpreter
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    failed = 0
    for name, thunk in entry_point_calls(device):
        try:
            thunk()
            if device == "cuda":
                torch.cuda.synchronize()
            print(f"ok {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - every call runs; the failure is printed
            failed += 1
            print(f"error {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=3)
    print(f"{failed} of the entry-point calls raised", flush=True)
    sys.exit(2 if failed else 0)


# --- the summary ------------------------------------------------------------------------------


def write_summary(ctx: Context) -> None:
    (ctx.out / "summary.json").write_text(json.dumps(ctx.summary, indent=1))
    s, env = ctx.summary, ctx.summary.get("environment", {})
    lines = [f"# make gpu: {env.get('device') or 'no device'}", ""]
    if not s.get("cuda"):
        lines += ["**Rehearsal: torch sees no CUDA device here, so every GPU part fails or is missing.**", ""]
    lines += [f"- commit {env.get('commit')}{' (dirty tree)' if env.get('dirty') else ''}",
              f"- driver {env.get('driver')}, torch {env.get('torch')} (CUDA {env.get('cuda')}), triton "
              f"{env.get('triton')}, python {env.get('python')}",
              f"- ncu: {env.get('ncu')}; compute-sanitizer: {env.get('compute-sanitizer')}",
              f"- runs: " + "; ".join(f"{r['started']} ({', '.join(r['parts'])}, budget {r['budget_s']:.0f} s, "
                                      f"{r.get('seconds', 0):.0f} s)" for r in s.get("runs", [])),
              "", "| part | status | seconds | limit | commit | result |", "| --- | --- | --- | --- | --- | --- |"]
    for name, p in s.get("parts", {}).items():
        detail = str(p.get("detail", "")).replace("|", "/").replace("\n", " ")
        lines.append(f"| {name} | {p['status']} | {p.get('seconds', 0):.0f} | {p.get('limit_s', 0):.0f} | "
                     f"{p.get('commit', '')} | {detail} |")
    lines += ["", "Logs: `logs/`, `tests-*.log`, `sanitizer-*.log`, `ncu/*.log`; reports: `speed/<workload>/report.md`, "
              "`precision/<workload>/report.md`; Nsight Compute: `ncu/ncu.json` (per kernel; bytes the op must read in "
              "`ncu/*-needed.json`), `ncu/*.ncu-rep`.", ""]
    (ctx.out / "README.md").write_text("\n".join(lines))
    if ctx.archive is not None:
        try:
            write_archive(ctx.out, ctx.archive)
        except OSError as e:  # (a full disk: the run goes on, the last complete archive stays)
            print(f"[make gpu] archive {ctx.archive}: not written: {type(e).__name__}: {e}", flush=True)


ARCHIVE_MAX_FILE = 32 << 20  # bytes: a bigger file (an .ncu-rep, a trace) stays out of --archive


def write_archive(out: Path, path: Path, max_file: int = ARCHIVE_MAX_FILE) -> list[str]:
    """``out`` as one .tar.gz at ``path`` (under ``out``'s name), rewritten whole and renamed into
    place, so that a machine which hands back only a few files a call (the device tool: 8) returns
    the whole folder, and a run killed mid-part leaves the last complete archive. Files over
    ``max_file`` bytes are left out and named in the archive's ``archive-left-out.txt``; the
    names of the files left out are returned."""
    out, path = Path(out).resolve(), Path(path).resolve()  # (the folder's own name: "." or ".." has none)
    part = path.with_name(path.name + ".part")
    left = []
    try:
        with tarfile.open(part, "w:gz") as tar:
            for f in sorted(out.rglob("*")):
                if not f.is_file() or f.is_symlink() or f.resolve() in (path, part):
                    continue
                rel = f.relative_to(out)
                if f.stat().st_size > max_file:
                    left.append(f"{rel} ({f.stat().st_size} bytes)")
                    continue
                tar.add(f, arcname=str(Path(out.name) / rel))
            if left:
                data = ("\n".join(left) + "\n").encode()
                info = tarfile.TarInfo(f"{out.name}/archive-left-out.txt")
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    return left


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0].startswith("_"):  # the targets the parts run in their own processes
        {"_env": _env, "_ncu_target": _ncu_target, "_entry_points": _entry_points}[argv[0]](*argv[1:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m profiling.gpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="output folder (default profiling/results/<gpu>/)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for all parts (default {BUDGET_S:.0f})")
    parser.add_argument("--only", help="comma-separated parts to run (see --list)")
    parser.add_argument("--skip", help="comma-separated parts to leave out")
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    parser.add_argument("--archive", help="also write the folder as one .tar.gz at this path after every part "
                        "(for a machine that returns only a few files a call: e.g. $OUT/gpu.tgz)")
    args = parser.parse_args(argv)
    if args.list:
        for p in PARTS:
            print(f"{p.name:18} {p.limit_s:4.0f} s  {p.what}{'' if p.default else '  [only with --only]'}")
        return 0
    names = {p.name for p in PARTS}
    only = set(args.only.split(",")) if args.only else None
    skip = set(args.skip.split(",")) if args.skip else set()
    unknown = ((only or set()) | skip) - names
    if unknown:
        parser.error(f"unknown part(s) {sorted(unknown)}; parts: {', '.join(p.name for p in PARTS)}")
    if args.archive and not Path(args.archive).resolve().parent.is_dir():
        parser.error(f"--archive {args.archive}: its folder {Path(args.archive).resolve().parent} does not exist")
    # the environment part always runs first: the folder's name and the summary's header need it
    parts = [p for p in PARTS[1:] if (p.name in only if only else p.default) and p.name not in skip]

    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"rome-gpu-env-{os.getpid()}"
    probe.mkdir(parents=True, exist_ok=True)
    ctx = Context(out=probe, python=sys.executable, env=env, deadline=start + args.budget)
    t0 = time.monotonic()
    status, detail = part_environment(ctx, PARTS[0], min(PARTS[0].limit_s, ctx.left()))
    try:
        info = json.loads((probe / "environment.json").read_text())
    except (OSError, ValueError):
        info = {}
    cuda = bool(info.get("cuda_available"))
    folder = folder_name(info.get("device") or "") if info.get("device") else "unknown-gpu"
    if args.out:
        out = Path(args.out)
    elif cuda:
        out = ROOT / "profiling" / "results" / folder
    else:
        out = ROOT / "reports" / f"gpu-rehearsal-{folder}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    for f in probe.rglob("*"):
        if f.is_file():
            dest = out / f.relative_to(probe)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(f), dest)
    shutil.rmtree(probe, ignore_errors=True)
    ctx.out, ctx.info = out, info
    ctx.archive = Path(args.archive) if args.archive else None
    if not cuda:
        print(f"[make gpu] torch sees no CUDA device: a rehearsal, written to {out}", flush=True)
    try:
        ctx.summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        ctx.summary = {}
    ctx.summary.update({"environment": info, "cuda": cuda, "folder": str(out.relative_to(ROOT) if out.is_relative_to(ROOT) else out)})
    ctx.summary.setdefault("parts", {})
    run = {"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "budget_s": args.budget,
           "parts": ["environment"] + [p.name for p in parts]}
    ctx.summary.setdefault("runs", []).append(run)
    commit = (info.get("commit") or "unknown")[:10] + ("+dirty" if info.get("dirty") else "")
    ctx.summary["parts"]["environment"] = {"status": status, "seconds": time.monotonic() - t0,
                                           "limit_s": PARTS[0].limit_s, "detail": detail, "commit": commit}
    print(f"[make gpu] environment: {status}: {detail}", flush=True)
    write_summary(ctx)
    for part in parts:
        left = ctx.left()
        if left < MIN_PART_S:
            ctx.summary["parts"][part.name] = {"status": "not run", "seconds": 0, "limit_s": part.limit_s,
                                               "detail": f"budget spent ({left:.0f} s left); run it with --only {part.name}",
                                               "commit": commit}
            print(f"[make gpu] {part.name}: not run (budget spent)", flush=True)
            write_summary(ctx)
            continue
        seconds = min(part.limit_s, left)
        print(f"[make gpu] {part.name}: {part.what} (limit {seconds:.0f} s)", flush=True)
        t0 = time.monotonic()
        try:
            status, detail = part.run(ctx, part, seconds)
        except Exception as e:  # noqa: BLE001 - a part's own failure is recorded, the rest run
            status, detail = "error", f"{type(e).__name__}: {e}"
        took = time.monotonic() - t0
        ctx.summary["parts"][part.name] = {"status": status, "seconds": took, "limit_s": seconds, "detail": detail,
                                           "commit": commit}
        print(f"[make gpu] {part.name}: {status} in {took:.0f} s: {detail}", flush=True)
        write_summary(ctx)
    run["seconds"] = time.monotonic() - start
    write_summary(ctx)
    print(f"[make gpu] {time.monotonic() - start:.0f} s; summary: {out / 'README.md'}", flush=True)
    bad = [n for n, p in ctx.summary["parts"].items() if n in run["parts"] and p["status"] != "ok"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
