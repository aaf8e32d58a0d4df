"""When to scrape which endpoint: each once per period, spread evenly over it.

Scraping every endpoint in one burst each period stalls the event loop for as long as the
burst takes, and a request that arrives then waits: the router's tail latency would grow with
its endpoint count. `ScrapeSchedule` instead visits the endpoints in a ring at a steady rate,
`n / period_s(n)` scrapes per second, so a tick scrapes one endpoint (more only when the loop
ran late and catches up) and every endpoint is scraped once per pass, about `period_s` apart.
A tick's endpoints all belong to one pass: a catch-up that would cross the end of a pass stops
there and goes on at the next tick, so the caller can tell when each pass's scrapes are done.

Endpoints that appear between ticks join the ring just ahead of the cursor, so they are
scraped at the next tick; endpoints that disappear leave it. Pure: the caller passes the time
and the current endpoints, and does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tiergate.router.endpoints.state import EndpointState

__all__ = ["ScrapeSchedule", "ScrapeTick"]


@dataclass(frozen=True, slots=True)
class ScrapeTick:
    """What one tick asks for."""

    endpoints: tuple[EndpointState, ...]  # to scrape now, all of the same pass
    pass_done: bool  # these endpoints are the last of their pass over the ring
    wait_s: float  # until the next tick


class ScrapeSchedule:
    """A ring of endpoints visited at `n / period_s(n)` scrapes per second."""

    def __init__(
        self, period_s: Callable[[int], float], *, min_tick_s: float, max_tick_s: float
    ) -> None:
        """
        period_s: the time one pass over `n` endpoints should take (each endpoint's scrape
            interval); it may stretch with `n` to bound the scrape rate.
        min_tick_s: ticks are at least this far apart (at high rates a tick takes several).
        max_tick_s: ticks are at most this far apart, so that new endpoints are noticed soon
            even when there are few or none.
        """
        if not 0 < min_tick_s <= max_tick_s:
            raise ValueError("need 0 < min_tick_s <= max_tick_s")
        self.period_s = period_s
        self.min_tick_s = min_tick_s
        self.max_tick_s = max_tick_s
        self.passes = 0
        self._ring: list[EndpointState] = []
        self._ids: list[int] = []  # id() of the endpoints last passed in, in their order
        self._cursor = 0  # index in the ring of the next endpoint to scrape
        self._credit = 1.0  # scrapes owed; the first tick scrapes at once
        self._rate_per_s = 0.0  # as of the last tick
        self._last_s: float | None = None

    def tick(self, now_s: float, current: Sequence[EndpointState]) -> ScrapeTick:
        """The endpoints to scrape at `now_s`, given the endpoints that exist now."""
        if self._last_s is not None:
            # Owed at the rate of the ring as it was since the last tick, and never more than
            # one pass: after a long stall, catch up once, not repeatedly.
            owed = self._credit + (now_s - self._last_s) * self._rate_per_s
            self._credit = min(owed, max(len(self._ring), 1))
        self._last_s = now_s
        self._sync(current)
        n = len(self._ring)
        rate_per_s = self._rate_per_s = n / self.period_s(n) if n else 0.0
        # The epsilon: 50 ticks of 1/50 of a scrape must add up to one, not 0.99999.
        take = min(int(self._credit + 1e-9), n - self._cursor)
        self._credit -= take
        batch = tuple(self._ring[self._cursor : self._cursor + take])
        self._cursor += take
        pass_done = take > 0 and self._cursor == n
        if pass_done:
            self._cursor = 0
            self.passes += 1
        if rate_per_s:
            wait_s = max(1.0 - self._credit, 0.0) / rate_per_s
        else:
            self._credit = 1.0  # the first endpoint to appear is scraped at the next tick
            wait_s = self.max_tick_s
        wait_s = min(max(wait_s, self.min_tick_s), self.max_tick_s)
        return ScrapeTick(batch, pass_done, wait_s)

    def _sync(self, current: Sequence[EndpointState]) -> None:
        ids = [id(ep) for ep in current]
        if ids == self._ids:  # the common case, at C speed
            return
        self._ids = ids
        wanted = set(ids)
        before_cursor = self._ring[: self._cursor]
        kept_before = [ep for ep in before_cursor if id(ep) in wanted]
        kept_after = [ep for ep in self._ring[self._cursor :] if id(ep) in wanted]
        ringed = {id(ep) for ep in self._ring}
        new = [ep for ep in current if id(ep) not in ringed]
        # New endpoints go next: they have no metrics yet. The others keep their order, so
        # each is still scraped about one period after its previous scrape.
        self._ring = kept_before + new + kept_after
        self._cursor = len(kept_before)
        if self._cursor == len(self._ring):
            self._cursor = 0
