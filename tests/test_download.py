"""Model download against local fake hubs: resume, fallback, and the completeness checks. No network."""

from __future__ import annotations

import os
import shutil
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from cosyserve.errors import ModelDirError, exit_code_for
from cosyserve.modeldir import download
from cosyserve.modeldir.download import (
    SKIP_PATTERNS,
    SOURCE_ENV,
    DownloadError,
    default_target_dir,
    download_model,
    looks_like_mainland_china,
    source_order,
    verify_download,
)
from cosyserve.modeldir.model_dir import REAL_MODEL_MIN_SIZES, REQUIRED_FILES

# Before any test imports huggingface_hub, which reads this once; the fakes never reach a network anyway.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL_ID = "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
# Floors for the fake files below (the real floors are gigabytes).
TINY_MIN_SIZES = {"llm.pt": 4000, "flow.pt": 2000, "hift.pt": 2000, "campplus.onnx": 100}


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(SOURCE_ENV, raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)


def _write_pt(path: Path, payload_size: int) -> None:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data/0", os.urandom(payload_size))


@pytest.fixture()
def remote(tmp_path: Path) -> Path:
    """A fake hub repository: every required file, plus files the download must skip."""
    root = tmp_path / "remote"
    (root / "CosyVoice-BlankEN").mkdir(parents=True)
    (root / "cosyvoice3.yaml").write_text("# fake config\n" + "x: 1\n" * 60)
    _write_pt(root / "llm.pt", 6000)
    _write_pt(root / "flow.pt", 3000)
    _write_pt(root / "hift.pt", 3000)
    _write_pt(root / "llm.rl.pt", 3000)
    (root / "campplus.onnx").write_bytes(os.urandom(300))
    (root / "speech_tokenizer_v3.onnx").write_bytes(os.urandom(300))
    (root / "CosyVoice-BlankEN" / "config.json").write_text(
        '{"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2}\n'
    )
    (root / "CosyVoice-BlankEN" / "vocab.json").write_text(
        '{"a": 0, "b": 1, "ab": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7}\n'
    )
    (root / "CosyVoice-BlankEN" / "merges.txt").write_text("#version: 0.2\na b\n")
    (root / "CosyVoice-BlankEN" / "tokenizer_config.json").write_text('{"added_tokens_decoder": {}}\n')
    (root / "CosyVoice-BlankEN" / "model.safetensors").write_bytes(b"never needed")
    return root


class FakeHub:
    """Copies `remote` into the target like snapshot_download; can fail, or cut one file short and resume it.

    A cut file is left as `<target>/.incomplete/<name>` (as the real clients keep partial files) and the next
    call continues from its length, so `bytes_sent` shows whether a retry started over.
    """

    def __init__(self, remote: Path, *, fail: int = 0, cut_file: str | None = None) -> None:
        self.remote = remote
        self.fail = fail
        self.cut_file = cut_file
        self.calls = 0
        self.bytes_sent = 0

    def __call__(
        self, model_id: str, target_dir: Path, *, skip_patterns: Sequence[str], progress: bool
    ) -> None:
        assert model_id == MODEL_ID
        self.calls += 1
        if self.calls <= self.fail:
            raise ConnectionError("hub unreachable")
        for source in sorted(p for p in self.remote.rglob("*") if p.is_file()):
            name = source.relative_to(self.remote).as_posix()
            if any(Path(name).match(pattern) for pattern in skip_patterns):
                continue
            target = target_dir / name
            if target.is_file() and target.stat().st_size == source.stat().st_size:
                continue
            self._copy(source, target, name)

    def _copy(self, source: Path, target: Path, name: str) -> None:
        data = source.read_bytes()
        partial = target.parent / ".incomplete" / target.name
        done = partial.stat().st_size if partial.is_file() else 0
        partial.parent.mkdir(parents=True, exist_ok=True)
        if name == self.cut_file:
            self.cut_file = None  # only the first transfer of it breaks
            with partial.open("ab") as out:
                out.write(data[done : len(data) // 2])
            self.bytes_sent += len(data) // 2 - done
            raise ConnectionError(f"connection reset while downloading {name}")
        with partial.open("ab") as out:
            out.write(data[done:])
        self.bytes_sent += len(data) - done
        target.parent.mkdir(parents=True, exist_ok=True)
        partial.replace(target)


class BrokenHub:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(
        self, model_id: str, target_dir: Path, *, skip_patterns: Sequence[str], progress: bool
    ) -> None:
        self.calls += 1
        raise OSError("name resolution failed")


def _download(target: Path, fetchers: dict, **kwargs) -> Path:
    kwargs.setdefault("min_sizes", TINY_MIN_SIZES)
    kwargs.setdefault("progress", False)
    return download_model(MODEL_ID, target_dir=target, fetchers=fetchers, **kwargs)


def _remote_total(remote: Path) -> int:
    skipped = ("llm.rl.pt", "model.safetensors")
    return sum(p.stat().st_size for p in remote.rglob("*") if p.is_file() and p.name not in skipped)


def test_download_fetches_every_required_file(remote: Path, tmp_path: Path) -> None:
    hub = FakeHub(remote)
    path = _download(tmp_path / "model", {"huggingface": hub}, source="huggingface")
    assert path == (tmp_path / "model").resolve()
    for name in REQUIRED_FILES:
        assert (path / name).read_bytes() == (remote / name).read_bytes()
    assert not (path / "llm.rl.pt").exists()
    assert not (path / "CosyVoice-BlankEN" / "model.safetensors").exists()


def test_interrupted_file_resumes_on_retry(remote: Path, tmp_path: Path) -> None:
    hub = FakeHub(remote, cut_file="llm.pt")
    path = _download(tmp_path / "model", {"huggingface": hub}, source="huggingface", attempts_per_source=2)
    assert hub.calls == 2
    assert (path / "llm.pt").read_bytes() == (remote / "llm.pt").read_bytes()
    assert hub.bytes_sent == _remote_total(remote)  # the second call continued, it did not start over


def test_rerun_after_failed_download_resumes(remote: Path, tmp_path: Path) -> None:
    hub = FakeHub(remote, cut_file="llm.pt")
    target = tmp_path / "model"
    with pytest.raises(ModelDirError, match=r"ConnectionError.*llm\.pt.*Rerun `cosyserve download`"):
        _download(target, {"huggingface": hub}, source="huggingface", attempts_per_source=1)
    assert (target / ".incomplete" / "llm.pt").is_file()  # the partial file is kept for the next run

    _download(target, {"huggingface": hub}, source="huggingface", attempts_per_source=1)
    assert (target / "llm.pt").read_bytes() == (remote / "llm.pt").read_bytes()
    assert hub.bytes_sent == _remote_total(remote)


def test_falls_back_to_the_other_hub(remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "Asia/Shanghai")  # ModelScope first
    broken, good = BrokenHub(), FakeHub(remote)
    _download(tmp_path / "model", {"modelscope": broken, "huggingface": good}, attempts_per_source=2)
    assert broken.calls == 2 and good.calls == 1


def test_explicit_source_does_not_fall_back(remote: Path, tmp_path: Path) -> None:
    broken, good = BrokenHub(), FakeHub(remote)
    with pytest.raises(ModelDirError, match=r"modelscope \(2 attempts\): OSError: name resolution failed\. "):
        _download(tmp_path / "model", {"modelscope": broken, "huggingface": good}, source="modelscope")
    assert good.calls == 0
    assert not (tmp_path / "model").exists()  # nothing fetched: no empty folder that reads as a broken model


def test_a_failed_download_leaves_a_folder_it_did_not_create(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    with pytest.raises(DownloadError):
        _download(tmp_path / "mine", {"modelscope": BrokenHub()}, source="modelscope", attempts_per_source=1)
    assert (tmp_path / "mine").is_dir()


def test_unreachable_hubs_give_up_after_the_retry_budget(remote: Path, tmp_path: Path) -> None:
    """Offline: attempts that fetch nothing stop once they have taken the budget; one reason per hub."""
    slow_broken, other = BrokenHub(), BrokenHub()
    original = slow_broken.__call__

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return original(*args, **kwargs)

    with pytest.raises(DownloadError) as caught:
        _download(
            tmp_path / "model",
            {"huggingface": slow, "modelscope": other},
            attempts_per_source=5,
            retry_budget_s=0.01,
        )
    assert slow_broken.calls == 1 and other.calls == 0
    assert caught.value.reason == "OSError: name resolution failed"
    assert str(caught.value).count("name resolution failed") == 1


def test_an_attempt_that_fetched_something_is_retried_whatever_the_budget(
    remote: Path, tmp_path: Path
) -> None:
    hub = FakeHub(remote, cut_file="llm.pt")
    _download(tmp_path / "model", {"huggingface": hub}, source="huggingface", retry_budget_s=0.0)
    assert hub.calls == 2


def test_root_cause_names_the_innermost_error() -> None:
    try:
        try:
            try:
                raise OSError("[Errno -2] Name or service not known")
            except OSError as inner:
                raise ConnectionError("Max retries exceeded " + "x" * 400) from inner
        except ConnectionError as middle:
            raise RuntimeError("An error happened while trying to locate the files on the Hub") from middle
    except RuntimeError as outer:
        assert download.root_cause(outer) == "OSError: [Errno -2] Name or service not known"
    assert len(download.root_cause(ValueError("y" * 1000))) < 200


def test_missing_file_is_named(remote: Path, tmp_path: Path) -> None:
    (remote / "speech_tokenizer_v3.onnx").unlink()
    with pytest.raises(ModelDirError, match=r"speech_tokenizer_v3\.onnx is missing"):
        _download(tmp_path / "model", {"huggingface": FakeHub(remote)}, source="huggingface")


def test_short_llm_checkpoint_is_caught(remote: Path, tmp_path: Path) -> None:
    _write_pt(remote / "llm.pt", 1000)  # a valid zip, but smaller than the floor
    with pytest.raises(ModelDirError, match=r"llm\.pt is [\d,]+ bytes, expected at least 4,000"):
        _download(tmp_path / "model", {"huggingface": FakeHub(remote)}, source="huggingface")


def test_real_size_floors_reject_a_tiny_model(tiny_dir: Path) -> None:
    with pytest.raises(ModelDirError) as caught:
        verify_download(tiny_dir / "model")
    assert "llm.pt is" in str(caught.value) and "expected at least 1,000,000,000" in str(caught.value)
    assert REAL_MODEL_MIN_SIZES["llm.pt"] >= 1_000_000_000


def test_complete_directory_is_not_downloaded_again(remote: Path, tmp_path: Path) -> None:
    target = tmp_path / "model"
    shutil.copytree(remote, target)
    hub = FakeHub(remote)
    assert _download(target, {"huggingface": hub}, source="huggingface") == target.resolve()
    assert hub.calls == 0
    _download(target, {"huggingface": hub}, source="huggingface", refresh=True)
    assert hub.calls == 1


def test_source_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(download, "_system_timezone", lambda localtime: "")
    assert source_order("modelscope", {}) == ["modelscope"]
    assert source_order(None, {SOURCE_ENV: "huggingface", "TZ": "Asia/Shanghai"}) == ["huggingface"]
    assert source_order(None, {"TZ": "Asia/Shanghai"}) == ["modelscope", "huggingface"]
    assert source_order(None, {"LANG": "zh_CN.UTF-8"}) == ["modelscope", "huggingface"]
    assert source_order(None, {"LANG": "en_US.UTF-8"}) == ["huggingface", "modelscope"]
    assert source_order(None, {"TZ": "Asia/Shanghai", "HF_ENDPOINT": "https://mirror"}) == [
        "huggingface",
        "modelscope",
    ]
    with pytest.raises(ModelDirError, match="unknown download source 'github'") as unknown:
        source_order("github", {})
    assert exit_code_for(unknown.value) == 2  # a setting to fix, not a model missing (it was 3)


def test_system_timezone_hint(tmp_path: Path) -> None:
    zone = tmp_path / "zoneinfo" / "Asia" / "Shanghai"
    zone.parent.mkdir(parents=True)
    zone.write_bytes(b"TZif")
    (tmp_path / "localtime").symlink_to(zone)
    assert looks_like_mainland_china({}, localtime=tmp_path / "localtime")
    (tmp_path / "utc").symlink_to(tmp_path / "zoneinfo")
    assert not looks_like_mainland_china({"LANG": "C.UTF-8"}, localtime=tmp_path / "utc")


def test_default_target_dir(tmp_path: Path) -> None:
    assert default_target_dir(MODEL_ID, {"COSYSERVE_HOME": str(tmp_path)}) == (
        tmp_path / "models" / "Fun-CosyVoice3-0.5B-2512"
    )
    assert default_target_dir(MODEL_ID, {"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "cosyserve" / "models" / "Fun-CosyVoice3-0.5B-2512"
    )


def _library_fake(remote: Path, seen: dict):
    def snapshot_download(**kwargs) -> str:
        seen.update(kwargs)
        shutil.copytree(remote, kwargs["local_dir"], dirs_exist_ok=True)
        return kwargs["local_dir"]

    return snapshot_download


def test_huggingface_fetcher_calls_snapshot_download(
    remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    seen: dict = {}
    monkeypatch.setattr(huggingface_hub, "snapshot_download", _library_fake(remote, seen))
    _download(tmp_path / "model", download.FETCHERS, source="huggingface")
    assert seen["repo_id"] == MODEL_ID
    assert Path(seen["local_dir"]) == tmp_path / "model"
    assert set(SKIP_PATTERNS) <= set(seen["ignore_patterns"])
    assert not seen.get("force_download")


def test_modelscope_fetcher_calls_snapshot_download(
    remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modelscope = pytest.importorskip("modelscope")
    seen: dict = {}
    monkeypatch.setattr(modelscope, "snapshot_download", _library_fake(remote, seen), raising=False)
    _download(tmp_path / "model", download.FETCHERS, source="modelscope")
    assert seen["model_id"] == MODEL_ID
    assert Path(seen["local_dir"]) == tmp_path / "model"
    assert "CosyVoice-BlankEN/model.safetensors" in seen["ignore_patterns"]


def test_missing_client_library_is_not_retried(
    remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    calls = []

    def no_modelscope(
        model_id: str, target_dir: Path, *, skip_patterns: Sequence[str], progress: bool
    ) -> None:
        calls.append(model_id)
        raise download.MissingClientError("modelscope is not installed: pip install 'cosyserve[download]'")

    _download(
        tmp_path / "model",
        {"modelscope": no_modelscope, "huggingface": FakeHub(remote)},
        attempts_per_source=3,
    )
    assert len(calls) == 1


def test_a_hub_that_never_answers_fails_the_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hub that accepts the connection and sends nothing held the download for ever (10 minutes in the
    run, past every retry budget): huggingface_hub's client has no timeout of its own."""
    import socket

    constants = pytest.importorskip("huggingface_hub.constants")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # (this module's default; the hub is local)
    monkeypatch.setattr(download, "HUB_STALL_S", 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(Exception) as stalled:  # huggingface_hub wraps the timeout in a class of its own
            download.fetch_huggingface("owner/model", tmp_path / "m", skip_patterns=[], progress=False)
    finally:
        silent.close()
    assert time.monotonic() - started < 30
    assert "timed out" in str(stalled.value), stalled.value
