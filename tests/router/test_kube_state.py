"""The pure half of Kubernetes discovery: reading objects and events, folding them, backoff."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from kube_helpers import recorded

from tiergate.router.config import ConfigError
from tiergate.router.kube_state import (
    ENDPOINT_SLICES,
    INFERENCE_POOLS,
    ClusterState,
    KubeApiError,
    WatchExpired,
    event_resource_version,
    list_items,
    pool_from_object,
    slice_urls,
)
from tiergate.router.kube_watch import Backoff


def pool_object(**spec: Any) -> dict[str, Any]:
    base = {"tier": "batched", "model": "llama-3.1-8b", "accelerator": "h100-sxm"}
    return {"metadata": {"name": "p", "resourceVersion": "1"}, "spec": {**base, **spec}}


def test_a_pool_is_built_from_the_spec_its_name_and_the_urls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="tiergate.router.kube")
    obj = recorded("inferencepools_list")["items"][0]
    spec = pool_from_object(obj, ["http://10.0.0.1:8000"])
    assert spec.name == "coder-batched" and spec.tier == "batched"
    assert spec.names == ("coder",) and spec.chips == 1 and spec.replicas == 3
    assert spec.batching.max_num_seqs == 64
    assert spec.endpoints == ["http://10.0.0.1:8000"]
    assert spec.slo is not None and spec.slo.ttft_ms == 2000  # the InferencePool spec's own
    # a field from a newer CRD than this router knows: dropped, said at debug
    assert "event=pool_keys_ignored pool=coder-batched keys=priorityClassName" in caplog.text


def test_the_object_name_and_urls_win_over_the_spec() -> None:
    obj = pool_object(name="other", endpoints=["http://elsewhere:1"])
    spec = pool_from_object(obj, ["http://10.0.0.1:8000"])
    assert spec.name == "p" and spec.endpoints == ["http://10.0.0.1:8000"]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (pool_object(tier="turbo"), "pool p: tier: Input should be"),
        (pool_object(batching={"maxNumSeqs": 0}), "pool p: batching.maxNumSeqs"),
        # only top-level keys are forgiven: inside a known field, a typo is still a typo
        (pool_object(batching={"maxNumSeq": 4}), "pool p: batching.maxNumSeq: Extra inputs"),
        ({"metadata": {"name": "Bad_Name"}, "spec": pool_object()["spec"]}, "pool Bad_Name: name"),
        ({"metadata": {"name": "p"}}, "pool p: spec: not an object"),
    ],
)
def test_an_unusable_pool_names_its_first_problem(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        pool_from_object(obj)
    assert "\n" not in str(raised.value)


def test_slice_urls_use_the_http_port_and_skip_endpoints_known_unready() -> None:
    obj = {
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}],
        "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": True}},
            {"addresses": ["10.0.0.2"], "conditions": {}},  # unknown means ready
            {"addresses": ["10.0.0.3"]},
            {"addresses": ["10.0.0.4"], "conditions": {"ready": False, "serving": True}},
        ],
    }
    assert slice_urls(obj) == (
        "http://10.0.0.1:8000",
        "http://10.0.0.2:8000",
        "http://10.0.0.3:8000",
    )
    ipv6 = {**obj, "addressType": "IPv6", "endpoints": [{"addresses": ["fd00::5"]}]}
    assert slice_urls(ipv6) == ("http://[fd00::5]:8000",)
    assert slice_urls({**obj, "ports": [{"name": "grpc", "port": 9000}]}) == ()
    assert slice_urls({**obj, "ports": None}) == ()
    assert slice_urls({"ports": [{"name": "http", "port": 8000}], "endpoints": None}) == ()


def test_events_move_the_resource_version_and_errors_raise() -> None:
    assert event_resource_version(recorded("slice_spark_added")) == "48261"
    assert event_resource_version(recorded("pools_bookmark")) == "48300"
    with pytest.raises(WatchExpired, match="too old resource version"):
        event_resource_version(recorded("error_410"))
    with pytest.raises(KubeApiError, match="InternalError") as raised:
        event_resource_version(recorded("error_500"))
    assert raised.value.status == 500
    with pytest.raises(KubeApiError):
        event_resource_version({"type": "ADDED"})


def test_list_items_needs_a_resource_version() -> None:
    items, version = list_items(recorded("endpointslices_list"))
    assert len(items) == 3 and version == "48250"
    with pytest.raises(KubeApiError):
        list_items({"items": []})
    with pytest.raises(KubeApiError):
        list_items({"kind": "Status", "code": 500})


def test_cluster_state_folds_lists_and_events() -> None:
    state = ClusterState()
    state.replace(INFERENCE_POOLS, recorded("inferencepools_list")["items"])
    assert not state.synced
    state.replace(ENDPOINT_SLICES, recorded("endpointslices_list")["items"])
    assert state.synced and set(state.pools) == {"coder-batched", "coder-premium"}
    assert state.urls_of("coder-batched") == ["http://10.244.1.17:8000", "http://10.244.2.9:8000"]
    assert state.urls_of("nobody") == []

    revision = state.revision
    assert not state.apply(INFERENCE_POOLS, recorded("pools_bookmark"))
    assert not state.apply(ENDPOINT_SLICES, {"type": "DELETED", "object": {"metadata": {}}})
    assert state.apply(ENDPOINT_SLICES, recorded("slice_batched_pod_unready"))
    assert not state.apply(ENDPOINT_SLICES, recorded("slice_batched_pod_unready"))  # same again
    assert state.urls_of("coder-batched") == ["http://10.244.1.17:8000", "http://10.244.3.4:8000"]
    assert state.apply(INFERENCE_POOLS, recorded("pool_premium_deleted"))
    assert not state.apply(INFERENCE_POOLS, recorded("pool_premium_deleted"))
    assert state.revision == revision + 2

    # a second slice of the same service adds its endpoints (slice name order)
    second = recorded("slice_spark_added")
    second["object"]["metadata"]["name"] = "coder-batched-zz9"
    second["object"]["metadata"]["labels"]["kubernetes.io/service-name"] = "coder-batched"
    assert state.apply(ENDPOINT_SLICES, second)
    assert state.urls_of("coder-batched")[-1] == "http://10.244.4.2:8000"

    state.replace(INFERENCE_POOLS, recorded("inferencepools_relist")["items"])
    assert set(state.pools) == {"coder-batched"}


def test_backoff_doubles_up_to_its_bound_with_jitter() -> None:
    backoff = Backoff(initial_s=0.5, max_s=8.0, rng=random.Random(1))
    delays = [backoff.next_delay_s() for _ in range(10)]
    ceilings = [0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    assert len(set(delays)) == len(delays)  # jittered, not a fixed ladder
    backoff.reset()
    assert backoff.next_delay_s() <= 0.5
    many = Backoff(initial_s=1.0, max_s=30.0, rng=random.Random(2))
    many.failures = 10_000
    assert many.next_delay_s() <= 30.0
