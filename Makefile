# The two entry points of the README: `make run` and `make test`.
# Both create .venv with Python 3.10 when it is missing and install the project
# with the pinned constraints, so they work on a fresh machine.

PYTHON ?= python3.10
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export PYTHONWARNINGS := ignore::FutureWarning

.PHONY: run test lint install clean

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

clean:
	rm -rf deepseek_tfx_output .pytest_cache
