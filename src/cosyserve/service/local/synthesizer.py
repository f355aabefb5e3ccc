"""The Synthesizer: text + voice → audio, joining the text frontend, prompt analysis and the engine.

    synth = Synthesizer.load("demo")                       # or a model directory
    stream = synth.synthesize(SynthesisRequest(text="你好，世界。", prompt_wav=wav, prompt_text="…"))
    for chunk in stream: play(chunk.samples)                # sentence by sentence, or chunked
    result = stream.result()                                # seed, timings, stage seconds, warnings

Every input is checked when `synthesize` is called (InputError), before any audio is produced, so
callers can answer with a clear error instead of a broken stream. Running out of memory anywhere in
a synthesis or an enrolment (the engine, the prompt models on onnxruntime, the flow's prompt cache, the
host's own arrays) raises `OutOfMemory` (a 503 with Retry-After), the engine usable after it.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import threading
import time
from collections import OrderedDict
from pathlib import Path

from cosyserve.engine.device import Placement, configure_cpu_threads, resolve_placement
from cosyserve.engine.memory import out_of_memory_as_error
from cosyserve.engine.pipeline import EngineOptions, SpeechEngine
from cosyserve.engine.speech_lm_runner import PromptPrefix
from cosyserve.engine.token2wav import (
    DEFAULT_PROMPT_STORE_BYTES,
    FlowPrompt,
    PromptCache,
    PromptCacheStore,
)
from cosyserve.errors import InputError
from cosyserve.frontend.onnx_models import SpeakerEncoder, SpeechTokenizer
from cosyserve.frontend.prompt_features import PromptFeatures, analyse_prompt
from cosyserve.frontend.text import PreparedText, prepare_texts
from cosyserve.frontend.tokenizer import TextTokenizer
from cosyserve.limits import DEFAULT_MAX_TEXT_CHARS, MAX_SPEED, MIN_SPEED
from cosyserve.modeldir.model_dir import ModelDir
from cosyserve.service.local.synthesis_stream import ProgressCallback, SynthesisPlan, SynthesisStream
from cosyserve.service.local.voice_pins import PinnedVoice
from cosyserve.service.outcomes import SynthesisResult
from cosyserve.service.quality import MAX_TAKES, TakePolicy
from cosyserve.service.quality.overrides import apply_overrides
from cosyserve.service.quality.pace import voice_seconds_per_unit
from cosyserve.service.quality.scorer import TakeScorer, Transcriber
from cosyserve.service.requests import EVERY_VOICE, MAX_SEED, SynthesisRequest, VoiceScope
from cosyserve.service.stores.voices import Voice, VoiceLibrary

__all__ = ["ProgressCallback", "SynthesisStream", "Synthesizer"]
PREFIX_CACHE_SIZE = 32
# Streaming caches of the flow's prompt K/V hold ~0.9 GB per 6 s voice at full size: keep only a few.


class Synthesizer:
    """A loaded model with its text and prompt front ends and (optionally) a voice library."""

    def __init__(
        self,
        model_dir: ModelDir,
        engine: SpeechEngine,
        tokenizer: TextTokenizer,
        speaker_encoder: SpeakerEncoder,
        speech_tokenizer: SpeechTokenizer,
        *,
        voices: VoiceLibrary | None = None,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
        lexicon: dict[str, str] | None = None,
        quality: TakePolicy | None = None,
        transcriber: Transcriber | None = None,
    ) -> None:
        self.model_dir = model_dir
        self.engine = engine
        self.tokenizer = tokenizer
        self.speaker_encoder = speaker_encoder
        self.speech_tokenizer = speech_tokenizer
        self.voices = voices
        self.max_text_chars = max_text_chars
        self.lexicon = dict(lexicon or {})
        self.sample_rate = engine.sample_rate
        # Every take is scored (and made again when it fails, up to `quality.takes`): `service.quality`.
        self.quality = quality or TakePolicy()
        self.transcriber = transcriber
        self.scorer = None
        if self.quality.enabled:
            self.scorer = TakeScorer(speaker_encoder, self.quality.thresholds, transcriber)
        self._prefixes: OrderedDict[tuple[int, ...], PromptPrefix] = OrderedDict()
        # Saved voices' streaming starts within a byte budget (~0.9 GB per 6 s prompt, full size, float32).
        self._flow_caches = PromptCacheStore(DEFAULT_PROMPT_STORE_BYTES)
        self._prefix_lock = threading.Lock()

    @classmethod
    def load(
        cls,
        model_dir: ModelDir | str | Path,
        *,
        device: str = "auto",
        precision: str = "auto",
        threads: int | None = None,
        voices: VoiceLibrary | None = None,
        max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
        lexicon: dict[str, str] | None = None,
        engine_options: EngineOptions | None = None,
        quality: TakePolicy | None = None,
        transcriber: Transcriber | None = None,
    ) -> Synthesizer:
        """Load every network of `model_dir` (a ModelDir or a path) onto `device`; `engine_options` say
        how the networks run (default: the exact one-request-at-a-time path)."""
        model_dir = model_dir if isinstance(model_dir, ModelDir) else ModelDir.open(model_dir)
        placement: Placement = resolve_placement(device, precision)
        if placement.device.type == "cpu":
            threads = configure_cpu_threads(threads)
        onnx_device = str(placement.device)  # "cuda:N" keeps the prompt models on the engine's GPU
        return cls(
            model_dir,
            SpeechEngine.load(model_dir, placement, engine_options),
            TextTokenizer.from_dir(model_dir.tokenizer_dir),
            SpeakerEncoder.from_model_dir(model_dir.path, device=onnx_device, intra_op_threads=threads),
            SpeechTokenizer.from_model_dir(model_dir.path, device=onnx_device, intra_op_threads=threads),
            voices=voices,
            max_text_chars=max_text_chars,
            lexicon=lexicon,
            quality=quality,
            transcriber=transcriber,
        )

    def sharing_model(
        self, *, voices: VoiceLibrary | None, max_text_chars: int, quality: TakePolicy | None = None
    ) -> Synthesizer:
        """A synthesizer on the same loaded networks and front ends with its own voice library, text
        limit and take policy (None: this one's): several services in one process, e.g. test servers
        sharing one loaded model."""
        return Synthesizer(
            self.model_dir,
            self.engine,
            self.tokenizer,
            self.speaker_encoder,
            self.speech_tokenizer,
            voices=voices,
            max_text_chars=max_text_chars,
            lexicon=self.lexicon,
            quality=quality or self.quality,
            transcriber=self.transcriber,
        )

    # ---- prompts and voices ---------------------------------------------------------------------
    def analyse_prompt(self, audio: bytes | str | Path, denoise: bool = False) -> PromptFeatures:
        """Validate and analyse a prompt recording (InputError when it is unusable); `denoise` suppresses
        background noise first."""
        return analyse_prompt(audio, self.speaker_encoder, self.speech_tokenizer, self.sample_rate, denoise)

    def add_voice(self, name: str, audio: bytes, transcript: str | None = None, **kwargs: object) -> Voice:
        """Enrol a voice: analysed once (denoised first when its defaults ask), stored with its original
        recording."""
        defaults = kwargs.get("defaults")
        analyse = functools.partial(self.analyse_prompt, denoise=bool(getattr(defaults, "denoise", False)))
        with out_of_memory_as_error("the voice's enrolment"):
            return self._library().add(name, audio, analyse, transcript=transcript, **kwargs)  # type: ignore[arg-type]

    def voice_features(self, voice: Voice) -> PromptFeatures:
        """A saved voice's prompt features by its id (VoiceNotFound once it is gone): what pinning loads."""
        analyse = functools.partial(self.analyse_prompt, denoise=bool(voice.defaults.denoise))
        return self._library().features(voice, analyse)

    def cached_prefix(self, prompt_text_ids: list[int]) -> PromptPrefix:
        """A saved voice's LM prefix KV, computed once and kept (LRU) for later requests."""
        key = tuple(prompt_text_ids)
        with self._prefix_lock:
            if key in self._prefixes:
                self._prefixes.move_to_end(key)
                return self._prefixes[key]
        prefix = self.engine.prepare_prefix(prompt_text_ids)
        with self._prefix_lock:
            self._prefixes[key] = prefix
            while len(self._prefixes) > PREFIX_CACHE_SIZE:
                self._prefixes.popitem(last=False)
        return prefix

    def cached_flow_prompt(self, voice_id: str, prompt: FlowPrompt) -> PromptCache:
        """A saved voice's streaming start (prompt K/V of the flow), computed once and kept while the
        voices' caches fit their byte budget (least recently used dropped; redone if the prompt changed)."""
        with out_of_memory_as_error("a voice's streaming preparation"):
            return self._flow_caches.get(voice_id, prompt, self.engine.token2wav.prepare_prompt)

    # ---- synthesis ------------------------------------------------------------------------------
    def synthesize(
        self,
        request: SynthesisRequest,
        *,
        progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        voices: VoiceScope = EVERY_VOICE,
        pinned: PinnedVoice | None = None,
    ) -> SynthesisStream:
        """Check the request now (InputError; a saved voice outside `voices` is not found), generate
        lazily as the stream is read. `pinned`: the request's saved voice as its work pinned it (its
        settings and features are used as they are, nothing is looked up)."""
        with out_of_memory_as_error("the analysis of the request's prompt"):
            plan = self._plan(request, voices, pinned)
        return SynthesisStream(self, plan, progress, cancel)

    def run(self, request: SynthesisRequest, **kwargs: object) -> SynthesisResult:
        """Synthesise the whole request and return it."""
        return self.synthesize(request, **kwargs).result()  # type: ignore[arg-type]

    def _plan(
        self, request: SynthesisRequest, voices: VoiceScope, pinned: PinnedVoice | None
    ) -> SynthesisPlan:
        started = time.perf_counter()
        request.check_fields()
        voice = None
        if request.voice is not None:
            if pinned is not None:
                voice, features = pinned.voice, pinned.features
            else:
                voice = self._library().get(request.voice, voices)
                features = self.voice_features(voice)
            speed = request.speed if request.speed is not None else (voice.defaults.speed or 1.0)
            seed = request.seed if request.seed is not None else voice.defaults.seed
        else:
            seed = request.seed
            speed = request.speed if request.speed is not None else 1.0
            features = None
        transcript, prepared = self._prepared_text(request, voice)
        if features is None and request.prompt_wav is not None:  # last: text errors are cheaper to find
            features = self.analyse_prompt(request.prompt_wav, denoise=request.denoise)
        if features is None:
            raise InputError("no prompt recording: give `voice` or `prompt_wav`")
        if not (MIN_SPEED <= speed <= MAX_SPEED):
            raise InputError(f"speed {speed} is out of range: use {MIN_SPEED} to {MAX_SPEED}")
        if seed is None:
            seed = secrets.randbelow(MAX_SEED + 1)
        plan = SynthesisPlan(request, prepared, features, seed, speed, voice, time.perf_counter() - started)
        return self._with_takes(plan, transcript)

    def segment_count(self, request: SynthesisRequest, voices: VoiceScope = EVERY_VOICE) -> int:
        """How many segments `synthesize` splits the request's text into: only the text side of its plan
        (no prompt analysis, no engine); InputError / VoiceNotFound as `synthesize` raises them."""
        voice = self._library().get(request.voice, voices) if request.voice is not None else None
        return len(self._prepared_text(request, voice)[1].segments)

    def _prepared_text(
        self, request: SynthesisRequest, voice: Voice | None
    ) -> tuple[str | None, PreparedText]:
        """(the prompt transcript, the text prepared) as `voice` reads it (None: an uploaded recording)."""
        lexicon = dict(self.lexicon)
        if voice is not None:
            transcript = request.prompt_text if request.prompt_text is not None else voice.transcript
            instruct = request.instruct if request.instruct is not None else voice.defaults.instruct
            lexicon.update(voice.lexicon)
        else:
            transcript, instruct = request.prompt_text, request.instruct
        prepared = prepare_texts(
            request.text,
            tokenizer=self.tokenizer,
            prompt_text=transcript,
            instruct=instruct,
            lexicon=lexicon or None,
            max_chars=self.max_text_chars,
        )
        return transcript, prepared

    def _with_takes(self, plan: SynthesisPlan, transcript: str | None) -> SynthesisPlan:
        """The plan with its takes and thresholds (the request's over the policy's) and the voice's own
        pace."""
        takes = plan.request.takes if plan.request.takes is not None else self.quality.takes
        if not (1 <= takes <= MAX_TAKES):
            raise InputError(f"takes must be from 1 to {MAX_TAKES}, got {takes}")
        return dataclasses.replace(
            plan,
            takes=takes,
            thresholds=apply_overrides(self.quality.thresholds, plan.request.thresholds),
            voice_seconds_per_unit=voice_seconds_per_unit(plan.features.num_tokens, transcript),
        )

    def _library(self) -> VoiceLibrary:
        if self.voices is None:
            raise InputError("this synthesizer has no voice library configured")
        return self.voices
