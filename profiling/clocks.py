"""The GPU's clocks while timings run: nvidia-smi sampled in the background.

A kernel's share of copy depends on the SM clock where it issues more instructions than the
memory's round trips hide, and the static model gives both ends (1.755 GHz sustained and 1.98 GHz
boost on an H100/H200): the clock the timings ran at says which end a measurement is to be read
against. ``Clocks`` runs ``nvidia-smi --query-gpu=uuid,clocks.sm,clocks.mem --loop-ms=PERIOD`` for
the length of a ``with`` block, a thread reading its lines (stderr merged) as they come: a pipe
left unread fills and stalls nvidia-smi. ``window()`` marks the calls that time kernels (the
caller warms them first: a compile inside one would count an idle GPU's clocks), and
``summary()`` gives the minimum, median and maximum of the timed GPU's samples that arrived
inside them, or the reason there are none (no nvidia-smi, no sample, another device). A sample's
arrival is when this process read it: line-buffered through coreutils' ``stdbuf``, ~5 ms after
nvidia-smi took it; without ``stdbuf`` lines come in blocks and every sample is kept, said so.
(Under MIG torch names the instance and nvidia-smi the GPU: on a machine with several GPUs that
is "no sample", never another GPU's.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import threading
import time

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


def samples(lines) -> tuple[list[tuple[float, str, float, float]], str | None]:
    """``(at, uuid, sm MHz, mem MHz)`` of each whole sample among ``(at, line)`` pairs (nvidia-smi's
    ``uuid, sm, mem`` lines, no header or units; a line without its newline, cut off, is not one),
    and the first line that is not a sample (nvidia-smi prints its failures there)."""
    rows, other = [], None
    for at, line in lines:
        if not line.endswith("\n"):  # (cut off when nvidia-smi was stopped)
            continue
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) != 3:
                raise ValueError
            rows.append((at, _bare(parts[0]), float(parts[1]), float(parts[2])))
        except ValueError:  # ("[N/A]", "[Not Supported]", a message)
            if other is None and line.strip() and len(parts) != 3:
                other = line.strip()[:300]
    return rows, other


def summarise(rows, uuid: str | None, windows=()) -> dict:
    """Min / median / max of the SM and memory clocks over ``rows`` (``samples``) of the device
    ``uuid`` (where only one device was sampled, that one: the machine's only GPU, the timed one
    whatever UUID torch gave; with several and no ``uuid``, none) taken inside ``windows`` (``(t0,
    t1)`` monotonic seconds; none given: every sample)."""
    devices = {r[1] for r in rows}
    if uuid is None and len(devices) > 1:
        return {"error": f"{len(devices)} GPUs sampled and the timed one's UUID unknown"}
    if uuid is not None and (_bare(uuid) in devices or len(devices) > 1):
        rows = [r for r in rows if r[1] == _bare(uuid)]
    if not rows:
        return {"error": "no clock sample of the timed GPU" + (f" (sampled: {', '.join(sorted(devices))})"
                                                              if devices else "")}
    whole = len(rows)
    sampled = 0
    if windows:
        inside = [[r for r in rows if t0 <= r[0] <= t1] for t0, t1 in windows]
        sampled = sum(1 for w in inside if w)
        rows = [r for w in inside for r in w]
        if not rows:
            return {"error": f"no clock sample inside the {len(windows)} timed calls ({whole} outside them)"}

    def spread(values):
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    return {"sm_mhz": spread([r[2] for r in rows]), "mem_mhz": spread([r[3] for r in rows]), "samples": len(rows),
            "samples_outside": whole - len(rows), "windows_sampled": sampled}


class Clocks:
    """``with Clocks(device) as c: ... with c.window(): <time a kernel> ...`` then ``c.summary()``:
    the SM and memory clocks nvidia-smi was asked for every ``period_ms`` inside the windows (the
    whole block where none was marked, or without ``stdbuf``) (``smi``: the executable, found on
    PATH)."""

    def __init__(self, device=None, *, period_ms: int = PERIOD_MS, smi: str | None = None):
        self.uuid = device_uuid(device) if device is not None else None
        self.period_ms = period_ms
        self.smi = smi or shutil.which("nvidia-smi")
        self.proc = None
        self.lines: list[tuple[float, str]] = []  # (arrival, line), filled by the reader thread
        self.windows: list[tuple[float, float]] = []
        self.result: dict = {"error": "not run"}
        self._reader = None
        self.line_buffered = False

    def __enter__(self):
        if not self.smi:
            self.result = {"error": "no nvidia-smi on PATH"}
            return self
        if not (os.path.isfile(self.smi) and os.access(self.smi, os.X_OK)):
            self.result = {"error": f"nvidia-smi: no executable at {self.smi}"}
            return self
        # (line-buffered where coreutils' stdbuf is there: else samples reach the pipe in blocks,
        # and their arrival says nothing of when they were taken)
        cmd = [self.smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", f"--loop-ms={self.period_ms}"]
        stdbuf = shutil.which("stdbuf")
        self.line_buffered = stdbuf is not None
        try:
            self.proc = subprocess.Popen([stdbuf, "-oL", *cmd] if stdbuf else cmd, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True, errors="replace")
        except OSError as e:
            self.result = {"error": f"nvidia-smi: {e}"}
            return self
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self):
        for line in self.proc.stdout:  # (until nvidia-smi exits; if this whole process dies, the pipe's
            self.lines.append((time.monotonic(), line))  # read end closes and nvidia-smi ends by SIGPIPE)

    @contextlib.contextmanager
    def window(self):
        """Marks a timed call: the summary keeps the samples that arrived while it ran (a call
        that raised marks nothing)."""
        t0 = time.monotonic()
        yield
        self.windows.append((t0, time.monotonic()))

    def __exit__(self, *exc):
        if self.proc is None:
            return False
        for stop in (lambda p: p.send_signal(signal.SIGINT), lambda p: p.terminate(), lambda p: p.kill()):
            # (Ctrl+C ends nvidia-smi's loop with its output flushed; then harder)
            if self.proc.poll() is None:
                stop(self.proc)
            try:
                self.proc.wait(timeout=STOP_WAIT_S)
                break
            except subprocess.TimeoutExpired:
                continue
        self._reader.join(timeout=STOP_WAIT_S)
        stuck = self.proc.poll() is None or self._reader.is_alive()
        if not stuck:
            self.proc.stdout.close()
        rows, other = samples(list(self.lines))
        self.result = summarise(rows, self.uuid, self.windows if self.line_buffered else ())
        if "error" in self.result and other:
            self.result["error"] += f"; nvidia-smi: {other}"
        if not self.line_buffered and "error" not in self.result:
            self.result["note"] = "no stdbuf: every sample kept, not only those inside the timed calls"
        if stuck:  # (nvidia-smi stuck in the driver past SIGKILL: its samples so far, said so)
            self.result["note"] = "nvidia-smi did not stop when asked: the samples read until then"
        return False

    def summary(self) -> dict:
        """``{"sm_mhz": {min, median, max}, "mem_mhz": {...}, "samples": n, "samples_outside": m,
        "windows_sampled": v, "timed_calls": w, "period_ms": p}`` (``samples``: those inside the
        timed calls, in ``v`` of the ``w``, or all where none was marked or without ``stdbuf``; a
        ``note`` where so), or ``{"error": why, ...}``."""
        return {**self.result, "timed_calls": len(self.windows), "period_ms": self.period_ms}


class NotSampled:
    """What a CPU run takes instead of ``Clocks``: windows that mark nothing, no summary."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def window(self):
        return contextlib.nullcontext()

    def summary(self):
        return None


def line(summary: dict | None) -> str:
    """One sentence for a report."""
    if not summary:
        return "Clocks during the timings: not sampled."
    if "error" in summary:
        return f"Clocks during the timings: not known ({summary['error']})."
    sm, mem = summary["sm_mhz"], summary["mem_mhz"]
    if summary.get("windows_sampled"):
        where = (f"{summary['samples']} samples inside {summary['windows_sampled']} of its "
                 f"{summary['timed_calls']} timed calls")
    else:
        where = f"{summary['samples']} samples"
    note = f" ({summary['note']}.)" if summary.get("note") else ""
    low, high = (f"{1000 * g:,.0f}" for g in CLOCKS_GHZ)
    return (f"Clocks during the timings (nvidia-smi asked every {summary['period_ms']} ms, {where}): SM median "
            f"{sm['median']:.0f} MHz ({sm['min']:.0f}–{sm['max']:.0f}), memory median {mem['median']:.0f} MHz "
            f"({mem['min']:.0f}–{mem['max']:.0f}).{note} The static model's clock ends for an H100/H200: {low} "
            f"MHz (sustained) and {high} MHz (boost).")
