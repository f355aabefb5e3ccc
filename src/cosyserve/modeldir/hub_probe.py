"""Can this machine reach the model hubs at all? One TCP connection each, in parallel, before downloading.

A hub whose name does not resolve, that refuses the connection or does not answer within a few seconds
is not worth the hub libraries' own retries (ModelScope alone waits 1+2+4 s per listing, twice over):
`download_model` skips it at once, so an offline machine hears within seconds. A transfer that stalls
midway is a different case: the hub was reached, and the retry budget resumes it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

PROBE_TIMEOUT_S = 4.0  # for every hub together: the probes run in parallel
# hub -> (environment variable that moves it, default endpoint): the variables the hub libraries read
HUB_ENDPOINTS: dict[str, tuple[str, str]] = {
    "huggingface": ("HF_ENDPOINT", "https://huggingface.co"),
    "modelscope": ("MODELSCOPE_DOMAIN", "https://www.modelscope.cn"),
}
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def hub_address(hub: str, environ: Mapping[str, str] | None = None) -> tuple[str, int]:
    """(host, port) the hub's client connects to first: the HTTPS proxy when one is set, else the hub."""
    env = os.environ if environ is None else environ
    variable, default = HUB_ENDPOINTS[hub]
    endpoint = env.get(variable, "").strip() or default
    if "://" not in endpoint:  # MODELSCOPE_DOMAIN is a bare host name
        endpoint = f"https://{endpoint}"
    target = urlsplit(endpoint)
    proxy = next((env[name] for name in _PROXY_VARIABLES if env.get(name)), "")
    no_proxy = [
        entry.strip().lstrip(".") for entry in env.get("NO_PROXY", env.get("no_proxy", "")).split(",")
    ]
    host = target.hostname or ""
    if proxy and not any(entry and (entry == "*" or host.endswith(entry)) for entry in no_proxy):
        target = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    default_port = 80 if target.scheme == "http" else 443
    return target.hostname or "", target.port or default_port


def probe_address(host: str, port: int, timeout_s: float) -> str | None:
    """None when `host:port` accepts a TCP connection; else why not, as `Type: message`."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as exc:
        return f"gaierror: {exc.strerror or exc} ({host})"
    except TimeoutError:
        return f"TimeoutError: no answer from {host}:{port} within {timeout_s:g} s"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc} ({host}:{port})"


def probe_hubs(
    hubs: Sequence[str], environ: Mapping[str, str] | None = None, timeout_s: float = PROBE_TIMEOUT_S
) -> dict[str, str | None]:
    """hub -> None (reachable) or the reason it is not, for every hub in `hubs`, within `timeout_s`.

    Name lookups have no timeout of their own (a broken resolver can hang for long), so each probe runs
    in a daemon thread and one that has not answered by the deadline counts as out of reach.
    """
    results: dict[str, str | None] = {}
    threads = []
    for hub in hubs:
        host, port = hub_address(hub, environ)

        def probe(hub: str = hub, host: str = host, port: int = port) -> None:
            results[hub] = probe_address(host, port, timeout_s)

        thread = threading.Thread(target=probe, name=f"cosyserve-probe-{hub}", daemon=True)
        thread.start()
        threads.append((hub, host, port, thread))
    deadline = time.monotonic() + timeout_s
    for hub, host, port, thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if hub not in results:
            results[hub] = f"TimeoutError: no answer from {host}:{port} within {timeout_s:g} s"
    return {hub: results[hub] for hub in hubs}


def is_unreachable(exc: BaseException) -> bool:
    """Whether `exc` (or an error behind it) says the hub could not be reached at all: a name that does
    not resolve, a refused connection. Retrying that within seconds cannot help."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (socket.gaierror, ConnectionRefusedError)):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
