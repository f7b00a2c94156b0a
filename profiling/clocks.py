"""The GPU's clocks while timings run: nvidia-smi sampled in the background.

A kernel's share of copy depends on the SM clock where it issues more instructions than the
memory's round trips hide, and the static model gives both ends (1.755 and 1.98 GHz on an
H100/H200): the clock the timings ran at says which end a measurement is to be read against.
``Clocks`` runs ``nvidia-smi --query-gpu=uuid,clocks.sm,clocks.mem -lms PERIOD`` for the length of
a ``with`` block and keeps the samples of the timed device; ``summary()`` gives their minimum,
median and maximum, or the reason there are none (no nvidia-smi, no sample, another device).
"""

from __future__ import annotations

import shutil
import signal
import statistics
import subprocess

from .static.schedule import CLOCKS_GHZ

QUERY = "uuid,clocks.sm,clocks.mem"
PERIOD_MS = 20
STOP_WAIT_S = 5.0  # how long each way of stopping nvidia-smi is given


def device_uuid(device) -> str | None:
    """The CUDA device's UUID as nvidia-smi prints it less its ``GPU-`` prefix, lower case (None
    where torch does not say)."""
    import torch

    try:
        uuid = torch.cuda.get_device_properties(device).uuid
    except (AttributeError, RuntimeError, AssertionError):
        return None
    return _bare(str(uuid)) or None


def _bare(uuid: str) -> str:
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def parse(text: str, uuid: str | None) -> dict:
    """The samples of ``text`` (nvidia-smi's ``uuid, sm MHz, mem MHz`` lines, no header or units)
    for the device ``uuid``; where only one device was sampled, that one (the machine's only GPU,
    the timed one whatever UUID torch gave); with several and no ``uuid``, none."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            rows.append((_bare(parts[0]), float(parts[1]), float(parts[2])))
        except ValueError:  # ("[N/A]", "[Not Supported]")
            continue
    devices = {r[0] for r in rows}
    if uuid is None and len(devices) > 1:
        return {"error": f"{len(devices)} GPUs sampled and the timed one's UUID unknown"}
    if uuid is not None and (_bare(uuid) in devices or len(devices) > 1):  # (one GPU sampled: the
        rows = [r for r in rows if r[0] == _bare(uuid)]  # machine's only one, whatever torch called it)
    if not rows:
        return {"error": "no clock sample of the timed GPU" + (f" (sampled: {', '.join(sorted(devices))})"
                                                              if devices else "")}

    def spread(values):
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    return {"sm_mhz": spread([r[1] for r in rows]), "mem_mhz": spread([r[2] for r in rows]), "samples": len(rows)}


class Clocks:
    """``with Clocks(device) as c: ...`` then ``c.summary()``: the SM and memory clocks nvidia-smi
    sampled every ``period_ms`` while the block ran (``smi``: the executable, found on PATH)."""

    def __init__(self, device=None, *, period_ms: int = PERIOD_MS, smi: str | None = None):
        self.uuid = device_uuid(device) if device is not None else None
        self.period_ms = period_ms
        self.smi = smi or shutil.which("nvidia-smi")
        self.proc = None
        self.result: dict = {"error": "not run"}

    def __enter__(self):
        if not self.smi:
            self.result = {"error": "no nvidia-smi on PATH"}
            return self
        # (line-buffered where coreutils' stdbuf is there: a pipe's block buffer could hold every sample)
        cmd = [self.smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", f"--loop-ms={self.period_ms}"]
        stdbuf = shutil.which("stdbuf")
        try:
            self.proc = subprocess.Popen([stdbuf, "-oL", *cmd] if stdbuf else cmd, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
        except OSError as e:
            self.result = {"error": f"nvidia-smi: {e}"}
        return self

    def __exit__(self, *exc):
        if self.proc is None:
            return False
        out = err = ""
        for stop in (lambda p: p.send_signal(signal.SIGINT), lambda p: p.terminate(), lambda p: p.kill()):
            # (Ctrl+C ends nvidia-smi's loop with its output flushed; then harder)
            if self.proc.poll() is None:
                stop(self.proc)
            try:
                out, err = self.proc.communicate(timeout=STOP_WAIT_S)
                break
            except subprocess.TimeoutExpired:
                continue
        self.result = parse(out, self.uuid)
        if "error" in self.result and err.strip():
            self.result["error"] += f"; nvidia-smi: {err.strip()[:300]}"
        return False

    def summary(self) -> dict:
        """``{"sm_mhz": {min, median, max}, "mem_mhz": {...}, "samples": n, "period_ms": p}``, or
        ``{"error": why, "period_ms": p}``."""
        return {**self.result, "period_ms": self.period_ms}


def line(summary: dict | None) -> str:
    """One sentence for a report."""
    if not summary:
        return "Clocks during the timings: not sampled."
    if "error" in summary:
        return f"Clocks during the timings: not known ({summary['error']})."
    sm, mem = summary["sm_mhz"], summary["mem_mhz"]
    return (f"Clocks during the timings (nvidia-smi every {summary['period_ms']} ms, {summary['samples']} "
            f"samples): SM median {sm['median']:.0f} MHz ({sm['min']:.0f}–{sm['max']:.0f}), memory median "
            f"{mem['median']:.0f} MHz ({mem['min']:.0f}–{mem['max']:.0f}). The static model's ends: "
            + " and ".join(f"{1000 * g:,.0f}" for g in CLOCKS_GHZ) + " MHz (H100, H200).")
