"""Kubernetes discovery tests' helpers: recorded API responses and an API that replays them.

`ReplayApi` implements `kube_watch.KubeApi` the way the real client does (blocking list and
watch calls, made from the watcher threads), so the source under test runs its real loop.
The test hands it responses while the source runs: list bodies, watch events, `END` (the
server ended the watch: its timeoutSeconds) or an exception to raise.
"""

from __future__ import annotations

import asyncio
import copy
import json
import queue
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from tiergate.router.discovery.kube import KubeSource
from tiergate.router.discovery.kube_state import KubeApiError, Resource
from tiergate.router.discovery.kube_watch import Backoff
from tiergate.router.http.app import RouterApp
from tiergate.sim_nodes.catalogs import default_catalog

RECORDED: dict[str, Any] = json.loads(
    (Path(__file__).parent / "recorded" / "kube_watch.json").read_text()
)
END = object()  # the server ended the watch


def recorded(name: str) -> dict[str, Any]:
    """A fresh copy of a recorded list body, or of an event from `events`."""
    data = RECORDED[name] if name in RECORDED else RECORDED["events"][name]
    return copy.deepcopy(data)


def recorded_pod(name: str) -> dict[str, Any]:
    """A fresh copy of the pod named `name` in the recorded pods list."""
    (pod,) = [p for p in recorded("pods_list")["items"] if p["metadata"]["name"] == name]
    return pod


def watch_event(kind: str, obj: dict[str, Any], resource_version: str) -> dict[str, Any]:
    """A `kind` watch event of a copy of `obj`, moved to `resource_version`."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = resource_version
    return {"type": kind, "object": obj}


def set_ready(pod: dict[str, Any], status: str) -> dict[str, Any]:
    """`pod` with its Ready condition set to `status` ("True", "False", "Unknown")."""
    for condition in pod["status"]["conditions"]:
        if condition["type"] == "Ready":
            condition["status"] = status
    return pod


class ReplayApi:
    """A `KubeApi` that answers from what the test gives it, and records every call."""

    def __init__(self) -> None:
        self._lists: dict[str, queue.Queue[Any]] = {}
        self._watches: dict[str, queue.Queue[Any]] = {}
        self.calls: list[tuple[str, str, str | None]] = []  # (list|watch, plural, rv)
        self._lock = threading.Lock()
        self._interrupted = threading.Event()

    def give_list(self, resource: Resource, *answers: Any) -> None:
        """Answers to the next list calls: a body (dict) or an exception to raise."""
        for answer in answers:
            self._queue(self._lists, resource).put(answer)

    def give_watch(self, resource: Resource, *items: Any) -> None:
        """What the current/next watch calls stream: events, END, or an exception."""
        for item in items:
            self._queue(self._watches, resource).put(item)

    def calls_of(self, kind: str, resource: Resource) -> list[str | None]:
        """The resourceVersions of the `kind` calls made for `resource`, in order."""
        with self._lock:
            return [rv for k, p, rv in self.calls if k == kind and p == resource.plural]

    def list(self, resource: Resource) -> dict[str, Any]:
        self._record("list", resource, None)
        answer = self._next(self._queue(self._lists, resource))
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, dict)
        return answer

    def watch(self, resource: Resource, resource_version: str, timeout_s: int) -> Iterator[Any]:
        assert timeout_s > 0
        self._record("watch", resource, resource_version)
        return self._stream(self._queue(self._watches, resource))

    def interrupt(self) -> None:
        self._interrupted.set()

    def _stream(self, items: queue.Queue[Any]) -> Iterator[Any]:
        while True:
            item = self._next(items)
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def _next(self, items: queue.Queue[Any]) -> Any:
        # Blocks like a real call would, but wakes when interrupted (the source stops).
        while not self._interrupted.is_set():
            try:
                return items.get(timeout=0.02)
            except queue.Empty:
                continue
        raise KubeApiError("interrupted")

    def _queue(self, table: dict[str, queue.Queue[Any]], resource: Resource) -> queue.Queue[Any]:
        with self._lock:
            return table.setdefault(resource.plural, queue.Queue())

    def _record(self, kind: str, resource: Resource, rv: str | None) -> None:
        with self._lock:
            self.calls.append((kind, resource.plural, rv))


def kube_source(api: ReplayApi, **overrides: Any) -> KubeSource:
    """A source on `api` with test timings: no debounce, near-zero seeded backoff."""
    settings: dict[str, Any] = {
        "namespace": "tiergate",
        "debounce_s": 0.0,
        "backoff": lambda: Backoff(0.001, 0.004, random.Random(7)),
        "min_watch_s": 0.0,
        **overrides,
    }
    return KubeSource(api, default_catalog(), **settings)


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll `check` on the event loop (the source publishes there) until true or timeout."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.002)


def urls(source: KubeSource, pool: str) -> list[str]:
    """Endpoint URLs of `pool` in the source's current view ([] if not in it)."""
    routed = source.view.pools.get(pool)
    return [e.url for e in routed.endpoints] if routed is not None else []


@asynccontextmanager
async def running(app: RouterApp) -> AsyncIterator[httpx.AsyncClient]:
    """The router app started, and a client calling it in process; stopped after."""
    await app.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            yield client
    finally:
        await app.stop()
