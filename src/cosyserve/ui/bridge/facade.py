"""`UiBridge`: the one object the web UI's pages receive, assembled from one part per concern.

The UI never touches the engine or the synthesizer: synthesis goes through the scheduler
(`service.backend`), voices through the library and `backend.submit_enrolment`, results through the
output store, and every call is made as a `Principal` resolved from the same credentials the API takes
(the API's session cookie, an API key, or nobody when auth is off).
"""

from __future__ import annotations

from cosyserve.service.assembly import Service
from cosyserve.ui.bridge.admin import AdminPart
from cosyserve.ui.bridge.outputs import OutputsPart
from cosyserve.ui.bridge.preview import PreviewPart
from cosyserve.ui.bridge.session import SessionPart
from cosyserve.ui.bridge.status import StatusPart
from cosyserve.ui.bridge.synthesis import SynthesisPart
from cosyserve.ui.bridge.uploads import UploadsPart
from cosyserve.ui.bridge.voices import VoicesPart

DOWNLOAD_FORMATS = ("wav", "mp3", "flac", "opus")
MODES = ("zero_shot", "cross_lingual", "instruct")


class UiBridge(
    SessionPart, StatusPart, UploadsPart, SynthesisPart, PreviewPart, OutputsPart, VoicesPart, AdminPart
):
    """The UI's view of one `Service`: who is calling, the server's state, uploads, synthesis, the text
    preview, stored results, saved voices and the admin panel (the Batch tab's `BatchBridge` wraps it)."""

    def __init__(self, service: Service) -> None:
        self.service = service
