"""A router process with few file descriptors, its connections filled to the cap: the tenants
file is still reloaded, a request past the cap is refused with a clear status, and one is
served once a connection leaves."""

from __future__ import annotations

import re
import resource
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx
from connection_helpers import connect, read_until_closed, status_of
from polling_helpers import until
from process_helpers import start_router

from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: The router's open-file limit: room for a few dozen client connections beside its own.
OPEN_FILES = 320

CONFIG = """\
router:
  tenantsFile: {tenants}
  ledgerPath: {ledger}
  reloadIntervalS: 0.05
  connections: {{headerTimeoutS: 120, idleTimeoutS: 120}}
pools:
  - {{name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, servedModelName: coder,
      batching: {{maxNumSeqs: 4}}, endpoints: [{node}]}}
"""
ALICE = "tenants:\n  - {name: alice, apiKeys: [alice-key-0123456789]}\n"
CAROL = "tenants:\n  - {name: carol, apiKeys: [carol-key-0123456789]}\n"


def few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def open_connections(metrics_url: str) -> float:
    """Client connections open on the tenants' port, as the metrics port reports them."""
    text = httpx.get(metrics_url).text
    (line,) = [x for x in text.splitlines() if x.startswith("tiergate_connections_open ")]
    return float(line.split()[1])


def usage_status(url: str, key: str) -> int:
    try:
        return httpx.get(url + "/v1/usage", headers={"authorization": f"Bearer {key}"}).status_code
    except httpx.HTTPError:
        return 0


def test_at_the_connection_cap_the_tenants_reload_and_the_next_client_still_work(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    tenants, log = tmp_path / "tenants.yaml", tmp_path / "router.log"
    tenants.write_text(ALICE)
    serving = ServingSpec(model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec())
    with (
        served(create_app(NodeConfig(serving=serving, served_model_names=["coder"]))) as node,
        ExitStack() as held,
    ):
        config = tmp_path / "router.yaml"
        config.write_text(
            CONFIG.format(tenants=tenants, ledger=tmp_path / "ledger.sqlite", node=node)
        )
        router = start_router(config, log, preexec_fn=few_open_files)
        url = router.url
        try:
            until(lambda: ready(url), "the router is not ready", 60)
            found = re.search(r"event=connection_limits max_connections=(\d+)", log.read_text())
            assert found, log.read_text()
            cap = int(found.group(1))
            assert 0 < cap < OPEN_FILES // 2
            # No client connection open (the readiness checks' have been counted out; the
            # scrape is on the metrics port, which the tenants' cap does not count).
            until(lambda: open_connections(router.metrics_url) == 0, "the checks' still count")

            # Fill the cap (the connections stay: their timeouts are long), then one more.
            fillers = [held.enter_context(connect(url)) for _ in range(cap)]
            with connect(url) as sock:
                reply = read_until_closed(sock)
            assert status_of(reply) == 503 and b'"too_many_connections"' in reply
            assert f"open={cap} max_connections={cap}" in log.read_text()
            assert open_connections(router.metrics_url) == cap  # monitoring still sees in

            tenants.write_text(CAROL)  # alice's key revoked, carol's added
            until(lambda: "event=tenants_reloaded" in log.read_text(), "no reload at the cap")
            assert "tenants_reload_failed" not in log.read_text()
            refused = httpx.get(url + "/healthz")  # a client past the cap: a clear refusal
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "too_many_connections"

            fillers.pop().close()  # a connection leaves: carol is served, alice refused
            until(lambda: usage_status(url, "carol-key-0123456789") == 200, "carol not served")
            until(lambda: usage_status(url, "alice-key-0123456789") == 401, "alice served")
        finally:
            router.stop()
        assert "Traceback" not in log.read_text()
