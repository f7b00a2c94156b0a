"""The package's layers: imports inside ``rome`` form no circle, and the Triton source
(``rome/kernel.py``) imports nothing from rome (the choice of a launch and the launch sit above
it: ``launch.py``, ``tuning.py``, ``launcher.py``).

Two graphs are checked. Module-level imports form no circle (Python would fail or half-load a
module). Function-level (lazy) imports are allowed where they defer a module until a call needs
it: triton (``ops`` -> ``launcher``), torch.distributed (``ops`` -> ``distributed``, the first
time a DTensor arrives), an optional library or a costly module. Any module may import any other
lazily, a lower layer a higher one included, as long as that closes no circle: counting the
function-level imports too, the graph has no circle either, so no two modules import each other
at any level (what both need lives below both, e.g. ``checks`` below ``ops`` and
``distributed``), nor do longer chains come back to where they started. The layers:
docs/layout.md. Outside rome, ``profiling/static/``'s modules each import only those listed
before them."""

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


def _imports(path: Path, lazy: bool = False) -> set[str]:
    """The rome modules ``path`` imports at module level; ``lazy``: also those it imports inside
    functions (and anywhere else in its body)."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if lazy else tree.body:
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


def _graph(lazy: bool) -> dict[str, set[str]]:
    mods = {_module(p): p for p in ROOT.rglob("*.py")}
    return {m: {i for i in _imports(p, lazy) if i in mods and i != m} for m, p in mods.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    """Module-level imports."""
    return _graph(lazy=False)


@pytest.fixture(scope="module")
def full_graph() -> dict[str, set[str]]:
    """Module-level and function-level imports."""
    return _graph(lazy=True)


def _assert_no_circle(graph: dict[str, set[str]], what: str) -> None:
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            cycle = path[path.index(m):] + [m]
            pytest.fail(f"import circle ({what}): " + " -> ".join(cycle))
        if state.get(m) == 2:
            return
        state[m] = 1
        for n in sorted(graph[m]):
            visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])
    assert len(graph) > 10  # the walk saw the package


def test_the_kernel_source_imports_nothing_from_rome(full_graph):
    assert full_graph["rome.kernel"] == set()


def test_no_import_circle(graph):
    _assert_no_circle(graph, "module-level imports")


def test_no_import_circle_through_function_level_imports(full_graph):
    _assert_no_circle(full_graph, "counting function-level imports")


def test_function_level_imports_are_seen(graph, full_graph):
    """The walk finds imports inside functions: ``ops`` imports ``launcher`` (triton) and
    ``distributed`` (torch.distributed) only when a call needs them."""
    for lazy in ("rome.launcher", "rome.distributed"):
        assert lazy in full_graph["rome.ops"] and lazy not in graph["rome.ops"], lazy
    assert all(graph[m] <= full_graph[m] for m in graph)


def test_the_walk_reports_two_modules_importing_each_other():
    graph = {"rome.ops": {"rome.distributed"}, "rome.distributed": {"rome.ops"}, **{f"m{i}": set() for i in range(10)}}
    with pytest.raises(pytest.fail.Exception, match="rome.distributed -> rome.ops -> rome.distributed"):
        _assert_no_circle(graph, "test")


STATIC = ROOT.parent / "profiling" / "static"
STATIC_ORDER = ("archs", "nvidia", "amd", "compile", "schedule", "model", "configs", "launches", "tables", "cli")


def test_profiling_static_modules_import_only_those_before_them():
    """``profiling/static/`` (``python -m profiling kernels``): each module imports, at any level,
    only the package's modules listed before it (its ``__init__`` and docs/layout.md)."""
    assert sorted(p.stem for p in STATIC.glob("*.py") if p.stem != "__init__") == sorted(STATIC_ORDER)
    for i, name in enumerate(STATIC_ORDER):
        used = set()
        for node in ast.walk(ast.parse((STATIC / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                used |= {node.module} if node.module else {a.name for a in node.names}
        assert used <= set(STATIC_ORDER[:i]), f"profiling/static/{name}.py imports {sorted(used - set(STATIC_ORDER[:i]))}"
