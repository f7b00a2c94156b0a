"""profiling/gpu.py (``make gpu``) without a GPU: folder names, the time limit of a part, the
Nsight Compute summary, the entry points the sanitizer parts launch, and a rehearsal run whose
GPU parts fail gracefully and are recorded."""

import json
import sys
import time

import pytest

import rome
from profiling import gpu


@pytest.mark.parametrize("name,folder", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"), ("NVIDIA L40S", "l40s"), ("AMD Instinct MI300X", "mi300x"),
    ("NVIDIA GH200 480GB", "gh200"), ("Tesla V100-SXM2-16GB", "v100"), ("", "unknown-gpu"),
])
def test_folder_name(name, folder):
    assert gpu.folder_name(name) == folder


def test_a_part_past_its_limit_is_stopped_with_its_children(tmp_path):
    log = tmp_path / "log"
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    t0 = time.monotonic()
    status, rc = gpu.run_cmd([sys.executable, "-c", code], log, 1.5)
    assert status == "timeout" and rc is None and time.monotonic() - t0 < 15
    assert "time limit" in log.read_text()
    assert gpu.run_cmd([sys.executable, "-c", "raise SystemExit(3)"], log, 30) == ("failed", 3)
    assert gpu.run_cmd([str(tmp_path / "no-such-tool")], log, 30) == ("missing", None)


def test_ncu_summary_reads_the_raw_page(tmp_path):
    header = ["ID", "Process ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum",
              "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
              "lts__t_sector_hit_rate.pct"]
    units = ["", "", "", "ns", "byte", "%", "%", "%"]
    row = ["0", "77", "_rope_gather", "123,456", "400,000,000", "91.5", "62.25", "48.0"]
    raw = "==PROF== Connected\n" + "\n".join(",".join(f'"{c}"' for c in r) for r in (header, units, row))
    needed = tmp_path / "needed.json"
    needed.write_text(json.dumps({"bytes_must_read": 380_000_000, "table_bytes": 20_000_000}))
    s = gpu.ncu_summary(raw, needed)
    (k,) = s["kernels"]
    assert k["kernel"] == "_rope_gather" and k["duration_ns"] == 123456 and k["dram_bytes_read"] == 4e8
    assert k["dram_throughput_pct_of_peak"] == 91.5 and k["achieved_occupancy_pct"] == 62.25 and k["l2_hit_rate_pct"] == 48
    assert s["total"]["dram_read_over_needed"] == pytest.approx(4e8 / 3.8e8)
    assert s["total"]["extra_read_in_tables"] == pytest.approx(1.0)
    assert "DRAM 92% of peak" in gpu._ncu_line({"forward": s})


def test_entry_points_cover_every_public_entry_point():
    names = {name.split()[0] for name, _ in gpu.entry_point_calls("cpu")}
    public = {n for n in rome.__all__ if n.startswith("apply")} | {"RoPE"}
    assert public <= names, public - names


def test_rehearsal_records_every_part(tmp_path, monkeypatch):
    """No CUDA here: the parts that need it fail or find no tool, each recorded with its reason;
    the summary is written. (The report and test parts are left out: minutes on a CPU.)"""
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, ncu or compute-sanitizer
    out = tmp_path / "out"
    rc = gpu.main(["--out", str(out), "--only", "ncu,memcheck,racecheck", "--budget", "120"])
    assert rc == 1
    s = json.loads((out / "summary.json").read_text())
    assert list(s["parts"]) == ["environment", "ncu", "memcheck", "racecheck"]
    assert s["cuda"] is False and s["parts"]["environment"]["status"] == "ok"
    assert s["parts"]["ncu"] == {**s["parts"]["ncu"], "status": "missing", "detail": "ncu is not on the PATH"}
    assert s["parts"]["memcheck"]["status"] == "missing"
    assert "Rehearsal" in (out / "README.md").read_text()
    env = json.loads((out / "environment.json").read_text())
    assert env["torch"] and env["triton"] and env["commit"]


def test_part_selection(tmp_path, capsys):
    out = tmp_path / "out"
    assert gpu.main(["--out", str(out), "--only", "environment"]) == 0
    assert list(json.loads((out / "summary.json").read_text())["parts"]) == ["environment"]
    assert gpu.main(["--out", str(out), "--only", "gpu-tests", "--skip", "environment", "--budget", "1"]) == 1
    s = json.loads((out / "summary.json").read_text())  # the same folder: the runs add up
    assert list(s["parts"]) == ["environment", "gpu-tests"] and len(s["runs"]) == 2
    assert s["parts"]["gpu-tests"]["status"] == "not run" and "--only gpu-tests" in s["parts"]["gpu-tests"]["detail"]
    with pytest.raises(SystemExit):
        gpu.main(["--only", "no-such-part"])
    assert gpu.main(["--list"]) == 0 and "suite" in capsys.readouterr().out
    # the QK-norm speed parts (issue 29) only when asked for
    names = {p.name: p for p in gpu.PARTS}
    assert {"speed-flux-qknorm", "speed-wan-qknorm"} <= set(names)
    assert not names["speed-flux-qknorm"].default and not names["speed-wan-qknorm"].default


def test_archive_holds_the_folder_after_every_part(tmp_path):
    """--archive: the folder as one .tar.gz (the device tool returns 8 files a call; 2026-12-04's
    call O lost make gpu's folder and four ncu reports to that): written after the environment
    part, under the folder's name, the summary in it; a file over the size cap is named, not held."""
    import tarfile

    out, arc = tmp_path / "out", tmp_path / "gpu.tgz"
    assert gpu.main(["--out", str(out), "--only", "environment", "--archive", str(arc)]) == 0
    with tarfile.open(arc) as tar:
        names = set(tar.getnames())
        summary = json.loads(tar.extractfile("out/summary.json").read())
    assert {"out/summary.json", "out/README.md", "out/environment.json"} <= names
    assert list(summary["parts"]) == ["environment"] and not (tmp_path / "gpu.tgz.part").exists()
    (out / "big.bin").write_bytes(b"x" * (1 << 20))
    inside = out / "a.tgz"  # (an archive inside the folder, written twice, holds neither itself nor its .part)
    for _ in range(2):
        assert gpu.write_archive(out, inside, max_file=1 << 19) == ["big.bin (1048576 bytes)"]
    with tarfile.open(inside) as tar:
        names = set(tar.getnames())
        assert tar.extractfile("out/archive-left-out.txt").read() == b"big.bin (1048576 bytes)\n"
    assert "out/big.bin" not in names and "out/summary.json" in names
    assert not {"out/a.tgz", "out/a.tgz.part"} & names and not (out / "a.tgz.part").exists()


def test_archive_of_a_relative_folder_and_where_it_cannot_be_written(tmp_path, monkeypatch, capsys):
    """--out . is archived under the folder's own name (no bare or "../" entries); an archive
    whose folder is missing is refused before any part runs; one that fails to write mid-run
    (here: its folder removed) is a printed line, not the end of the run, and leaves no .part."""
    import tarfile

    out = tmp_path / "res"
    out.mkdir()
    (out / "a.txt").write_text("a")
    monkeypatch.chdir(out)
    gpu.write_archive(".", tmp_path / "r.tgz")
    with tarfile.open(tmp_path / "r.tgz") as tar:
        assert tar.getnames() == ["res/a.txt"]
    with pytest.raises(SystemExit):
        gpu.main(["--out", str(out), "--only", "environment", "--archive", str(tmp_path / "no" / "g.tgz")])
    assert "--archive" in capsys.readouterr().err
    ctx = gpu.Context(out=out, python="", env={}, deadline=0.0, summary={"parts": {}},
                      archive=tmp_path / "gone" / "g.tgz")
    gpu.write_summary(ctx)  # (no exception)
    assert "archive" in capsys.readouterr().out and (out / "summary.json").exists()
    assert not (tmp_path / "gone").exists()


def test_speed_summary_names_the_fused_qk_norm_against_the_unfused_pair(tmp_path):
    """A QK-norm workload's speed part: its summary line gives the fused op's and the unfused
    pair's median ms per pass and the ratio."""
    rows = [{"variant": "rome.apply_qk_norm", "pass": "fwd", "median_ms": 0.5},
            {"variant": "q/k norm, then rome.apply_qk", "pass": "fwd", "median_ms": 1.0},
            {"variant": "rome.apply_qk_norm", "pass": "bwd", "median_ms": 2.0},
            {"variant": "q/k norm, then rome.apply_qk", "pass": "bwd", "median_ms": 1.0}]
    (tmp_path / "results.json").write_text(json.dumps({"speed": rows, "copy_bandwidth": {"gbps": 3000.0}}))
    line = gpu._report_numbers(tmp_path, "speed")
    assert "fused QK-norm fwd 0.5 ms, unfused pair 1 ms (2.00x)" in line
    assert "fused QK-norm bwd 2 ms, unfused pair 1 ms (0.50x)" in line and "copy 3000 GB/s" in line
    assert "Triton copy" not in line
    (tmp_path / "results.json").write_text(json.dumps({"speed": rows, "copy_bandwidth": {
        "gbps": 3000.0, "triton": {"gbps": 2900.0}}}))
    assert "copy 3000 GB/s; plain Triton copy 2900 GB/s (96.7% of copy)" in gpu._report_numbers(tmp_path, "speed")
