"""`tiergate router` starts with every combination of its configuration's sources: pools from
the file or from Kubernetes, tenants open, from a file or from a mounted Secret's folder, the
ledger in memory or on disk. Each serves /metrics on its metrics port with one reload counter
per reloaded file."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import httpx
import pytest
from kube_helpers import ReplayApi, eventually, kube_source, running
from process_helpers import start_router

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.kube_state import INFERENCE_POOLS, PODS

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

TENANTS = "tenants:\n  - {name: alice, apiKeys: [alice-key-0123456789]}\n"
POOLS = """pools:
  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3,
     batching: {maxNumSeqs: 4}, endpoints: ['http://127.0.0.1:9']}
"""
RELOADS = re.compile(r'^tiergate_config_reloads_total\{config="(\w+)",result="applied"\}', re.M)


def tenants_setting(tmp_path: Path, tenants: str) -> str:
    """The `tenantsFile` line for `tenants`: none, a file, or a Secret's folder."""
    if tenants == "open":
        return ""
    folder = tmp_path / "secret"
    folder.mkdir()
    (folder / "tenants.yaml").write_text(TENANTS)
    return f", tenantsFile: {folder if tenants == 'secret-folder' else folder / 'tenants.yaml'}"


def ledger_setting(tmp_path: Path, ledger: str) -> str:
    return "':memory:'" if ledger == "memory" else str(tmp_path / "state" / "ledger.sqlite")


@pytest.mark.parametrize("ledger", ["memory", "file"])
@pytest.mark.parametrize("tenants", ["open", "file", "secret-folder"])
def test_tiergate_router_starts_with_pools_from_its_file(
    tmp_path: Path, tenants: str, ledger: str
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        f"router: {{ledgerPath: {ledger_setting(tmp_path, ledger)}"
        f"{tenants_setting(tmp_path, tenants)}}}\n{POOLS}"
    )
    router = start_router(path, tmp_path / "router.log")
    try:
        metrics = httpx.get(router.metrics_url, timeout=10).text
        expected = ["pools"] if tenants == "open" else ["pools", "tenants"]
        assert sorted(RELOADS.findall(metrics)) == expected
        assert httpx.get(router.url + "/healthz", timeout=10).status_code == 200
    finally:
        status = router.stop()
    # uvicorn re-raises SIGTERM with the default handler once it has shut down cleanly.
    assert status in (0, -signal.SIGTERM), router.log_text()
    assert "Traceback" not in router.log_text(), router.log_text()


@pytest.mark.parametrize("tenants", ["open", "file", "secret-folder"])
async def test_the_router_starts_with_pools_from_kubernetes(tmp_path: Path, tenants: str) -> None:
    config = parse_config(
        f"router: {{ledgerPath: ':memory:'{tenants_setting(tmp_path, tenants)}}}\n"
        "discovery: {kubernetes: {}}"
    )
    api = ReplayApi()
    app = build_app(config, kube_source(api))
    empty = {"kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}
    async with running(app) as client:
        api.give_list(INFERENCE_POOLS, empty)
        api.give_list(PODS, empty)
        await eventually(lambda: app.synced())
        assert (await client.get("/readyz")).status_code == 200
        transport = httpx.ASGITransport(app=app.metrics_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://metrics") as scrape:
            metrics = (await scrape.get("/metrics")).text
    assert RELOADS.findall(metrics) == ([] if tenants == "open" else ["tenants"])
