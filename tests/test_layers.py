"""The package's layers: module-level imports inside ``rome`` form no circle, and the Triton
source (``rome/kernel.py``) imports nothing from rome (the choice of a launch and the launch sit
above it: ``launch.py``, ``tuning.py``, ``launcher.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "rome"


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(path: Path) -> set[str]:
    """The rome modules ``path`` imports at module level (not inside functions: those are the
    lazy imports a layer may make of a higher one at call time)."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "rome"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "rome":
                continue
            if node.module is None or node.level and not node.module:
                out |= {f"{target}.{a.name}" for a in node.names}
            else:
                out.add(target)
                out |= {f"{target}.{a.name}" for a in node.names}
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    mods = {_module(p): p for p in ROOT.rglob("*.py")}
    return {m: {i for i in _top_level_imports(p) if i in mods and i != m} for m, p in mods.items()}


def test_the_kernel_source_imports_nothing_from_rome(graph):
    assert graph["rome.kernel"] == set()


def test_no_import_circle(graph):
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            cycle = path[path.index(m):] + [m]
            pytest.fail("import circle: " + " -> ".join(cycle))
        if state.get(m) == 2:
            return
        state[m] = 1
        for n in sorted(graph[m]):
            visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
    assert len(graph) > 10  # the walk saw the package
