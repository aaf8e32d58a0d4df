"""Helpers of the operator tests: a fake cluster, the example pools, a ticking clock."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tiergate.operator.autoscaling import HpaUnknown
from tiergate.operator.images import ImagePolicy
from tiergate.operator.kube import ApplyRejected, PodAddress, RoutersUnknown
from tiergate.operator.reconcile import reconcile
from tiergate.operator.status import rebase_conditions
from tiergate.pools import InferencePoolSpec, predict
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import Workload, evaluate

ROOT = Path(__file__).resolve().parents[2]
CATALOG = default_catalog()
IMAGE = ImagePolicy("tiergate:0.1.0")


class FakeCluster:
    """Records applies, and keeps what was applied as existing; Deployment statuses, objects
    that exist already and the API server's refusals are set by the test.

    A Deployment's generation moves as the API server's does (on an applied spec change); a
    status set by the test is observed (its observedGeneration is the generation) unless it
    says otherwise."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.deployments: dict[tuple[str, str], dict[str, Any]] = {}
        self.pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.status_patches: list[tuple[str, dict[str, Any]]] = []
        self.existing: dict[tuple[str, str, str], dict[str, Any]] = {}  # kind, ns, name
        self.rejects: dict[str, str] = {}  # kind -> the API server's message
        self.pods: dict[tuple[str, str], list[PodAddress]] = {}  # ns, pool -> its pods
        # The router's pods, or why they cannot be listed.
        self.routers: list[PodAddress] | RoutersUnknown = []
        # ns, pool -> the HPA targeting it, or HpaUnknown (the operator may not list them)
        self.hpas: dict[tuple[str, str], str | HpaUnknown] = {}
        self.writes: list[tuple[str, str, Any]] = []  # (what, pool, value), in order
        self.deleted: list[tuple[str, str, str]] = []  # kind, ns, name
        # ns, name -> a Deployment's metadata.generation, and the spec applied at it
        self.generations: dict[tuple[str, str], int] = {}
        self.specs: dict[tuple[str, str], dict[str, Any]] = {}

    def apply(self, manifest: dict[str, Any]) -> None:
        meta = manifest["metadata"]
        if manifest["kind"] in self.rejects:
            raise ApplyRejected(self.rejects[manifest["kind"]])
        key = (meta["namespace"], meta["name"])
        if manifest["kind"] == "Deployment" and self.specs.get(key) != manifest["spec"]:
            self.specs[key] = copy.deepcopy(manifest["spec"])
            self.generations[key] = self.generations.get(key, 0) + 1
        self.applied.append(copy.deepcopy(manifest))
        self.existing[(manifest["kind"], meta["namespace"], meta["name"])] = copy.deepcopy(meta)

    def delete(self, kind: str, namespace: str, name: str) -> None:
        self.deleted.append((kind, namespace, name))
        self.existing.pop((kind, namespace, name), None)
        if kind == "Deployment":
            self.deployments.pop((namespace, name), None)
            self.generations.pop((namespace, name), None)
            self.specs.pop((namespace, name), None)

    def metadata(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.existing.get((kind, namespace, name))

    def deployment_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        status = self.deployments.get((namespace, name))
        if status is None:
            return None
        generation = self.generations.get((namespace, name), 1)
        return {"observedGeneration": generation, **status, "generation": generation}

    def pool(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pools.get((namespace, name))

    def patch_pool_status(
        self,
        namespace: str,
        name: str,
        status: dict[str, Any],
        base: dict[str, Any] | None = None,
    ) -> None:
        """Recorded, and merged into the stored pool (top-level fields, as a merge patch);
        with `base`, its conditions rebased on the stored pool's, as KubeCluster does."""
        stored = self.pools.get((namespace, name))
        if base is not None and stored is not None and "conditions" in status:
            theirs = (stored.get("status") or {}).get("conditions") or []
            ours = rebase_conditions(base.get("conditions") or [], status["conditions"], theirs)
            status = {**status, "conditions": ours}
        self.status_patches.append((name, status))
        self.writes.append(("status", name, copy.deepcopy(status)))
        if stored is not None:
            stored.setdefault("status", {}).update(copy.deepcopy(status))

    def pool_pods(self, namespace: str, pool: str) -> list[PodAddress]:
        return list(self.pods.get((namespace, pool), []))

    def router_pods(self, namespace: str, selector: str) -> list[PodAddress]:
        if isinstance(self.routers, RoutersUnknown):
            raise self.routers
        return list(self.routers)

    def hpa_targeting(self, namespace: str, pool: str) -> str | HpaUnknown | None:
        return self.hpas.get((namespace, pool))

    def scale_pool(self, namespace: str, pool: str, replicas: int) -> None:
        """Recorded, and written to the stored pool's spec.replicas."""
        self.writes.append(("scale", pool, replicas))
        stored = self.pools.get((namespace, pool))
        if stored is not None:
            stored["spec"]["replicas"] = replicas


def pool(name: str = "premium", **spec_changes: Any) -> dict[str, Any]:
    obj = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text(encoding="utf-8"))
    obj["spec"].update(spec_changes)
    obj["metadata"].update(namespace="team-a", uid="uid-1", generation=3)
    return obj


def served(cluster: FakeCluster, body: dict[str, Any]) -> dict[str, Any]:
    """`body` rolled out: its objects applied and its one pod ready; its status written."""
    body["status"] = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    cluster.deployments[("team-a", body["metadata"]["name"])] = {
        "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}  # fmt: skip
    body["status"] = reconcile(body, cluster, CATALOG, IMAGE, clock()).status
    assert conditions(body["status"])["Ready"]["reason"] == "Serving"
    return body


def edit(body: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`body` with `changes` to its spec, at the next generation (as the API server does)."""
    body["spec"].update(changes)
    body["metadata"]["generation"] += 1
    return body


def clock() -> Callable[[], str]:
    ticks = (f"2026-11-21T00:00:{s:02d}Z" for s in itertools.count())
    return lambda: next(ticks)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def tpot_ms(streams: int) -> float:
    """The premium replica's steady-state TPOT at `streams` streams of its workload."""
    spec = InferencePoolSpec.model_validate(pool("premium", background=None)["spec"])
    w = spec.workload
    deployment = predict(spec, w, CATALOG).deployment
    shape = Workload(w.input_tokens, w.output_tokens, w.cached_input_tokens, streams)
    return evaluate(deployment, shape, spec.batching.to_batching()).tpot_s * 1e3


class GatewayCluster(FakeCluster):
    """A FakeCluster whose API server knows GIE's InferencePool (or not: `gateway_crd`), whose
    tiergate pools are `pools`, and that records the GIE pools applied and deleted."""

    def __init__(self, *, gateway_crd: bool = True) -> None:
        super().__init__()
        self.gateway_crd = gateway_crd
        self.gateway_pools: dict[tuple[str, str], dict[str, Any]] = {}
        self.gateway_deletes: list[tuple[str, str]] = []

    def apply_gateway_pool(self, manifest: dict[str, Any]) -> None:
        from tiergate.operator.gateway_pool import GatewayPoolMissing

        if not self.gateway_crd:
            raise GatewayPoolMissing(
                "the API server has no inferencepools.inference.networking.k8s.io/v1"
            )
        meta = manifest["metadata"]
        self.gateway_pools[(meta["namespace"], meta["name"])] = copy.deepcopy(manifest)

    def delete_gateway_pool(self, namespace: str, name: str) -> None:
        self.gateway_deletes.append((namespace, name))
        self.gateway_pools.pop((namespace, name), None)

    def list_pools(self, namespace: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for (ns, _), p in sorted(self.pools.items()) if ns == namespace]
