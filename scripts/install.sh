#!/usr/bin/env bash
# Create .venv and install cosyserve into it, torch first.
# Without an NVIDIA GPU (nvidia-smi lists none) torch's CPU build wherever pip can get it (a venv of about
# 2 GB instead of ~6.5 GB), in this order:
#   1. from PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu);
#   2. from your configured package index, if the build pip would take there is a CPU one: the version
#      asked for, then the version the tests pin (TESTED_TORCH; no nvidia-* requirements, no +cu label);
#   3. only as the last resort the default build (CUDA on Linux x86_64), with a warning naming its size
#      and the one line that switches to the CPU build later.
# With an NVIDIA GPU, the default (CUDA) build.
# Switching builds removes the wheels the old build brought (nvidia-*, triton), so a venv that held the
# CUDA build shrinks back when it gets the CPU one. It ends by printing torch's version, build and the
# venv's size.
# Settings (environment variables):
#   COSYSERVE_TORCH        a torch version to install, e.g. 2.13.0 (default: the newest that fits torch>=2.6)
#   COSYSERVE_TORCH_BUILD  cpu, cuda or auto (default auto: cuda when nvidia-smi lists a GPU)
#   COSYSERVE_EXTRAS       the package's extras (default: download)
#   COSYSERVE_CPU_INDEX    PyTorch's CPU wheel index (default https://download.pytorch.org/whl/cpu)
# A torch already in .venv is kept when it is the version and build asked for.
set -euo pipefail
cd "$(dirname "$0")/.."
python_bin="${PYTHON:-python3}"
extras="${COSYSERVE_EXTRAS:-download}"
cpu_index="${COSYSERVE_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
TESTED_TORCH=2.13.0  # the version scripts/test.sh pins
CUDA_VENV_SIZE="about 6.5 GB"
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
# "<version> <cpu|cuda>" of the torch wheel pip would take from the configured index for $1 (nothing
# installed: a dry run reads the wheel's metadata), or nothing when pip finds none.
index_build() {
  local report
  report=$(mktemp)
  if ! $py -m pip install --quiet --dry-run --ignore-installed --no-deps --report "$report" "$1" \
       >/dev/null 2>&1; then
    rm -f "$report"; return 0
  fi
  $py - "$report" <<'PY' || true
import json, sys
try:  # pip's own copy: evaluates `; platform_system == "Linux"` for this machine
    from pip._vendor.packaging.requirements import Requirement
except ImportError:
    Requirement = None

def active(requirement):
    if Requirement is None:
        return True
    marker = Requirement(requirement).marker
    return marker is None or marker.evaluate({"extra": ""})

for item in json.load(open(sys.argv[1], encoding="utf-8")).get("install", []):
    meta = item.get("metadata", {})
    if meta.get("name", "").lower() != "torch":
        continue
    version = meta.get("version", "")
    needs_cuda = any(r.lower().startswith("nvidia-") and active(r) for r in meta.get("requires_dist") or [])
    print(version.split("+")[0], "cuda" if needs_cuda or "+cu" in version else "cpu")
PY
  rm -f "$report"
}
# Distributions that only a CUDA torch brings: nvidia-* (CUDA runtime, cuDNN, NCCL, …; not nvidia-ml-py,
# which cosyserve itself needs), the cuda-toolkit/cuda-bindings/cuda-pathfinder wheels and triton.
cuda_wheels() {
  $py -c 'import importlib.metadata as m
names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in m.distributions()}
cuda = {"triton", "cuda-toolkit", "cuda-bindings", "cuda-pathfinder"}
print(" ".join(sorted(n for n in names if n in cuda or (n.startswith("nvidia-") and n != "nvidia-ml-py"))))' \
    2>/dev/null || true
}
remove_cuda_wheels() {
  local wheels
  wheels=$(cuda_wheels)
  if [ -n "$wheels" ]; then
    echo "removing the CUDA build's wheels: $wheels"
    # shellcheck disable=SC2086
    $py -m pip uninstall --quiet -y $wheels
  fi
}
install_cpu_torch() {
  if index_reachable; then
    if $py -m pip install --quiet --index-url "$cpu_index" "$spec"; then
      echo "installed torch ($spec, CPU build) from $cpu_index"
      return 0
    fi
    echo "PyTorch's CPU wheel index ($cpu_index) has no $spec: looking on your package index"
  else
    echo "PyTorch's CPU wheel index ($cpu_index) is unreachable: looking on your package index"
  fi
  local candidates=("$spec") candidate found
  if [ -z "${COSYSERVE_TORCH:-}" ]; then candidates+=("torch==$TESTED_TORCH"); fi
  for candidate in "${candidates[@]}"; do
    found=$(index_build "$candidate")
    if [ "${found#* }" = cpu ]; then
      echo "installing torch ${found% *} (CPU build) from your package index"
      $py -m pip install --quiet "$candidate"
      return 0
    fi
  done
  echo "WARNING: no CPU build of torch is reachable (neither $cpu_index nor your package index offers one" \
       "for $spec): installing the CUDA build, $CUDA_VENV_SIZE of venv that a machine without an NVIDIA" \
       "GPU cannot use. To switch once the CPU index is reachable, run:" \
       "COSYSERVE_TORCH_BUILD=cpu bash scripts/install.sh" >&2
  $py -m pip install --quiet "$spec"
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
if [ "$keep" = no ] && [ -n "$have" ]; then
  echo "replacing torch $have_version ($have_build build)"
  $py -m pip uninstall --quiet -y torch  # else a torch that satisfies $spec would stay
fi
if [ "$keep" = no ] && [ "$build" = cpu ]; then
  remove_cuda_wheels  # the old build's; cosyserve's extras bring back any they need (gpu)
  install_cpu_torch
elif [ "$keep" = no ]; then
  echo "installing torch ($spec, default build: CUDA on Linux x86_64)"
  $py -m pip install --quiet "$spec"
elif [ "$build" = cpu ] && [[ ",$extras," != *,gpu,* ]]; then
  remove_cuda_wheels  # left by an earlier switch that did not remove them
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
