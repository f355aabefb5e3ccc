"""`cosyserve serve` (the web service on port 7860) and `cosyserve keys` (API key administration).

Every setting is a flag (`--port`, `--concurrency`, …; `cosyserve serve --help` lists them): flags win
over `COSYSERVE_*` environment variables, which win over `cosyserve.toml`.
"""

from __future__ import annotations

import argparse
import logging
import typing
from pathlib import Path
from typing import Any

from cosyserve.commands.data_dir_lock import hold_single_server
from cosyserve.commands.data_dirs import existing_data_dir
from cosyserve.errors import ModelDirError, Unavailable, exit_code_for
from cosyserve.exit_codes import ExitCode

log = logging.getLogger("cosyserve.serve")


def _field_annotation(path: str) -> Any:
    from cosyserve.service.setting_groups import GROUPS

    group, key = path.split(".")
    for name, info in GROUPS[group].model_fields.items():
        if (info.alias or name) == key:
            return info.annotation
    raise KeyError(path)  # pragma: no cover - settings_reference only lists real fields


# The short forms the docs use, and the official CosyVoice scripts' `--model_dir`.
FLAG_ALIASES = {"--queue-url": ("--queue",), "--model": ("--model_dir", "--model-dir")}


def add_settings_flags(parser: argparse.ArgumentParser) -> list[str]:
    """One flag per setting (values are checked by Settings, not argparse); returns their dest names."""
    from cosyserve.service.settings import settings_reference

    parser.add_argument("--config", default=None, metavar="FILE", help="TOML settings file")
    dests = []
    for doc in settings_reference():
        annotation = _field_annotation(doc.path)
        help_text = f"{doc.description} [env {doc.env_vars[1]}]"
        if not doc.secret and doc.default not in (None, ""):
            help_text += f" (default: {doc.default})"
        if annotation is bool:
            parser.add_argument(
                doc.flag,
                dest=doc.flat_name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            if typing.get_origin(annotation) is typing.Literal:
                help_text += f" (one of: {', '.join(map(str, typing.get_args(annotation)))})"
            parser.add_argument(
                doc.flag,
                *FLAG_ALIASES.get(doc.flag, ()),
                dest=doc.flat_name,
                default=None,
                metavar=doc.flat_name.upper(),
                help=help_text,
            )
        dests.append(doc.flat_name)
    return dests


def load_settings(args: argparse.Namespace, dests: list[str]) -> Any:
    from cosyserve.service.settings import Settings

    flags = {name: getattr(args, name) for name in dests}
    return Settings.load(config_file=args.config, **flags)


def cmd_serve(args: argparse.Namespace) -> int:
    from cosyserve.commands.private_files import keep_files_private
    from cosyserve.commands.startup import address_in_use, print_failure, watch_first_load
    from cosyserve.modeldir.resolve import unreachable_download
    from cosyserve.service.local.load_failure import load_failure_message
    from cosyserve.service.logs import configure_from_settings

    keep_files_private()  # before the log file, the database or any output is made
    settings = load_settings(args, args.settings_dests)
    require_distributed_extra(settings)
    configure_from_settings(settings.log)
    from cosyserve.commands.open_files import raise_open_files_limit
    from cosyserve.commands.startup import where_things_are

    log.info(where_things_are(settings))
    raise_open_files_limit()
    for warning in startup_safety(settings):  # raises SettingsError for an open public address
        log.warning(warning)
    taken = address_in_use(settings.server.host, settings.server.port)
    if taken is not None:  # said now, before the model loads (it was uvicorn's log line, exit status 3)
        print_failure("serve", taken)
        return ExitCode.USAGE
    storage = settings.storage
    held = (
        None
        if settings.queue.queue_url
        else hold_single_server(storage.data_dir, storage.database_url or "", storage.output_dir)
    )
    if not settings.queue.queue_url and not settings.server.keep_serving_on_load_error:
        unreachable = unreachable_download(settings.engine.model, models_root=settings.engine.models_dir)
        if unreachable is not None:  # seconds, not the half minute the web UI's imports take
            print_failure("serve", load_failure_message(settings.engine.model, unreachable))
            return exit_code_for(unreachable)
    import uvicorn

    from cosyserve.api.app import create_app
    from cosyserve.commands.draining import DrainingServer
    from cosyserve.service.assembly import Service

    # With a shared queue this node loads no model: `cosyserve worker` processes do the synthesis.
    service = Service(settings, role="api" if settings.queue.queue_url else "single")
    service.preload()  # the model loads while the web UI's imports run
    from cosyserve.ui.app import mount_ui

    app = create_app(service)
    mount_ui(app, service)  # the web UI at "/", behind the same auth as the API
    service.startup.mark("imports done")
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_config=None,  # keep our logging (request ids, JSON lines)
        access_log=False,  # our middleware logs each request with its id
        lifespan="on",
        timeout_graceful_shutdown=int(service.shutdown_grace_s) + 1,
        # uvicorn's 5 s equals httpx's own idle limit: a client then sometimes sends its next request on a
        # connection the server is just closing, and gets a disconnect instead of an answer.
        timeout_keep_alive=settings.server.keep_alive_s,
        server_header=False,
    )
    log.info("cosyserve on http://%s:%d (API docs at /docs)", settings.server.host, settings.server.port)
    server = DrainingServer(config, drain=service.drain)
    load_failed: list[str] = []
    host = service.model  # None on an API node: it loads no model
    if host is not None and not settings.server.keep_serving_on_load_error:

        def stop_serving(message: str) -> None:
            load_failed.append(message)
            server.should_exit = True

        watch_first_load(lambda: host.state, lambda: host.load_error, settings.engine.model, stop_serving)
    server.run()
    if held is not None:
        held.close()  # the next server on this data directory may start
    if load_failed:
        print_failure("serve", load_failed[0])
        missing = host is not None and isinstance(host.load_error, (ModelDirError, Unavailable))
        return ExitCode.UNAVAILABLE if missing else ExitCode.FAILED  # a device, a damaged checkpoint: 1
    return ExitCode.OK if server.started else ExitCode.FAILED


def require_distributed_extra(settings: Any) -> None:
    """`--queue redis://…` needs Celery and redis-py (the distributed extra): say so before starting."""
    from cosyserve.errors import require_modules

    if settings.queue.queue_url:
        require_modules("--queue (distributed mode)", "celery", "redis")


def startup_safety(settings: Any) -> list[str]:
    """`Settings.check_startup_safety` with the key database consulted (before anything is started)."""
    from cosyserve.service.stores.db import make_engine, metadata, sqlite_path
    from cosyserve.service.stores.keys import KeyStore

    url = settings.storage.database_url or ""
    database = sqlite_path(url)
    if database is not None and not database.exists():  # no keys yet, and a refused start makes no files
        return settings.check_startup_safety(False, settings.auth.ui_login_configured)
    engine = make_engine(url)
    try:
        has_key = bool(KeyStore(engine, metadata).list(include_revoked=False))
    finally:
        engine.dispose()
    return settings.check_startup_safety(has_key, settings.auth.ui_login_configured)


def _key_store(args: argparse.Namespace) -> Any:
    from cosyserve.service.stores.db import make_engine, metadata
    from cosyserve.service.stores.keys import KeyStore

    settings = load_settings(args, args.settings_dests)
    url = settings.storage.database_url or ""
    if args.keys_command != "create" and url.startswith("sqlite:///"):
        existing_data_dir(Path(url.removeprefix("sqlite:///")).parent)  # a misspelt --data-dir: say so
    return KeyStore(make_engine(url), metadata)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the web service: REST API, OpenAI-compatible speech, web UI (port 7860)",
        description="Serve the model over HTTP. Binds 127.0.0.1 unless --host says otherwise; another "
        "address needs an API key or a UI login (or --insecure). `--model demo` serves the demo model.",
    )
    dests = add_settings_flags(serve)
    serve.set_defaults(func=cmd_serve, settings_dests=dests)

    from cosyserve.commands.keys import add_keys_parser

    keys = add_keys_parser(sub, _key_store)
    actions = next(a for a in keys._actions if isinstance(a, argparse._SubParsersAction))
    for action in actions.choices.values():  # after the action, where people put them
        action.add_argument("--config", default=None, metavar="FILE", help="TOML settings file")
        action.add_argument("--data-dir", dest="data_dir", default=None, help="where the database lives")
        action.add_argument("--database-url", dest="database_url", default=None, help="SQLAlchemy URL")
    keys.set_defaults(settings_dests=["data_dir", "database_url"])
