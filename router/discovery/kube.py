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

A hosted pool's provider key is in a Secret its spec names. The router reads each such Secret
when a pool first names it and every `SECRET_REFRESH_S` after (a rotated key is picked up),
by name: its Role may `get` the Secrets it is told of, and no others (the chart's
`router.providerKeySecrets`). A Secret it cannot read leaves the pool's requests failing over
to other pools of its tier, with one WARNING that says why; its content is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tiergate.router.config import ConfigError, PoolSpec
from tiergate.router.discovery.kube_state import (
    RESOURCES,
    ClusterState,
    KubeApiError,
    Object,
    Resource,
    pool_from_object,
)
from tiergate.router.discovery.kube_watch import SERVER_TIMEOUT_S, Backoff, KubeApi, ResourceWatcher
from tiergate.router.discovery.view import PoolView, build_view
from tiergate.router.endpoints.hosted import SecretKeys
from tiergate.router.endpoints.state import EndpointState
from tiergate.sim_nodes.catalogs import Catalog

log = logging.getLogger("tiergate.router.kube")

#: How long a change may wait for others before the view is rebuilt: a rollout changes many
#: pods within milliseconds, and one rebuild for all of them is enough.
DEBOUNCE_S = 0.1
#: How often the Secrets of hosted pools' keys are read again (a rotated key is used after).
SECRET_REFRESH_S = 30.0
#: How long an endpoint that left the view (its pod not ready for a while, its pool left out)
#: keeps its state for its return: its ejection, in-flight count and figures carry over as if
#: it had stayed, so a sick pod whose readiness flaps does not come back unejected. Longer
#: than the longest ejection (router/discovery/outliers.py: 120 s).
RETIRED_KEEP_S = 600.0


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
        read_secret: Callable[[str], Mapping[str, str]] | None = None,
        secret_refresh_s: float = SECRET_REFRESH_S,
    ) -> None:
        """`read_secret`: the data of a Secret of the namespace, by name (hosted pools' keys;
        None: no Secret is read, and hosted pools that name one cannot be served)."""
        self.api = api
        self.read_secret = read_secret
        self.secret_refresh_s = secret_refresh_s
        self.keys = SecretKeys()
        self._wanted_secrets: set[tuple[str, str]] = set()
        self._secrets_wake: asyncio.Event | None = None
        self._secrets_task: asyncio.Task[None] | None = None
        self.catalog = catalog
        self.namespace = namespace
        self.debounce_s = debounce_s
        self.stop_timeout_s = stop_timeout_s
        self.view = PoolView(())
        self.on_view: Callable[[PoolView], object] | None = None  # see PoolSource
        self._clock = clock
        # (pool, URL) -> an endpoint that left the view, when, and which pod it was.
        self._retired: dict[tuple[str, str], tuple[EndpointState, float, str | None]] = {}
        # (pool, URL) -> the pod behind the view's endpoint (its uid, if it says).
        self._uids: dict[tuple[str, str], str | None] = {}
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
        if self.read_secret is not None:
            self._secrets_wake = asyncio.Event()
            self._secrets_task = asyncio.create_task(self._read_secrets(), name="tiergate-secrets")
        log.info("event=kube_discovery_started namespace=%s", self.namespace)

    async def stop(self) -> None:
        """Stop watching: wake blocked calls, wait (bounded) for the threads to end."""
        self._stop.set()
        self.api.interrupt()
        if self._secrets_task is not None:
            self._secrets_task.cancel()
            await asyncio.gather(self._secrets_task, return_exceptions=True)
            self._secrets_task = None
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
        before, pods_before = self.view, self._uids
        try:
            self.view = self.build_view()
        except Exception:  # a bug here must not kill discovery: keep the last view
            log.exception("event=kube_view_failed namespace=%s", self.namespace)
            return
        self._retire(before, self.view, pods_before)
        if self.on_view is not None:
            try:
                self.on_view(self.view)
            except Exception:  # a bug there must not stop discovery
                log.exception("event=kube_view_listener_failed namespace=%s", self.namespace)
        self.publishes += 1
        if not self.synced:
            log.info("event=kube_discovery_synced namespace=%s", self.namespace)
        self.synced = True
        log.debug(
            "event=kube_view_published pools=%d endpoints=%d",
            len(self.view.pools), len(self.view.endpoints()),
        )  # fmt: skip

    def _retire(
        self, before: PoolView, after: PoolView, pods: dict[tuple[str, str], str | None]
    ) -> None:
        """Keep the endpoints `before` had and `after` has not, for `RETIRED_KEEP_S`, with
        the pods they were (`pods`, by pool and URL)."""
        now = self._clock()
        kept = {(e.pool, e.url) for e in after.endpoints()}
        for e in before.endpoints():
            key = (e.pool, e.url)
            if key not in kept:
                self._retired[key] = (e, now, pods.get(key))
        self._retired = {
            key: retired
            for key, retired in self._retired.items()
            if key not in kept and now - retired[1] < RETIRED_KEEP_S
        }

    def build_view(self) -> PoolView:
        """The view of the current state (apart from the warnings it logs, it only remembers
        which pods the view's endpoints are). An endpoint keeps its state (ejection, requests
        in flight) across views, and for `RETIRED_KEEP_S` after it left, while it is the same
        pod: a new pod given an old one's IP starts afresh."""
        now = self._clock()
        problems: dict[str, str] = {}
        specs: list[PoolSpec] = []
        answers: dict[str, dict[str, frozenset[str]]] = {}  # pool -> URL -> names, if known
        uids: dict[tuple[str, str], str | None] = {}
        for name in sorted(self.state.pools):
            pods = self.state.endpoints_of(name)
            answers[name] = {p.url: p.serves for p in pods if p.serves is not None}
            uids.update(((name, p.url), p.uid) for p in pods)
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
            keys=self.keys,
            retired=[
                e
                for key, (e, since, uid) in self._retired.items()
                if now - since < RETIRED_KEEP_S and not _another_pod(uid, uids.get(key))
            ],
            renewed={key for key, uid in uids.items() if _another_pod(self._uids.get(key), uid)},
        )
        self._uids = uids
        self._report(problems)
        self._want_secrets(specs)
        return view

    def _want_secrets(self, specs: list[PoolSpec]) -> None:
        """Note the Secrets hosted pools name; one not read yet is read at once."""
        wanted = {
            (ref.name, ref.key)
            for spec in specs
            if spec.endpoint is not None and (ref := spec.endpoint.api_key_secret_ref)
        }
        new = wanted - self._wanted_secrets
        self._wanted_secrets = wanted
        if new and self._secrets_wake is not None:
            self._secrets_wake.set()

    async def _read_secrets(self) -> None:
        """Read the wanted Secrets now and every `secret_refresh_s`, or at once when a pool
        names a new one."""
        wake = self._secrets_wake
        assert wake is not None and self.read_secret is not None
        read = self.read_secret
        refused: set[str] = set()  # Secrets whose last read was refused (403)
        while True:
            wake.clear()
            wanted = set(self._wanted_secrets)
            for name in sorted({name for name, _ in wanted}):
                try:
                    data = await asyncio.to_thread(read, name)
                    problem, gone = None, True  # read: a key not in it is no more
                    refused.discard(name)
                except KubeApiError as exc:
                    data, problem = {}, _secret_problem(name, exc)
                    # Deleted; or refused twice in a row (the grant withdrawn: one refusal
                    # may be an authorizer's outage, and a working key stays meanwhile).
                    gone = exc.status == 404 or (exc.status == 403 and name in refused)
                    if exc.status == 403:
                        refused.add(name)
                    else:
                        refused.discard(name)
                for secret, key in wanted:
                    if secret != name:
                        continue
                    value = data.get(key)
                    if problem is None and value:
                        self.keys.put(name, key, value)
                        continue
                    why = problem or (
                        f"key {key} of Secret {name} is empty" if key in data
                        else f"Secret {name} has no key {key}"
                    )  # fmt: skip
                    dropped = gone and self.keys.get(name, key) is not None
                    told = self.keys.problem(name, key) == why
                    self.keys.fail(name, key, why, gone=gone)
                    if dropped or not told:
                        log.warning("event=provider_key_unreadable namespace=%s problem=%r%s",
                                    self.namespace, why,
                                    " (the key read before is no longer used)" * dropped,
                                    )  # fmt: skip
            self.keys.forget(wanted)
            try:
                await asyncio.wait_for(wake.wait(), self.secret_refresh_s)
            except TimeoutError:
                pass

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


def _secret_problem(name: str, exc: KubeApiError) -> str:
    """Why a Secret could not be read, and what to do about it."""
    if exc.status == 403:
        return (
            f"the router may not read Secret {name}: list it in the chart's "
            "router.providerKeySecrets (its Role names the Secrets it may get)"
        )
    if exc.status == 404:
        return f"Secret {name} does not exist"
    return f"reading Secret {name} failed: {exc}"


def _another_pod(before: str | None, now: str | None) -> bool:
    """Whether two pods' uids say they are different pods (an unknown uid says nothing)."""
    return before is not None and now is not None and before != now
