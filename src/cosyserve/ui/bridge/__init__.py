"""The web UI's only way to the service: `UiBridge` (one part per concern, assembled in `facade.py`), the
Batch tab's `BatchBridge`, and the service's types and helpers the pages use (`exports.py`).

    session.py    who is calling (the principal of a page request), the login form's calls
    status.py     the model's readiness, Gradio's event slots, the page's upload limit and private folders
    uploads.py    uploaded recordings: limits, prompt checks, noise reduction, transcription, optional parts
    synthesis.py  one synthesis queued or streamed, long texts as jobs, cancelling
    preview.py    the text preview (computed by `service.text_preview`)
    outputs.py    stored results: one, the history, deleting, signed links
    voices.py     saved voices: listing, recordings, enrolment with consent, renaming, deleting
    admin.py      the admin panel: status, memory, restarts, logs, API keys, enrolments
    batches.py    the Batch tab: scripts and subtitle files as batches and dubs
    exports.py    the service's types, constants and helpers the other UI modules use

Only the modules of this package import `cosyserve.service` or `cosyserve.frontend`; the rest of `ui/`
imports from here (`tests/test_structure.py` checks it).
"""

from cosyserve.ui.bridge import exports
from cosyserve.ui.bridge.batches import SCRIPT_SUFFIXES, SUBTITLE_SUFFIXES, BatchBridge
from cosyserve.ui.bridge.exports import *  # noqa: F403  (its __all__: named there once)
from cosyserve.ui.bridge.facade import DOWNLOAD_FORMATS, MODES, UiBridge
from cosyserve.ui.bridge.uploads import UploadProblem, UploadRefused

__all__ = [
    "DOWNLOAD_FORMATS",
    "MODES",
    "SCRIPT_SUFFIXES",
    "SUBTITLE_SUFFIXES",
    "BatchBridge",
    "UiBridge",
    "UploadProblem",
    "UploadRefused",
]
__all__ += exports.__all__
