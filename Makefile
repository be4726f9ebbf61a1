# The two entry points of the README: `make run` and `make test`.
# Both create .venv with Python 3.10 when it is missing and install the project
# with the pinned constraints, so they work on a fresh machine.

PYTHON ?= python3.10
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export PYTHONWARNINGS := ignore::FutureWarning

.PHONY: run test lint install clean bench-torch

install: $(STAMP)

$(STAMP): setup.py constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,lint]"
	@touch $@

# The full pipeline on the built-in corpus (ARGS="..." passes options to `deepseek-tfx run`).
run: $(STAMP)
	$(VENV)/bin/deepseek-tfx run $(ARGS)

# The whole test suite, every tier (PYTEST_ARGS="..." passes options to pytest).
test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

# ruff, configured in ruff.toml (rules and why); .ci/run runs this before the tests.
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# A Python with torch for bench.torch_compare only (torch is a bench-only extra, not a dependency): PyPI has
# no CPU-only torch for Python 3.10, so this uses Python 3.11 and the CPU wheel (the `bench` extra in setup.py).
TORCH_PYTHON ?= python3.11
bench-torch: .venv-torch/.installed-stamp
.venv-torch/.installed-stamp:
	@test -x .venv-torch/bin/python || $(TORCH_PYTHON) -m venv .venv-torch
	.venv-torch/bin/pip install --quiet "torch==2.13.0+cpu" numpy
	@touch $@

clean:
	rm -rf deepseek_tfx_output .pytest_cache
