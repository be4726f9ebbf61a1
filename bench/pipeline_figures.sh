#!/usr/bin/env bash
# Issue 2's figures: wall time and peak memory of the README's run command (fresh output directory,
# after install) and of the end-to-end test. Prints one `measure:` line for each.
set -euo pipefail
cd "$(dirname "$0")/.."
make install >/dev/null
rm -rf deepseek_tfx_output
.venv/bin/python -m bench.measure -- make run
.venv/bin/python -m bench.measure -- .venv/bin/python -m pytest -q tests/test_e2e.py
