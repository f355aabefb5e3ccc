"""The open-files limit a server runs with: every connection, upload, download and database handle takes
a descriptor, and at systemd's default soft limit (1024) a few hundred idle connections made other
users' saves fail with EMFILE. A process may raise its soft limit up to the hard one itself."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

WANTED_OPEN_FILES = 65536  # plenty for thousands of connections; more only costs kernel memory when used


def raise_open_files_limit(wanted: int = WANTED_OPEN_FILES) -> int | None:
    """Raise this process's soft RLIMIT_NOFILE towards `wanted` (at most the hard limit); the limit it
    runs with (None where the platform has no such limit)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # a container's seccomp or a platform quirk: keep the old one
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
            return soft
        log.info("open-files limit raised from %d to %d", soft, target)
        return target
    return soft
