"""Service settings: one pydantic-settings model, read from four places.

Precedence, highest first:
1. keyword arguments (the CLI passes its flags): flat names (`port=8000`) or groups (`server={"port": 8000}`);
2. environment variables: `COSYSERVE_<GROUP>__<FIELD>` (`COSYSERVE_SERVER__PORT`) or the flat alias
   `COSYSERVE_<FLAT_NAME>` (`COSYSERVE_PORT`); when both are set the nested form wins;
3. a TOML file: the path in `COSYSERVE_CONFIG` (or the `config_file` argument), else `./cosyserve.toml`
   when present; tables per group (`[server]`, `port = 8000`) or flat names at the top level;
4. the defaults below.

Every field has a flat name, unique across groups: the field's own name, except in the `s3` and `log` groups
where it is prefixed (`s3_bucket`, `log_level`). The groups and their fields are in `setting_groups`;
`settings_reference()` lists them all for `--help` and docs.
"""

from __future__ import annotations

import os
import secrets
import sys
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from cosyserve.errors import SettingsError
from cosyserve.service.quality.settings import QualitySettings
from cosyserve.service.redact import without_passwords
from cosyserve.service.setting_groups import (
    FLAT_NAMES,
    GROUPS,
    AuthSettings,
    EngineSettings,
    LabelSettings,
    LimitSettings,
    LogSettings,
    QueueSettings,
    S3Settings,
    ServerSettings,
    StorageSettings,
    input_name,
    nest_flat,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: tomli is what tomllib was before it joined the standard library
    import tomli as tomllib

ENV_PREFIX = "COSYSERVE_"
CONFIG_ENV = "COSYSERVE_CONFIG"  # path of the TOML file
CONFIG_FILENAME = "cosyserve.toml"
SIGNING_SECRET_FILE = "signing_secret"


class _FlatEnvSource(PydanticBaseSettingsSource):
    """`COSYSERVE_<FLAT_NAME>` environment variables, nested into their groups."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        env = {key.upper(): value for key, value in os.environ.items()}
        found = {
            flat: env[ENV_PREFIX + flat.upper()] for flat in FLAT_NAMES if ENV_PREFIX + flat.upper() in env
        }
        return nest_flat(found)


class _TomlSource(PydanticBaseSettingsSource):
    """The TOML config file, if any; its path is recorded as `config_file`."""

    def __init__(self, settings_cls: type[BaseSettings], explicit: Any) -> None:
        super().__init__(settings_cls)
        if explicit:
            self.path, origin = Path(explicit), "config_file"
        elif os.environ.get(CONFIG_ENV) or os.environ.get(ENV_PREFIX + "CONFIG_FILE"):
            self.path = Path(os.environ.get(CONFIG_ENV) or os.environ[ENV_PREFIX + "CONFIG_FILE"])
            origin = CONFIG_ENV
        else:
            self.path, origin = Path.cwd() / CONFIG_FILENAME, None
            if not self.path.is_file():
                self.path = None
        if self.path is not None and not self.path.is_file():
            raise SettingsError(
                f"config file {self.path} (from {origin}) does not exist: fix the path or unset it"
            )

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            data = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"cannot read config file {self.path}: {exc}") from exc
        data.pop("config_file", None)
        return {**nest_flat(data), "config_file": str(self.path)}


class Settings(BaseSettings):
    """Everything the service can be told; see the module docstring for where values come from."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    config_file: Path | None = Field(None, description="TOML settings file (default: ./cosyserve.toml)")
    engine: EngineSettings = Field(default_factory=EngineSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    queue: QueueSettings = Field(default_factory=QueueSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    s3: S3Settings = Field(default_factory=S3Settings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    labels: LabelSettings = Field(default_factory=LabelSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**nest_flat(values))
        except ValidationError as exc:
            raise SettingsError(explain_validation_error(exc)) from exc
        except PydanticSettingsError as exc:  # COSYSERVE_QUEUE=… names a group, which it reads as JSON
            group = str(exc).partition('field "')[2].partition('"')[0] or "?"
            raise SettingsError(
                f"COSYSERVE_{group.upper()} names a group of settings, not one setting ({exc}): set its "
                "settings one by one (each flag of `cosyserve serve --help` is COSYSERVE_<FLAG>: --queue-url "
                "is COSYSERVE_QUEUE_URL)"
            ) from exc

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        explicit = getattr(init_settings, "init_kwargs", {}).get("config_file")
        return init_settings, env_settings, _FlatEnvSource(settings_cls), _TomlSource(settings_cls, explicit)

    @classmethod
    def load(cls, **flags: Any) -> Settings:
        """Settings with CLI flags on top; flags that are None (not given on the command line) are dropped."""
        return cls(**{key: value for key, value in flags.items() if value is not None})

    @model_validator(mode="after")
    def _derive_paths(self) -> Settings:
        storage = self.storage
        storage.data_dir = storage.data_dir.expanduser().absolute()
        storage.output_dir = (storage.output_dir or storage.data_dir / "outputs").expanduser().absolute()
        if not storage.database_url:
            storage.database_url = f"sqlite:///{storage.data_dir / 'cosyserve.db'}"
        if self.s3.sync and not self.s3.bucket:
            raise ValueError("s3.sync is on but s3.bucket is unset: set s3_bucket or turn sync off")
        if bool(self.auth.ui_username) != bool(self.auth.ui_password):
            raise ValueError("ui_username and ui_password must be set together (or neither)")
        return self

    def resolve_concurrency(self, device_type: str) -> int:
        """Slots to run at once: the configured value, else 1 on CPU and 2 on a GPU."""
        if self.queue.concurrency is not None:
            return self.queue.concurrency
        return 1 if device_type == "cpu" else 2

    def check_startup_safety(self, has_any_key: bool, has_ui_login: bool) -> list[str]:
        """Refuse to serve a non-loopback address with no authentication; return warnings to log."""
        authenticated = has_any_key or has_ui_login or self.auth.ui_login_configured
        if is_loopback(self.server.host) or authenticated:
            if self.auth.api_keys_required and not has_any_key:
                return [
                    "api_keys_required is on but no API key exists: create one with `cosyserve keys create`"
                ]
            return []
        if not self.server.insecure:
            raise SettingsError(
                f"refusing to listen on {self.server.host}, which other machines can reach, with no "
                "authentication: create an admin API key (`cosyserve keys create NAME --role admin`; any key "
                "turns authentication on, on 127.0.0.1 too), set ui_username and "
                "ui_password, listen on 127.0.0.1, or pass --insecure to serve it open anyway"
            )
        return [f"--insecure: serving {self.server.host}:{self.server.port} with no authentication"]

    def resolve_signing_secret(self) -> SecretStr:
        """The configured signing secret, else one kept in `<data_dir>/signing_secret` (created 0600 once)."""
        if self.auth.signing_secret is not None:
            return self.auth.signing_secret
        path = self.storage.data_dir / SIGNING_SECRET_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            value = path.read_text(encoding="utf-8").strip()
            if not value:
                raise SettingsError(f"{path} is empty: delete it to generate a new signing secret") from None
        else:
            value = secrets.token_urlsafe(32)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(value + "\n")
        self.auth.signing_secret = SecretStr(value)
        return self.auth.signing_secret

    def public_dict(self) -> dict[str, Any]:
        """All values as JSON-able data with secrets masked (for the admin panel and `--print-config`): the
        secret fields, and the password inside a URL (`queue_url`, `database_url`)."""
        return without_passwords(self.model_dump(mode="json", by_alias=True))


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses; names other than `localhost` count as reachable."""
    if host.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class SettingDoc:
    """One setting as documented: its names in every source, default and one-line description."""

    flat_name: str  # keyword argument / CLI flag name (`--` + flat_name with dashes)
    path: str  # group.field, also the TOML table and key
    env_vars: tuple[str, ...]
    default: Any
    description: str
    secret: bool

    @property
    def flag(self) -> str:
        return "--" + self.flat_name.replace("_", "-")


def settings_reference() -> list[SettingDoc]:
    """Every setting, grouped in declaration order, for `--help` and the docs."""
    docs = []
    for flat, (group, key) in FLAT_NAMES.items():
        name = next(n for n, i in GROUPS[group].model_fields.items() if input_name(n, i) == key)
        info = GROUPS[group].model_fields[name]
        default = None if info.default_factory is not None else info.default
        env = (f"{ENV_PREFIX}{group.upper()}__{key.upper()}", f"{ENV_PREFIX}{flat.upper()}")
        secret = "SecretStr" in str(info.annotation)
        docs.append(SettingDoc(flat, f"{group}.{key}", env, default, info.description or "", secret))
    return docs


def _known_hint(loc: list[str], by_path: dict[str, SettingDoc]) -> str:
    """What an unknown setting could have been: inside a [table] its keys as written there (a flat name
    such as quality_takes is for flags, variables and the file's top level: in [quality] it is `takes`)."""
    in_group = [doc for doc in by_path.values() if doc.path.startswith(loc[0] + ".")]
    if not in_group:
        return f"; known settings: {', '.join(FLAT_NAMES)}"
    keys = [doc.path.split(".", 1)[1] for doc in in_group]
    meant = next((doc for doc in in_group if len(loc) > 1 and doc.flat_name == loc[1]), None)
    said = f"; in [{loc[0]}] write {meant.path.split('.', 1)[1]!r}" if meant is not None else ""
    return f"{said}; known in [{loc[0]}]: {', '.join(keys)}"


def explain_validation_error(exc: ValidationError) -> str:
    """One line per bad value: which setting, what is allowed, and where it can be set."""
    by_path = {doc.path: doc for doc in settings_reference()}
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        path = ".".join(loc[:2])
        doc = by_path.get(path)
        if error["type"] == "extra_forbidden":
            lines.append(f"unknown setting {path!r}{_known_hint(loc, by_path)}")
            continue
        message = error["msg"]
        if doc is not None and not doc.secret:
            message += f" (got {error.get('input')!r})"
        where = (
            f"; set it with {doc.flag}, {doc.env_vars[1]} or [{loc[0]}] in {CONFIG_FILENAME}" if doc else ""
        )
        lines.append(f"invalid setting {path or 'settings'}: {message}{where}")
    if len(lines) == 1:
        return lines[0]  # one line as it is (the CLI joins several into one with "; ")
    return "invalid settings:\n  " + "\n  ".join(lines)
