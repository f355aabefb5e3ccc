"""The service's (and the frontend's) types, constants and helpers that the UI's other modules use, named
here once so that they import only the bridge (`tests/test_structure.py` holds them to it)."""

from __future__ import annotations

from cosyserve.errors import VoiceNotFound
from cosyserve.frontend.text.presets import INSTRUCT_PRESETS
from cosyserve.frontend.text.prompts import resolve_instruction
from cosyserve.service.access.principals import AuthRequired, Forbidden, Principal, RateLimited
from cosyserve.service.access.sessions import AUTH_COOKIES, SESSION_COOKIE
from cosyserve.service.assembly import Service
from cosyserve.service.backend import AudioStream
from cosyserve.service.batches.status import BatchStatus
from cosyserve.service.logs import log_failure, new_request_id, one_line
from cosyserve.service.optional_parts import OptionalPart
from cosyserve.service.outcomes import TtsOutcome
from cosyserve.service.quality import TakeReport
from cosyserve.service.requests import MAX_SEED, SynthesisRequest
from cosyserve.service.scheduling.scheduler import Ticket
from cosyserve.service.stores.batches import BatchItem
from cosyserve.service.stores.job_table import JobRecord
from cosyserve.service.stores.keys import ROLES
from cosyserve.service.stores.outputs import StoredOutput
from cosyserve.service.stores.voices import Voice
from cosyserve.service.subtitles import manifest_timings, to_srt
from cosyserve.service.text_preview import PLAIN, PRONUNCIATION, TAG, ReadingFields, Span, TextPreview

__all__ = [
    "AUTH_COOKIES",
    "INSTRUCT_PRESETS",
    "MAX_SEED",
    "PLAIN",
    "PRONUNCIATION",
    "ROLES",
    "SESSION_COOKIE",
    "TAG",
    "AudioStream",
    "AuthRequired",
    "BatchItem",
    "BatchStatus",
    "Forbidden",
    "JobRecord",
    "OptionalPart",
    "Principal",
    "RateLimited",
    "ReadingFields",
    "Service",
    "Span",
    "StoredOutput",
    "SynthesisRequest",
    "TakeReport",
    "TextPreview",
    "Ticket",
    "TtsOutcome",
    "Voice",
    "VoiceNotFound",
    "log_failure",
    "manifest_timings",
    "new_request_id",
    "one_line",
    "resolve_instruction",
    "to_srt",
]
