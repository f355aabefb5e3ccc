"""The server as the page sees it: the model's readiness (the banner and status line), how many event
handlers Gradio may run at once, and what the page's file serving must respect (the upload limit, the
folders it never serves)."""

from __future__ import annotations

from typing import Any

from cosyserve.limits import upload_bytes
from cosyserve.service.assembly import Service


class StatusPart:
    """The UI bridge's part that reports the server's state and serving limits."""

    service: Service

    def readiness(self) -> dict[str, Any]:
        """The model's state as GET /ready reports it (ready, state, reason, model, device, demo)."""
        return self.service.readiness()

    @property
    def event_slots(self) -> int:
        """Gradio may run this many syntheses' event handlers at once; the service's own queue decides the
        rest (its workers, its queue, and one more to be refused with a clear "busy")."""
        settings = self.service.settings
        return settings.resolve_concurrency(self.service.device_type) + settings.queue.queue_size + 1

    @property
    def max_upload_bytes(self) -> int:
        return upload_bytes(self.service.settings.limits.max_upload_mb)

    @property
    def private_folders(self) -> list[str]:
        """The folders the page must never serve files from: the data directory and the outputs."""
        storage = self.service.settings.storage
        data_dir = str(storage.data_dir)
        return [data_dir, str(storage.output_dir or data_dir)]
