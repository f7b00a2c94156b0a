"""profiling.clocks: the GPU's clocks sampled by nvidia-smi while the report times kernels. The
sampler runs against stand-in nvidia-smi executables here (no GPU); what a real one prints is its
``--format=csv,noheader,nounits`` lines, ``uuid, sm MHz, mem MHz``."""

import json
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from profiling import clocks, gpu, report

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="stand-in executables are POSIX scripts")


def _fake_smi(tmp_path, lines, *, every_s=0.01, ignore_sigint=False, fail=None, name="nvidia-smi"):
    """An executable that writes its arguments to args.json and prints ``lines`` (one per
    ``every_s``, flushed, cycling; ``{i}`` in a line: the sample's number from 1) until it is
    interrupted (or, ``ignore_sigint``, terminated); ``fail``: prints that to stderr and exits 9."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, signal, sys, time
        json.dump(sys.argv[1:], open({str(tmp_path / "args.json")!r}, "w"))
        if {fail!r}:
            print({fail!r}, file=sys.stderr, flush=True)
            sys.exit(9)
        if {ignore_sigint!r}:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        lines = {lines!r}
        try:
            i = 0
            while True:
                print(lines[i % len(lines)].format(i=i + 1), flush=True)
                i += 1
                time.sleep({every_s!r})
        except KeyboardInterrupt:
            sys.exit(0)
        """))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _until(cond, what, deadline_s=20.0):
    """Waits (polling) until ``cond()``: a stand-in is a fresh Python process, slow to start on a
    loaded machine, so no fixed sleep is relied on."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < deadline_s, f"no {what} within {deadline_s} s"
        time.sleep(0.01)


def _samples(sampler, n):
    _until(lambda: len(sampler.lines) >= n, f"{n} samples")


def test_samples_the_timed_gpu_while_the_block_runs(tmp_path):
    """The sampler asks nvidia-smi for uuid, SM and memory clocks in a loop of ``period_ms``, keeps
    the timed GPU's samples (its UUID, with or without ``GPU-``, any case; another GPU's and "[N/A]"
    lines left out) and gives their minimum, median and maximum; no window marked: all of them."""
    smi = _fake_smi(tmp_path, ["GPU-AAA, 1980, 2619", "GPU-bbb, 1410, 1593", "GPU-aaa, 1755, 2619",
                               "GPU-aaa, [N/A], 2619"])
    sampler = clocks.Clocks(smi=smi, period_ms=20)
    sampler.uuid = "GPU-aaa"
    with sampler:
        _samples(sampler, 12)
    s = sampler.summary()
    assert s["samples"] >= 6 and s["samples_outside"] == 0 and s["timed_calls"] == 0, s
    assert s["sm_mhz"]["min"] == 1755 and s["sm_mhz"]["max"] == 1980 and 1755 <= s["sm_mhz"]["median"] <= 1980
    assert s["mem_mhz"] == {"min": 2619, "median": 2619, "max": 2619} and s["period_ms"] == 20
    args = json.loads((tmp_path / "args.json").read_text())
    assert "--query-gpu=uuid,clocks.sm,clocks.mem" in args and "--format=csv,noheader,nounits" in args
    assert "--loop-ms=20" in args
    assert sampler.proc.poll() is not None  # (stopped, not left running)


def test_only_the_samples_inside_the_timed_calls_are_kept(tmp_path):
    """Samples numbered as they come (the SM column): those taken before and after the marked
    window are left out, so the kept ones are a run from the middle."""
    smi = _fake_smi(tmp_path, ["GPU-aaa, {i}, 2619"])
    with clocks.Clocks(smi=smi) as sampler:
        _samples(sampler, 5)
        with sampler.window():
            _samples(sampler, 15)
        _samples(sampler, 25)
        with pytest.raises(RuntimeError):  # (a timing call that raised marks no window)
            with sampler.window():
                raise RuntimeError
    s = sampler.summary()
    every = clocks.summarise(clocks.samples(sampler.lines)[0], None)
    assert s["timed_calls"] == 1 and s["windows_sampled"] == 1 and s["samples"] >= 5, s
    assert s["samples_outside"] >= 10 and "note" not in s, s
    assert every["sm_mhz"]["min"] < s["sm_mhz"]["min"] <= s["sm_mhz"]["max"] < every["sm_mhz"]["max"], (s, every)


def test_samples_keep_coming_past_a_pipes_buffer(tmp_path):
    """nvidia-smi's lines are read as they come: an unread pipe fills at 64 KiB and stalls the
    sampler, whose samples would then all be from the start. ~170 KB written here; the window at
    the end still has its samples."""
    smi = _fake_smi(tmp_path, ["GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, {i}, 2619"], every_s=0.0002)
    with clocks.Clocks(smi=smi) as sampler:
        _until(lambda: sum(len(line) for _, line in sampler.lines) > 3 * 2 ** 16, "192 KiB of samples")
        with sampler.window():
            _samples(sampler, len(sampler.lines) + 50)
    assert sampler.summary()["samples"] >= 50


def test_a_sampler_that_ignores_ctrl_c_is_terminated_and_its_samples_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(clocks, "STOP_WAIT_S", 0.5)
    smi = _fake_smi(tmp_path, ["GPU-aaa, 1980, 2619"], ignore_sigint=True)
    with clocks.Clocks(smi=smi) as sampler:
        _samples(sampler, 3)  # (its first line comes after it set Ctrl+C aside)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 3 and sampler.proc.poll() is not None
    assert sampler.summary()["sm_mhz"]["median"] == 1980


def test_no_nvidia_smi_or_no_sample_is_said_not_guessed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # (an empty folder: no nvidia-smi)
    with clocks.Clocks() as sampler:
        pass
    assert sampler.summary() == {"error": "no nvidia-smi on PATH", "timed_calls": 0, "period_ms": clocks.PERIOD_MS}
    monkeypatch.undo()
    missing = clocks.Clocks(smi=str(tmp_path / "gone"))
    with missing:
        pass
    assert missing.summary()["error"] == f"nvidia-smi: no executable at {tmp_path / 'gone'}"
    smi = _fake_smi(tmp_path, ["GPU-bbb, 1410, 1593", "GPU-ccc, 1410, 1593"])
    sampler = clocks.Clocks(smi=smi)
    sampler.uuid = "aaa"
    with sampler:
        _samples(sampler, 4)
    assert sampler.summary()["error"] == "no clock sample of the timed GPU (sampled: bbb, ccc)"
    # nvidia-smi's failures (on stdout, or stderr: merged) are what the report gives
    failing = clocks.Clocks(smi=_fake_smi(tmp_path, [], fail="NVIDIA-SMI has failed because it couldn't "
                                          "communicate with the NVIDIA driver.", name="smi-failing"))
    with failing:
        _until(lambda: failing.proc.poll() is not None, "exit of the failing stand-in")
    assert failing.summary()["error"] == ("no clock sample of the timed GPU; nvidia-smi: NVIDIA-SMI has failed "
                                          "because it couldn't communicate with the NVIDIA driver.")


def test_without_stdbuf_every_sample_is_kept_and_said(tmp_path, monkeypatch):
    """Without coreutils' stdbuf nvidia-smi's lines reach the pipe in blocks, so when they arrived
    says nothing of when they were taken: every sample is kept, with a note, not the windows'."""
    which = clocks.shutil.which
    monkeypatch.setattr(clocks.shutil, "which", lambda name: None if name == "stdbuf" else which(name))
    smi = _fake_smi(tmp_path, ["GPU-aaa, {i}, 2619"])
    with clocks.Clocks(smi=smi) as sampler:
        _samples(sampler, 5)
        with sampler.window():
            pass
    s = sampler.summary()
    assert s["samples"] == len(clocks.samples(sampler.lines)[0]) and s["samples_outside"] == 0, s
    assert s["note"] == "no stdbuf: every sample kept, not only those inside the timed calls"
    assert "(no stdbuf: every sample kept, not only those inside the timed calls.)" in clocks.line(s)


def test_samples_and_their_summary():
    lines = [(0.0, "GPU-aaa, 1980, 2619\n"), (1.0, "GPU-bbb, 1410, 1593\n"), (2.0, "not a sample\n"),
             (3.0, "GPU-aaa, [Not Supported], 2619\n"), (4.0, "GPU-aaa, 1755, 2619\n"), (5.0, "GPU-aaa, 1980, 26")]
    rows, other = clocks.samples(lines)
    assert other == "not a sample"
    assert [r[0] for r in rows] == [0.0, 1.0, 4.0]  # (the last line was cut off: no newline, not a sample)
    assert clocks.summarise(rows, None) == {"error": "2 GPUs sampled and the timed one's UUID unknown"}
    assert clocks.summarise(rows, "GPU-BBB") == {"sm_mhz": {"min": 1410, "median": 1410, "max": 1410},
                                                 "mem_mhz": {"min": 1593, "median": 1593, "max": 1593},
                                                 "samples": 1, "samples_outside": 0, "windows_sampled": 0}
    aaa = clocks.summarise(rows, "aaa")
    assert aaa["sm_mhz"] == {"min": 1755, "median": pytest.approx(1867.5), "max": 1980} and aaa["samples"] == 2
    two = clocks.summarise(rows, "aaa", [(3.5, 4.5), (6.0, 7.0)])
    assert two["sm_mhz"]["median"] == 1755 and two["windows_sampled"] == 1 and two["samples_outside"] == 1
    assert clocks.summarise(rows, "aaa", [(0.5, 0.9)]) == {"error": "no clock sample inside the 1 timed calls "
                                                                    "(2 outside them)"}
    assert clocks.summarise([], None) == {"error": "no clock sample of the timed GPU"}
    # one GPU sampled: the machine's only one, the timed one, whatever UUID torch gave
    assert clocks.summarise(clocks.samples([(0.0, "GPU-aaa, 1980, 2619\n")])[0], "GPU-zzz")["samples"] == 1


def test_the_sentence_names_the_models_clock_ends():
    s = {"sm_mhz": {"min": 1755, "median": 1980, "max": 1980}, "mem_mhz": {"min": 2619, "median": 2619, "max": 2619},
         "samples": 40, "samples_outside": 9, "windows_sampled": 11, "timed_calls": 12, "period_ms": 20}
    assert clocks.line(s) == ("Clocks during the timings (nvidia-smi asked every 20 ms, 40 samples inside 11 of "
                              "its 12 timed calls): SM median 1980 MHz (1755–1980), memory median 2619 MHz "
                              "(2619–2619). "
                              "The static model's clock ends for an H100/H200: 1,755 MHz (sustained) and 1,980 MHz "
                              "(boost).")
    assert clocks.line({"error": "no nvidia-smi on PATH", "period_ms": 20}) == \
        "Clocks during the timings: not known (no nvidia-smi on PATH)."
    assert clocks.line(None) == "Clocks during the timings: not sampled."
    assert clocks.NotSampled().summary() is None


def test_a_gpu_reports_clocks_line_and_make_gpus_summary(tmp_path):
    """The report of a GPU run says the clocks (sampled, or why not); a run without the field (the
    first H200 make gpu's results.json predates it) or a CPU run (None) says nothing of them. make
    gpu's speed line gives the SM clock's median."""
    path = Path(__file__).resolve().parents[1] / "profiling/results/h200/speed/default/results.json"
    r = json.loads(path.read_text())
    assert "Clocks during the timings" not in report.markdown(r)
    r["clocks"] = None
    assert "Clocks during the timings" not in report.markdown(r)
    r["clocks"] = {"sm_mhz": {"min": 1755.0, "median": 1980.0, "max": 1980.0},
                   "mem_mhz": {"min": 3201.0, "median": 3201.0, "max": 3201.0}, "samples": 7, "samples_outside": 3,
                   "windows_sampled": 5, "timed_calls": 5, "period_ms": 20}
    text = report.markdown(r)
    assert clocks.line(r["clocks"]) in text
    assert text.index("Copy bandwidth, measured in this run") < text.index("Clocks during the timings") < \
        text.index("| variant |")
    r["clocks"] = {"error": "no nvidia-smi on PATH", "period_ms": 20}
    assert "Clocks during the timings: not known (no nvidia-smi on PATH)." in report.markdown(r)
    (tmp_path / "results.json").write_text(json.dumps({"speed": [], "copy_bandwidth": {"gbps": 3000.0},
                                                       "clocks": {"sm_mhz": {"median": 1980.0}}}))
    assert "copy 3000 GB/s; SM clock median 1980 MHz" in gpu._report_numbers(tmp_path, "speed")
    (tmp_path / "results.json").write_text(json.dumps({"speed": [], "copy_bandwidth": {"gbps": 3000.0},
                                                       "clocks": {"error": "no nvidia-smi on PATH"}}))
    assert "SM clock" not in gpu._report_numbers(tmp_path, "speed")
