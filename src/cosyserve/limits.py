"""The limits input is checked against, written once for every layer: the engine, the service, the API,
the web UI and the CLI all read them from here.

Where a server operator may change a limit it is a setting (`LimitSettings`: `max_text_chars`,
`max_upload_mb`, ...) and its default is here. This module imports nothing, so the engine and the CLI's
argument parser read it at no cost.
"""

from __future__ import annotations

# -- text ----------------------------------------------------------------------------------------------

DEFAULT_MAX_TEXT_CHARS = 200  # the longest text one request carries (setting `max_text_chars`)
DEFAULT_MAX_BATCH_ITEMS = 1000  # the most items one batch carries (setting `max_batch_items`)
MAX_INSTRUCT_CHARS = 500  # an instruction (`instruct`), and a prompt recording's transcript
MAX_LIST_OFFSET = 10**9  # past any list's end (a database integer takes at most 2^63 - 1: larger was a 500)

# -- how it is spoken ----------------------------------------------------------------------------------

MIN_SPEED, MAX_SPEED = 0.5, 2.0  # what the flow's length regulator supports (`engine.token2wav`)
SPEED_RANGE_TEXT = f"{MIN_SPEED:g} to {MAX_SPEED:g}"  # as help texts say it
MIN_VOLUME, MAX_VOLUME = 0.0, 4.0  # linear gain on the output
# A dub's cue longer than its slot is sped up at most this much (callers may choose up to MAX_SPEED).
MIN_DUB_MAX_SPEED, DEFAULT_DUB_MAX_SPEED = 1.0, 1.25

# -- uploads -------------------------------------------------------------------------------------------

# The suffixes of what the audio decoder (libsndfile) reads: the one list behind the API's and the web
# UI's upload checks. M4A/AAC and WebM would need an ffmpeg-based decoder, which cosyserve does not depend
# on: they are refused by name before anything is decoded.
AUDIO_SUFFIXES = (
    ".wav",
    ".wave",
    ".flac",
    ".mp3",
    ".ogg",
    ".oga",
    ".opus",
    ".aif",
    ".aiff",
    ".au",
    ".snd",
    ".caf",
    ".w64",
)
AUDIO_SUFFIX_LIST = ", ".join(suffix.lstrip(".") for suffix in AUDIO_SUFFIXES)  # for messages
SCRIPT_SUFFIXES = (".csv", ".txt", ".jsonl", ".json")  # a batch's script (the web UI's file picker)
SUBTITLE_SUFFIXES = (".srt", ".vtt")  # a dub's subtitles
DEFAULT_MAX_UPLOAD_MB = 20.0  # the largest upload (setting `max_upload_mb`)


def upload_bytes(max_upload_mb: float) -> int:
    """The upload limit in bytes: settings give it in MB of 10^6 bytes."""
    return int(max_upload_mb * 1e6)
