"""The Makefile's set-up: offline, a python that already has the packages is used as it is (no
venv, no pip); a python without them gets the venv as before. Dry runs (``make -n``) plus one
real ``make test`` of a small module with pip cut off from every index."""

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

OFFLINE = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}


# the Makefile's own variables: a make that runs this suite exports those set on its command
# line (.ci/run's SETUP=venv TORCH=...) to the environment, where the make under test would read them
MAKE_VARIABLES = ("SETUP", "PYTHON", "VENV", "VENV_FLAGS", "TORCH", "ARGS", "MFLAGS")


def make(*args, env=None, timeout=120):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MAKE", "PYTEST_")) and k not in MAKE_VARIABLES} | (env or {})
    return subprocess.run(["make", "-C", str(ROOT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_a_python_with_the_packages_is_used_as_it_is(tmp_path):
    venv = tmp_path / "venv"
    r = make("-n", "test", "report", "gpu", f"PYTHON={sys.executable}", f"VENV={venv}", env=OFFLINE)
    assert r.returncode == 0, r.stderr
    assert "pip" not in r.stdout and "-m venv" not in r.stdout, r.stdout
    assert f"{sys.executable} -m pytest -q" in r.stdout
    assert f"{sys.executable} -m profiling report" in r.stdout
    assert f"{sys.executable} -m profiling.gpu" in r.stdout


def test_a_python_without_them_gets_the_venv(tmp_path):
    bare = tmp_path / "python3"  # answers the Makefile's probe "no torch"
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(bare.stat().st_mode | stat.S_IEXEC)
    venv = tmp_path / "venv"
    r = make("-n", "test", f"PYTHON={bare}", f"VENV={venv}", "TORCH=torch==2.13.0")
    assert r.returncode == 0, r.stderr
    assert re.search(rf"^{re.escape(str(bare))} -m venv +{re.escape(str(venv))}$", r.stdout, re.M), r.stdout
    assert "--system-site-packages" not in r.stdout  # that python has no torch to share
    assert 'pip install -q --no-compile "torch==2.13.0"' in r.stdout
    assert 'pip install -q --no-compile -c constraints/ci.txt -e ".[test,report]"' in r.stdout  # the pinned set
    assert "-m compileall -q -j 0" in r.stdout  # (byte-compiled on every CPU, not by pip)
    assert f"{venv}/bin/python -m pytest -q" in r.stdout
    # and SETUP=venv forces it for a python that has everything (CI does)
    r = make("-n", "test", f"PYTHON={sys.executable}", f"VENV={venv}", "SETUP=venv")
    assert r.returncode == 0 and f"{venv}/bin/python -m pytest -q" in r.stdout, r.stdout + r.stderr


def test_offline_make_test_runs(tmp_path):
    """``make test`` for real with pip cut off: nothing installed, nothing fetched, the tests pass."""
    venv = tmp_path / "venv"
    r = make("test", f"PYTHON={sys.executable}", f"VENV={venv}",
             "ARGS=-p no:cacheprovider tests/test_matrices.py", env=OFFLINE, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "SETUP=python" in r.stdout and " passed" in r.stdout
    assert not venv.exists()


def test_bad_setup_is_refused():
    r = make("-n", "test", "SETUP=conda")
    assert r.returncode != 0 and "SETUP is python or venv" in r.stderr
