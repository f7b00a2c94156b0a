# `make test`, `make report` and `make gpu` run on one of two set-ups, SETUP (make SETUP=... to choose):
#
# SETUP=python  $(PYTHON) as it is: nothing is installed or fetched, rome runs from this tree
#               (PYTHONPATH). The default when $(PYTHON) already has what the tests need (torch,
#               pytest, hypothesis, einops, and triton on Linux): a machine without network whose
#               python carries the packages, as the GPU machines'. Tests and report variants that
#               need an optional package that python lacks (diffusers, rotary-embedding-torch,
#               liger-kernel, ...) are skipped with the reason.
# SETUP=venv    a virtual environment $(VENV) built on first use: pip installs torch ($(TORCH)) and
#               the project with its test and report extras (needs a package index). The default
#               otherwise, so CI (a python without torch) is unchanged.
#
# TORCH is the pip requirement for PyTorch in the venv. With an NVIDIA GPU (nvidia-smi on the PATH)
# the default keeps the torch the machine's python already has (the venv then sees that python's
# packages, also when that python is itself a virtual environment) or installs the newest. Without
# one it pins torch==2.13.0, which on the project's CPU machines is a CPU wheel on disk rather than a
# multi-GB CUDA download.
PYTHON ?= python3
VENV   ?= .venv
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
TORCH  ?= $(if $(HAS_GPU),torch>=2.11,torch==2.13.0)
ARGS   ?=
# the exact versions of everything but torch/triton that the suite was last made green with
CONSTRAINTS ?= constraints/ci.txt

# find_spec: whether the module is there, without importing it (torch takes seconds to import)
READY_PYTHON := $(shell $(PYTHON) -c "import importlib.util as u, sys; \
	need = ['torch', 'pytest', 'hypothesis', 'einops'] + (['triton'] if sys.platform == 'linux' else []); \
	sys.exit(any(u.find_spec(m) is None for m in need))" >/dev/null 2>&1 && echo yes)
SETUP ?= $(if $(READY_PYTHON),python,venv)

ifeq ($(SETUP),python)
PY    := $(PYTHON)
READY := python-ready
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
else ifeq ($(SETUP),venv)
PY    := $(VENV)/bin/python
READY := $(VENV)/.installed
else
$(error SETUP is python or venv, not '$(SETUP)')
endif

SYSTEM_TORCH := $(shell $(PYTHON) -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" >/dev/null 2>&1 && echo yes)
VENV_FLAGS   ?= $(if $(SYSTEM_TORCH),--system-site-packages,)

.PHONY: help test test-ends fuzz gate gate36 report gpu clean python-ready report-ready matrices families static static36

help:
	@echo "make report      the main job: speed + precision report (reports/<workload>-<timestamp>/)"
	@echo "make test        the test suite (without a GPU the kernel runs under TRITON_INTERPRET=1)"
	@echo "make test-ends   the integration tests with the newest and the oldest transformers/diffusers"
	@echo "make fuzz        thousands of hypothesis examples per property (long)"
	@echo "make gate        the static gate on every kernel configuration, not CI's covering array (~3,400 builds)"
	@echo "make gate36      CI's static gate under triton 3.6, the GPU machines' compiler ($(VENV36); ROME_GATE=full: all)"
	@echo "make gpu         on a GPU machine: everything a first GPU run should measure (profiling/results/<gpu>/)"
	@echo "make matrices    matrices/: every family's rotation matrix as a record and a picture"
	@echo "make families    docs/families.md, generated from rome's family tables"
	@echo "make static      the static table with the bandwidth model, no GPU (STATIC_ARGS; docs/kernels.md)"
	@echo "make static36    the same under triton 3.6, the GPU machines' compiler ($(VENV36), built on first use)"
	@echo "make clean       remove the venvs and reports"
	@echo "SETUP=$(SETUP) (python: $(PYTHON) as it is; venv: $(VENV) built on first use); ARGS=... goes to the command"

# venv mode. --system-site-packages shows the venv the base interpreter's packages only: when
# $(PYTHON) is itself a virtual environment, a .pth file adds that environment's site-packages too
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@echo "building $(VENV): torch ($(TORCH)), then rome with its test and report extras at the versions of $(CONSTRAINTS) (a minute or two)"
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
ifneq ($(findstring --system-site-packages,$(VENV_FLAGS)),)
	$(PYTHON) -c "import site, sys; sys.prefix != sys.base_prefix and print(*site.getsitepackages(), sep='\n')" \
		> "$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_rome_outer_site.pth"
endif
	$(PY) -m pip install -q --no-compile "$(TORCH)"
	$(PY) -m pip install -q --no-compile -c $(CONSTRAINTS) -e ".[test,report]"
	@# (pip byte-compiles what it installs one file at a time; compileall on every CPU: on CI's two,
	@# the install 107 -> 93 s. Like pip, a file this python cannot compile is no error: torch ships
	@# python-3.12-only test helpers)
	$(PY) -m compileall -q -j 0 "$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" > /dev/null || true
	touch $@

# python mode: say which python runs and which optional packages it lacks (their tests are skipped)
python-ready:
	@$(PY) -c "import importlib.util as u, sys; \
		opt = ['transformers', 'diffusers', 'rotary_embedding_torch', 'rich', 'matplotlib']; \
		missing = [m for m in opt if u.find_spec(m) is None]; \
		print(f'SETUP=python: {sys.executable} as it is, rome from this tree' \
		      + (f'; without {\", \".join(missing)} (what needs them is skipped)' if missing else ''))"

report-ready: $(READY)
	@$(PY) -c "import importlib.util as u, sys; m = [p for p in ('rich', 'matplotlib') if u.find_spec(p) is None]; \
		m and sys.exit(f'make report needs {\" and \".join(m)}, which {sys.executable} lacks')"

# with pytest-xdist (the test extra) the suite runs on the CPUs (tests/conftest.py: as many workers as
# CPUs up to 4, none with a GPU), a test at a time to whichever worker is free, the files whose
# tests share a module fixture (the static gate's compile) one unit each (conftest's scheduler);
# without it, in one process
XDIST = $$($(PY) -c "import importlib.util as u; print('-n auto --dist loadgroup' if u.find_spec('xdist') else '')")

test: $(READY)
	$(PY) -m pytest -q $(XDIST) $(ARGS)

# the integration tests again at both ends of the transformers/diffusers range pyproject claims:
# the newest the package index serves, and constraints/oldest.txt (.ci/run runs it after make test)
test-ends: $(READY)
	PY=$(PY) bash .ci/ends $(ARGS)

# thousands of hypothesis examples per property (tests/conftest.py, profile "fuzz"); long
fuzz: $(READY)
	$(PY) -m pytest -q tests/test_fuzz.py --hypothesis-profile=fuzz $(ARGS)

# the static gate on every configuration (sm_90, sm_80, sm_100, gfx942: ~850 builds each, 2-5 s
# of CPU a build; make test compiles a covering array of them: docs/testing.md)
gate: $(READY)
	ROME_GATE=full $(PY) -m pytest -q tests/test_kernels_static.py $(ARGS)

report: report-ready
	$(PY) -m profiling report $(ARGS)

# the first GPU contact in one command under 10 minutes: profiling/results/<gpu>/ (profiling/gpu.py)
gpu: report-ready
	$(PY) -m profiling.gpu $(ARGS)

# matrices/: every family's rotation matrix, one record (JSON) and one picture (PNG) each, and
# its README (profiling/matrices.py); tests/test_matrices_records.py holds the code to them
matrices: $(READY)
	$(PY) -m profiling matrices $(ARGS)

# docs/families.md: every family rome.integrations.patch patches or refuses, generated from the tables
# of rome/integrations/{transformers,diffusers}.py (profiling/families.py); tests/test_families_doc.py
# fails when the committed page is not what this writes
families: $(READY)
	$(PY) -m profiling families $(ARGS)

# the static table (python -m profiling kernels: compile ahead of time, no GPU) with the bandwidth
# model, under this python's triton (static) and under triton 3.6, torch 2.11's, the GPU machines'
# compiler (static36). static36 runs $(PY36): by default $(VENV36), a venv built on first use that
# sees $(PY)'s packages (torch, rich, liger-kernel, rome) and holds triton 3.6 itself; a python that
# already has triton 3.6 (PY36=...) is used as it is. Offline: WHEELS=DIR, a folder holding the
# triton 3.6.0 wheel (pip download triton==3.6.0 --no-deps -d DIR, once, with a package index);
# without WHEELS pip asks the index (or its own cache of an earlier download).
STATIC_ARGS ?= --workload default --arch sm_90
TRITON36    ?= triton==3.6.0
VENV36      ?= .venv-static36
WHEELS      ?=
PY36        ?= $(VENV36)/bin/python
PIP_WHEELS  := $(if $(WHEELS),--no-index --find-links $(WHEELS),)

$(VENV36)/.installed:
	@echo "building $(VENV36): $(PY)'s packages seen through, $(TRITON36) in it"
	$(PY) -m venv --system-site-packages $(VENV36)
	$(PY) -c "import site, sys; print(*site.getsitepackages(), sep='\n')" \
		> "$$($(VENV36)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_rome_outer_site.pth"
	$(VENV36)/bin/python -m pip install -q --no-deps $(PIP_WHEELS) "$(TRITON36)"
	$(VENV36)/bin/python -c "import triton; assert triton.__version__.startswith('3.6'), triton.__version__"
	touch $@

static: $(READY)
	$(PY) -m profiling kernels $(STATIC_ARGS) $(ARGS)

static36: $(READY) $(if $(filter $(VENV36)/bin/python,$(PY36)),$(VENV36)/.installed,)
	$(PY36) -m profiling kernels $(STATIC_ARGS) $(ARGS)

# CI's static gate (tests/test_kernels_static.py) under triton 3.6 in $(PY36), as static36; with
# ROME_GATE=full every configuration (not run so: every sm_80/sm_100 build compiled without spill
# under 3.6 by triton-37-38/gate.py, profiling/results/cpu/src-again/)
gate36: $(READY) $(if $(filter $(VENV36)/bin/python,$(PY36)),$(VENV36)/.installed,)
	$(PY36) -m pytest -q tests/test_kernels_static.py $(ARGS)

clean:
	rm -rf $(VENV) $(VENV36) .venv-newest .venv-oldest reports .pytest_cache
