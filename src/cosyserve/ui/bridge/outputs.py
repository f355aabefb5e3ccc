"""Stored results for the UI: one the principal may see, its history, deleting, and signed download links
(the same rules as `/v1/outputs`)."""

from __future__ import annotations

from datetime import tzinfo

from cosyserve.service.access.principals import Principal
from cosyserve.service.assembly import Service
from cosyserve.service.stores.outputs import OutputNotFound, StoredOutput


class OutputsPart:
    """The UI bridge's part that reads and deletes stored results."""

    service: Service

    def output(self, principal: Principal, output_id: str) -> StoredOutput:
        """A stored result the principal may see (admins and anonymous users see all)."""
        output = self.service.outputs.get(output_id)
        if not principal.may_see(output.manifest.get("owner")):
            raise OutputNotFound(f"no output {output_id}; it may have expired or been deleted")
        return output

    @property
    def time_zone(self) -> tzinfo | None:
        """The operator's zone (`--timezone`; None: this machine's), which output names are written in."""
        return self.service.outputs.zone

    def made_output(self, output_id: str) -> StoredOutput:
        """The stored result of a synthesis this page has just run for its caller (so no owner check)."""
        return self.service.outputs.get(output_id)

    def history(self, principal: Principal, limit: int = 50, everyone: bool = False) -> list[StoredOutput]:
        """This user's results, newest first (everyone's when there is no login at all, or when an admin
        asks for `everyone`'s)."""
        if everyone and principal.is_admin:
            return self.service.outputs.list(owner=None, limit=limit)
        owner = principal.owner
        if owner is None and principal.kind != "anonymous":
            return []
        return self.service.outputs.list(owner=owner, limit=limit)

    def delete_output(self, principal: Principal, output_id: str) -> StoredOutput:
        """Delete a stored result by the rule of `DELETE /v1/outputs/{id}`: a user its own, an admin any;
        another user's is OutputNotFound, as for a missing one."""
        self.output(principal, output_id)
        return self.service.outputs.delete(output_id)

    def download_url(self, output: StoredOutput, fmt: str = "wav") -> str:
        """The download route of `output`, for the page's own user: the browser sends its sign-in, so the
        link works as long as the session does (a signed link stopped working after `signed_url_ttl_s`,
        15 minutes, while the result still played on the page, and the click did nothing)."""
        return output.url_path + (f"?format={fmt}" if fmt != "wav" else "")
