"""The Celery application API nodes send tasks to and workers consume from.

Delivery guarantees, per task:
- `cosyserve.job` (long texts) and `cosyserve.batch` (batches and dubs, their items in the batch_items
  table; the message carries only the job's id): rows in the jobs table, acknowledged *late*, after they
  finished, so a
  worker that dies mid-job leaves the message unacknowledged and Redis hands it to another worker after
  `visibility_timeout_s`. The jobs table's claim/lease/attempt (see `stores/jobs.py`) makes the
  redelivered copy wait while the first worker is alive and makes sure only one attempt records a result.
  Should the message be lost, the workers find the job from its expired lease (`lost_jobs.py`).
- `cosyserve.tts` and `cosyserve.enrol` (a client is waiting on the line): acknowledged when a worker takes
  them. If that worker dies the API node sees its lease vanish and answers 503 "retry"; re-running an
  interactive request minutes later for a client that has gone would only waste a GPU.

Two queues, one per class of work: interactive tasks (`cosyserve`) and jobs, batches and dubs
(`cosyserve.background`). A worker takes from both, with room in its pool for interactive tasks beside at
most `background_running` background ones (more go back to the queue for a moment, `worker_jobs.py`,
as does a key's task while another key waits that runs fewer in the cluster); its own scheduler then
shares the engine sentence by sentence (item by item), interactive first.

Messages are JSON only; results travel through the relay (`relay.py`), not a Celery result backend.
"""

from __future__ import annotations

from typing import Any

QUEUE = "cosyserve"  # interactive tasks
BACKGROUND_QUEUE = "cosyserve.background"  # jobs, batches and dubs
TTS_TASK = "cosyserve.tts"
JOB_TASK = "cosyserve.job"
ENROL_TASK = "cosyserve.enrol"
BATCH_TASK = "cosyserve.batch"


def make_celery(broker_url: str, *, visibility_timeout_s: float = 600.0, restore_interval_s: int = 10) -> Any:
    """A configured Celery app on `broker_url` (redis:// or rediss://)."""
    from celery import Celery

    app = Celery("cosyserve", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_backend=None,
        task_ignore_result=True,
        task_default_queue=QUEUE,
        worker_prefetch_multiplier=1,  # a busy worker does not sit on messages an idle one could run
        task_acks_late=False,  # per task below
        task_reject_on_worker_lost=True,  # a crashed pool process gives its late-acked task back
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": int(visibility_timeout_s),
            # how often a worker looks for messages whose consumer vanished (kombu's default is 100 s)
            "unacked_restore_interval": restore_interval_s,
            "unacked_restore_throttle": 1,
        },
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


def queue_of(task: str) -> str:
    """The queue a task goes to: background work apart from interactive requests."""
    return BACKGROUND_QUEUE if task in (JOB_TASK, BATCH_TASK) else QUEUE


def task_options(name: str) -> dict[str, Any]:
    """Decorator options for each task: late acks for jobs only (see the module docstring)."""
    late = name in (JOB_TASK, BATCH_TASK)
    # max_retries None: `task.retry(max_retries=None)` means the task's limit, which must be none (Celery's
    # default of 3 ended a job whose worker died after three looks at its lease, leaving it running)
    return {
        "name": name,
        "bind": True,
        "acks_late": late,
        "reject_on_worker_lost": late,
        "max_retries": None,
    }
