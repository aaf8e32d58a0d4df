"""The Gateway API Inference Extension InferencePool the operator keeps beside the pools: valid
for GIE's own CRD (v1.6.0, as vendored in the chart), owned by every pool with pods, deleted
with the last, and a missing CRD said once rather than failing the pool."""

from __future__ import annotations

import argparse
import hashlib
import logging
import re
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from crd_helpers import problems
from operator_helpers import CATALOG, IMAGE, GatewayCluster, pool

from tiergate.common.cli import CliError
from tiergate.operator import handlers
from tiergate.operator.commands.operator_cmd import add_arguments, gateway_pool
from tiergate.operator.gateway_pool import GatewayPool, gateway_pool_manifest, sync_gateway_pool

ROOT = Path(__file__).resolve().parents[2]
VENDORED = ROOT / "charts" / "tiergate" / "files" / "gateway-api-inference-extension"
GIE_CRD = VENDORED / "inference.networking.k8s.io_inferencepools.yaml"
GATEWAY = GatewayPool("team-a", "tiergate", "tg-tiergate-router-epp", 9002)


def gie_crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(GIE_CRD.read_text(encoding="utf-8"))
    return loaded


def test_the_vendored_crd_is_the_one_its_readme_names() -> None:
    """The README gives the release and the file's sha256: a changed file needs both."""
    readme = (VENDORED / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"sha256 `([0-9a-f]{64})`", readme)
    assert stated is not None
    assert hashlib.sha256(GIE_CRD.read_bytes()).hexdigest() == stated.group(1)
    crd = gie_crd()
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] in readme
    assert [v["name"] for v in crd["spec"]["versions"] if v["storage"]] == ["v1"]


@pytest.mark.parametrize("failure_mode", ["FailClose", "FailOpen"])
def test_the_gateway_pool_is_valid_for_gie_s_crd(failure_mode: str) -> None:
    gateway = GatewayPool("team-a", "tiergate", "tg-tiergate-router-epp", 9002, failure_mode)  # type: ignore[arg-type]
    manifest = gateway_pool_manifest(gateway, [pool("batched"), pool("premium")])
    assert problems(gie_crd(), manifest) == []
    spec = manifest["spec"]
    assert spec["endpointPickerRef"] == {
        "kind": "Service", "name": "tg-tiergate-router-epp", "port": {"number": 9002},
        "failureMode": failure_mode,
    }  # fmt: skip
    # The pods the router routes to: every pool's, on the port they serve.
    assert spec["selector"] == {"matchLabels": {"app.kubernetes.io/name": "tiergate-sim-node"}}
    assert spec["targetPorts"] == [{"number": 8000}]


def test_a_gateway_pool_without_a_picker_port_is_refused_by_gie_s_crd() -> None:
    """The check above can fail: GIE's CEL rule wants a Service's port."""
    manifest = gateway_pool_manifest(GATEWAY, [pool()])
    del manifest["spec"]["endpointPickerRef"]["port"]
    assert problems(gie_crd(), manifest) != []


def _named(name: str, **changes: Any) -> dict[str, Any]:
    obj = pool("batched")
    obj["metadata"].update(name=name, uid=f"uid-{name}", **changes)
    return obj


def test_every_pool_with_pods_owns_the_gateway_pool_and_none_is_its_controller() -> None:
    cluster = GatewayCluster()
    hosted = _named("hosted")
    hosted["spec"]["endpoint"] = {"url": "https://api.example.com/v1", "model": "m"}
    for obj in [_named("b"), _named("a"), hosted, _named("going", deletionTimestamp="x")]:
        cluster.pools[("team-a", obj["metadata"]["name"])] = obj
    cluster.pools[("team-b", "elsewhere")] = _named("elsewhere")
    assert sync_gateway_pool(GATEWAY, cluster) == {"uid-a", "uid-b"}
    applied = cluster.gateway_pools[("team-a", "tiergate")]
    owners = applied["metadata"]["ownerReferences"]
    assert [(o["name"], o["uid"]) for o in owners] == [("a", "uid-a"), ("b", "uid-b")]
    assert all(o["kind"] == "InferencePool" and not o.get("controller") for o in owners)
    assert all(o["apiVersion"] == "tiergate.dev/v1alpha1" for o in owners)


def test_with_no_pool_with_pods_left_the_gateway_pool_is_deleted() -> None:
    cluster = GatewayCluster()
    hosted = _named("hosted")
    hosted["spec"]["endpoint"] = {"url": "https://api.example.com/v1", "model": "m"}
    cluster.pools[("team-a", "hosted")] = hosted
    assert sync_gateway_pool(GATEWAY, cluster) == frozenset()
    assert cluster.gateway_deletes == [("team-a", "tiergate")]


def _memo(
    cluster: GatewayCluster, events: list[tuple[str, str]], clock: list[float] | None = None
) -> handlers.OperatorMemo:
    now = clock if clock is not None else [0.0]
    return handlers.OperatorMemo(
        catalog=CATALOG, images=IMAGE, cluster=cluster, gateway=GATEWAY,
        warn=lambda _body, reason, message: events.append((reason, message)),
        monotonic=lambda: now[0],
    )  # fmt: skip


def test_reconciling_a_pool_of_the_routers_namespace_keeps_the_gateway_pool() -> None:
    cluster = GatewayCluster()
    body = pool("batched")
    cluster.pools[("team-a", body["metadata"]["name"])] = body
    events: list[tuple[str, str]] = []
    handlers.inferencepool_reconcile(
        body=kopf.Body(body), patch=kopf.Patch(), memo=_memo(cluster, events)
    )
    assert list(cluster.gateway_pools) == [("team-a", "tiergate")]
    assert events == []


class CountingCluster(GatewayCluster):
    def __init__(self) -> None:
        super().__init__()
        self.lists = 0

    def list_pools(self, namespace: str) -> list[dict[str, Any]]:
        self.lists += 1
        return super().list_pools(namespace)


def test_resyncs_keep_the_gateway_pool_once_a_period_and_a_new_pool_joins_at_once() -> None:
    """Every pool's resync would list the pools and apply the GIE pool again: a resync of a
    pool it already serves skips that within a resync period; a spec change, a pool it does
    not serve yet, or a period gone by applies it."""
    cluster = CountingCluster()
    a, b = _named("a"), _named("b")
    cluster.pools[("team-a", "a")] = a
    clock = [100.0]
    memo = _memo(cluster, [], clock)
    handlers.inferencepool_reconcile(body=kopf.Body(a), patch=kopf.Patch(), memo=memo)
    assert cluster.lists == 1
    handlers.inferencepool_resync(body=kopf.Body(a), patch=kopf.Patch(), memo=memo)
    assert cluster.lists == 1  # a serves already: nothing to do
    cluster.pools[("team-a", "b")] = b
    handlers.inferencepool_resync(body=kopf.Body(b), patch=kopf.Patch(), memo=memo)
    assert cluster.lists == 2  # b is new: it joins at once
    owners = cluster.gateway_pools[("team-a", "tiergate")]["metadata"]["ownerReferences"]
    assert [o["name"] for o in owners] == ["a", "b"]
    handlers.inferencepool_reconcile(body=kopf.Body(a), patch=kopf.Patch(), memo=memo)
    assert cluster.lists == 3  # a spec change always syncs
    clock[0] += handlers.RESYNC_S
    handlers.inferencepool_resync(body=kopf.Body(b), patch=kopf.Patch(), memo=memo)
    assert cluster.lists == 4  # a period later: applied again (drift repaired)


def test_a_pool_of_another_namespace_leaves_the_gateway_pool_alone() -> None:
    cluster = GatewayCluster()
    body = pool("batched")
    body["metadata"]["namespace"] = "team-b"
    events: list[tuple[str, str]] = []
    handlers.inferencepool_reconcile(
        body=kopf.Body(body), patch=kopf.Patch(), memo=_memo(cluster, events)
    )
    assert cluster.gateway_pools == {} and cluster.gateway_deletes == []


def test_a_missing_gie_crd_is_said_on_the_pool_and_logged_once_and_the_pool_still_reconciles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = GatewayCluster(gateway_crd=False)
    body = pool("batched")
    cluster.pools[("team-a", body["metadata"]["name"])] = body
    events: list[tuple[str, str]] = []
    memo = _memo(cluster, events)
    with caplog.at_level(logging.WARNING, logger="tiergate.operator"):
        handlers.inferencepool_reconcile(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
        for _ in range(3):
            handlers.inferencepool_resync(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
    assert [reason for reason, _ in events] == ["GatewayPoolNotKept"]
    assert "inferencepools.inference.networking.k8s.io/v1" in events[0][1]
    logged = [r for r in caplog.records if "event=gateway_pool_not_kept" in r.getMessage()]
    assert len(logged) == 1
    assert {m["kind"] for m in cluster.applied} == {"Deployment", "Service"}
    assert cluster.status_patches[0][1]["conditions"]  # the pool's own status was written
    cluster.gateway_crd = True  # someone installs the CRD: the next resync keeps the pool
    handlers.inferencepool_resync(body=kopf.Body(body), patch=kopf.Patch(), memo=memo)
    assert list(cluster.gateway_pools) == [("team-a", "tiergate")]
    assert memo.gateway_problem is None


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_gateway_flags_name_the_pool_in_the_routers_pools_namespace() -> None:
    args = _flags("--gateway-pool", "tiergate", "--epp-service", "svc", "--router-pools-namespace",
                  "pools", "--gateway-failure-mode", "FailOpen")  # fmt: skip
    assert gateway_pool(args, lambda: "own") == GatewayPool(
        "pools", "tiergate", "svc", 9002, "FailOpen"
    )
    assert gateway_pool(_flags(), lambda: "own") is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--gateway-pool", "tiergate"], "--gateway-pool needs --epp-service"),
        (
            ["--gateway-pool", "t", "--epp-service", "s", "--epp-port", "0"],
            "--epp-port 0: not a port",
        ),
    ],
)
def test_bad_gateway_flags_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(CliError, match=message):
        gateway_pool(_flags(*argv), lambda: "own")
