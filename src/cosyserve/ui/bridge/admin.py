"""What the web UI's admin panel asks of the service: engine status and memory, restarts, logs, API keys and
quotas (the same calls as the admin REST routes, `service.access.key_admin`), and the enrolment list. Every
call that reads or changes something an ordinary user may not checks the admin role first."""

from __future__ import annotations

import os
from typing import Any

from cosyserve.errors import error_code
from cosyserve.service.access import key_admin
from cosyserve.service.access.principals import Forbidden, Principal
from cosyserve.service.activity import log_activity
from cosyserve.service.assembly import Service
from cosyserve.service.gpu import engine_allocator, gpu_report
from cosyserve.service.logs import recent_activity, recent_logs
from cosyserve.service.stores.voices import Voice


class AdminPart:
    """The UI bridge's part for the admin panel."""

    service: Service

    @staticmethod
    def require_admin(principal: Principal) -> None:
        if not principal.is_admin:
            raise Forbidden("this needs an admin login")

    def status(self) -> dict[str, Any]:
        """Engine, device memory, queue and storage, for the admin panel."""
        service = self.service
        return {
            "readiness": service.readiness(detailed=True),
            "scheduler": service.scheduler.stats(),
            "memory": self.memory(),
            "outputs": {"root": str(service.outputs.root), "total_bytes": service.outputs.total_bytes()},
            "uptime_s": round(service.uptime_s, 1),
        }

    def memory(self) -> dict[str, Any]:
        """Process memory, every GPU as NVML reports it (no CUDA context is created), and PyTorch's
        allocator on the engine's own device; a figure that can't be read is left out, never an error."""
        report = gpu_report()
        device = str(self.service.readiness().get("device") or self.service.device_type)
        return {
            "process_rss_mb": _rss_mb(),
            "device": device,
            "gpus": [gpu.as_dict() for gpu in report.gpus],
            "gpu_absent_reason": report.absent_reason,
            "engine_allocator": engine_allocator(device),
        }

    def restart_engine(self, principal: Principal) -> str:
        self.require_admin(principal)
        try:
            state = self.service.backend.restart_engine()
        except Exception as exc:
            log_activity("restart", error_code(exc), who=principal.name or principal.owner, endpoint="ui")
            raise
        log_activity("restart", "ok", who=principal.name or principal.owner, endpoint="ui", state=state)
        return state

    def logs(self, principal: Principal, limit: int = 100, level: str | None = None) -> list[dict[str, Any]]:
        self.require_admin(principal)
        return recent_logs(limit, level)

    def activity(self, principal: Principal, limit: int = 100) -> list[dict[str, Any]]:
        """The newest activity lines (syntheses, jobs, enrolments, logins, key changes), oldest first."""
        self.require_admin(principal)
        return recent_activity(limit)

    def keys(self, principal: Principal) -> list[dict[str, Any]]:
        """Every API key with today's usage, as GET /admin/keys lists them (admins only)."""
        self.require_admin(principal)
        quota = self.service.access.quota
        return [key_admin.key_view(quota, key) for key in self.service.keys.list(include_revoked=True)]

    def owner_names(self, principal: Principal) -> dict[str, str]:
        """For an admin, who each owner is (`key:<id>` -> the key's name); nobody else sees others'
        voices or work, so for them it is empty."""
        if not principal.is_admin:
            return {}
        return {f"key:{key.id}": key.name for key in self.service.keys.list(include_revoked=True)}

    def create_key(
        self, principal: Principal, name: str, role: str, quota: float | None
    ) -> tuple[dict[str, Any], str]:
        """A new key (admins only): its view and the plaintext, which can't be shown again."""
        self.require_admin(principal)
        key, plaintext = key_admin.create_key(
            self.service.keys, who=_who(principal), endpoint="ui", name=name, role=role, quota=quota
        )
        return key_admin.key_view(self.service.access.quota, key), plaintext

    def revoke_key(self, principal: Principal, key_id: int | str) -> dict[str, Any]:
        """The same as POST /admin/keys/{id}/revoke (admins only)."""
        self.require_admin(principal)
        key = key_admin.revoke_key(self.service.keys, key_id, who=_who(principal), endpoint="ui")
        return key_admin.key_view(self.service.access.quota, key)

    def rotate_key(self, principal: Principal, key_id: int | str) -> tuple[dict[str, Any], str]:
        """The same as POST /admin/keys/{id}/rotate (admins only): the view and the new plaintext."""
        self.require_admin(principal)
        key, plaintext = key_admin.rotate_key(self.service.keys, key_id, who=_who(principal), endpoint="ui")
        return key_admin.key_view(self.service.access.quota, key), plaintext

    def set_quota(self, principal: Principal, key_id: int | str, quota: float | None) -> dict[str, Any]:
        """A key's daily audio seconds (None: the server default), as PATCH /admin/keys/{id} (admins only)."""
        self.require_admin(principal)
        key = key_admin.update_key(self.service.keys, key_id, who=_who(principal), endpoint="ui", quota=quota)
        return key_admin.key_view(self.service.access.quota, key)

    def enrolments(self, principal: Principal) -> list[Voice]:
        """Every voice, with its owner and consent record, for the admin's enrolment list (admins only)."""
        self.require_admin(principal)
        return self.service.voices.list(principal.voices)


def _who(principal: Principal) -> str | None:
    return principal.name or principal.owner


def _rss_mb() -> float | None:
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None
