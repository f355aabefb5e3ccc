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

from cosyserve.ui.bridge.batches import SCRIPT_SUFFIXES, SUBTITLE_SUFFIXES, BatchBridge
from cosyserve.ui.bridge.exports import (
    AUTH_COOKIES,
    INSTRUCT_PRESETS,
    MAX_SEED,
    PLAIN,
    PRONUNCIATION,
    ROLES,
    SESSION_COOKIE,
    TAG,
    AudioStream,
    AuthRequired,
    BatchStatus,
    Forbidden,
    OptionalPart,
    Principal,
    RateLimited,
    Service,
    Span,
    StoredOutput,
    SynthesisRequest,
    TakeReport,
    TextPreview,
    Ticket,
    TtsOutcome,
    Voice,
    log_failure,
    manifest_timings,
    new_request_id,
    resolve_instruction,
    to_srt,
)
from cosyserve.ui.bridge.facade import DOWNLOAD_FORMATS, MODES, UiBridge
from cosyserve.ui.bridge.uploads import UploadProblem, UploadRefused

__all__ = [
    "AUTH_COOKIES",
    "DOWNLOAD_FORMATS",
    "INSTRUCT_PRESETS",
    "MAX_SEED",
    "MODES",
    "PLAIN",
    "PRONUNCIATION",
    "ROLES",
    "SCRIPT_SUFFIXES",
    "SESSION_COOKIE",
    "SUBTITLE_SUFFIXES",
    "TAG",
    "AudioStream",
    "AuthRequired",
    "BatchBridge",
    "BatchStatus",
    "Forbidden",
    "OptionalPart",
    "Principal",
    "RateLimited",
    "Service",
    "Span",
    "StoredOutput",
    "SynthesisRequest",
    "TakeReport",
    "TextPreview",
    "Ticket",
    "TtsOutcome",
    "UiBridge",
    "UploadProblem",
    "UploadRefused",
    "Voice",
    "log_failure",
    "manifest_timings",
    "new_request_id",
    "resolve_instruction",
    "to_srt",
]
