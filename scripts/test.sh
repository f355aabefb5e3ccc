#!/usr/bin/env bash
# Install cosyserve with its test extras into .venv (torch 2.13.0: the CPU build unless an NVIDIA GPU is
# present) and run the whole test suite.
# The browser tests use Debian's chromium; the distributed-mode tests start their own redis-server and
# PostgreSQL (as the postgres user); the take checks' ASR test speaks English with Debian's flite. As root
# with apt-get available they are installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
have_postgres() { command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; }
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
   && { ! command -v chromium >/dev/null || ! command -v redis-server >/dev/null || ! have_postgres \
        || ! command -v flite >/dev/null; }; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    chromium redis-server postgresql fonts-wqy-microhei flite >/dev/null
fi
COSYSERVE_TORCH="${COSYSERVE_TORCH:-2.13.0}" COSYSERVE_EXTRAS="test,download,distributed,denoise,labels" bash scripts/install.sh
# The similarity check's test reads the GE2E speaker-encoder weights inside resemblyzer's wheel, nothing
# else of it: without its dependencies (librosa, numba, webrtcvad built from source).
.venv/bin/python -m pip install --quiet --no-deps "resemblyzer==0.1.4"
# Which CPU family and torch build this run is on: numerics and kernels differ between AVX2 and AVX-512.
.venv/bin/python -m cosyserve.bench.machine
.venv/bin/ruff check src tests
# Two processes, each test file whole in one of them (module fixtures, and the browser tests' order); each
# test's torch runs one thread (tests/conftest.py), so two use both cores. COSYSERVE_TEST_WORKERS=0: one
# process; arguments after the script's name go to pytest (`-n 0` too).
.venv/bin/python -m pytest -n "${COSYSERVE_TEST_WORKERS:-2}" --dist loadfile --durations=15 "$@"
