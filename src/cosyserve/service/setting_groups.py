"""What the service can be told, group by group (`[engine]`, `[server]`, …), and the names each setting
goes by: its flat name (`port`, `s3_bucket`) is the CLI flag, the keyword argument and the top-level TOML
key, unique across groups. `settings.Settings` reads values from every source into these groups.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import NoDecode

from cosyserve.limits import DEFAULT_MAX_BATCH_ITEMS, DEFAULT_MAX_TEXT_CHARS, DEFAULT_MAX_UPLOAD_MB
from cosyserve.modeldir.model_dir import DEFAULT_MODEL_ID
from cosyserve.service.quality.settings import QualitySettings
from cosyserve.service.scheduling.queue_settings import QueueSettings

_PREFIXED_GROUPS = ("s3", "log", "quality")  # groups whose flat names carry the group name


DEFAULT_CONSENT_STATEMENT = (
    "我确认：声音的主人已单独同意我用这段录音克隆其声音，并知晓生成内容的用途。"
    " / I confirm that the person whose voice this is has separately agreed to my cloning it from this "
    "recording and knows what the generated audio will be used for."
)


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class EngineSettings(_Group):
    model: str = Field(DEFAULT_MODEL_ID, description="model directory path, hub model id, or 'demo'")
    models_dir: Path | None = Field(
        None, description="where hub models are downloaded (default: $COSYSERVE_HOME/models or the cache)"
    )
    download_retry_s: float = Field(
        30.0,
        ge=0,
        description="give up downloading the model after this many seconds of attempts that fetched "
        "nothing (hubs out of reach); a transfer cut midway is always resumed",
    )
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    asr_model: Path | None = Field(
        None,
        description="prompt-transcription model directory (SenseVoice-Small for sherpa-onnx; default: "
        "where `cosyserve download --asr` puts it)",
    )
    lexicon: Path | None = Field(
        None,
        description='a JSON file of words every voice reads a given way, e.g. {"重庆": "chóng qìng"} '
        "(pinyin or CMU phones; a voice's own lexicon wins for its words); checked at start",
    )
    precision: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto", description="compute dtype: auto (float16 on GPU, float32 on CPU), float32, float16, bfloat16"
    )
    preset: Literal["exact", "fast"] = Field(
        "exact",
        description="exact: the networks as they are, in the precision setting's dtype (float32 matches the "
        "official outputs; on a GPU auto means float16); fast: int8/float16 LLM, int8 DiT linears, "
        "bfloat16 where this CPU measures it faster (DiT, LM prefill, vocoder convolutions), on CPU "
        "(not bit-exact; `cosyserve bench` reports the deviation)",
    )
    threads: int | None = Field(
        None, ge=1, description="CPU threads for the engine (default: all usable cores)"
    )
    gpu_batching: bool = Field(
        True,
        description="on CUDA: batch concurrent requests' LLM steps and flow passes (concurrency > 1), "
        "CUDA graphs for the LLM step otherwise; same outputs up to float rounding",
    )
    flow_steps: int = Field(
        10, ge=1, le=10, description="flow solver steps; fewer is faster but changes the audio (see bench)"
    )
    flow_guidance: bool = Field(
        True, description="classifier-free guidance in the flow; off halves its work but changes the audio"
    )

    @field_validator("lexicon")
    @classmethod
    def _check_lexicon(cls, value: Path | None) -> Path | None:
        if value is not None:
            from cosyserve.frontend.text.lexicon import read_lexicon_file

            read_lexicon_file(value)  # raises ValueError naming the file and the entry
        return value


class ServerSettings(_Group):
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0 for all interfaces)")
    port: int = Field(7860, ge=1, le=65535, description="TCP port to listen on")
    insecure: bool = Field(
        False, description="allow a non-loopback address without any API key or UI login configured"
    )
    keep_serving_on_load_error: bool = Field(
        False,
        description="keep serving (health, UI, admin restart) when the model can't be loaded at start, "
        "instead of exiting with the reason",
    )
    keep_alive_s: int = Field(
        75,
        ge=1,
        le=3600,
        description="seconds an idle HTTP connection is kept open; longer than what clients and proxies keep "
        "one (httpx 5 s, nginx upstreams and cloud load balancers 60 s), so none reuses a connection the "
        "server is closing",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins (scheme://host[:port]) whose pages may call the API and the web UI with the "
        "browser's credentials, comma-separated; * lets any page call without credentials "
        "(empty: CORS off, same-origin only)",
    )

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.strip()
            if value.startswith("["):
                import json

                return json.loads(value)
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("cors_origins")
    @classmethod
    def _check_origins(cls, origins: list[str]) -> list[str]:
        """Browsers send `Origin: scheme://host[:port]`, never a path: anything else would never match."""
        checked = []
        for origin in origins:
            origin = origin.strip().rstrip("/").lower()
            if origin != "*" and not re.fullmatch(r"https?://[^/\s?#@]+", origin):
                raise ValueError(
                    f"cors_origins: {origin!r} is not an origin; write scheme://host[:port] "
                    "(e.g. https://app.example.com), without a path, or *"
                )
            checked.append(origin)
        return checked


class LimitSettings(_Group):
    max_text_chars: int = Field(
        DEFAULT_MAX_TEXT_CHARS, ge=1, description="longest text one request may carry"
    )
    max_upload_mb: float = Field(
        DEFAULT_MAX_UPLOAD_MB, gt=0, description="largest prompt-audio upload, in MB"
    )
    max_receiving_mb: float = Field(
        64.0,
        gt=0,
        description="request bodies over 1 MB being received at once, in MB together: more wait up to "
        "30 s, then get 503 (bounds the memory a flood of uploads can take)",
    )
    rate_limit_per_minute: int = Field(60, ge=0, description="requests per minute per API key (0: no limit)")
    daily_audio_seconds_quota: float | None = Field(
        None, gt=0, description="seconds of audio per API key per day (default: unlimited)"
    )
    max_voices_per_owner: int = Field(
        200, ge=1, description="most saved voices one API key (or UI user) keeps; each holds its recording"
    )
    max_batch_items: int = Field(
        DEFAULT_MAX_BATCH_ITEMS,
        ge=1,
        description="most items (lines of a script, cues of a subtitle file) in one batch or dub",
    )
    quota_reservation_ttl_s: float = Field(
        3600.0,
        gt=0,
        description="how long a request's quota reservation holds when its holder does not settle it (a "
        "process that died elsewhere); a job's lasts as long as the job",
    )
    max_dub_track_s: float = Field(
        10800.0,
        gt=0,
        le=86400,
        description="longest dub track, in seconds (to the end of the last cue; default 3 h): longer "
        "subtitle files are refused at submit. The track is charged to the key's quota and written as "
        "16-bit WAV (at most 24 h: a WAV file holds 4 GB)",
    )


def default_data_dir() -> Path:
    """`./cosyserve-data` when it exists, else `$XDG_DATA_HOME/cosyserve` (`~/.local/share/cosyserve`)."""
    local = Path.cwd() / "cosyserve-data"
    if local.is_dir():
        return local
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "cosyserve"


class StorageSettings(_Group):
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="database, secrets and outputs (default: ./cosyserve-data if present, else XDG data dir)",
    )
    output_dir: Path | None = Field(None, description="synthesised audio files (default: <data_dir>/outputs)")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL (default: sqlite:///<data_dir>/cosyserve.db)"
    )
    retention_days: float = Field(7.0, ge=0, description="delete outputs older than this (0: keep forever)")
    retention_max_gb: float = Field(
        10.0, ge=0, description="delete oldest outputs above this size, checked at every save (0: no cap)"
    )
    min_free_mb: float = Field(
        200.0,
        ge=0,
        description="below this much free space in the output directory /ready turns false (0: no floor)",
    )
    retention_interval_s: float = Field(
        3600.0, ge=1, description="how often old outputs are looked for and deleted, in seconds"
    )
    job_retention_days: float = Field(
        90.0,
        ge=0,
        description="delete the records of jobs, batches and dubs (their texts and items) this many days "
        "after they ended (0: keep forever)",
    )
    timezone: str = Field(
        "local",
        description="time zone of output file names: local (this machine's), UTC, or a name such as "
        "Asia/Shanghai; the sidecar always records the UTC instant too",
    )

    @field_validator("data_dir", "output_dir", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():  # Path("") is the current folder: said, not taken
            raise ValueError("is empty: give a folder (leave the setting out for the default)")
        return value

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, value: str) -> str:
        from cosyserve.service.stores.output_timezone import output_timezone

        output_timezone(value)  # raises ValueError naming the problem
        return value


class S3Settings(_Group):
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (default: AWS)")
    bucket: str | None = Field(None, description="bucket for outputs (unset: S3 off)")
    prefix: str = Field("", description="key prefix inside the bucket")
    region: str | None = Field(None, description="bucket region")
    access_key_id: str | None = Field(None, description="access key id (default: the boto3 credential chain)")
    secret_access_key: SecretStr | None = Field(None, description="secret access key")
    sync: bool = Field(False, description="upload every output to the bucket")
    lifecycle_days: int | None = Field(None, ge=1, description="expire uploaded objects after this many days")


class AuthSettings(_Group):
    api_keys_required: bool = Field(False, description="refuse API requests without a valid API key")
    ui_username: str | None = Field(None, description="web UI login name (unset: no UI login)")
    ui_password: SecretStr | None = Field(
        None,
        description="web UI password, plain or a hash (scrypt$… as docs/deploy.md makes it; pbkdf2_sha256$…)",
    )
    signing_secret: SecretStr | None = Field(
        None, description="key for signed download URLs (default: generated once, kept in data_dir)"
    )
    signed_url_ttl_s: int = Field(900, ge=1, description="how long a signed download URL stays valid")
    voice_consent_required: bool = Field(
        True,
        description="user keys must confirm the consent statement to enrol a voice (admins may, and it is "
        "recorded when they do)",
    )
    voice_consent_statement: str = Field(
        DEFAULT_CONSENT_STATEMENT,
        min_length=10,
        max_length=2000,
        description="what a user confirms when enrolling a voice (recorded with the voice, word for word)",
    )
    ui_session_idle_s: int = Field(
        7 * 86400,
        ge=60,
        description="a web UI sign-in ends after this many seconds without a request of its user (the "
        "page's own polling does not count)",
    )
    ui_session_max_s: int = Field(
        30 * 86400, ge=60, description="a web UI sign-in ends this many seconds after the login, however used"
    )

    @property
    def ui_login_configured(self) -> bool:
        return bool(self.ui_username and self.ui_password)


class LogSettings(_Group):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field("INFO", description="log level")
    json_lines: bool = Field(False, alias="json", description="log one JSON object per line")
    file: Path | None = Field(
        None, description="also write the log to this file, rotated by size (unset: the console only)"
    )
    file_max_mb: float = Field(50.0, gt=0, description="rotate the log file when it reaches this size, in MB")
    file_backups: int = Field(5, ge=0, description="rotated log files kept (file.1 … file.N)")

    model_config = ConfigDict(extra="forbid", validate_default=True, populate_by_name=True)

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class LabelSettings(_Group):
    label_implicit: bool = Field(
        True,
        description="write the GB 45438 implicit label (an AIGC metadata field, signed and bound to the "
        "audio) into every wav, mp3, flac and opus file the server stores or serves",
    )
    label_provider: str = Field(
        "cosyserve",
        min_length=1,
        max_length=200,
        description="the service provider's name or code written as ContentProducer/ContentPropagator in "
        "implicit labels (a public deployment in China: its registered name or filing number)",
    )
    label_explicit: Literal["off", "start", "start_and_end"] = Field(
        "off",
        description="the audible label: the rhythm cue short-long-short-short at the start of every output "
        "(and at its end with start_and_end); off by default, turn it on for a public service; admins "
        "may skip it per request",
    )
    label_explicit_kind: Literal["cue", "notice"] = Field(
        "cue",
        description="what the audible label is: the tones of the rhythm cue, or a short spoken notice in the "
        "request's voice ('本音频由人工智能生成。' / 'This audio was generated by AI.', made once per voice "
        "and language, then reused)",
    )
    c2pa: bool = Field(
        True,
        description="also embed a signed C2PA manifest in wav and mp3 outputs (needs c2pa-python: "
        "pip install 'cosyserve[labels]')",
    )
    c2pa_cert_file: Path | None = Field(
        None,
        description="PEM certificate chain for C2PA signing (unset: a self-signed certificate made once in "
        "data_dir, which says it is for a private deployment)",
    )
    c2pa_key_file: Path | None = Field(None, description="PEM private key of c2pa_cert_file")


GROUPS: dict[str, type[BaseModel]] = {
    "engine": EngineSettings,
    "server": ServerSettings,
    "queue": QueueSettings,
    "limits": LimitSettings,
    "storage": StorageSettings,
    "s3": S3Settings,
    "auth": AuthSettings,
    "log": LogSettings,
    "labels": LabelSettings,
    "quality": QualitySettings,
}


def input_name(name: str, info: FieldInfo) -> str:
    return info.alias or name


def _flat_name(group: str, name: str, info: FieldInfo) -> str:
    key = input_name(name, info)
    return f"{group}_{key}" if group in _PREFIXED_GROUPS else key


# flat name -> (group, key inside the group)
FLAT_NAMES: dict[str, tuple[str, str]] = {
    _flat_name(group, name, info): (group, input_name(name, info))
    for group, model in GROUPS.items()
    for name, info in model.model_fields.items()
}
if len(FLAT_NAMES) != sum(len(m.model_fields) for m in GROUPS.values()):  # pragma: no cover
    raise RuntimeError("two settings share a flat name")


def nest_flat(values: dict[str, Any]) -> dict[str, Any]:
    """`{"port": 1, "engine": {...}}` -> `{"server": {"port": 1}, "engine": {...}}`; other keys unchanged."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        if key in GROUPS and isinstance(value, dict):
            nested.setdefault(key, {}).update(value)
    for key, value in values.items():
        target = FLAT_NAMES.get(key.lower())
        if target:
            group, field = target
            nested.setdefault(group, {})[field] = value
        elif not (key in GROUPS and isinstance(value, dict)):
            nested[key] = value
    return nested
