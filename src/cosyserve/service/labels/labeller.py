"""What the service does to label an output: one `Labeller` built from the settings at start.

- `label_file`: the implicit label (bound to the file's audio, signed) and, where c2pa-python is installed
  and the format takes one, a C2PA manifest; used wherever a whole file is stored or served.
- `explicit_for`: the explicit label of one output (None when off): the cue's tones or the spoken notice.
- `stream_encoder`: wraps a `StreamEncoder` so a stream's container header carries the label (not bound to
  audio that does not exist yet) and the explicit label plays first (and last).
- `with_explicit`: a finished result with its explicit label, sentence timings shifted to match.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cosyserve.service.labels import c2pa_manifest, cue, riff_tags
from cosyserve.service.labels.containers import TAGGERS
from cosyserve.service.labels.errors import LabelFormatError
from cosyserve.service.labels.implicit import ImplicitLabel, bound_hash
from cosyserve.service.labels.notice import NoticeCache
from cosyserve.service.outcomes import SynthesisResult
from cosyserve.service.requests import EVERY_VOICE, SynthesisRequest, VoiceScope

if TYPE_CHECKING:
    from cosyserve.service.audio_formats import StreamEncoder
    from cosyserve.service.settings import Settings
    from cosyserve.service.stores.output_files import StoredOutput

log = logging.getLogger(__name__)

C2PA_FILE_MAX_BYTES = 256 << 20  # a dub track of ~1.5 h at 24 kHz: C2PA signs whole files in memory

# The OutputSpec.extra key whose False skips the explicit label (admins only, checked by the API).
OPT_OUT = "explicit_label"
EXPLICIT_KINDS = ("cue", "notice")
STREAM_HEADER_LIMIT = 1 << 20  # bytes a stream may hold back while its container header is incomplete


class Labeller:
    """Labels outputs as the settings say; `Labeller.disabled()` labels nothing (tests, tools)."""

    def __init__(
        self,
        *,
        provider: str,
        secret: bytes,
        implicit: bool = True,
        explicit: str = "off",
        explicit_kind: str = "cue",
        c2pa: c2pa_manifest.C2paSigner | None = None,
        c2pa_note: str = "off",
    ) -> None:
        if explicit not in cue.EXPLICIT_MODES:
            raise ValueError(f"explicit must be one of {', '.join(cue.EXPLICIT_MODES)}, got {explicit!r}")
        if explicit_kind not in EXPLICIT_KINDS:
            raise ValueError(
                f"explicit_kind must be one of {', '.join(EXPLICIT_KINDS)}, got {explicit_kind!r}"
            )
        self.explicit_kind = explicit_kind
        self.notices = NoticeCache()
        self.provider = provider
        self.secret = secret
        self.implicit = implicit
        self.explicit = explicit
        self.c2pa = c2pa
        self.c2pa_note = c2pa_note  # why C2PA is on or off, for the startup log and the output manifests

    @classmethod
    def disabled(cls) -> Labeller:
        return cls(provider="", secret=b"", implicit=False, explicit="off")

    @classmethod
    def from_settings(cls, settings: Settings) -> Labeller:
        labels = settings.labels
        signer, note = None, "off (c2pa = false)"
        if labels.c2pa and not c2pa_manifest.available():
            note = "off: c2pa-python is not installed (pip install 'cosyserve[labels]')"
        elif labels.c2pa:
            creds = c2pa_manifest.load_credentials(
                labels.c2pa_cert_file, labels.c2pa_key_file, settings.storage.data_dir
            )
            signer = c2pa_manifest.C2paSigner(creds)
            note = "on, self-signed (private deployment)" if creds.self_signed else "on"
        labeller = cls(
            provider=labels.label_provider,
            secret=settings.resolve_signing_secret().get_secret_value().encode("utf-8"),
            implicit=labels.label_implicit,
            explicit=labels.label_explicit,
            explicit_kind=labels.label_explicit_kind,
            c2pa=signer,
            c2pa_note=note,
        )
        log.info("output labels: %s", labeller.describe())
        return labeller

    def describe(self) -> dict[str, Any]:
        explicit = self.explicit if self.explicit == "off" else f"{self.explicit} ({self.explicit_kind})"
        return {"implicit": self.implicit, "explicit": explicit, "c2pa": self.c2pa_note}

    # -- whole files ----------------------------------------------------------------------------------

    def label_json(self, content_id: str, audio_sha256: str | None) -> str:
        label = ImplicitLabel(
            content_producer=self.provider,
            produce_id=content_id,
            audio_sha256=audio_sha256,
            content_propagator=self.provider,
            propagate_id=content_id,
        )
        return label.to_json(self.secret)

    def label_file(
        self, data: bytes, fmt: str, content_id: str, *, model: str | None = None, voice: str | None = None
    ) -> bytes:
        """`data` (a whole `fmt` file) with its implicit label and C2PA manifest; raw pcm is returned as it
        is (no container to hold a label). A file that can't be labelled is logged and returned as is."""
        tagger = TAGGERS.get(fmt)
        if tagger is None or not (self.implicit or self.c2pa):
            return data
        try:
            if self.implicit:
                bound = bound_hash(tagger.format_fields(data), tagger.payload(data))
                data = tagger.embed(data, self.label_json(content_id, bound))
        except LabelFormatError as exc:
            log.warning("output %s (%s) was not labelled: %s", content_id, fmt, exc)
            return data
        except Exception:  # a bug in the tag code must not cost the caller the audio: logged loudly
            log.exception("output %s (%s) was not labelled", content_id, fmt)
            return data
        if self.c2pa is not None:
            try:
                data = self.c2pa.sign(data, fmt, content_id=content_id, model=model, voice=voice)
            except Exception as exc:  # an optional extra: the output is still served, with its label
                log.warning("output %s (%s): no C2PA manifest: %s", content_id, fmt, exc)
        return data

    def label_output(
        self, audio: bytes | Path, ext: str, output_id: str, record: dict[str, Any]
    ) -> bytes | Path:
        """A result being stored as `output_id`, labelled with that id (its `record`, the sidecar, says how):
        bytes as `label_file` does; a WAV file on disk (a dub track) in place: the implicit label in
        blocks, the C2PA manifest where the file is small enough to sign in memory."""
        record["labels"] = self.describe()
        if isinstance(audio, Path):
            if ext == "wav":
                self.label_wav_file(audio, output_id)
                self._sign_wav_file(audio, output_id, record)
            return audio
        model, voice = record.get("model_checksum"), record.get("voice")
        return self.label_file(audio, ext, output_id, model=model, voice=voice)

    def label_wav_file(self, path: Path, content_id: str | None) -> None:
        """Label a WAV file on disk in place (a dub track of hours): its samples hashed and copied in
        blocks, never held whole. The implicit label only: C2PA signs whole files in memory. `content_id`
        None: `local-` and the start of the samples' SHA-256, as the CLI names its files."""
        if not self.implicit:
            return
        try:
            riff_tags.label_file(
                path, lambda digest: self.label_json(content_id or f"local-{digest[:16]}", digest)
            )
        except LabelFormatError as exc:
            log.warning("output %s (wav file) was not labelled: %s", content_id or path.name, exc)

    def _sign_wav_file(self, path: Path, content_id: str, record: dict[str, Any]) -> None:
        """The C2PA manifest of a WAV file on disk, replaced whole; not for one over `C2PA_FILE_MAX_BYTES`
        (C2PA signs whole files in memory), which keeps its implicit label (logged)."""
        if self.c2pa is None:
            return
        size = path.stat().st_size
        if size > C2PA_FILE_MAX_BYTES:
            log.info(
                "output %s: %d MB, no C2PA manifest (over %d MB)",
                content_id,
                size >> 20,
                C2PA_FILE_MAX_BYTES >> 20,
            )
            return
        model, voice = record.get("model_checksum"), record.get("voice")
        try:
            signed = self.c2pa.sign(path.read_bytes(), "wav", content_id=content_id, model=model, voice=voice)
            partial = path.with_name(path.name + ".c2pa")
            partial.write_bytes(signed)
            os.replace(partial, path)
        except Exception as exc:  # an optional extra: the track is still stored, with its implicit label
            log.warning("output %s (wav file): no C2PA manifest: %s", content_id, exc)

    def label_stored(self, data: bytes, fmt: str, output: StoredOutput) -> bytes:
        """A stored output transcoded to `fmt` (a download, an archive entry), labelled with its id."""
        manifest = output.manifest
        return self.label_file(
            data, fmt, output.id, model=manifest.get("model_checksum"), voice=manifest.get("voice")
        )

    # -- explicit label -----------------------------------------------------------------------------------

    def explicit_mode(self, extra: dict[str, Any]) -> str:
        """The explicit-label mode for one request (`extra[OPT_OUT] is False`: an admin skipped it)."""
        return "off" if extra.get(OPT_OUT) is False else self.explicit

    def explicit_for(
        self, synth: Any, request: SynthesisRequest, extra: dict[str, Any], voices: VoiceScope = EVERY_VOICE
    ) -> cue.ExplicitLabel | None:
        """The explicit label of one output made by `synth` (a Synthesizer) for `request`: None when off,
        else the cue, or the spoken notice in the request's voice (synthesised on first use per voice,
        language and model; call before the request's own synthesis starts)."""
        mode = self.explicit_mode(extra)
        if mode == "off":
            return None
        rate = synth.sample_rate
        if self.explicit_kind == "cue":
            return cue.tones(mode, rate)

        def speak(notice: SynthesisRequest) -> np.ndarray:
            return synth.synthesize(notice, voices=voices).result().audio

        # the caller's own voice of that name (a name is per owner): VoiceNotFound as its synthesis would
        library = getattr(synth, "voices", None)
        voice_id = library.get(request.voice, voices).id if request.voice and library is not None else None
        spoken = self.notices.get(request, synth.model_dir.fingerprint, rate, speak, voice_id)
        pause = np.zeros(round(cue.PAUSE_S * rate), dtype=np.float32)
        end = np.concatenate([pause, spoken[: len(spoken) - len(pause)]]) if mode == "start_and_end" else None
        return cue.ExplicitLabel(spoken, end)

    @staticmethod
    def with_explicit(result: SynthesisResult, label: cue.ExplicitLabel | None) -> SynthesisResult:
        return cue.with_label(result, label)

    # -- streams --------------------------------------------------------------------------------------

    def stream_encoder(
        self, encoder: StreamEncoder, content_id: str, label: cue.ExplicitLabel | None
    ) -> LabelledStream:
        return LabelledStream(encoder, self, content_id, label)


class LabelledStream:
    """A `StreamEncoder` whose output starts with the explicit label and whose container header carries
    the implicit one.

    Same interface as the encoder. Bytes are held back only until the header is complete (FLAC and Ogg
    write it with their first audio), then the header is labelled and everything flows through.
    """

    def __init__(
        self, encoder: StreamEncoder, labeller: Labeller, content_id: str, explicit: cue.ExplicitLabel | None
    ) -> None:
        self._encoder = encoder
        self.format = encoder.format
        self.sample_rate = encoder.sample_rate
        self.media_type = encoder.media_type
        self._explicit = explicit
        self._tagger = TAGGERS.get(encoder.format) if labeller.implicit else None
        self._label = labeller.label_json(content_id, None) if self._tagger is not None else ""
        self._held = bytearray()
        self._content_id = content_id

    def header(self) -> bytes:
        data = self._encoder.header()
        if self._explicit is not None:
            data += self._encoder.encode(self._explicit.start)
        return self._pass(data)

    def encode(self, chunk: np.ndarray) -> bytes:
        return self._pass(self._encoder.encode(chunk))

    def finish(self) -> bytes:
        data = b""
        if self._explicit is not None and self._explicit.end is not None:
            data += self._encoder.encode(self._explicit.end)
        return self._pass(data + self._encoder.finish(), last=True)

    def _pass(self, data: bytes, *, last: bool = False) -> bytes:
        if self._tagger is None:
            return data
        self._held += data
        try:
            labelled = self._tagger.embed(bytes(self._held), self._label)
        except LabelFormatError as exc:
            if not last and len(self._held) < STREAM_HEADER_LIMIT:
                return b""  # the header is not complete yet
            log.warning("stream %s (%s) was not labelled: %s", self._content_id, self.format, exc)
            labelled = bytes(self._held)
        self._tagger = None
        self._held.clear()
        return labelled
