"""Discovery: the router's view of pools and endpoints, and the sources that build it.

`PoolView` is immutable once built and indexed by (served model name, tier), so picking
candidates on the request path is one dict lookup whatever the number of pools, and the
`CandidateSet` found says it is all of that model and tier, so no filter rescans it. Sources
build a new view when something changes and hand it over with one assignment: requests in
flight keep the view they started with, so a reload never drops them. `EndpointState`
objects are carried over from the previous view by (pool, URL), so live metrics, in-flight
counts and ejections survive a reload.

Sources (`PoolSource`): `StaticSource` (a fixed list of pools, e.g. what `tiergate up`
started), `FileSource` (a YAML file, polled for changes: hot reload) and `kube.KubeSource`,
which builds the same view from InferencePools and their pods.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tiergate.pools import predict
from tiergate.router.base.tiers import TIERS, Tier
from tiergate.router.config import ConfigError, PoolSpec, RouterConfig, load_config
from tiergate.router.discovery.file_watch import WatchedFile, watch
from tiergate.router.endpoints.hosted import (
    ApiKey,
    FileKey,
    HostedApi,
    KeyUnavailable,
    SecretKey,
    SecretKeys,
)
from tiergate.router.endpoints.state import CandidateSet, EndpointState
from tiergate.sim_nodes.catalogs import Catalog, CatalogError, ModelProfile
from tiergate.sim_nodes.perf import Deployment, PerfConfigError, PerfResult, ProfileSource

log = logging.getLogger("tiergate.router.discovery.view")


@dataclass(frozen=True, slots=True)
class RoutedPool:
    """A pool as the router uses it: spec, performance envelope, prices and endpoints."""

    spec: PoolSpec
    #: The replica the spec describes and the model's prediction for it; None for a hosted
    #: pool (the provider's hardware is nobody's to model here).
    deployment: Deployment | None
    envelope: PerfResult | None
    output_price_per_token_usd: float
    input_price_per_token_usd: float
    endpoints: tuple[EndpointState, ...]
    #: Where the (model, accelerator) profiles came from: catalog or the spec's inline ones.
    profile_sources: tuple[ProfileSource, ProfileSource]
    #: The model's context length: the most a request may cost is bounded by it.
    max_context_tokens: int
    #: The model's profile (catalog or inline), when known: what model family it is.
    model: ModelProfile | None

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            prompt_tokens * self.input_price_per_token_usd
            + completion_tokens * self.output_price_per_token_usd
        )

    @property
    def output_usd_per_million(self) -> float:
        """The output price per million tokens as the pool states it (its billing, else its
        envelope's cost): the figure a tenant's price cap is compared with, exactly."""
        return _output_usd_per_million(self.spec, self.envelope)

    @property
    def slots(self) -> int:
        """Requests one endpoint of the pool takes at once: its batch cap, or what a hosted
        pool allows to be open to the provider."""
        if self.spec.endpoint is not None:
            return self.spec.endpoint.max_concurrent_requests
        return self.spec.batching.max_num_seqs


class PoolView:
    """Every pool and endpoint, indexed for the request path."""

    def __init__(self, pools: Iterable[RoutedPool]) -> None:
        self.pools: dict[str, RoutedPool] = {p.spec.name: p for p in pools}
        members: dict[tuple[str, Tier], list[EndpointState]] = {}
        providers: dict[tuple[str, Tier], list[EndpointState]] = {}  # hosted pools' members
        tiers: dict[str, set[Tier]] = {}
        pod_tiers: dict[str, set[Tier]] = {}  # tiers by pools of pods alone (not hosted)
        #: (model, tier) -> the dearest input and output prices and the longest context.
        self._ceilings: dict[tuple[str, Tier], tuple[float, float, int]] = {}
        #: (model, tier) -> the dearest output price per million tokens, as pools state it.
        self._output_prices: dict[tuple[str, Tier], float] = {}
        for pool in self.pools.values():
            hosted = pool.spec.endpoint is not None
            for name in pool.spec.names:
                key = (name, pool.spec.tier)
                members.setdefault(key, [])
                tiers.setdefault(name, set()).add(pool.spec.tier)
                if not hosted:
                    pod_tiers.setdefault(name, set()).add(pool.spec.tier)
                self._raise_ceiling(key, pool)
            for endpoint in pool.endpoints:  # not every pod answers to every name (a rollout)
                for name in endpoint.served_names:
                    key = (name, pool.spec.tier)
                    members.setdefault(key, []).append(endpoint)
                    if hosted:
                        providers.setdefault(key, []).append(endpoint)
                    else:
                        pod_tiers.setdefault(name, set()).add(pool.spec.tier)
                    tiers.setdefault(name, set()).add(pool.spec.tier)
                    self._raise_ceiling(key, pool)  # a name only previous pods may answer to
        self._candidates = {
            (model, tier): CandidateSet(eps, model, tier, providers.get((model, tier), ()))
            for (model, tier), eps in members.items()
        }
        self._tiers = {m: tuple(t for t in TIERS if t in ts) for m, ts in tiers.items()}
        self._pod_tiers = {m: tuple(t for t in TIERS if t in ts) for m, ts in pod_tiers.items()}
        #: What latency prediction reads (`PoolShapes`), computed once per view.
        self._deployments = {
            name: p.deployment for name, p in self.pools.items() if p.deployment is not None
        }
        self._batch_caps = {name: p.slots for name, p in self.pools.items()}
        self._contexts = {name: p.max_context_tokens for name, p in self.pools.items()}
        #: (model, tier) -> the shortest context of the pools with endpoints serving it (those
        #: `candidates` holds), for `context-filter`.
        self._shortest: dict[tuple[str, Tier], int] = {}
        for pool in self.pools.values():
            for name in {n for e in pool.endpoints for n in e.served_names}:
                key = (name, pool.spec.tier)
                held = self._shortest.get(key)
                self._shortest[key] = min(held or pool.max_context_tokens, pool.max_context_tokens)

    def deployment(self, pool: str) -> Deployment | None:
        """The replica `pool`'s spec describes (None: unknown pool, or hosted)."""
        return self._deployments.get(pool)

    def batch_cap(self, pool: str) -> int | None:
        """Requests one endpoint of `pool` takes at once (its `slots`)."""
        return self._batch_caps.get(pool)

    def context(self, pool: str) -> int | None:
        """The longest context `pool` serves (its `max_context_tokens`)."""
        return self._contexts.get(pool)

    def shortest_context(self, model: str, tier: Tier) -> int | None:
        """The shortest context of the pools of `tier` whose endpoints serve `model` (None:
        no endpoint does)."""
        return self._shortest.get((model, tier))

    def longest_context(self, model: str, tier: Tier) -> int:
        """The longest context of the pools of `tier` serving `model` (0: none does)."""
        return self._ceilings.get((model, tier), (0.0, 0.0, 0))[2]

    def _raise_ceiling(self, key: tuple[str, Tier], pool: RoutedPool) -> None:
        """The dearest prices and longest context of any pool serving `key`: a budget holds
        the most a request may cost."""
        held = self._ceilings.get(key, (0.0, 0.0, 0))
        self._ceilings[key] = (
            max(held[0], pool.input_price_per_token_usd),
            max(held[1], pool.output_price_per_token_usd),
            max(held[2], pool.max_context_tokens),
        )
        self._output_prices[key] = max(
            self._output_prices.get(key, 0.0), pool.output_usd_per_million
        )

    def candidates(self, model: str, tier: Tier) -> CandidateSet:
        """Endpoints of pools of `tier` serving `model`, built with the view (one lookup)."""
        found = self._candidates.get((model, tier))
        return found if found is not None else CandidateSet((), model, tier)

    def candidate_sets(self) -> Iterable[CandidateSet]:
        """Every non-empty (model, tier) set of `candidates`."""
        return self._candidates.values()

    def most_cost_usd(
        self,
        model: str,
        tier: Tier,
        prompt_tokens_most: int,
        max_tokens: int | None,
        sequences: int = 1,
        prompts: int = 1,
    ) -> float:
        """The most a request may cost on the dearest pool of `tier` serving `model` (0 when
        none does): at most `prompt_tokens_most` prompt tokens, and at most the model's context
        for each of its `prompts` (a completions batch), and `sequences` outputs of
        `max_tokens` each, or, when it sets none, of as much of the context as the node may
        fill (a vLLM backend's default)."""
        per_in, per_out, context = self._ceilings.get((model, tier), (0.0, 0.0, 0))
        output = context if max_tokens is None else min(max_tokens, context)
        prompt = min(prompt_tokens_most, context * prompts)
        return prompt * per_in + sequences * output * per_out

    def output_usd_per_million(self, model: str, tier: Tier) -> float:
        """The dearest output price, per million tokens, of the pools of `tier` serving
        `model` (what a request served there may pay at most; 0 when none serves it)."""
        return self._output_prices.get((model, tier), 0.0)

    def tiers_serving(self, model: str, *, hosted: bool = True) -> tuple[Tier, ...]:
        """The tiers with a pool serving `model` (one scaled to zero included), in tier order;
        `hosted=False`: by pools of pods alone, the only ones a gateway reaches."""
        return (self._tiers if hosted else self._pod_tiers).get(model, ())

    def models_served(self, *, hosted: bool = True) -> dict[str, tuple[Tier, ...]]:
        """Model name -> tiers serving it (`hosted=False`: by pools of pods alone)."""
        return dict(self._tiers if hosted else self._pod_tiers)

    def endpoints(self) -> list[EndpointState]:
        return [e for p in self.pools.values() for e in p.endpoints]


def build_pool(
    spec: PoolSpec,
    catalog: Catalog,
    urls: Sequence[str],
    previous: dict[tuple[str, str], EndpointState] | None = None,
    answers_to: Mapping[str, Collection[str]] | None = None,
    keys: KeySource | None = None,
    carried: list[Carried] | None = None,
) -> RoutedPool:
    """Evaluate one pool's envelope and attach its endpoints; ConfigError if it cannot run.

    `answers_to`: URL -> the model names that endpoint answers to, where it says (a pod made
    from another version of the spec: a rollout that changes the model or the aliases, or one
    that failed). Such an endpoint is sent only the names it answers to: a name the spec no
    longer has stays routed to the pods that still answer to it until they are gone (a rename
    rolls out without a 404), and the spec's new names go only to the pods made for them.
    Other endpoints take the spec's names. A hosted pool's one endpoint is the provider's URL
    (`urls` is not read); `keys` holds the keys of the Secrets such pools name.

    An endpoint of `previous` is reused as it is; what it is to say now goes to `carried`,
    for the caller to apply once its whole view has built (`build_view`), or, without
    `carried`, is applied at once.
    """
    previous = previous or {}
    if carried is None:
        pending: list[Carried] = []
        pool = build_pool(spec, catalog, urls, previous, answers_to, keys, pending)
        for change in pending:
            change.apply()
        return pool
    if spec.endpoint is not None:
        old = previous.get((spec.name, spec.endpoint.url))
        return _hosted_pool(spec, catalog, old, keys, carried)
    try:
        performance = predict(spec, spec.workload, catalog)
    except (CatalogError, PerfConfigError) as exc:
        raise ConfigError(f"pool {spec.name}: {exc}") from None
    deployment, envelope = performance.deployment, performance.result
    if not envelope.fits:
        raise ConfigError(f"pool {spec.name}: does not fit: {envelope.reason}")
    out_price = _output_usd_per_million(spec, envelope)
    answers_to = answers_to or {}
    endpoints = []
    for url in dict.fromkeys(urls):
        known = answers_to.get(url)
        names = spec.names
        if known is not None:
            names = tuple(n for n in spec.names if n in known)
            names += tuple(sorted(set(known).difference(spec.names)))
        if names:
            old = previous.get((spec.name, url))
            endpoints.append(_endpoint(old, spec, url, names, None, carried))
    return RoutedPool(
        spec,
        deployment,
        envelope,
        out_price / 1e6,
        spec.billing.input_per_million_usd / 1e6,
        tuple(endpoints),
        (performance.model_source, performance.accelerator_source),
        deployment.model.max_context_tokens,
        deployment.model,
    )


def _hosted_pool(
    spec: PoolSpec,
    catalog: Catalog,
    old: EndpointState | None,
    keys: KeySource | None,
    carried: list[Carried],
) -> RoutedPool:
    """A pool a provider's API serves: one endpoint, the provider's URL (none while the pool
    is scaled to zero), priced as its billing states, no envelope."""
    hosted = spec.endpoint
    assert hosted is not None
    key = _api_key(spec, keys)
    model = catalog.models.get(spec.model)
    context = hosted.max_context_tokens or (model.max_context_tokens if model else None)
    stated = spec.billing.output_per_million_usd
    if context is None or stated is None:  # the spec's validators refuse both
        raise ConfigError(f"pool {spec.name}: a hosted pool needs its billing and context")
    endpoints: tuple[EndpointState, ...] = ()
    if spec.replicas > 0:
        api = HostedApi(
            hosted.url,
            hosted.model,
            key,
            hosted.timeout_s,
            hosted.max_concurrent_requests,
            hosted.output_cap_field,
        )
        endpoints = (_endpoint(old, spec, hosted.url, spec.names, api, carried),)
    return RoutedPool(
        spec,
        None,
        None,
        stated / 1e6,
        spec.billing.input_per_million_usd / 1e6,
        endpoints,
        ("catalog", "catalog"),
        context,
        model,
    )


#: Where a hosted pool's key comes from when its endpoint names a Secret (Kubernetes
#: discovery's `SecretKeys`); None where no Secret can be read (a router file).
KeySource = SecretKeys


def _api_key(spec: PoolSpec, keys: KeySource | None) -> ApiKey:
    """The pool's key, where its endpoint says; ConfigError when a key file cannot be read
    now (a pool must not start, or reload, with a key that is not there)."""
    hosted = spec.endpoint
    assert hosted is not None
    if hosted.api_key_file is not None:
        key = FileKey(hosted.api_key_file)
        try:
            key.value()
        except KeyUnavailable as exc:
            raise ConfigError(f"pool {spec.name}: endpoint.apiKeyFile: {exc}") from None
        return key
    ref = hosted.api_key_secret_ref
    if ref is None or keys is None:
        raise ConfigError(f"pool {spec.name}: endpoint.apiKeyFile is required")
    return SecretKey(keys, ref.name, ref.key)


def _output_usd_per_million(spec: PoolSpec, envelope: PerfResult | None) -> float:
    """A pool's output price per million tokens: its billing's, else its envelope's cost."""
    stated = spec.billing.output_per_million_usd
    if stated is not None:
        return stated
    return envelope.cost_per_million_output_tokens_usd if envelope is not None else 0.0


@dataclass(frozen=True)
class Carried:
    """An endpoint of the previous view, reused, and what it is to say in the new one."""

    state: EndpointState
    tier: Tier
    model: str
    names: tuple[str, ...]
    hosted: HostedApi | None

    def apply(self) -> None:
        state = self.state
        state.tier, state.model, state.served_names = self.tier, self.model, self.names
        state.hosted = self.hosted


def _endpoint(
    old: EndpointState | None,
    spec: PoolSpec,
    url: str,
    names: tuple[str, ...],
    hosted: HostedApi | None,
    carried: list[Carried],
) -> EndpointState:
    if old is None:
        state = EndpointState(url, spec.name, spec.tier, spec.model, names)
        state.hosted = hosted
        return state
    # The same pool and URL: the same server, whatever the edit (a new alias, another tier).
    # Its figures, ejection and in-flight count carry over; requests in flight hold this very
    # object and release on it, so a copy would undercount now and overcount forever after.
    # The old view's candidate sets say their tier and model as a whole, not per member.
    # What it says changes only with the view it is in: a reload refused leaves it as it was.
    carried.append(Carried(old, spec.tier, spec.model, names, hosted))
    return old


def build_view(
    specs: Sequence[PoolSpec],
    catalog: Catalog,
    previous: PoolView | None = None,
    urls_of: Callable[[PoolSpec], Sequence[str]] = lambda s: s.endpoints,
    on_error: Callable[[PoolSpec, ConfigError], None] | None = None,
    answers_to: Callable[[PoolSpec], Mapping[str, Collection[str]]] | None = None,
    keys: KeySource | None = None,
    retired: Iterable[EndpointState] = (),
    renewed: Collection[tuple[str, str]] = (),
) -> PoolView:
    """A view of `specs`, reusing `previous`' endpoint states where pool and URL match, or
    else `retired` ones (endpoints that left an earlier view and may come back), but for the
    (pool, URL)s in `renewed` (another pod took the URL over: its state starts afresh).

    A pool that cannot run raises ConfigError, unless `on_error` is given: then it is
    reported there and left out, and the other pools still make the view (a source fed by
    other people's objects must not lose every pool over one bad one). `answers_to`: a
    pool's endpoints' names, where they say (`build_pool`).
    """
    old = {(e.pool, e.url): e for e in retired}
    old.update(((e.pool, e.url), e) for e in (previous.endpoints() if previous else ()))
    for key in renewed:
        old.pop(key, None)
    pools: list[RoutedPool] = []
    carried: list[Carried] = []
    for spec in specs:
        pending: list[Carried] = []
        try:
            names = answers_to(spec) if answers_to is not None else None
            pools.append(build_pool(spec, catalog, urls_of(spec), old, names, keys, pending))
        except ConfigError as exc:
            if on_error is None:
                raise
            on_error(spec, exc)
            continue
        carried += pending
    for change in carried:  # the view stands: its endpoints say what it says
        change.apply()
    return PoolView(pools)


class PoolSource(Protocol):
    """Where the router's pools come from; the app starts and stops it with itself.

    `view` is replaced, never mutated, when pools or endpoints change. `synced` is False
    until the source has seen the whole of its truth once (the router is not ready before).
    `ready_needs_endpoints`: whether the router is ready only with a usable endpoint. True
    for a file, whose endpoints are the configuration; False for a cluster, where pools come
    and go (a gateway with no pools yet is ready, or `helm install --wait` could never end
    before the first pool, and scaling every pool to zero would pull the router from its
    Service).
    """

    ready_needs_endpoints: bool
    #: Called with each new view once it is in place (the router resizes its queues, so
    #: requests waiting for a slot take the new endpoints' at once); None: nobody is told.
    on_view: Callable[[PoolView], object] | None

    @property
    def view(self) -> PoolView: ...

    @property
    def synced(self) -> bool: ...

    def start(self) -> Awaitable[None] | None: ...
    def stop(self) -> Awaitable[None] | None: ...


class StaticSource:
    """A fixed set of pools (what `tiergate up` started, or a test's)."""

    synced = True
    ready_needs_endpoints = True
    on_view: Callable[[PoolView], object] | None = None  # its view never changes

    def __init__(self, view: PoolView) -> None:
        self.view = view

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class FileSource:
    """Pools from a YAML configuration file, reloaded when its content changes.

    A changed file that does not parse or validate is logged and ignored: the router keeps
    serving with the last good view (a typo must not take a gateway down).
    """

    ready_needs_endpoints = True

    synced = True  # the file was read in full before the app starts

    def __init__(self, path: Path, catalog: Catalog, *, interval_s: float | None = None) -> None:
        self.path = path
        self.catalog = catalog
        #: None: the file's own `router.reloadIntervalS` (as it reads now).
        self.interval_s = interval_s
        self.config: RouterConfig = load_config(path)
        self.file = WatchedFile(path)
        self.view = build_view(self.config.pools, catalog)
        self.on_view: Callable[[PoolView], object] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="tiergate-config-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def poll_interval_s(self) -> float:
        """How long the watcher waits between looks at the file."""
        if self.interval_s is not None:
            return self.interval_s
        return self.config.router.reload_interval_s

    def reload_if_changed(self) -> bool:
        """Rebuild the view if the file changed; True if a new view is in place."""
        if not self.file.changed():
            return False
        try:
            config = load_config(self.path)
            if config.discovery.kubernetes is not None:
                raise ConfigError("switching to discovery.kubernetes needs a restart")
            view = build_view(config.pools, self.catalog, self.view)
        except ConfigError as exc:
            if self.file.refused(str(exc)):
                log.error("event=config_reload_failed path=%s error=%r", self.path, str(exc))
            return False
        unapplied = _restart_only_changes(self.config, config)
        if unapplied:
            log.warning(
                "event=config_settings_need_restart path=%s fields=%s applied=pools,policy",
                self.path, ",".join(unapplied),
            )  # fmt: skip
        self.config, self.view = config, view
        self.file.applied()
        if self.on_view is not None:
            self.on_view(view)
        log.info("event=config_reloaded path=%s pools=%d", self.path, len(view.pools))
        return True

    async def _watch(self) -> None:
        await watch(self.reload_if_changed, self.poll_interval_s, "config")


#: Router settings a reload applies: the rest are read once, when the router starts.
_LIVE_SETTINGS = frozenset({"reload_interval_s", "policy"})


def _restart_only_changes(old: RouterConfig, new: RouterConfig) -> list[str]:
    """The `router.*` settings (as the file spells them) that changed but take a restart."""
    return [
        f"router.{info.alias or name}"
        for name, info in type(old.router).model_fields.items()
        if name not in _LIVE_SETTINGS and getattr(old.router, name) != getattr(new.router, name)
    ]
