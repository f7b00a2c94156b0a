# `make test` and `make report` build their own virtual environment on first use.
#
# TORCH is the pip requirement for PyTorch. With an NVIDIA GPU (nvidia-smi on the PATH) the
# default keeps the torch the machine's python already has (the venv then sees the system
# site-packages) or installs the newest. Without one it pins torch==2.13.0, which on the
# project's CPU machines is a CPU wheel on disk rather than a multi-GB CUDA download.
PYTHON ?= python3
VENV   ?= .venv
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)
TORCH  ?= $(if $(HAS_GPU),torch>=2.6,torch==2.13.0)
ARGS   ?=
PY     := $(VENV)/bin/python

SYSTEM_TORCH := $(shell $(PYTHON) -c "import torch" >/dev/null 2>&1 && echo yes)
VENV_FLAGS   ?= $(if $(SYSTEM_TORCH),--system-site-packages,)

.PHONY: test fuzz report clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,report]"
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q $(ARGS)

# thousands of hypothesis examples per property (tests/conftest.py, profile "fuzz"); long
fuzz: $(VENV)/.installed
	$(PY) -m pytest -q tests/test_fuzz.py --hypothesis-profile=fuzz $(ARGS)

report: $(VENV)/.installed
	$(PY) -m profiling report $(ARGS)

clean:
	rm -rf $(VENV) reports .pytest_cache
