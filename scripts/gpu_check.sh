#!/usr/bin/env bash
# The GPU check: run once on a new GPU server before opening it to users (README, "GPU").
#   bash scripts/gpu_check.sh [--dry-run] [--report FILE] [--device cuda:N] [--only STEP ...]
# From a bare machine with this repository and ../shared (the parity fixtures and prompt audio):
# installs Python's venv module if missing (as root, apt-get), then .venv with torch (the CUDA build
# when nvidia-smi lists a GPU) and cosyserve with its gpu extra, then runs scripts/gpu_check.py, which
# writes one JSON report (default gpu_check_report.json) and exits non-zero when any check failed.
# About 8 minutes on one datacenter GPU, most of it the install. --dry-run: the same plan on the CPU,
# CUDA-only steps listed as skipped.
# Settings: GPU_CHECK_PYTHON=/path/to/python skips the install and uses that interpreter;
# COSYSERVE_SHARED=DIR if ../shared is elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
export COSYSERVE_SHARED="${COSYSERVE_SHARED:-$(cd .. && pwd)/shared}"
if [ ! -d "$COSYSERVE_SHARED/parity/tiny" ]; then
  echo "gpu_check.sh: $COSYSERVE_SHARED/parity/tiny not found: set COSYSERVE_SHARED" >&2
  exit 2
fi
py="${GPU_CHECK_PYTHON:-}"
if [ -z "$py" ]; then
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
    else
      echo "gpu_check.sh: Python's venv module is missing: install python3-venv" >&2
      exit 2
    fi
  fi
  COSYSERVE_TORCH="${COSYSERVE_TORCH:-2.13.0}" COSYSERVE_EXTRAS="gpu" bash scripts/install.sh
  py=.venv/bin/python
fi
exec "$py" scripts/gpu_check.py "$@"
