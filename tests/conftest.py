import importlib
import importlib.util
import os
import sys

import pytest
import torch
from hypothesis import settings

# Without a GPU the Triton kernel runs on the CPU through Triton's interpreter. The variable
# must be set before rome's kernel module is first imported (rome imports it lazily).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":  # (a fifth of an interpreter test's time: profiling/interpreter.py)
    from profiling.interpreter import speed_up

    speed_up()

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# Hypothesis profiles (tests/test_fuzz.py). "rome", the default: 30 examples a property, so
# `make test` stays within CI's 20 minutes under the interpreter (50 took ~230 s of a worker),
# and no example database (a failure is not replayed by the next run: its printed case and blob
# reproduce it). "fuzz" (`make fuzz`, --hypothesis-profile=fuzz):
# thousands of examples per test, failures kept in .hypothesis/ (which Hypothesis gitignores)
# and replayed first next time. deadline=None: interpreter launches vary a lot in time.
settings.register_profile("rome", max_examples=30, deadline=None, database=None, print_blob=True)
settings.register_profile("fuzz", max_examples=3000, deadline=None, print_blob=True)
settings.load_profile("rome")
BACKENDS = ("torch", "triton")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SECTIONS = {"3d-44/44/40": (44, 44, 40), "3d-16/56/56": (16, 56, 56), "3d-16/24/24": (16, 24, 24),
            "1d-64": (64,)}
MODES = ("interleave", "half")


def assert_formula(got, exact, x, *tables):
    """``got``, computed with ``backend="auto"`` from ``x`` and ``tables``, against a RoPE
    formula's float64 value ``exact`` (not rounded). On a CPU "auto" is the torch backend, which
    rounds ``exact`` once to x's dtype: bit for bit. On a GPU it is the Triton kernel, which sums
    in float32 and rounds once (faithful, not correctly rounded): within rome's stated tolerance
    (``rome.precision.tolerance``: one ulp of x's dtype plus 4 * 2**-24 of the terms' size), the
    terms' size |x*cos| + |rot(x)*sin| bounded by 2 * max|x| * max|table|."""
    from rome.precision import tolerance

    assert got.dtype == x.dtype and got.shape == exact.shape, (got.dtype, x.dtype, got.shape, exact.shape)
    if not got.is_cuda:
        torch.testing.assert_close(got, exact.to(got.dtype), rtol=0, atol=0, equal_nan=True)
        return
    size = 2 * x.detach().abs().max().double() * max(t.detach().abs().max().double() for t in tables)
    err = (got.detach().double() - exact.detach().double()).abs()
    bound = tolerance(exact.detach(), size.expand(exact.shape), got.dtype)
    assert (err <= bound).all(), f"max error {err.max().item():.3g}, over the bound at {int((err > bound).sum())} elements"


def optional(module: str, package: str | None = None):
    """``(module or None, skipif marker)`` for an optional test dependency (pyproject's ``test``
    extra): without it, e.g. on a machine whose python has the core packages and no network
    (``make test`` SETUP=python), the tests that need it are skipped with the reason, and the
    rest of their module still runs."""
    found = importlib.util.find_spec(module) is not None
    reason = f"needs {package or module}, not installed for {sys.executable}"
    return (importlib.import_module(module) if found else None), pytest.mark.skipif(not found, reason=reason)


# Each test is called from a wide frame: CPython 3.11/3.12's frame stack otherwise maps and
# unmaps a 16 KB chunk per call where the interpreter's kernel frames go up and down across a
# chunk's start (gh-142183; a third of the interpreter tests' CPU time: profiling/frames.py).
@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    from _pytest.python import pytest_pyfunc_call as call

    from profiling.frames import call_in_a_wide_frame

    return call_in_a_wide_frame(call, pyfuncitem)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


STATIC_MODULE = "test_kernels_static.py"
# test files whose tests share a module-scoped fixture (the gate's compile, a built sdist and
# wheel, spawned ranks, generated records, the import graph): under pytest-xdist each runs in one
# worker, so that fixture is set up once (tests/test_suite.py checks that the list holds
# every file that defines one); any other test is a unit of its own
SHARED_FIXTURE_FILES = ("test_kernels_static.py", "test_packaging.py", "test_distributed.py",
                        "test_matrices_records.py", "test_layers.py")


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook)
def pytest_xdist_make_scheduler(config, log):
    # `--dist loadgroup` (make test): a test at a time to whichever worker is free, the tests of
    # SHARED_FIXTURE_FILES (and of an xdist_group mark) as one unit, the largest units first, so
    # the gate's compile starts at once and the run ends with both workers busy (loadfile handed
    # the largest files out first and the gate's small one ~20 minutes in, its serial tests last).
    # The file list stands in for the marks: under pytest 9.2 pytest-xdist 3.8's loadgroup leaves
    # them out of the node ids it schedules by, so a mark alone groups nothing
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SharedFixtureFiles(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            path = nodeid.split("::", 1)[0]
            if scope == nodeid and path.rsplit("/", 1)[-1] in SHARED_FIXTURE_FILES:
                return path
            return scope

    return SharedFixtureFiles(config, log)


@pytest.hookimpl(optionalhook=True)  # (pytest-xdist's hook: unknown to pytest without it)
def pytest_xdist_auto_num_workers(config):
    # `-n auto` (make test, where pytest-xdist is installed): a worker per CPU up to 4 without a
    # GPU (the interpreter is one process's CPU), none with one (the GPU tests time kernels)
    return 0 if torch.cuda.is_available() else min(4, os.cpu_count() or 1)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection
def pytest_collection_modifyitems(config, items):
    # The static compile of every kernel config (tests/test_kernels_static.py) is the suite's
    # longest job and runs in compiler processes, while the rest of the suite is one process
    # under the interpreter: its tests go last and the compile starts now, in the background on
    # every CPU at a lower priority, so the two overlap: the interpreter (one process) keeps its
    # CPU, the compile takes the others and, while the fixture waits, all of them.
    static = [item for item in items if item.path.name == STATIC_MODULE]
    if static:
        items[:] = [item for item in items if item.path.name != STATIC_MODULE] + static
        # (under pytest-xdist one worker runs this module, first: pytest_xdist_make_scheduler;
        # its `compiled` fixture compiles there on every CPU while the other workers test)
        if os.environ.get("PYTEST_XDIST_WORKER") is None \
                and any("compiled" in getattr(item, "fixturenames", ()) for item in static):
            from concurrent.futures import ThreadPoolExecutor

            from profiling.static import compile as aot
            from profiling.static import configs

            pool = ThreadPoolExecutor(1, thread_name_prefix="rome-static-compile")
            # the workers start here, before any test (tests that spawn processes themselves
            # must not start while the compile's environment is set); config.rome_static_compile:
            # a Future of (rows, files) for sm_90, gfx942, sm_80 and sm_100 (CI's covering arrays and
            # subsets: profiling.static.configs.gate_configs)
            workers = aot.start_compiler_pool(os.cpu_count() or 2, nice=10)
            # (the gate checks compiles, spills and fit: from the resource usage, without the SASS
            # and its model, which the model's own tests and the table's CLI read)
            config.rome_static_compile = pool.submit(configs.inspect_kernels, (90, "gfx942", 80, 100), pool=workers,
                                                     configs_ref=configs.GATE_CONFIGS, schedule=False, sass=False)
            pool.shutdown(wait=False)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
