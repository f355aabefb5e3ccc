"""Downloading an official model directory from ModelScope or Hugging Face, then checking it is complete.

Both hubs host the same repository id. Both client libraries resume interrupted downloads when called again
with the same `local_dir`, so a failed download is retried (and can be rerun) without starting over.
The fetch functions are looked up in `FETCHERS` at call time (or passed in), so tests substitute local fakes.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from cosyserve.errors import InputError, ModelDirError
from cosyserve.modeldir.hub_probe import is_unreachable
from cosyserve.modeldir.model_dir import DEFAULT_MODEL_ID, REAL_MODEL_MIN_SIZES, ModelDir

Source = Literal["modelscope", "huggingface"]
SOURCES: tuple[Source, ...] = ("modelscope", "huggingface")
SOURCE_ENV = "COSYSERVE_DOWNLOAD_SOURCE"  # "modelscope" or "huggingface": skips the guess
HOME_ENV = "COSYSERVE_HOME"  # default download root is $COSYSERVE_HOME/models
# Files in the official repository that cosyserve never reads: the Qwen2 weights (llm.pt carries them),
# the RL-tuned alternative LLM, and TensorRT engines/exports.
SKIP_PATTERNS: tuple[str, ...] = (
    "CosyVoice-BlankEN/model.safetensors",
    "llm.rl.pt",
    "flow.decoder.estimator*",
    "*.plan",
)
# Time zones of mainland China, where Hugging Face is usually unreachable and ModelScope is fast.
_CHINA_TIMEZONES = frozenset(
    {"Asia/Shanghai", "Asia/Chongqing", "Asia/Chungking", "Asia/Harbin", "Asia/Urumqi", "PRC"}
)


DEFAULT_RETRY_BUDGET_S = 30.0  # failed attempts that fetched nothing: give up after this much time in them
_REASON_CHARS = 160


class MissingClientError(ModelDirError):
    """The hub's client library is not installed: retrying that hub cannot help."""


class DownloadError(ModelDirError):
    """No hub delivered a complete model. `reason` is the last failure's root cause, in one short line."""

    def __init__(self, message: str, *, model_id: str, reason: str) -> None:
        super().__init__(message)
        self.model_id = model_id
        self.reason = reason


class UnknownSource(InputError, ModelDirError):
    """A download source that is neither hub: a setting to fix (exit status 2), not a model to fetch."""


HUB_STALL_S = 30.0  # a hub that sends nothing for this long (connecting, or between bytes) has stalled


class Fetcher(Protocol):
    """Fetch `model_id` into `target_dir`, resuming what an earlier call left there; raise on failure."""

    def __call__(
        self, model_id: str, target_dir: Path, *, skip_patterns: Sequence[str], progress: bool
    ) -> None: ...


def fetch_huggingface(
    model_id: str, target_dir: Path, *, skip_patterns: Sequence[str], progress: bool
) -> None:
    """`huggingface_hub.snapshot_download` into `target_dir`; partials resume from `.cache/huggingface`."""
    try:
        import huggingface_hub
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
            enable_progress_bars,
        )
    except ImportError as exc:
        raise MissingClientError(
            "huggingface_hub is not installed: pip install 'cosyserve[download]'"
        ) from exc
    # Per-file bars ignore `tqdm_class`, so quiet mode switches the library's bars off for the call.
    silence = not progress and not are_progress_bars_disabled()
    if silence:
        disable_progress_bars()
    # Its client waits for ever where a call passes no timeout (the repository's info): a hub that accepts
    # the connection and never answers held `cosyserve download` past every retry budget (10 minutes in
    # the run). Each request's timeouts are capped before it is sent: a stall fails the attempt.
    hooks = huggingface_hub.get_session().event_hooks["request"]
    if _cap_timeouts not in hooks:
        hooks.append(_cap_timeouts)
    try:
        huggingface_hub.snapshot_download(
            repo_id=model_id, local_dir=str(target_dir), ignore_patterns=list(skip_patterns)
        )
    finally:
        if silence:
            enable_progress_bars()


def _cap_timeouts(request: Any) -> None:
    """An httpx request hook: no wait of `request` (connect, read, write, pool) longer than HUB_STALL_S."""
    given = request.extensions.get("timeout") or {}
    request.extensions["timeout"] = {
        part: HUB_STALL_S if given.get(part) is None else min(float(given[part]), HUB_STALL_S)
        for part in ("connect", "read", "write", "pool")
    }


def fetch_modelscope(
    model_id: str, target_dir: Path, *, skip_patterns: Sequence[str], progress: bool
) -> None:
    """`modelscope.snapshot_download` into `target_dir`; it resumes partial files with HTTP ranges.

    ModelScope always draws its tqdm bars; `progress` only affects Hugging Face.
    """
    try:
        import modelscope
    except ImportError as exc:
        raise MissingClientError("modelscope is not installed: pip install 'cosyserve[download]'") from exc
    modelscope.snapshot_download(
        model_id=model_id, local_dir=str(target_dir), ignore_patterns=list(skip_patterns)
    )


FETCHERS: dict[str, Fetcher] = {"modelscope": fetch_modelscope, "huggingface": fetch_huggingface}


def default_models_root(environ: Mapping[str, str] | None = None) -> Path:
    """`$COSYSERVE_HOME/models`, else `$XDG_CACHE_HOME/cosyserve/models`, else `~/.cache/cosyserve/models`."""
    env = os.environ if environ is None else environ
    if env.get(HOME_ENV):
        return Path(env[HOME_ENV]).expanduser() / "models"
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "cosyserve" / "models"


def default_target_dir(model_id: str, environ: Mapping[str, str] | None = None) -> Path:
    """Where `model_id` goes by default: the models root plus the repository name."""
    return default_models_root(environ) / model_id.rstrip("/").split("/")[-1]


def looks_like_mainland_china(
    environ: Mapping[str, str] | None = None, localtime: Path | None = None
) -> bool:
    """A hint only (time zone, locale): decides which hub is tried first, never which one is allowed."""
    env = os.environ if environ is None else environ
    if env.get("HF_ENDPOINT"):  # a configured Hugging Face mirror means Hugging Face works here
        return False
    if env.get("TZ", "").lstrip(":") in _CHINA_TIMEZONES or _system_timezone(localtime) in _CHINA_TIMEZONES:
        return True
    locale = env.get("LC_ALL") or env.get("LC_MESSAGES") or env.get("LANG") or ""
    return locale.startswith(("zh_CN", "zh_Hans_CN"))


def source_order(source: str | None, environ: Mapping[str, str] | None = None) -> list[Source]:
    """Hubs to try in order: only `source` if given, else the guessed one first and the other as fallback."""
    env = os.environ if environ is None else environ
    chosen = source or env.get(SOURCE_ENV) or None
    if chosen is not None:
        if chosen not in SOURCES:
            raise UnknownSource(f"unknown download source {chosen!r}; use one of {', '.join(SOURCES)}")
        return [chosen]  # type: ignore[list-item]
    if looks_like_mainland_china(env):
        return ["modelscope", "huggingface"]
    return ["huggingface", "modelscope"]


def verify_download(target_dir: Path, min_sizes: Mapping[str, int] = REAL_MODEL_MIN_SIZES) -> ModelDir:
    """Every required file present and plausibly sized; raise ModelDirError naming each one that is not."""
    short = []
    for name, min_size in min_sizes.items():
        path = Path(target_dir) / name
        if path.is_file() and path.stat().st_size < min_size:
            short.append(f"{name} is {path.stat().st_size:,} bytes, expected at least {min_size:,}")
    if short:
        raise ModelDirError(
            f"download into {target_dir} is incomplete: {'; '.join(short)}; "
            "run `cosyserve download` again to resume it"
        )
    return ModelDir.open(target_dir, require_onnx=True)  # names missing, truncated and corrupt files


def download_model(
    model_id: str | None = DEFAULT_MODEL_ID,
    *,
    source: str | None = None,
    target_dir: str | Path | None = None,
    progress: bool = True,
    min_sizes: Mapping[str, int] = REAL_MODEL_MIN_SIZES,
    skip_patterns: Sequence[str] = SKIP_PATTERNS,
    attempts_per_source: int = 2,
    retry_budget_s: float | None = DEFAULT_RETRY_BUDGET_S,
    refresh: bool = False,
    fetchers: Mapping[str, Fetcher] | None = None,
    log: Callable[[str], None] | None = None,
    verify: Callable[[Path], Path] | None = None,
    probe: Callable[[Sequence[str]], Mapping[str, str | None]] | None = None,
) -> Path:
    """Download `model_id` into `target_dir` (default: `default_target_dir`) and return the verified path.

    `source` None means: `$COSYSERVE_DOWNLOAD_SOURCE`, else ModelScope first where the machine looks like it
    is in mainland China and Hugging Face first elsewhere, falling back to the other hub. A failed attempt is
    retried `attempts_per_source` times; each retry resumes the partial files. Attempts that fail without
    fetching anything (a hub out of reach) stop before they would take more than `retry_budget_s`
    seconds together, judged by the hub's last such attempt (None: no limit), so an offline machine hears
    within seconds, while a transfer cut midway is still resumed. A directory that already verifies is
    returned without contacting a hub unless `refresh`.
    Before fetching, `probe` (default with the real fetchers: one TCP connection per hub, in parallel,
    `hub_probe.probe_hubs`) marks hubs that can't be reached at all; they are skipped, and an attempt
    that fails on an unresolvable name or a refused connection is not retried.
    `min_sizes` overrides the real-model size floors (tests use tiny files); `verify` replaces the model
    directory check for other downloads (the ASR model). Raises DownloadError.
    """
    model_id = model_id or DEFAULT_MODEL_ID
    target = Path(target_dir).expanduser() if target_dir else default_target_dir(model_id)
    say = log if log is not None else (_stderr if progress else _quiet)
    order = source_order(source)
    check = verify or (lambda path: verify_download(path, min_sizes).path)
    if not refresh:
        try:
            done = check(target)
        except ModelDirError:
            pass
        else:
            say(f"{model_id} is already complete in {done}")
            return done
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    table = FETCHERS if fetchers is None else fetchers
    if probe is None and fetchers is None:
        from cosyserve.modeldir.hub_probe import probe_hubs as probe
    out_of_reach = probe(order) if probe is not None else {}
    failures: dict[str, list[str]] = {}  # hub -> one short reason per failed attempt
    idle_s = 0.0  # time spent in failed attempts that fetched nothing
    for hub in order:
        fetch = table.get(hub)
        if fetch is None:
            failures[hub] = ["no fetch function given"]
            continue
        if out_of_reach.get(hub):
            failures[hub] = [out_of_reach[hub] or ""]  # named in the error, if no other hub delivers
            continue
        last_idle_s = 0.0  # the hub's last fruitless attempt: the next one will likely take as long
        for attempt in range(1, max(1, attempts_per_source) + 1):
            if retry_budget_s is not None and idle_s + last_idle_s > retry_budget_s:
                say(f"giving up on {hub}: {idle_s:.0f} s of attempts fetched nothing")
                break
            say(f"downloading {model_id} from {hub} into {target} (attempt {attempt})")
            started, size_before = time.monotonic(), _bytes_under(target)
            try:
                fetch(model_id, target, skip_patterns=skip_patterns, progress=progress)
                done = check(target)
            except Exception as exc:  # hub/network errors, an incomplete result, a missing client library
                reason = root_cause(exc)
                failures.setdefault(hub, []).append(reason)
                say(f"{hub} attempt {attempt} failed: {reason}")
                last_idle_s = 0.0
                if _bytes_under(target) == size_before:
                    last_idle_s = time.monotonic() - started
                    idle_s += last_idle_s
                if isinstance(exc, MissingClientError) or (last_idle_s and is_unreachable(exc)):
                    break
                continue
            say(f"{model_id} ready in {done} ({time.monotonic() - started:.0f} s)")
            return done
    if created:
        _remove_if_nothing_fetched(target)
    last_reason = next((reasons[-1] for reasons in reversed(failures.values()) if reasons), "no hub tried")
    if all(out_of_reach.get(hub) for hub in order):
        raise DownloadError(
            f"could not download {model_id}: no hub can be reached ({_summarise(out_of_reach)}); check the "
            "network, or set HTTPS_PROXY for a proxy or HF_ENDPOINT for a Hugging Face mirror",
            model_id=model_id,
            reason=last_reason,
        )
    hint = "" if source else f"; set {SOURCE_ENV}=modelscope or huggingface to pick the hub"
    raise DownloadError(
        f"could not download {model_id} into {target}: {_summarise(failures)}. "
        f"Rerun `cosyserve download` to resume (partial files are kept){hint}",
        model_id=model_id,
        reason=last_reason,
    )


def root_cause(exc: BaseException) -> str:
    """`Type: message` of the innermost exception behind `exc` (hub libraries wrap the network error
    several times, each repeating it), on one line and cut to a readable length."""
    seen = {id(exc)}
    while True:
        inner = exc.__cause__ or exc.__context__
        if inner is None or id(inner) in seen or isinstance(exc, ModelDirError):
            break  # our own errors already say what they mean
        seen.add(id(inner))
        exc = inner
    text = " ".join(str(exc).split()).rstrip(".") or "no details"
    if len(text) > _REASON_CHARS:
        text = text[: _REASON_CHARS - 1].rstrip() + "…"
    return f"{type(exc).__name__}: {text}"


def _summarise(failures: Mapping[str, list[str] | str | None]) -> str:
    """Each hub once: its attempts and their distinct reasons (identical ones are not repeated); a hub
    with one reason (a probe's) is named with it alone."""
    parts = []
    for hub, reasons in failures.items():
        if not isinstance(reasons, list):
            parts.append(f"{hub}: {reasons}")
            continue
        attempts = f"{len(reasons)} attempt{'s' if len(reasons) != 1 else ''}"
        parts.append(f"{hub} ({attempts}): {'; '.join(dict.fromkeys(reasons))}")
    return " | ".join(parts)


def _remove_if_nothing_fetched(directory: Path) -> None:
    """Remove a model folder this download created when no attempt left a file in it: an empty folder
    would read as an incomplete model (`ModelDirError`) instead of one not downloaded yet."""
    try:
        if any(path.is_file() or path.is_symlink() for path in directory.rglob("*")):
            return  # partial files: kept for the next attempt to resume
        shutil.rmtree(directory)
    except OSError:
        pass  # left as it is: the next download fills it


def _bytes_under(directory: Path) -> int:
    """Bytes of every file under `directory` (partial downloads included): did an attempt fetch anything?"""
    total = 0
    for path in directory.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def _system_timezone(localtime: Path | None) -> str:
    """IANA name of the system time zone from /etc/localtime (a link into zoneinfo) or /etc/timezone."""
    link = localtime if localtime is not None else Path("/etc/localtime")
    try:
        resolved = str(link.resolve())
        if "zoneinfo/" in resolved:
            return resolved.split("zoneinfo/", 1)[1]
        if localtime is None and Path("/etc/timezone").is_file():
            return Path("/etc/timezone").read_text(encoding="utf-8").strip()
    except OSError:
        pass
    return ""


def _stderr(message: str) -> None:
    print(f"cosyserve download: {message}", file=sys.stderr, flush=True)


def _quiet(message: str) -> None:
    del message
