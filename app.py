"""Start the cosyserve web service: `python app.py --device cuda --port 7860` is `cosyserve serve …`."""

import sys
from pathlib import Path

try:
    import cosyserve  # noqa: F401
except ImportError:  # a source checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parent / "src"))

from cosyserve.cli import serve_main as main

if __name__ == "__main__":
    sys.exit(main())
