#!/usr/bin/env sh
# Start the cosyserve web service: `./run.sh --device cuda --port 7860` is `cosyserve serve ...`.
# Uses ./.venv when it exists, else the python on PATH.
set -e
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
if [ -x "$here/.venv/bin/python" ]; then
    python="$here/.venv/bin/python"
fi
exec "$python" "$here/app.py" "$@"
