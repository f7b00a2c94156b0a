# `make test` and `make report` build their own virtual environment on first use.
#
# TORCH is the pip requirement for PyTorch. The default keeps whatever torch the machine's
# python already has (the venv then sees the system site-packages) or installs the newest one.
# On a CPU-only machine with a local CPU wheel, pin it: `make test TORCH=torch==2.13.0`
# (.ci/run does this).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch>=2.6
ARGS   ?=
PY     := $(VENV)/bin/python

SYSTEM_TORCH := $(shell $(PYTHON) -c "import torch" >/dev/null 2>&1 && echo yes)
VENV_FLAGS   ?= $(if $(SYSTEM_TORCH),--system-site-packages,)

.PHONY: test report clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,report]"
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q $(ARGS)

report: $(VENV)/.installed
	$(PY) -m profiling report $(ARGS)

clean:
	rm -rf $(VENV) reports .pytest_cache
