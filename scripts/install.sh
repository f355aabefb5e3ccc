#!/usr/bin/env bash
# Create .venv and install cosyserve into it. Torch comes first so that a CPU-only machine that already
# has a CPU wheel keeps it; on a GPU machine pip's default torch is the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
extras="${COSYSERVE_EXTRAS:-download}"
[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if [ -n "${COSYSERVE_TORCH:-}" ]; then
    .venv/bin/python -m pip install --quiet "torch==${COSYSERVE_TORCH}"
  else
    .venv/bin/python -m pip install --quiet "torch>=2.6"
  fi
fi
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
echo "installed: $(.venv/bin/cosyserve --version) in $(pwd)/.venv"
