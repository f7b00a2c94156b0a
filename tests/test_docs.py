"""The README and docs/*.md: every ```python block runs, every fence names its language, and every
relative link resolves (to a file, and a #fragment to one of its headings). The rules the
snippets are written to are in docs/index.md, "Snippets and links"."""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from conftest import optional

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON = ("python", "py")
TORCHRUN = re.compile(r"#\s*torchrun\s+--nproc-per-node[= ](\d+)")
FENCE = re.compile(r"^( {0,3})(`{3,}(?=[^`]*$)|~{3,})\s*(\S*)")  # CommonMark: no ` after a ``` fence
CUDA = re.compile(r"""(["'])cuda\1""")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the block's first code line
    lang: str
    code: str


def _name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def parse(page: Path) -> tuple[list[Block], list[str]]:
    """(fenced blocks, the page's lines with every fenced line blanked) of a CommonMark page."""
    lines = page.read_text(encoding="utf-8").split("\n")
    blocks, prose, fence = [], [], None
    for i, line in enumerate(lines):
        if fence is None:
            m = FENCE.match(line)
            if m:
                indent, marker, lang = len(m.group(1)), m.group(2), m.group(3)
                fence, body, start = (marker[0], len(marker), indent), [], i + 2
                prose.append("")
            else:
                prose.append(line)
            continue
        prose.append("")
        stripped = line.strip()
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= fence[1] and len(line) - len(line.lstrip()) <= 3:
            blocks.append(Block(page, start, lang.lower(), "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line[min(fence[2], len(line) - len(line.lstrip())):])
    if fence is not None:
        raise AssertionError(f"{_name(page)}: a fence opened on line {start - 1} is never closed")
    return blocks, prose


def _python_pages() -> list[Path]:
    return [page for page in PAGES if any(b.lang in PYTHON for b in parse(page)[0])]


def _imports(code: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _skip_without_imports(blocks: list[Block]) -> None:
    """Skip (with conftest's reason) a page whose snippets import a package that is missing."""
    for name in sorted(set().union(*(_imports(b.code) for b in blocks)) - set(sys.stdlib_module_names)):
        module, mark = optional(name)
        if module is None:
            pytest.skip(mark.kwargs["reason"])


def _on_cpu(code: str) -> str:
    return CUDA.sub(r"\1cpu\1", code)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(block: Block, tmp_path: Path) -> None:
    """The block as a script on N CPU processes (gloo): one GPU cannot hold two NCCL ranks. The
    ranks get torchrun's environment and are started directly, without its launcher process
    (one torch import less on a 2-core machine)."""
    nproc = int(TORCHRUN.match(block.code.lstrip()).group(1))
    script = tmp_path / f"{block.page.stem}_{block.line}.py"
    # the page's line numbers; after the block, leave without C++ static destructors: under load
    # gloo's worker threads can still be joinable at exit and abort a rank ("terminate called
    # without an active exception") once the block has run (tests/test_distributed.py does the same)
    script.write_text("\n" * (block.line - 1) + _on_cpu(block.code)
                      + "\nimport os as _os, sys as _sys\n_sys.stdout.flush(); _sys.stderr.flush(); _os._exit(0)\n")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    common = dict(os.environ, PYTHONPATH=path, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                  WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", OMP_NUM_THREADS="1")
    ranks = [
        subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         env=dict(common, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0"))
        for rank in range(nproc)
    ]
    try:
        outputs = [rank.communicate(timeout=300)[0] for rank in ranks]
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
    failed = [(i, r.returncode, out) for i, (r, out) in enumerate(zip(ranks, outputs)) if r.returncode]
    assert not failed, f"{_name(block.page)}:{block.line}: " + "\n".join(
        f"rank {i} exited {code}:\n{out[-4000:]}" for i, code, out in failed)


@pytest.mark.parametrize("page", _python_pages(), ids=_name)
def test_snippets_run(page, tmp_path):
    """The page's ```python blocks, in order, in one namespace ("cuda" -> "cpu" without CUDA);
    a block headed `# torchrun --nproc-per-node=N` runs as a script under torchrun."""
    blocks = [b for b in parse(page)[0] if b.lang in PYTHON]
    _skip_without_imports(blocks)
    namespace = {"__name__": "__docs__"}
    for block in blocks:
        if TORCHRUN.match(block.code.lstrip()):
            _torchrun(block, tmp_path)
            continue
        code = block.code if torch.cuda.is_available() else _on_cpu(block.code)
        # the page's own line numbers in a traceback
        exec(compile("\n" * (block.line - 1) + code, str(block.page), "exec"), namespace)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_fences_name_their_language(page):
    """A bare ``` fence could hide a snippet from test_snippets_run: each says what it holds."""
    bare = [b.line - 1 for b in parse(page)[0] if not b.lang]
    assert not bare, f"{_name(page)}: fences without a language on lines {bare} (```python, ```sh, ```text, ...)"


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in parse(page)[1]:
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
    return {base if i == 0 else f"{base}-{i}" for base, n in seen.items() for i in range(n)}


def links(page: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and link reference outside code."""
    found = []
    for number, line in enumerate(parse(page)[1], 1):
        prose = re.sub(r"(`+)(.+?)\1", "", line)  # inline code spans
        found += [(number, m.group(1)) for m in LINK.finditer(prose)]
        found += [(number, m.group(1)) for m in REFERENCE.finditer(prose)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_resolve(page):
    bad = []
    for line, target in links(page):
        if SCHEME.match(target):
            continue  # http(s), mailto: not checked (no network)
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"line {line}: {target} ({file} does not exist)")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            bad.append(f"line {line}: {target} (no heading with the anchor #{fragment} in {_name(file)})")
    assert not bad, f"{_name(page)}: broken links:\n" + "\n".join(bad)


def test_pages_have_snippets_and_links():
    """The parsers find what the pages hold: a README quickstart that runs, and links into docs/."""
    readme = parse(ROOT / "README.md")[0]
    assert any(b.lang == "python" and "rome.apply_qk" in b.code for b in readme)
    assert any(t == "docs/index.md" for _, t in links(ROOT / "README.md"))
    assert "snippets-and-links" in anchors(ROOT / "docs" / "index.md")
    assert slug("The first GPU run (`make gpu`)") == "the-first-gpu-run-make-gpu"
