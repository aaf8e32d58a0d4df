"""Tenants reloaded while the router runs: a revoked key stops working without a restart, and a
bad edit keeps the tenants already loaded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling_helpers import settled, until
from tenant_router_helpers import KEY, tenant_router

from tiergate.router.build import build_app, file_source
from tiergate.router.discovery.view import FileSource
from tiergate.router.tenants.registry import TenantRegistry
from tiergate.router.tenants.reload import TenantsReloader
from tiergate.router.tier_queue import TierQueue
from tiergate.sim_nodes.catalogs import default_catalog

ALICE = "tenants:\n  - {name: alice, apiKeys: [alice-key-0123456789]}\n"
CAROL = "tenants:\n  - {name: carol, apiKeys: [carol-key-0123456789], requestsPerMinute: 5}\n"


@pytest.mark.parametrize("secret", [False, True], ids=["file", "secret-folder"])
def test_a_changed_file_is_swapped_in_and_a_bad_one_keeps_the_tenants(
    tmp_path: Path, secret: bool, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "tenants.yaml"
    file.write_text(ALICE)
    swapped: list[TenantRegistry] = []
    reloader = TenantsReloader(tmp_path if secret else file, swapped.append, interval_s=lambda: 1)
    assert not reloader.reload_if_changed()  # unchanged
    file.write_text(CAROL)
    assert settled(reloader.reload_if_changed)
    (registry,) = swapped
    assert registry.authenticate("Bearer carol-key-0123456789").name == "carol"
    with caplog.at_level(logging.ERROR, logger="tiergate.router"):
        file.write_text("tenants:\n  - {name: dave, apiKeys: [dave-key-0123456789], colour: 1}\n")
        assert not settled(reloader.reload_if_changed)
        file.unlink()
        assert not settled(reloader.reload_if_changed)
    assert len(swapped) == 1 and reloader.file.reload_errors == 2
    assert "dave-key" not in caplog.text  # a rejected file's keys are never logged
    assert caplog.text.count("event=tenants_reload_failed") == 2


def test_a_revoked_key_is_refused_without_a_restart(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    with tenant_router(
        served, tmp_path / "ledger.sqlite", tmp_path, budget="", router="reloadIntervalS: 0.05"
    ) as (_, url):
        usage = url + "/v1/usage"
        assert httpx.get(usage, headers=KEY).status_code == 200
        (tmp_path / "tenants.yaml").write_text(CAROL)  # alice's key revoked, carol's added
        until(lambda: httpx.get(usage, headers=KEY).status_code == 401, "the revoked key works")
        carol = {"authorization": "Bearer carol-key-0123456789"}
        assert httpx.get(usage, headers=carol).json()["tenant"] == "carol"


def test_router_settings_changed_in_a_reload_are_named_as_needing_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "router.yaml"
    pools = "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]\n"
    path.write_text("router: {reloadIntervalS: 1}\n" + pools)
    source = FileSource(path, default_catalog())
    with caplog.at_level(logging.WARNING, logger="tiergate.router"):
        path.write_text("router: {reloadIntervalS: 2, forwardFaultHeader: true}\n" + pools)
        assert settled(source.reload_if_changed)
    assert "fields=router.forwardFaultHeader applied=pools,policy" in caplog.text
    assert source.poll_interval_s() == 2  # read live: not named


def test_reloads_are_counted_in_the_metrics(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    with (
        tenant_router(
            served, tmp_path / "ledger.sqlite", tmp_path, budget="", router="reloadIntervalS: 0.05"
        ) as (app, _),
        served(app.metrics_app) as metrics,
    ):
        (tmp_path / "tenants.yaml").write_text("tenants: [{name: x}]\n")  # no keys: refused
        failed = 'tiergate_config_reloads_total{config="tenants",result="failed"} 1.0'
        until(lambda: failed in httpx.get(metrics + "/metrics").text, "no failed reload counted")
        applied = 'tiergate_config_reloads_total{config="tenants",result="applied"} 0.0'
        assert applied in httpx.get(metrics + "/metrics").text


def test_a_router_with_a_pools_file_and_a_tenants_file_counts_the_reloads_of_both(
    tmp_path: Path,
) -> None:
    """`tiergate router --config` with both files: one metric family for the two (a second
    one of the same name made the app fail to build)."""
    tenants, path = tmp_path / "tenants.yaml", tmp_path / "router.yaml"
    tenants.write_text(ALICE)
    path.write_text(
        f"router: {{tenantsFile: {tenants}, ledgerPath: {tmp_path / 'ledger.sqlite'}}}\n"
        "pools: [{name: a, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]\n"
    )
    config, source = file_source(path, default_catalog())
    text = build_app(config, source).metrics.exposition().decode()
    for name in ("pools", "tenants"):
        assert f'tiergate_config_reloads_total{{config="{name}",result="applied"}} 0.0' in text


def test_a_tenant_a_reload_removes_is_forgotten_by_the_queues(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    """Tenants come and go with reloads: what the tier queues count of a removed tenant (its
    fair-share counter, its weight, what it was served) goes with it, or it would be kept for
    as long as the router runs."""
    with tenant_router(
        served, tmp_path / "ledger.sqlite", tmp_path, budget="", router="reloadIntervalS: 0.05"
    ) as (app, url):
        body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(url + "/v1/chat/completions", json=body, headers=KEY).status_code == 200
        queue = app.router.admission.queues["batched"]
        assert "alice" in queue.known()
        (tmp_path / "tenants.yaml").write_text(CAROL)
        until(lambda: "alice" not in queue.known(), "alice's counters were kept")


def test_a_queue_forgets_only_tenants_that_hold_and_wait_for_nothing() -> None:
    queue = TierQueue("batched", capacity=1, max_waiting=4)
    grant = asyncio.run(queue.acquire("standard", "gone", tokens=10))
    queue.prune(keep=set())  # still holding its slot: kept
    assert queue.known() == {"gone"}
    queue.release(grant, served_tokens=12)
    queue.prune(keep={"other"})
    assert queue.known() == set() and queue.service("gone") == 0.0
