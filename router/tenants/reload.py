"""Tenants reloaded while the router runs: a revoked key stops working without a restart.

The tenants file (or `tenants.yaml` in a mounted Secret, which the kubelet updates in place
when the Secret changes) is read again whenever its content changes, looked at every
`interval_s`. A file that does not load is logged and ignored: the tenants already loaded keep
being served (a typo must not lock every client out, nor let anyone in). Spend, holds and
rate-limit buckets are kept per tenant name, so a tenant whose limits change keeps what it has
used; a removed tenant's key is refused at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from tiergate.router.base.background import LoopService
from tiergate.router.discovery.file_watch import WatchedFile, watch
from tiergate.router.tenants.registry import (
    SECRET_FILE_NAME,
    TenantConfigError,
    TenantRegistry,
    load_tenants,
)

__all__ = ["TenantsReloader"]

log = logging.getLogger("tiergate.router")


class TenantsReloader(LoopService):
    """Calls `swap` with a new registry when the tenants at `path` change (a service)."""

    task_name = "tiergate-tenants-reload"

    def __init__(
        self,
        path: Path,
        swap: Callable[[TenantRegistry], None],
        *,
        interval_s: Callable[[], float],
    ) -> None:
        self.path = path
        self._swap = swap
        self._interval_s = interval_s
        self.file = WatchedFile(path / SECRET_FILE_NAME if path.is_dir() else path)

    def reload_if_changed(self) -> bool:
        """Load and swap in the tenants if their file changed; True if it did."""
        if not self.file.changed():
            return False
        try:
            registry = load_tenants(self.path)
        except TenantConfigError as exc:
            if self.file.refused(str(exc)):
                log.error("event=tenants_reload_failed error=%r keeping=previous", str(exc))
            return False
        self._swap(registry)
        self.file.applied()
        log.info("event=tenants_reloaded tenants=%d", len(registry.tenants))
        return True

    async def _run(self) -> None:
        await watch(self.reload_if_changed, self._interval_s, "tenants")
