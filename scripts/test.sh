#!/usr/bin/env bash
# Install cosyserve with its test extras into .venv (CPU torch 2.13.0) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
COSYSERVE_TORCH="${COSYSERVE_TORCH:-2.13.0}" COSYSERVE_EXTRAS="test,download" bash scripts/install.sh
.venv/bin/ruff check src tests
.venv/bin/python -m pytest "$@"
