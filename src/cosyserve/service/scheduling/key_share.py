"""Keys sharing a cluster's background slots: whether a key's job may start on a worker now.

In a cluster, background work (long-text jobs, batches, dubs) waits in one Celery queue, first come, first
served, and each worker runs at most `background_running` of it at once. Without a rule, a key that
submitted twenty batches fills every slot of every worker while another key's single batch waits behind
them. So when a worker has a free slot for a job of key K, it looks at the whole cluster (the background
tasks running per key, the keys with a task waiting in the queue) and sends K's task back to the queue for
a moment when another key waits while running fewer tasks than K does: max-min fairness over slots.

- a key alone (no other key waits) is never sent back: it may use every slot of the cluster;
- no deadlock: of the keys that wait, the one running fewest is never sent back, so a free slot always
  goes to someone (ties are no reason to step aside);
- no starvation: a waiting key that runs nothing gets the next free slot before any key that runs one,
  and two busy keys end up with slots in turn (their counts differ by at most one).

Inside each worker the engine is then shared between keys by engine seconds (`fair_policy.py`).

Pure: the counts are passed in (`distributed/background_share.py` keeps them in Redis).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

ANONYMOUS_KEY = "anonymous"  # whose work has no owner (authentication off): all of it counts as one key


def share_key(owner: str | None) -> str:
    """Whom a job counts against when keys share the cluster: its owner (`key:7`, `user:ann`)."""
    return owner or ANONYMOUS_KEY


def yields_to(key: str, running: Mapping[str, int], waiting: Iterable[str]) -> str | None:
    """The key a task of `key` steps aside for, or None when it may start now.

    `running`: background tasks running in the cluster per key (absent: none); `waiting`: the keys with a
    background task waiting in the queue (`key` itself among them or not). The answer is the waiting key
    that runs fewest, when it runs fewer than `key` does (the earliest name on a tie, for stable logs).
    """
    mine = running.get(key, 0)
    others = sorted((running.get(other, 0), other) for other in set(waiting) if other != key)
    if others and others[0][0] < mine:
        return others[0][1]
    return None
