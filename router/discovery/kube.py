"""The Kubernetes discovery source: pools from InferencePools, endpoints from their pods.

Two watcher threads (`kube_watch`) list and watch the namespace's InferencePools and
sim-node pods (why pods, not EndpointSlices: see `kube_state`) and hand everything to the
event loop with `call_soon_threadsafe`. On the loop, events fold into a `ClusterState`
(`kube_state`) and, at most `debounce_s` after a change, a new `PoolView` is built with
`build_view` and swapped in with one assignment, like `FileSource` does: requests in flight
keep the view they started with, and endpoint state (in-flight counts, ejections, scraped
load) carries over for endpoints that stay.

All mutable state lives on the event loop thread, so the request path needs no lock. An
InferencePool the router cannot use is left out with one WARNING (until it changes); the
other pools keep serving.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tiergate.router.config import ConfigError, PoolSpec
from tiergate.router.discovery.kube_state import (
    RESOURCES,
    ClusterState,
    Object,
    Resource,
    pool_from_object,
)
from tiergate.router.discovery.kube_watch import SERVER_TIMEOUT_S, Backoff, KubeApi, ResourceWatcher
from tiergate.router.discovery.view import PoolView, build_view
from tiergate.sim_nodes.catalogs import Catalog

log = logging.getLogger("tiergate.router.kube")

#: How long a change may wait for others before the view is rebuilt: a rollout changes many
#: pods within milliseconds, and one rebuild for all of them is enough.
DEBOUNCE_S = 0.1


class KubeSource:
    """A `PoolSource` kept current by watching one namespace of a Kubernetes API."""

    ready_needs_endpoints = False  # pools come and go; see PoolSource

    def __init__(
        self,
        api: KubeApi,
        catalog: Catalog,
        *,
        namespace: str = "",
        debounce_s: float = DEBOUNCE_S,
        server_timeout_s: int = SERVER_TIMEOUT_S,
        backoff: Callable[[], Backoff] = Backoff,
        clock: Callable[[], float] = time.monotonic,
        min_watch_s: float = 1.0,
        stop_timeout_s: float = 5.0,
    ) -> None:
        self.api = api
        self.catalog = catalog
        self.namespace = namespace
        self.debounce_s = debounce_s
        self.stop_timeout_s = stop_timeout_s
        self.view = PoolView(())
        self.state = ClusterState()
        self.synced = False
        self.publishes = 0
        self.problems: dict[str, str] = {}  # pool name -> why it is left out of the view
        self._stop = threading.Event()
        self.watchers = [
            ResourceWatcher(
                api,
                resource,
                self,
                self._stop,
                server_timeout_s=server_timeout_s,
                backoff=backoff(),
                clock=clock,
                min_watch_s=min_watch_s,
            )
            for resource in RESOURCES
        ]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._pending: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        """Start the watcher threads; the view fills (and `synced` turns True) as they list."""
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._threads = [
            threading.Thread(target=w.run, name=f"tiergate-watch-{w.resource.plural}", daemon=True)
            for w in self.watchers
        ]
        for thread in self._threads:
            thread.start()
        log.info("event=kube_discovery_started namespace=%s", self.namespace)

    async def stop(self) -> None:
        """Stop watching: wake blocked calls, wait (bounded) for the threads to end."""
        self._stop.set()
        self.api.interrupt()
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
        threads, self._threads = self._threads, []
        deadline_s = time.monotonic() + self.stop_timeout_s

        def join() -> list[str]:
            for thread in threads:
                thread.join(max(deadline_s - time.monotonic(), 0))
            return [t.name for t in threads if t.is_alive()]

        alive = await asyncio.to_thread(join)
        if alive:
            # Daemon threads: they cannot keep the process alive, and they deliver nothing
            # more (the stop flag is set), so this is worth a line, not a hang.
            log.warning("event=kube_watch_stop_slow threads=%s", ",".join(alive))
        log.info("event=kube_discovery_stopped namespace=%s", self.namespace)

    # WatchSink: called on the watcher threads; hand everything over to the loop.

    def listed(self, resource: Resource, items: list[Object]) -> None:
        self._on_loop(self._listed, resource, items)

    def event(self, resource: Resource, event: Object) -> None:
        self._on_loop(self._event, resource, event)

    def _on_loop(self, callback: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or self._stop.is_set():
            return
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the app is gone, so is our audience
            self._stop.set()

    # On the event loop.

    def _listed(self, resource: Resource, items: list[Object]) -> None:
        self.state.replace(resource, items)
        self._schedule()

    def _event(self, resource: Resource, event: Object) -> None:
        if self.state.apply(resource, event):
            self._schedule()

    def _schedule(self) -> None:
        # Until both kinds are listed a view would be partial (pools without endpoints).
        if self._pending is None and self.state.synced and not self._stop.is_set():
            loop = asyncio.get_running_loop()
            self._pending = loop.call_later(self.debounce_s, self._publish)

    def _publish(self) -> None:
        self._pending = None
        try:
            self.view = self.build_view()
        except Exception:  # a bug here must not kill discovery: keep the last view
            log.exception("event=kube_view_failed namespace=%s", self.namespace)
            return
        self.publishes += 1
        if not self.synced:
            log.info("event=kube_discovery_synced namespace=%s", self.namespace)
        self.synced = True
        log.debug(
            "event=kube_view_published pools=%d endpoints=%d",
            len(self.view.pools), len(self.view.endpoints()),
        )  # fmt: skip

    def build_view(self) -> PoolView:
        """The view of the current state (pure apart from the warnings it logs)."""
        problems: dict[str, str] = {}
        specs: list[PoolSpec] = []
        answers: dict[str, dict[str, frozenset[str]]] = {}  # pool -> URL -> names, if known
        for name in sorted(self.state.pools):
            pods = self.state.endpoints_of(name)
            answers[name] = {p.url: p.serves for p in pods if p.serves is not None}
            try:
                specs.append(pool_from_object(self.state.pools[name], [p.url for p in pods]))
            except ConfigError as exc:
                problems[name] = str(exc)

        def unusable(spec: PoolSpec, exc: ConfigError) -> None:
            problems[spec.name] = str(exc)

        view = build_view(
            specs,
            self.catalog,
            self.view,
            on_error=unusable,
            answers_to=lambda spec: answers.get(spec.name, {}),
        )
        self._report(problems)
        return view

    def _report(self, problems: dict[str, str]) -> None:
        """One WARNING per pool and problem, not one per rebuild."""
        for name, problem in problems.items():
            if self.problems.get(name) != problem:
                log.warning(
                    "event=pool_skipped namespace=%s pool=%s problem=%r",
                    self.namespace, name, problem.removeprefix(f"pool {name}: "),
                )  # fmt: skip
        for name in self.problems.keys() - problems.keys():
            if name in self.state.pools:
                log.info("event=pool_accepted namespace=%s pool=%s", self.namespace, name)
        self.problems = problems
