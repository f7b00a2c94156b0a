"""``python -m profiling overhead`` (issue 28): it runs, writes its JSON and markdown, and the
Python calls one entry point makes stay lean (a deterministic count: the lean path's budget)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Python function calls of one warm call (sys.setprofile, the launch recording's own left out);
# a5e13a7 made 278 (apply_qk), 276 (apply_qk_at) and 327 (RoPE)
MAX_CALLS = {"rome.apply_qk": 30, "rome.apply_qk_at": 35, "rome.RoPE": 45}


def test_overhead_runs_and_the_entry_points_stay_lean(tmp_path):
    out = tmp_path / "overhead"
    done = subprocess.run([sys.executable, "-m", "profiling", "overhead", "--shapes", "decode", "--calls", "5",
                           "--repeats", "1", "--no-compile", "--no-real", "--device", "cpu", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((out / "overhead.json").read_text())
    results = report["measured"]["this tree"]["results"]
    assert "| rome.apply_qk | decode | fwd |" in (out / "overhead.md").read_text()
    for entry, limit in MAX_CALLS.items():
        fwd = results[f"{entry}|decode|fwd"]
        assert fwd["median_us"] > 0 and 0 < fwd["python_calls"] <= limit, (entry, fwd)
        assert results[f"{entry}|decode|fwd+bwd"]["median_us"] > 0
    assert results["eager chain|decode|fwd"]["python_calls"] == 11  # transformers' chain, for scale
