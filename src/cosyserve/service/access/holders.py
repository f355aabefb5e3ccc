"""Who holds a request's quota reservation: a process named `host-pid.start`, and whether it still runs.

A process that dies (a crash, `kill -9`) leaves its reservations behind; the next process to start on
the same host releases those of processes that no longer run. By `host-pid` alone a restarted
container's server looked like its dead predecessor: both are PID 1 on the same hostname, so the dead
one's reservations were taken for its own and held the key's quota for an hour (their expiry). The
start time of the process (clock ticks since boot, from /proc) tells them apart, and a PID since reused
by another program too.
"""

from __future__ import annotations

import functools
import os
import socket


def start_ticks(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot), or None where /proc can't tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def this_process() -> str:
    """The holder name of this process's request reservations: `host-pid.start` (`host-pid` where the
    start time can't be read)."""
    return _holder_name(socket.gethostname(), os.getpid())


@functools.lru_cache(maxsize=4)
def _holder_name(host: str, pid: int) -> str:  # (read once per process: every reservation names it)
    start = start_ticks(pid)
    return f"{host}-{pid}" + (f".{start}" if start else "")


def holder_alive(pid_text: str) -> bool:
    """Whether the process named `pid_text` (`pid.start`, or a bare `pid` written before) on this host
    still runs: this process itself, or another with that pid and start time."""
    pid_part, _, start = pid_text.partition(".")
    try:
        pid = int(pid_part)
    except ValueError:
        return True  # not a holder this code wrote: leave it to its expiry
    if pid == os.getpid():  # this process's own, or a dead predecessor's that had the same pid
        return pid_text == this_process().rsplit("-", 1)[1]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    running = start_ticks(pid)
    return not (start and running and running != start)  # else the pid names another process now
