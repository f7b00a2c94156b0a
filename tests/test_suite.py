"""The suite's own scheduling under pytest-xdist (`make test`: ``-n auto --dist loadgroup``):
the files whose tests share a module-scoped fixture run in one worker (conftest.py's
SHARED_FIXTURE_FILES, its scheduler), every other test is a unit of its own."""

import ast
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl

from conftest import SHARED_FIXTURE_FILES, optional

xdist, needs_xdist = optional("xdist", "pytest-xdist")
TESTS = Path(__file__).parent
SHARED_SCOPES = {"module", "class", "package", "session"}


def _shared_fixture_files() -> set[str]:
    """Test files defining a fixture whose scope is wider than a test."""
    found = set()
    for path in TESTS.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    scopes = [kw.value.value for kw in getattr(dec, "keywords", ())
                              if kw.arg == "scope" and isinstance(kw.value, ast.Constant)]
                    if scopes and scopes[0] in SHARED_SCOPES:
                        found.add(path.name)
    return found


def test_every_file_with_a_shared_fixture_is_listed():
    """A module fixture whose tests were spread over workers would be set up in each (the static
    gate's compile twice, minutes): every file that defines one is in SHARED_FIXTURE_FILES, and
    every listed file exists and defines one."""
    assert _shared_fixture_files() == set(SHARED_FIXTURE_FILES)


@needs_xdist
def test_loadgroup_keeps_a_shared_fixture_file_in_one_worker_and_spreads_the_rest(tmp_path):
    """Two workers: test_layers.py's tests (one module fixture) all on one worker; the tests of
    test_tables.py, a file without one, on both."""
    files = ["tests/test_layers.py", "tests/test_tables.py"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-n", "2", "--dist",
                        "loadgroup", *files], cwd=TESTS.parent, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] .*?PASSED (tests/\S+?)::", r.stdout, re.M)
    workers = {f: {w for w, g in ran if g == f} for f in files}
    assert len(workers["tests/test_layers.py"]) == 1, workers
    assert len(workers["tests/test_tables.py"]) == 2, workers
    assert len(ran) >= 20, r.stdout[-2000:]


@triton.jit
def _twice(v):
    return v * 2.0


@triton.jit
def _eightfold(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)
    for _ in tl.static_range(3):
        v = _twice(v)
    tl.store(o_ptr + offs, v)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the kernel runs on a GPU, not interpreted")
def test_interpreter_skips_rescans_and_restores_the_language():
    """conftest.py installs profiling.interpreter.speed_up (on the triton CI pins): inside a
    launch, a helper's call scans triton.language no more (``inspect.getmembers`` not called), the
    launch's results are the same, and after it the builtins are as it found them."""
    import inspect as inspect_module

    import torch
    from triton.runtime import interpreter

    from profiling.interpreter import speed_up

    assert speed_up() and interpreter._patch_lang.original is not None

    calls = []
    real = inspect_module.getmembers

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    before = (tl.load, tl.core.load)  # (a helper's own patching, in triton, is never undone)
    x = torch.arange(16, dtype=torch.float32)
    out = torch.empty_like(x)
    inspect_module.getmembers, saved = counted, inspect_module.getmembers
    try:
        _eightfold[(1,)](x, out, 16)
    finally:
        inspect_module.getmembers = saved
    torch.testing.assert_close(out, x * 8, rtol=0, atol=0)
    scans = len(calls)
    assert 0 < scans <= 5, scans  # the launch's own patching only (tl, its tensor and math, ...)
    assert (tl.load, tl.core.load) == before and tl.core.is_builtin(tl.load)  # as the launch found them
    # the memo of _get_np_dtype gives the original's numpy dtype for scalars, blocks and pointers
    memo = interpreter._get_np_dtype
    for ty in (tl.float32, tl.bfloat16, tl.int1, tl.int64, tl.uint8, tl.pointer_type(tl.float16),
               tl.block_type(tl.float16, [4, 8]), tl.block_type(tl.pointer_type(tl.int32), [2])):
        assert memo(ty) == memo.original(ty) == memo(ty), ty


@triton.jit
def _wrapping_products(x_ptr, o_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)
    tl.store(o_ptr + offs, v * v + v - 7)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the kernel runs on a GPU, not interpreted")
def test_interpreter_builds_no_overflow_check_that_it_would_drop():
    """speed_up turns the interpreter's ``sanitize_overflow`` off, its ``debug`` being off: an int
    op no longer builds the int64 check that ``device_assert`` drops (no int64 cast is made), and
    int32 arithmetic that overflows wraps as before (the same bits with the option on again)."""
    import torch
    from triton.language import semantic
    from triton.runtime import interpreter

    from profiling.interpreter import speed_up

    builder = interpreter.interpreter_builder
    assert speed_up() and not builder.options.debug and not builder.options.sanitize_overflow
    x = torch.tensor([3, -5, 46341, 2**31 - 1, -(2**31), 65536, 7, 0], dtype=torch.int32)
    want = ((x.long() * x.long() + x.long() - 7 + 2**31) % 2**32 - 2**31).int()  # two's complement
    casts = []
    real = semantic.TritonSemantic.cast

    def counted(self, input, dst_ty, *args, **kwargs):
        casts.append(dst_ty)
        return real(self, input, dst_ty, *args, **kwargs)

    outs = {}
    saved = builder.options
    try:
        for sanitize in (False, True):
            builder.options = dataclasses.replace(saved, sanitize_overflow=sanitize)
            casts.clear()
            semantic.TritonSemantic.cast = counted
            outs[sanitize] = torch.empty_like(x)
            _wrapping_products[(1,)](x, outs[sanitize], 8)
            semantic.TritonSemantic.cast = real
            assert (tl.int64 in casts) == sanitize, (sanitize, casts)  # the check built only when on
    finally:
        semantic.TritonSemantic.cast, builder.options = real, saved
    assert torch.equal(outs[False], want) and torch.equal(outs[True], want)
