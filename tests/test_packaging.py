"""The distribution (issue 19 item 1, docs/install.md): the sdist and the wheel built from it, offline,
with the installed setuptools (what ``python -m build --no-isolation`` does: the sdist from the
source tree, the wheel from the unpacked sdist), their contents checked against the tree, the
unpacked sdist's tests collected; and ``import rome`` and the torch backend without triton."""

from __future__ import annotations

import email.parser
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

import rome
from rome import ops

ROOT = Path(__file__).resolve().parents[1]
NAME = "rome-rope"
STEM = f"rome_rope-{rome.__version__}"  # the file name's form of the name (PEP 625 / wheel)

try:
    SETUPTOOLS = Version(importlib.metadata.version("setuptools"))
except importlib.metadata.PackageNotFoundError:
    SETUPTOOLS = None
pytestmark = pytest.mark.skipif(
    SETUPTOOLS is None or SETUPTOOLS < Version("77"),
    reason=f"needs setuptools>=77 (the test extra), {sys.executable} has {SETUPTOOLS}",
)

# what a source tree holds that an sdist build must not see: VCS, environments, build outputs
# (.gitignore's entries); profiling/results is MANIFEST.in's to leave out, so it is copied
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", ".venv-*", "venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".hypothesis", ".pytest_cache", "reports", ".whl", "*.py[cod]", "shared")


def _env(**extra) -> dict[str, str]:
    """The environment of a child: no pytest variables of this run, pip offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "PYTHONPATH"}
    return env | {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"} | extra


def _run(args, cwd, timeout=120, **env):
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(**env))
    assert r.returncode == 0, f"{args} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist path, wheel path, unpacked sdist root)."""
    tmp = tmp_path_factory.mktemp("dist")
    src, dist, unpacked = tmp / "src", tmp / "dist", tmp / "unpacked"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"
    name = _run([sys.executable, "-c", code], cwd=src).stdout.strip().splitlines()[-1]
    sdist = dist / name
    with tarfile.open(sdist) as tar:
        tar.extractall(unpacked, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    tree = unpacked / STEM
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(tree)],
         cwd=tmp)
    (wheel,) = dist.glob("*.whl")
    shutil.rmtree(tree / "build", ignore_errors=True)  # pip's in-tree build output
    return sdist, wheel, tree


def _metadata(text: str):
    return email.parser.Parser().parsestr(text)


def _check_metadata(meta) -> None:
    assert meta["Name"] == NAME and meta["Version"] == rome.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Summary"].startswith("rome: rotary position embedding")
    assert "Typing :: Typed" in meta.get_all("Classifier")
    # triton only through an extra (torch brings its own where it has one: docs/install.md)
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    core = {r.name for r in requires if r.marker is None or "extra" not in str(r.marker)}
    assert core == {"torch", "einops"}, core
    triton_extras = {str(r.marker).split("extra == ")[1].strip("\"'") for r in requires if r.name == "triton"}
    assert triton_extras == {"triton", "test"}, triton_extras


def test_wheel_installs_rome_only_with_licence_and_types(built):
    _, wheel, _ = built
    assert wheel.name == f"{STEM}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = f"{STEM}.dist-info"
        top = {n.split("/")[0] for n in names}
        assert top == {"rome", info}, top  # no profiling/, tests/ or other generic name
        assert z.read(f"{info}/top_level.txt").decode().split() == ["rome"]
        assert "rome/py.typed" in names and "rome/types.py" in names
        # every module of the package in the tree is in the wheel
        package = {p.relative_to(ROOT).as_posix() for p in (ROOT / "rome").rglob("*.py")}
        assert package <= set(names), package - set(names)
        assert z.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        meta = _metadata(z.read(f"{info}/METADATA").decode())
    _check_metadata(meta)
    assert meta.get_all("License-File") == ["LICENSE"]


def test_wheel_installs_offline_and_imports_from_the_install(built, tmp_path):
    """The wheel installed as pip installs it (offline, no dependencies, into a fresh --target), and
    ``import rome`` in a child with PYTHONPATH=that target only (the repo not on sys.path, cwd outside
    it; torch from the environment's site-packages): rome comes from the install and the installed
    metadata names rome.__version__."""
    _, wheel, _ = built
    target, cwd = tmp_path / "site", tmp_path / "cwd"
    cwd.mkdir()
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "-q",
          "--target", str(target), str(wheel)], cwd=cwd)
    assert (target / "rome" / "__init__.py").is_file() and (target / f"{STEM}.dist-info" / "METADATA").is_file()
    code = (f"import os, sys, rome, importlib.metadata as m; "
            f"assert rome.__file__.startswith({str(target)!r}), rome.__file__; "
            f"assert {str(ROOT)!r} not in [os.path.abspath(p) for p in sys.path], sys.path; "
            f"print(m.version({NAME!r}))")
    r = _run([sys.executable, "-c", code], cwd=cwd, PYTHONPATH=str(target))
    assert r.stdout.strip().splitlines()[-1] == rome.__version__, r.stdout


def test_licence_is_the_full_apache_text():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert len(text.split()) > 1500  # the whole licence (about 1,580 words), not a pointer to it


def test_sdist_holds_the_tests_and_their_helpers(built):
    sdist, _, _ = built
    assert sdist.name == f"{STEM}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = {n.removeprefix(f"{STEM}/") for n in tar.getnames()}
        meta = _metadata(tar.extractfile(f"{STEM}/PKG-INFO").read().decode())
    _check_metadata(meta)
    for f in ("LICENSE", "pyproject.toml", "README.md", "Makefile", "rome/py.typed", "rome/__init__.py",
              "tests/conftest.py", "tests/helpers.py", "profiling/__init__.py", "docs/install.md"):
        assert f in names, f
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("*.py")}
    assert tests <= names, tests - names
    assert not any(n.startswith("profiling/results") or "__pycache__" in n for n in names)


def test_unpacked_sdist_tests_collect(built):
    """``pytest --collect-only`` in the unpacked sdist, rome from there (PYTHONPATH): no errors.
    tests/test_kernels_static.py is collected and then deselected: selected, its collection hook
    would start the static compile of every kernel config (minutes) in the background."""
    _, _, tree = built
    r = _run([sys.executable, "-c", "import rome; print(rome.__file__)"], cwd=tree, PYTHONPATH=str(tree))
    assert Path(r.stdout.strip()).is_relative_to(tree), r.stdout
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "no:cacheprovider",
                        "-k", "not test_kernels_static"], cwd=tree, capture_output=True, text=True, timeout=300,
                       env=_env(PYTHONPATH=str(tree)))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    last = out.strip().splitlines()[-1]
    assert "error" not in last.lower(), last
    counted = re.match(r"(\d+)(/\d+)? tests? collected", last)
    assert counted and int(counted.group(1)) > 100, last
    # every test module of the sdist was collected, or skipped whole for an optional package this
    # python lacks (diffusers on the GPU image: pytest.importorskip at import, counted per module)
    modules = {line.split("::")[0] for line in r.stdout.splitlines() if "::" in line}
    expected = {f"tests/{p.name}" for p in (tree / "tests").glob("test_*.py")} - {"tests/test_kernels_static.py"}
    skips = re.findall(r"^SKIPPED \[(\d+)\] tests/\S+: could not import '([\w.]+)'", out, re.M)
    for _, package in skips:
        assert importlib.util.find_spec(package) is None, f"{package} is importable here, yet skipped: {out[-2000:]}"
    assert len(expected - modules) == sum(int(n) for n, _ in skips), (expected - modules, skips)


class _CudaLike(torch.Tensor):
    """A CPU tensor that reports ``is_cuda`` (as tests/test_amd.py's stand-in): what ``backend="auto"``
    decides for a GPU tensor, without a GPU."""

    @property
    def is_cuda(self):
        return True


def _auto_choice() -> str:
    x = torch.Tensor._make_subclass(_CudaLike, torch.zeros(2, 8, 64))
    return ops._check({"x": x}, torch.zeros(8, 64), torch.zeros(8, 64), torch.eye(64), "auto")


NO_TRITON = textwrap.dedent("""
    import sys

    sys.modules["triton"] = None  # as if not installed: find_spec gives None, import raises ImportError
    import torch
    import rome
    import rome.integrations, rome.integrations.transformers  # transformers itself only when a model is patched
    from tests.test_packaging import _auto_choice

    x = torch.randn(2, 3, 4, 8)
    cos, sin = rome.rope_cos_sin(torch.arange(4), [8], mode="half")
    m = rome.rotation_matrix([8], "half")
    rot = torch.cat((-x[..., 4:], x[..., :4]), -1)  # rotate_half, NeoX's formula
    want = x * cos + rot * sin
    for backend in ("torch", "auto"):
        torch.testing.assert_close(rome.apply(x, cos, sin, m, backend=backend), want)
    q, k = rome.RoPE.sections([8])(x, x)
    torch.testing.assert_close(q, want)
    print("auto on a GPU tensor:", _auto_choice())
    try:
        rome.apply(x, cos, sin, m, backend="triton")
    except RuntimeError as e:
        print("refused:", e)
    assert sys.modules["triton"] is None and not [n for n in sys.modules if n.startswith("triton.")]
""")


@pytest.mark.skipif(getattr(torch.version, "hip", None) is not None, reason="a ROCm build's auto also reads the arch")
def test_import_and_torch_backend_without_triton(tmp_path):
    """triton is not a dependency (docs/install.md): without it ``import rome`` and the torch
    backend work, ``backend="auto"`` stays on torch for GPU tensors too, and backend="triton"
    says what is missing and how to install it. With triton, auto takes the kernel on a GPU."""
    if ops._has_triton():
        assert _auto_choice() == "triton"
    script = tmp_path / "no_triton.py"
    script.write_text(NO_TRITON)
    r = _run([sys.executable, str(script)], cwd=tmp_path, PYTHONPATH=str(ROOT))
    assert "auto on a GPU tensor: torch" in r.stdout, r.stdout + r.stderr
    assert "refused: backend='triton' needs triton, which failed to import" in r.stdout, r.stdout
    assert "rome-rope[triton]" in r.stdout and "backend='torch'" in r.stdout, r.stdout


def _distribution_closure(names, torch_only=("triton",)) -> list:
    """The installed distributions ``names`` require, transitively (extras left out), as
    ``(distribution, what required it)``. ``torch_only``: requirements left out where torch itself
    requires them (a CUDA build of torch on Linux requires triton, which it imports only for its
    GPU code: a CPU build, the environment the README's user may have, has none)."""
    import importlib.metadata as md

    seen, todo, out = set(), [(n, None) for n in names], []
    while todo:
        req, parent = todo.pop()
        name = Requirement(req).name.lower().replace("_", "-")
        if name in seen or (parent == "torch" and name in torch_only):
            continue
        seen.add(name)
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional or platform-only requirement this environment lacks
        out.append((dist, parent))
        for r in dist.requires or ():
            req = Requirement(r)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append((str(req.name), name))
    return out


def _readme_quickstart_on_cpu() -> str:
    """The README's Quickstart python blocks, as one script, on the CPU."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2, section[:500]
    return "\n".join(blocks).replace('device="cuda"', 'device="cpu"')


def test_wheel_user_runs_the_readme_with_torch_and_declared_dependencies_only(built, tmp_path):
    """Issue 26 item 4: the wheel installed into an environment holding torch and the wheel's
    declared dependencies (with theirs) and nothing else — no numpy, no triton, no repository on
    sys.path (``python -I -S``: no site-packages, sys.path set by hand to the wheel's --target and a
    folder of links to those distributions' files) — runs the README's Quickstart on the CPU."""
    _, wheel, _ = built
    target, deps, cwd = tmp_path / "site", tmp_path / "deps", tmp_path / "cwd"
    deps.mkdir(), cwd.mkdir()
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "-q",
          "--target", str(target), str(wheel)], cwd=cwd)
    meta = _metadata((target / f"{STEM}.dist-info" / "METADATA").read_text())
    declared = [r for r in meta.get_all("Requires-Dist") if "extra ==" not in r]
    linked = set()
    for dist, parent in _distribution_closure(declared):
        assert dist.metadata["Name"].lower() not in {"numpy", "triton"}, (dist.metadata["Name"], "required by", parent)
        for f in dist.files or ():
            top = f.parts[0]
            if top in linked or top.startswith("..") or top in {"bin", "__pycache__"}:
                continue
            src = Path(dist.locate_file(top))
            if src.exists():
                (deps / top).symlink_to(src, target_is_directory=src.is_dir())
                linked.add(top)
    script = cwd / "quickstart.py"
    script.write_text(
        f"import sys\nsys.path[:0] = [{str(target)!r}, {str(deps)!r}]\n"
        "import importlib.util as u\n"
        "assert u.find_spec('numpy') is None and u.find_spec('triton') is None, 'not a torch-only env'\n"
        + _readme_quickstart_on_cpu()
        + "\nassert rome.__file__.startswith(sys.path[0]), rome.__file__\n"
          "assert q_out.shape == q.shape and k_out.shape == k.shape and torch.isfinite(q_out).all()\n"
          "print('quickstart ok', q_out.dtype)\n")
    r = _run([sys.executable, "-I", "-S", str(script)], cwd=cwd, timeout=300)
    assert "quickstart ok torch.bfloat16" in r.stdout, r.stdout + r.stderr
