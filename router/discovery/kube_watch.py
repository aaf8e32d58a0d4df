"""List-then-watch of one Kubernetes resource in a thread: the router's reflector loop.

The Kubernetes client is synchronous, so each resource gets a thread that lists, then
watches from the list's resourceVersion, and hands what it sees to a sink (which moves it
to the event loop). The loop follows client-go's reflector:

- a watch the server ends (its `timeoutSeconds`) resumes from the last resourceVersion seen,
  BOOKMARK events included, so nothing is listed again;
- 410 Gone (as an ERROR event or as the watch request's status) lists again;
- any other failure waits (bounded exponential backoff with jitter) and retries, and the
  router keeps the last good view meanwhile;
- the client's socket read timeout exceeds the server's watch timeout, so a watch that went
  silent without closing (a dead proxy, a half-open connection) fails and is retried instead
  of hanging forever.

The API is injected (`KubeApi`): `kube_client.KubernetesApi` in a cluster, a recorded
replay in the tests, both through this same loop.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from tiergate.router.discovery.kube_state import (
    KubeApiError,
    Object,
    Resource,
    WatchExpired,
    event_resource_version,
)
from tiergate.router.discovery.kube_state import list_items as parse_list

log = logging.getLogger("tiergate.router.kube")

#: Server-side watch timeout: the API server ends each watch after this long (client-go
#: picks 5-10 minutes; shorter means a stalled watch is noticed sooner).
SERVER_TIMEOUT_S = 120
#: Failed watches in a row after which the watcher lists again instead of resuming.
RELIST_AFTER_FAILURES = 3


class KubeApi(Protocol):
    """The calls discovery makes, returning the API server's JSON as dicts."""

    def list(self, resource: Resource) -> Object:
        """The list response (`items`, `metadata.resourceVersion`); raises KubeApiError."""
        ...

    def watch(self, resource: Resource, resource_version: str, timeout_s: int) -> Iterable[Object]:
        """Watch events from `resource_version` (bookmarks on) until the server ends the watch.

        Raises WatchExpired on HTTP 410 and KubeApiError on other failures.
        """
        ...

    def interrupt(self) -> None:
        """Make blocked list/watch calls return or raise soon (the router is stopping)."""
        ...


class WatchSink(Protocol):
    """Where a watcher delivers (called from the watcher's thread)."""

    def listed(self, resource: Resource, items: list[Object]) -> None: ...
    def event(self, resource: Resource, event: Object) -> None: ...


class Backoff:
    """Delays between retries: doubling from `initial_s` up to `max_s`, with jitter.

    Jitter (each delay drawn from [d/2, d]) keeps a fleet of routers that lost the API
    server together from coming back in lockstep.
    """

    def __init__(
        self, initial_s: float = 0.5, max_s: float = 30.0, rng: random.Random | None = None
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.rng = rng or random.Random()
        self.failures = 0

    def next_delay_s(self) -> float:
        ceiling = min(self.max_s, self.initial_s * 2 ** min(self.failures, 32))
        self.failures += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


class ResourceWatcher:
    """Lists and watches one resource until `stop` is set; run it in a thread of its own."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        sink: WatchSink,
        stop: threading.Event,
        *,
        server_timeout_s: int = SERVER_TIMEOUT_S,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_watch_s: float = 1.0,
    ) -> None:
        self.api = api
        self.resource = resource
        self.sink = sink
        self.stop = stop
        self.server_timeout_s = server_timeout_s
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.min_watch_s = min_watch_s
        self.lists = 0
        self.watches = 0
        self.errors = 0
        #: Since when lists and watches have failed (`clock`), with nothing delivered since;
        #: None while they work. The view is as it was then.
        self.failing_since_s: float | None = None
        #: Where the next watch starts: the last resourceVersion delivered (None: list first).
        self.version: str | None = None

    def run(self) -> None:
        """The reflector loop; returns only when `stop` is set.

        A watch resumes from the last resourceVersion it delivered, so a watch that fails
        after some events does not have them sent again. The backoff grows with failures in a
        row and resets only when a watch ends cleanly (events arriving before a failure do not
        reset it: a watch the server breaks at the same event every time would otherwise be
        retried several times a second forever). After `RELIST_AFTER_FAILURES` failures in a
        row the watcher lists again, as client-go's reflector does.
        """
        plural = self.resource.plural
        self.version = None  # None: list (again) before watching
        failures = 0
        while not self.stop.is_set():
            try:
                if self.version is None:
                    self.version = self._list()
                self._watch()
                failures = 0
                self.backoff.reset()
                self.failing_since_s = None
            except WatchExpired:
                if self.stop.is_set():
                    return
                log.info(
                    "event=watch_expired resource=%s resource_version=%s", plural, self.version
                )
                self.version = None
            except Exception as exc:  # any failure: keep the last view, retry later
                if self.stop.is_set():
                    return
                self.errors += 1
                failures += 1
                if self.failing_since_s is None:
                    self.failing_since_s = self.clock()
                if failures % RELIST_AFTER_FAILURES == 0:
                    self.version = None
                delay_s = self.backoff.next_delay_s()
                status = exc.status if isinstance(exc, KubeApiError) else None
                log.warning(
                    "event=watch_failed resource=%s status=%s error=%r retry_in_s=%.2f "
                    "failures_in_a_row=%d next=%s",
                    plural, status, _short(exc), delay_s, failures,
                    "list" if self.version is None else "watch",
                )  # fmt: skip
                self.stop.wait(delay_s)

    def failing_s(self) -> float:
        """How long lists and watches have failed, with nothing delivered (0 while they work)."""
        since = self.failing_since_s
        return 0.0 if since is None else max(self.clock() - since, 0.0)

    def _list(self) -> str:
        items, version = parse_list(self.api.list(self.resource))
        self.lists += 1
        self.sink.listed(self.resource, items)
        self.failing_since_s = None
        log.info(
            "event=listed resource=%s items=%d resource_version=%s",
            self.resource.plural, len(items), version,
        )  # fmt: skip
        return version

    def _watch(self) -> None:
        """One watch call from `self.version`, which follows every event delivered."""
        self.watches += 1
        started_s = self.clock()
        events = 0
        assert self.version is not None, "list before watching"
        stream = iter(self.api.watch(self.resource, self.version, self.server_timeout_s))
        try:
            for event in stream:
                if self.stop.is_set():
                    return
                events += 1
                if event.get("type") != "BOOKMARK":
                    self.sink.event(self.resource, event)
                self.failing_since_s = None
                # After the sink has it: a failure in between resumes from before it.
                self.version = event_resource_version(event) or self.version
        finally:
            # A watch left early (410, stop) releases its connection now, not whenever the
            # generator happens to be collected.
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if events == 0 and self.clock() - started_s < self.min_watch_s:
            # A watch that ends at once with nothing in it, again and again, would spin a
            # core: count it as a failure so the backoff applies.
            raise KubeApiError("watch ended at once without events")
        log.debug(
            "event=watch_ended resource=%s events=%d resource_version=%s",
            self.resource.plural, events, self.version,
        )  # fmt: skip


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
