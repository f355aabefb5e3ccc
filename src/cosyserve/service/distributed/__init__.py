"""Distributed mode: API nodes and `cosyserve worker` processes sharing a Celery queue on Redis.

`celery_app` (the Celery app, task names and delivery guarantees), `relay` (result streams, cancel flags,
leases and worker heartbeats in Redis), `remote` (the API node's side), `task_watch` (a worker's task
leases); the worker process is assembled in `service/worker_node.py` (it builds a `Service`, as
`service/assembly.py` does), and what crosses the wire is `service/wire.py`. Single-process mode does not
import any of it.
"""
