#!/usr/bin/env bash
# The first hour of a new user, end to end: clone this repository's committed HEAD into a temporary
# directory, `bash scripts/install.sh` there, start the demo server (`--model demo`, no download), time it
# to /ready, make one synthesis through the API, run a few tests, and report the times and sizes.
# Usage: bash scripts/fresh_trial.sh [--skip-tests] [--keep] [--repo PATH_OR_URL] [--tests "FILES"]
#   --skip-tests  stop after the synthesis (the tests need the test extra: a larger install)
#   --keep        leave the temporary directory (its path is printed) instead of deleting it
# Environment: COSYSERVE_SHARED (the shared fixtures: a speech prompt, the parity model for the tests),
# and install.sh's own settings (COSYSERVE_TORCH_BUILD, …), which it passes on.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="$here"
run_tests=yes
keep=no
tests="tests/test_cli_errors.py tests/test_install_script.py tests/test_describe_text.py"
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-tests) run_tests=no ;;
    --keep) keep=yes ;;
    --repo) repo="$2"; shift ;;
    --tests) tests="$2"; shift ;;
    *) echo "fresh_trial.sh: unknown option $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
  shift
done
shared="${COSYSERVE_SHARED:-$here/../shared}"
prompt="$shared/audio/prompt_b_22k.wav"
[ -f "$prompt" ] || { echo "fresh_trial.sh: no speech prompt at $prompt: set COSYSERVE_SHARED" >&2; exit 2; }

trial="$(mktemp -d "${TMPDIR:-/tmp}/cosyserve-trial.XXXXXX")"
server_pid=""
finish() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  if [ "$keep" = yes ]; then echo "kept $trial"; else rm -rf "$trial"; fi
}
trap finish EXIT
report=()
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
step() { report+=("$(printf '%-28s %s' "$1" "$2")"); echo "== $1: $2"; }
size_of() { du -sh "$1" 2>/dev/null | cut -f1; }

start=$(now)
git clone --quiet "$repo" "$trial/cosyserve"
step "clone" "$(since "$start"), $(size_of "$trial/cosyserve")"
cd "$trial/cosyserve"

start=$(now)
extras="download"
[ "$run_tests" = yes ] && extras="download,test"
COSYSERVE_EXTRAS="$extras" bash scripts/install.sh 2>&1 | tee "$trial/install.log"
step "install ($extras)" "$(since "$start"), venv $(size_of .venv), $(tail -n 1 "$trial/install.log" | \
  sed -n 's/.*torch \([^ ]*\) (\([a-z]*\) build).*/torch \1 \2/p')"

port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export COSYSERVE_HOME="$trial/home"  # the demo model is written here, as on a new machine
start=$(now)
.venv/bin/cosyserve serve --model demo --port "$port" --data-dir "$trial/data" >"$trial/serve.log" 2>&1 &
server_pid=$!
ready=no
for _ in $(seq 1 600); do
  if curl -fsS "http://127.0.0.1:$port/ready" >/dev/null 2>&1; then ready=yes; break; fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.2
done
if [ "$ready" != yes ]; then
  tail -n 20 "$trial/serve.log" >&2
  echo "fresh_trial.sh: the demo server did not become ready (log above)" >&2
  exit 1
fi
step "serve --model demo: /ready" "$(since "$start") (demo model written on first start)"

start=$(now)
curl -fsS -o "$trial/hello.wav" -F text="你好，欢迎使用。" -F prompt_wav=@"$prompt" -F seed=1 \
  "http://127.0.0.1:$port/v1/tts"
step "one synthesis (/v1/tts)" "$(since "$start"), $(stat -c %s "$trial/hello.wav") bytes of WAV"
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""

if [ "$run_tests" = yes ]; then
  start=$(now)
  # shellcheck disable=SC2086
  COSYSERVE_SHARED="$shared" .venv/bin/python -m pytest -q -p no:cacheprovider $tests | tail -n 3
  step "tests ($(echo $tests | wc -w) files)" "$(since "$start")"
else
  step "tests" "skipped (--skip-tests)"
fi
step "sizes" "venv $(size_of .venv), demo model $(size_of "$trial/home/models"), data $(size_of "$trial/data")"
echo
echo "fresh trial of $(git -C "$trial/cosyserve" log -1 --format='%h %cs') on $(nproc) CPUs:"
printf '  %s\n' "${report[@]}"
