"""What the web UI's Batch tab asks of the service: the same calls `/v1/batches` and `/v1/dub` make.

A script (CSV, TXT, JSONL, JSON) becomes a batch and a subtitle file (SRT, WebVTT) a dub, submitted as the
signed-in principal (its rate limit and quota apply, its key is charged per item); status, items and
signed download links come from the same stores and helpers the API uses.
"""

from __future__ import annotations

from pathlib import Path

from cosyserve.errors import InputError
from cosyserve.frontend.subtitles import parse_subtitles
from cosyserve.limits import SCRIPT_SUFFIXES, SUBTITLE_SUFFIXES, upload_bytes
from cosyserve.service.access.principals import Principal
from cosyserve.service.batches.inputs import BatchRules, ItemSpec, cue_items, kind_of, read_items
from cosyserve.service.batches.status import BatchStatus, batch_status
from cosyserve.service.batches.submission import BatchSubmission
from cosyserve.service.requests import OutputSpec
from cosyserve.service.stores.batches import BatchItem
from cosyserve.service.stores.jobs import JobNotFound, JobRecord
from cosyserve.service.stores.outputs import StoredOutput
from cosyserve.ui.bridge.facade import UiBridge

BATCH_KINDS = ("batch", "dub")
RECENT_BATCHES = 20  # how many of a user's batches the tab lists


class BatchBridge:
    """The Batch tab's view of the service, through the page's `UiBridge`."""

    def __init__(self, bridge: UiBridge) -> None:
        self.bridge = bridge
        self.service = bridge.service

    def submit(
        self,
        principal: Principal,
        path: str | Path,
        *,
        voice: str | None,
        instruct: str | None,
        fmt: str,
        max_speed: float,
        request_id: str,
        takes: int | None = None,
    ) -> JobRecord:
        """A batch (a script) or a dub (a subtitle file) of the uploaded file, as `principal`; `takes`: per
        item unless an item sets its own (None: the server's)."""
        service = self.service
        data, suffix = self._read(path)
        service.access.check_rate(principal)
        service.access.check_quota(principal)
        limits = service.settings.limits
        shared = {"voice": voice or None, "instruct": (instruct or "").strip() or None, "format": fmt}
        if takes is not None:
            if not 1 <= takes <= self.bridge.max_takes:
                raise InputError(f"takes must be from 1 to {self.bridge.max_takes}, got {takes}")
            shared["takes"] = takes
        if suffix in SUBTITLE_SUFFIXES:
            kind, shared = "dub", {**shared, "max_speed": max_speed}
            rules = BatchRules(
                limits.max_batch_items,
                limits.max_text_chars,
                False,
                {**shared, "format": "wav"},
                max_track_s=limits.max_dub_track_s,
            )
            items: list[ItemSpec] = cue_items(parse_subtitles(data, what=Path(path).name), rules)
        else:
            kind = "batch"
            rules = BatchRules(limits.max_batch_items, limits.max_text_chars, False, shared)
            items = read_items(data, kind_of(Path(path).name), rules)
        spec = OutputSpec(
            owner=principal.owner, key=principal.key, request_id=request_id, endpoint=f"ui-{kind}"
        )
        return service.backend.submit_batch(BatchSubmission(kind, items, shared), spec)

    def _read(self, path: str | Path) -> tuple[bytes, str]:
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in SCRIPT_SUFFIXES + SUBTITLE_SUFFIXES:
            raise InputError(
                f"{path.name}: upload a script ({', '.join(SCRIPT_SUFFIXES)}) or subtitles (.srt, .vtt)"
            )
        limit_mb = self.service.settings.limits.max_upload_mb
        if path.stat().st_size > upload_bytes(limit_mb):
            raise InputError(f"{path.name} is larger than the limit of {limit_mb:g} MB")
        return path.read_bytes(), suffix

    def record(self, principal: Principal, batch_id: str) -> JobRecord:
        record = self.service.jobs.get(batch_id)
        if record is None or record.kind not in BATCH_KINDS or not principal.may_see(record.owner):
            raise JobNotFound(f"no batch {batch_id!r}")
        return record

    def recent(self, principal: Principal, limit: int = RECENT_BATCHES) -> list[JobRecord]:
        """`principal`'s own batches and dubs, newest first (an admin's own too: the API lists everyone's)."""
        owner = principal.owner if principal.owner is not None else principal.listed_owner
        return self.service.jobs.list(owner=owner, limit=limit, kinds=BATCH_KINDS)

    def status(self, principal: Principal, batch_id: str) -> BatchStatus:
        record = self.record(principal, batch_id)
        return batch_status(self.service.batches, self.service.scheduler, record)

    def items(self, batch_id: str) -> list[BatchItem]:
        return self.service.batches.items(batch_id)

    def cancel(self, principal: Principal, batch_id: str) -> JobRecord:
        self.record(principal, batch_id)
        return self.service.backend.cancel_job(batch_id)

    def item_output(self, principal: Principal, batch_id: str, position: int) -> StoredOutput:
        self.record(principal, batch_id)
        item = self.service.batches.item(batch_id, position)
        if item is None or item.state != "done" or not item.output_id:
            raise InputError(f"item {position} has no audio yet")
        return self.service.outputs.get(item.output_id)

    # -- links for the page's own user: the browser sends its sign-in (signed links expired after 15 min)

    def archive_url(self, batch_id: str) -> str:
        return f"/v1/batches/{batch_id}/archive"

    def report_url(self, batch_id: str) -> str:
        return f"/v1/batches/{batch_id}/report?format=csv"

    def track_url(self, record: JobRecord) -> str | None:
        if record.kind != "dub" or not record.output_id:
            return None
        fmt = (record.params or {}).get("format") or "wav"
        return f"/v1/outputs/{record.output_id}" + (f"?format={fmt}" if fmt != "wav" else "")
