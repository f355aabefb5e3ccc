"""Service settings: sources and their precedence, validation messages, secrets, startup safety."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cosyserve.errors import SettingsError
from cosyserve.modeldir.model_dir import DEFAULT_MODEL_ID
from cosyserve.service.setting_groups import FLAT_NAMES, nest_flat
from cosyserve.service.settings import Settings, is_loopback, settings_reference


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No COSYSERVE_* variables from the outside, a fresh working dir and XDG data dir."""
    for key in list(os.environ):
        if key.upper().startswith("COSYSERVE_"):
            monkeypatch.delenv(key)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return work


def test_defaults(tmp_path: Path) -> None:
    settings = Settings()
    assert settings.engine.model == DEFAULT_MODEL_ID
    assert (settings.server.host, settings.server.port, settings.server.insecure) == (
        "127.0.0.1",
        7860,
        False,
    )
    assert settings.queue.queue_size == 16 and settings.queue.request_timeout_s == 300
    assert settings.storage.data_dir == tmp_path / "xdg" / "cosyserve"
    assert settings.storage.output_dir == settings.storage.data_dir / "outputs"
    assert settings.storage.database_url == f"sqlite:///{settings.storage.data_dir}/cosyserve.db"
    assert settings.config_file is None
    assert settings.server.cors_origins == []


def test_local_data_dir_wins_when_present(clean_env: Path) -> None:
    (clean_env / "cosyserve-data").mkdir()
    assert Settings().storage.data_dir == clean_env / "cosyserve-data"


def test_precedence_init_over_env_over_toml_over_default(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (clean_env / "cosyserve.toml").write_text(
        'port = 1001\nhost = "0.0.0.0"\n[engine]\ndevice = "cpu"\npreset = "fast"\n[queue]\nqueue_size = 3\n'
    )
    from_toml = Settings()
    assert from_toml.server.port == 1001 and from_toml.engine.device == "cpu"
    assert from_toml.config_file == clean_env / "cosyserve.toml"

    monkeypatch.setenv("COSYSERVE_PORT", "1002")
    monkeypatch.setenv("COSYSERVE_ENGINE__PRESET", "exact")
    from_env = Settings()
    assert from_env.server.port == 1002
    assert from_env.engine.preset == "exact"
    assert from_env.engine.device == "cpu"  # untouched values still come from the file
    assert from_env.server.host == "0.0.0.0"

    flags = Settings.load(port=1003, device=None, queue_size=None)  # None: flag not given
    assert flags.server.port == 1003
    assert flags.engine.device == "cpu" and flags.queue.queue_size == 3
    assert Settings().queue.request_timeout_s == 300  # default where nobody said anything


def test_nested_env_wins_over_flat_alias_and_merges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYSERVE_PORT", "2001")
    monkeypatch.setenv("COSYSERVE_SERVER__PORT", "2002")
    monkeypatch.setenv("COSYSERVE_ENGINE__DEVICE", "cuda:1")
    monkeypatch.setenv("COSYSERVE_S3_BUCKET", "flat-bucket")
    monkeypatch.setenv("COSYSERVE_LOG__LEVEL", "debug")
    monkeypatch.setenv("COSYSERVE_LOG_JSON", "true")
    monkeypatch.setenv("COSYSERVE_CORS_ORIGINS", "https://a.example, https://b.example")
    settings = Settings(engine={"model": "demo"})
    assert settings.server.port == 2002
    assert (settings.engine.model, settings.engine.device) == ("demo", "cuda:1")
    assert settings.s3.bucket == "flat-bucket"
    assert settings.log.level == "DEBUG" and settings.log.json_lines is True
    assert settings.server.cors_origins == ["https://a.example", "https://b.example"]


def test_common_flat_env_aliases(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("COSYSERVE_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("COSYSERVE_MODEL", "/models/cv3")
    monkeypatch.setenv("COSYSERVE_DEVICE", "cpu")
    monkeypatch.setenv("COSYSERVE_DATA_DIR", str(tmp_path / "data"))
    settings = Settings()
    assert settings.storage.output_dir == tmp_path / "out"
    assert settings.engine.model == "/models/cv3" and settings.engine.device == "cpu"
    assert settings.storage.database_url == f"sqlite:///{tmp_path / 'data' / 'cosyserve.db'}"


def test_config_path_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "elsewhere.toml"
    config.write_text("[limits]\nmax_text_chars = 500\n[s3]\nbucket = 'b'\nsync = true\n")
    monkeypatch.setenv("COSYSERVE_CONFIG", str(config))
    settings = Settings()
    assert settings.limits.max_text_chars == 500 and settings.s3.sync
    monkeypatch.setenv("COSYSERVE_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(SettingsError, match=r"missing\.toml.*does not exist"):
        Settings()


def test_config_file_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "given.toml"
    config.write_text('[log]\njson = true\nlevel = "warning"\n')
    monkeypatch.setenv("COSYSERVE_LOG__JSON", "false")
    settings = Settings.load(config_file=config, log_level=None)
    assert settings.config_file == config
    assert settings.log.level == "WARNING" and settings.log.json_lines is False  # env beats the file


def test_bad_toml_is_reported(clean_env: Path) -> None:
    (clean_env / "cosyserve.toml").write_text("port = = 3\n")
    with pytest.raises(SettingsError, match="cannot read config file"):
        Settings()


def test_a_server_wide_lexicon_file_is_checked_at_start(tmp_path: Path) -> None:
    good = tmp_path / "lexicon.json"
    good.write_text('{"重庆": "chóng qìng", "行长": "[行长][hang2 zhang3]"}', encoding="utf-8")
    assert Settings(lexicon=str(good)).engine.lexicon == good
    for content, said in [
        ('{"重庆": "chong2"}', r"lexicon\.json: lexicon entry '重庆': .*1 pinyin syllables"),
        ("[1, 2]", "one JSON object of word -> pronunciation"),
        ("{not json", "is not UTF-8 JSON"),
    ]:
        good.write_text(content, encoding="utf-8")
        with pytest.raises(SettingsError, match=said):
            Settings(lexicon=str(good))
    with pytest.raises(SettingsError, match="cannot be read"):
        Settings(lexicon=str(tmp_path / "missing.json"))


def test_the_lexicon_file_reaches_the_synthesizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cosyserve.modeldir import resolve
    from cosyserve.service.local import loading

    lexicon = tmp_path / "lexicon.json"
    lexicon.write_text('{"重庆": "chóng qìng"}', encoding="utf-8")
    loaded: dict = {}
    monkeypatch.setattr(resolve, "resolve_model", lambda model, **kw: tmp_path)
    monkeypatch.setattr(loading.Synthesizer, "load", lambda model_dir, **kw: loaded.update(kw))
    loading.load_synthesizer(Settings(lexicon=str(lexicon), device="cpu"), None)
    assert loaded["lexicon"] == {"重庆": "chóng qìng"}


def test_validation_errors_name_the_setting_and_what_is_allowed() -> None:
    with pytest.raises(SettingsError) as info:
        Settings(preset="turbo", port=70000, device="tpu")
    message = str(info.value)
    assert "engine.preset" in message and "'exact' or 'fast'" in message and "COSYSERVE_PRESET" in message
    assert "server.port" in message and "65535" in message and "--port" in message
    assert "engine.device" in message
    with pytest.raises(SettingsError, match=r"unknown setting 'engine.modle'.*model"):
        Settings(engine={"modle": "x"})
    with pytest.raises(SettingsError, match="unknown setting 'prot'"):
        Settings(prot=1)
    with pytest.raises(SettingsError) as flat_in_table:  # `quality_takes = 2` under [quality]
        Settings(quality={"quality_takes": 2})
    hint = str(flat_in_table.value)
    assert "in [quality] write 'takes'" in hint and "quality_takes," not in hint.split("known in")[1]
    with pytest.raises(SettingsError, match="queue_url"):
        Settings(queue_url="http://redis")
    with pytest.raises(SettingsError, match=r"s3\.sync is on but s3\.bucket is unset"):
        Settings(s3_sync=True)


def test_secrets_are_not_leaked() -> None:
    settings = Settings(
        ui_username="admin",
        ui_password="hunter2-password",
        s3_bucket="b",
        s3_secret_access_key="aws-secret-value",
        signing_secret="signing-secret-value",
    )
    for text in (repr(settings), str(settings), str(settings.public_dict())):
        for secret in ("hunter2-password", "aws-secret-value", "signing-secret-value"):
            assert secret not in text
    assert settings.auth.ui_password is not None
    assert settings.auth.ui_password.get_secret_value() == "hunter2-password"
    with pytest.raises(SettingsError) as info:
        Settings(ui_password="lonely-password")  # no username: refused without echoing the value
    assert "lonely-password" not in str(info.value)


def test_passwords_inside_urls_are_masked_where_settings_are_shown(tmp_path: Path) -> None:
    """`/admin/status` showed `redis://:RedisPw@host/0` and the database URL's password (a team's run)."""
    from cosyserve.service.stores.db import make_engine

    settings = Settings(
        queue_url="redis://:RedisPw@127.0.0.1:6379/0",
        database_url="postgresql+psycopg://cosy:S3cretPw@db:5432/cosy",
    )
    shown = settings.public_dict()
    assert shown["queue"]["queue_url"] == "redis://:***@127.0.0.1:6379/0"
    assert shown["storage"]["database_url"] == "postgresql+psycopg://cosy:***@db:5432/cosy"
    assert "RedisPw" not in str(shown) and "S3cretPw" not in str(shown)
    assert Settings(data_dir=tmp_path).public_dict()["storage"]["database_url"].startswith("sqlite:///")
    with pytest.raises(SettingsError) as bad:  # SQLite takes no password; the error does not echo it
        make_engine("sqlite://dbuser:pw-value@/tmp/x.db")
    assert "pw-value" not in str(bad.value) and "no user, password or host" in str(bad.value)


def test_startup_safety() -> None:
    assert Settings().check_startup_safety(has_any_key=False, has_ui_login=False) == []
    exposed = Settings(host="0.0.0.0")
    with pytest.raises(SettingsError, match="--insecure"):
        exposed.check_startup_safety(has_any_key=False, has_ui_login=False)
    assert exposed.check_startup_safety(has_any_key=True, has_ui_login=False) == []
    assert exposed.check_startup_safety(has_any_key=False, has_ui_login=True) == []
    with_login = Settings(host="0.0.0.0", ui_username="a", ui_password="b")
    assert with_login.check_startup_safety(has_any_key=False, has_ui_login=False) == []
    warnings = Settings(host="0.0.0.0", insecure=True).check_startup_safety(False, False)
    assert len(warnings) == 1 and "no authentication" in warnings[0]
    required = Settings(api_keys_required=True).check_startup_safety(False, False)
    assert "no API key exists" in required[0]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True), ("127.0.0.2", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("myhost", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_resolve_concurrency() -> None:
    assert Settings().resolve_concurrency("cpu") == 1
    assert Settings().resolve_concurrency("cuda") == 2
    assert Settings(concurrency=5).resolve_concurrency("cpu") == 5


def test_signing_secret_generated_once_and_kept(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = Settings(data_dir=data_dir).resolve_signing_secret().get_secret_value()
    path = data_dir / "signing_secret"
    assert len(first) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Settings(data_dir=data_dir).resolve_signing_secret().get_secret_value() == first
    configured = Settings(data_dir=data_dir, signing_secret="x" * 40).resolve_signing_secret()
    assert configured.get_secret_value() == "x" * 40


def test_reference_covers_every_setting() -> None:
    docs = settings_reference()
    assert len(docs) == len(FLAT_NAMES) == len({doc.flat_name for doc in docs})
    assert all(doc.description for doc in docs)
    by_name = {doc.flat_name: doc for doc in docs}
    assert by_name["port"].env_vars == ("COSYSERVE_SERVER__PORT", "COSYSERVE_PORT")
    assert by_name["port"].flag == "--port" and by_name["port"].default == 7860
    assert by_name["s3_secret_access_key"].secret and not by_name["s3_bucket"].secret
    assert by_name["log_json"].path == "log.json"


def test_nest_flat() -> None:
    assert nest_flat({"port": 1, "server": {"host": "h"}, "model": "m", "_env_file": None}) == {
        "server": {"host": "h", "port": 1},
        "engine": {"model": "m"},
        "_env_file": None,
    }


def test_engine_options_follow_device_concurrency_and_flow_settings(monkeypatch) -> None:
    from cosyserve.service.local.loading import engine_options

    cpu = engine_options(Settings(engine={"device": "cpu"}))
    assert not cpu.batch_decode and not cpu.batch_flow and not cpu.cuda_graph
    assert cpu.flow_steps == 10 and cpu.guidance  # the exact path
    gpu = engine_options(Settings(engine={"device": "cuda:0"}, queue={"concurrency": 3}))
    assert gpu.batch_decode and gpu.batch_flow and gpu.max_batch == 3
    single = engine_options(Settings(engine={"device": "cuda"}, queue={"concurrency": 1}))
    assert single.cuda_graph and not single.batch_decode
    off = engine_options(Settings(engine={"device": "cuda", "gpu_batching": False}, queue={"concurrency": 3}))
    assert not off.batch_decode and not off.cuda_graph
    fast = engine_options(Settings(engine={"device": "cpu", "flow_steps": 4, "flow_guidance": False}))
    assert fast.flow_steps == 4 and fast.guidance is False


def test_a_group_named_in_the_environment_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """COSYSERVE_QUEUE=redis://… (the flag is --queue-url) was a 49-line traceback."""
    from cosyserve.errors import SettingsError

    monkeypatch.setenv("COSYSERVE_QUEUE", "redis://127.0.0.1:6379/0")
    with pytest.raises(SettingsError, match="COSYSERVE_QUEUE names a group of settings"):
        Settings()


def test_an_empty_data_dir_is_refused_not_the_current_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    from cosyserve.errors import SettingsError

    with pytest.raises(SettingsError, match=r"storage\.data_dir.*is empty"):
        Settings(data_dir="")
    monkeypatch.setenv("COSYSERVE_DATA_DIR", " ")
    with pytest.raises(SettingsError, match="is empty"):
        Settings()
