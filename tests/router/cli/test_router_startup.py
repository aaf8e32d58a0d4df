"""`tiergate router` starts with every combination of its configuration's sources: pools from
the file or from Kubernetes, tenants open, from a file or from a mounted Secret's folder, the
ledger in memory or on disk. Each serves /metrics on its metrics port with one reload counter
per reloaded file."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
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


@pytest.mark.parametrize("case", ["port in use", "one port for both", "bad tenants file"])
def test_a_router_that_cannot_start_says_why_in_one_line(tmp_path: Path, case: str) -> None:
    """Nothing is logged before the error: the limits it would serve within come once it
    serves."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS if case != "bad tenants file" else "tenants: [{name: [}\n")
    config = tmp_path / "router.yaml"
    config.write_text(f"router: {{tenantsFile: {tenants}, ledgerPath: ':memory:'}}\n{POOLS}")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        ports = {
            "port in use": ["--port", str(port), "--metrics-port", "0"],
            "one port for both": ["--port", "18557", "--metrics-port", "18557"],
            "bad tenants file": ["--port", "0", "--metrics-port", "0"],
        }[case]
        argv = [sys.executable, "-P", "-m", "tiergate", "router", "--config", str(config), *ports]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    expected = {
        "port in use": f"cannot listen on 127.0.0.1:{port}",
        "one port for both": "18557 is also the router's port",
        "bad tenants file": "not valid YAML (line 1, column",
    }[case]
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("tiergate router: error: ") and expected in line, line
