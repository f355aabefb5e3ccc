#!/usr/bin/env bash
# Create .venv and install cosyserve into it, torch first:
# - on a machine without an NVIDIA GPU, torch's CPU build from PyTorch's CPU wheel index (~1 GB venv
#   instead of ~6 GB); if that index is unreachable, the default build from your package index, saying so;
# - with an NVIDIA GPU (nvidia-smi lists one), the default build, which on Linux x86_64 is the CUDA one.
# Settings (environment variables):
#   COSYSERVE_TORCH        a torch version to install, e.g. 2.13.0 (default: the newest that fits torch>=2.6)
#   COSYSERVE_TORCH_BUILD  cpu, cuda or auto (default auto: cuda when nvidia-smi lists a GPU)
#   COSYSERVE_EXTRAS       the package's extras (default: download)
# A torch already in .venv is kept when it is the version and build asked for.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
extras="${COSYSERVE_EXTRAS:-download}"
cpu_index="https://download.pytorch.org/whl/cpu"
build="${COSYSERVE_TORCH_BUILD:-auto}"
case "$build" in
  auto) if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then build=cuda; else build=cpu; fi ;;
  cpu|cuda) ;;
  *) echo "install.sh: COSYSERVE_TORCH_BUILD must be cpu, cuda or auto (got '$build')" >&2; exit 2 ;;
esac
spec="torch>=2.6"
[ -n "${COSYSERVE_TORCH:-}" ] && spec="torch==${COSYSERVE_TORCH}"

[ -x .venv/bin/python ] || "$python_bin" -m venv .venv
py=.venv/bin/python
$py -m pip install --quiet --upgrade pip

# "<version without local label> <cpu|cuda>" of the torch in .venv, or nothing.
installed_torch() {
  $py -c 'import torch; print(torch.__version__.split("+")[0], "cuda" if torch.version.cuda else "cpu")' \
    2>/dev/null || true
}
index_reachable() {
  $py - "$cpu_index/" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=8)
PY
}

have=$(installed_torch)
want_version="${COSYSERVE_TORCH:-}"
keep=no
if [ -n "$have" ]; then
  have_version=${have% *}; have_build=${have#* }
  if { [ -z "$want_version" ] || [ "$have_version" = "$want_version" ]; } && [ "$have_build" = "$build" ]; then
    keep=yes
  fi
fi
if [ "$keep" = no ]; then
  if [ "$build" = cpu ] && index_reachable; then
    echo "installing torch ($spec, CPU build) from $cpu_index"
    $py -m pip install --quiet --index-url "$cpu_index" "$spec"
  elif [ "$build" = cpu ]; then
    echo "PyTorch's CPU wheel index ($cpu_index) is unreachable: installing the default torch build" \
         "($spec) from your package index; on Linux x86_64 that may be the CUDA build (several GB)"
    $py -m pip install --quiet "$spec"
  else
    echo "installing torch ($spec, default build: CUDA on Linux x86_64)"
    $py -m pip install --quiet "$spec"
  fi
fi
$py -m pip install --quiet -e ".[${extras}]"
# On Linux x86_64 the package wants onnxruntime-gpu; a venv made before that still has the CPU-only
# onnxruntime, and two distributions owning one package overwrite each other's files: keep one.
if $py -c 'import importlib.metadata as m, sys
names = ("onnxruntime", "onnxruntime-gpu")
sys.exit(0 if all(any(True for _ in m.distributions(name=n)) for n in names) else 1)' 2>/dev/null; then
  echo "removing the CPU-only onnxruntime that an earlier install left beside onnxruntime-gpu"
  $py -m pip uninstall --quiet -y onnxruntime onnxruntime-gpu
  $py -m pip install --quiet -e ".[${extras}]"
fi
read -r got_version got_build <<<"$(installed_torch)"
[ "$got_build" = "$build" ] || echo "note: asked for torch's $build build, got the $got_build build"
echo "installed: $(.venv/bin/cosyserve --version), torch $got_version ($got_build build)," \
     "$(du -sh .venv 2>/dev/null | cut -f1) in $(pwd)/.venv"
