"""`cosyserve worker`: take synthesis work from a shared Redis queue (distributed mode).

Start one per accelerator (`--device cuda:0`, `--device cuda:1`, …) on any machine that reaches the queue,
the database and the object store; API nodes (`cosyserve serve --queue …`) hand them the work. Every
setting `serve` takes applies here too (`--model`, `--concurrency`, `--database-url`, `--s3-*`, …).
"""

from __future__ import annotations

import argparse
import logging
from urllib.parse import urlsplit, urlunsplit

from cosyserve.commands.serve import add_settings_flags, load_settings, require_distributed_extra
from cosyserve.errors import SettingsError, Unavailable

log = logging.getLogger("cosyserve.worker")
QUEUE_CONNECT_TIMEOUT_S = 5.0


def cmd_worker(args: argparse.Namespace) -> int:
    from cosyserve.commands.private_files import keep_files_private
    from cosyserve.service.logs import configure_from_settings
    from cosyserve.service.worker_node import WorkerNode

    keep_files_private()  # (see `serve`)
    settings = load_settings(args, args.settings_dests)
    if not settings.queue.queue_url:
        raise SettingsError(
            "a worker needs the shared queue: pass --queue redis://HOST:6379/0 (or set COSYSERVE_QUEUE_URL)"
        )
    require_distributed_extra(settings)
    require_reachable_queue(settings.queue.queue_url)
    configure_from_settings(settings.log)
    from cosyserve.commands.open_files import raise_open_files_limit
    from cosyserve.commands.startup import where_things_are

    log.info(where_things_are(settings))
    raise_open_files_limit()
    node = WorkerNode(settings, name=args.name)
    return node.run(loglevel=settings.log.level)


def require_reachable_queue(url: str, timeout_s: float = QUEUE_CONNECT_TIMEOUT_S) -> None:
    """Unavailable (one line, exit 3) when the queue does not answer a ping: Celery's consumer would retry
    for ever, logging a connection error every few seconds, and the worker would look alive."""
    import redis

    try:
        redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s).ping()
    except redis.RedisError as exc:
        raise Unavailable(
            f"the queue {redact_url(url)} does not answer ({exc}): start Redis there, or pass the --queue "
            "URL the API nodes use"
        ) from None


def redact_url(url: str) -> str:
    """`url` without its password (a queue URL may carry one)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def add_parser(sub: argparse._SubParsersAction) -> None:
    worker = sub.add_parser(
        "worker",
        help="run a synthesis worker for API nodes sharing a Redis queue (one per GPU)",
        description="Load the model once and run queued work from `cosyserve serve --queue …` nodes. "
        "Stops on SIGTERM/SIGINT after the tasks it is running have finished.",
    )
    worker.add_argument("--name", default=None, help="worker name in /ready and logs (default: host-pid)")
    dests = add_settings_flags(worker)
    worker.set_defaults(func=cmd_worker, settings_dests=dests)
