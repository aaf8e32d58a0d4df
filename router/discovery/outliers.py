"""Outlier detection: eject an endpoint that keeps failing, for longer each time.

After `consecutive_failures` failures in a row an endpoint is ejected (the `ejected-filter`
skips it) for `base_ejection_s * 2**k`, capped at `max_ejection_s`, where k counts its recent
ejections. An ejection counts as recent while the previous one ended less than
`max_ejection_s` ago, so an endpoint that flaps keeps getting longer ejections, and one that
has been healthy for a while starts again from the base duration. What counts as a failure
is the proxy's call (router/upstream/proxy.py): an HTTP 500 only once another endpoint has
served the same request, so a request that fails everywhere ejects nothing.

The last endpoint of a pool that is not ejected is never ejected. With every endpoint of a pool
failing, ejecting them all would turn "some requests fail" into "every request gets a 503"
while the pool may be only partly broken (e.g. overloaded); keeping one in rotation lets
retries and the next requests find out when it recovers. The `ejected-filter` applies the same
reasoning across the pools of a tier (it keeps all candidates when all are ejected). A hosted
pool's one endpoint (a provider's API) is the exception: ejecting it sends the tier's requests
to its other pools, and with none left the `ejected-filter` still keeps it.

Pure: the caller passes the time and owns the `EndpointState`s this writes to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from tiergate.router.endpoints.state import EndpointState

__all__ = ["OutlierDetector"]


class OutlierDetector:
    """Counts consecutive failures per endpoint and ejects with exponential backoff."""

    def __init__(
        self,
        consecutive_failures: int = 5,
        base_ejection_s: float = 10.0,
        max_ejection_s: float = 120.0,
        *,
        pool_members: Callable[[str], Iterable[EndpointState]] | None = None,
    ) -> None:
        """
        pool_members: pool name -> its current endpoints, for the last-endpoint guard. Without
            it the detector cannot see the pool and never refuses an ejection.
        """
        if consecutive_failures < 1:
            raise ValueError("consecutive_failures must be at least 1")
        if not 0 < base_ejection_s <= max_ejection_s:
            raise ValueError("need 0 < base_ejection_s <= max_ejection_s")
        self.consecutive_failures = consecutive_failures
        self.base_ejection_s = base_ejection_s
        self.max_ejection_s = max_ejection_s
        self.pool_members = pool_members

    def record_success(self, ep: EndpointState) -> None:
        """A request to `ep` succeeded: its failure streak ends."""
        ep.consecutive_failures = 0

    def record_failure(self, ep: EndpointState, now_s: float) -> bool:
        """A request to `ep` failed at `now_s`; True if this failure ejected it. A failure
        while it is ejected (a request sent before) counts for nothing: a pod that died with
        forty streams open would otherwise be ejected again, for twice as long, by the first
        failure after its ejection."""
        if ep.is_ejected(now_s):
            return False
        ep.consecutive_failures += 1
        if ep.consecutive_failures < self.consecutive_failures:
            return False
        if ep.hosted is None and self._last_in_rotation(ep, now_s):
            return False
        if now_s - ep.ejected_until_s >= self.max_ejection_s:
            ep.ejections = 0  # healthy long enough since the last ejection: start over
        ep.ejected_until_s = now_s + self.ejection_s(ep.ejections)
        ep.ejections += 1
        # A fresh streak is needed to eject it again once it is back.
        ep.consecutive_failures = 0
        return True

    def ejection_s(self, previous_ejections: int) -> float:
        """How long the ejection after `previous_ejections` recent ones lasts."""
        # Capping the exponent first keeps 2**k finite for an endpoint failing for days.
        k = min(previous_ejections, 62)
        return min(self.base_ejection_s * 2.0**k, self.max_ejection_s)

    def _last_in_rotation(self, ep: EndpointState, now_s: float) -> bool:
        if self.pool_members is None:
            return False
        return not any(
            other is not ep and not other.is_ejected(now_s) for other in self.pool_members(ep.pool)
        )
