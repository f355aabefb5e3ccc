"""Distributed mode: API nodes and `cosyserve worker` processes sharing a Celery queue on Redis.

`celery_app` (the Celery app, task names and delivery guarantees), `relay` (result streams, cancel flags,
leases and worker heartbeats in Redis), `remote` (the API node's side), `worker` (the worker process);
what crosses the wire is `service/wire.py`. Single-process mode does not import any of it.
"""
