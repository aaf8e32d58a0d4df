"""Sim nodes, a router serving the endpoint picker, and Envoy in front: the pieces the
gateway tests put together (a uniquely named module: conftest names clash)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from envoy_gateway import Envoy, GatewayConfig, start_envoy
from polling_helpers import until

from tiergate.router.build import build_app
from tiergate.router.config import EppTls, RouterSettings, parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.epp.server import EppServer
from tiergate.router.http.app import RouterApp
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

TENANTS = """
tenants:
  - name: alice
    apiKeys: [alice-key-0123456789]
    allowedTiers: [batched, premium, wafer-scale]
  - name: bob
    apiKeys: [bob-key-0123456789]
    allowedTiers: [batched]
  - name: carol
    apiKeys: [carol-key-0123456789]
    allowedTiers: [batched, premium, wafer-scale]
    budgetUsd: 0.0000001
    budgetPeriod: day
  - name: erin
    apiKeys: [erin-key-0123456789]
    requestsPerMinute: 2
  - name: dave
    apiKeys: [dave-key-0123456789]
    allowedTiers: [batched, premium, wafer-scale]
    budgetUsd: 1000
    budgetPeriod: day
"""
ALICE = {"authorization": "Bearer alice-key-0123456789"}
BOB = {"authorization": "Bearer bob-key-0123456789"}
CAROL = {"authorization": "Bearer carol-key-0123456789"}
DAVE = {"authorization": "Bearer dave-key-0123456789"}
ERIN = {"authorization": "Bearer erin-key-0123456789"}


def node(names: list[str], accelerator: str = "wse-3", **overrides: Any) -> NodeConfig:
    """The 8B model on one chip: fast tokens on a wafer-scale one (the default)."""
    serving = ServingSpec(
        model="llama-3.1-8b", accelerator=accelerator, batching=BatchingSpec(max_num_seqs=16)
    )
    return NodeConfig(serving=serving, served_model_names=names, **overrides)


def config_yaml(
    urls: dict[str, list[str]], tenants: Path, ledger: Path, router: str = "", more: str = ""
) -> str:
    """The router's file: its settings (and `router`'s), the three pools of `urls`, and the
    pool entries `more` lists."""

    def pool(name: str, tier: str, served: str) -> str:
        return (
            f"  - {{name: {name}, tier: {tier}, model: llama-3.1-8b, accelerator: wse-3, "
            f"servedModelName: {served}, batching: {{maxNumSeqs: 16}}, "
            f"endpoints: {json.dumps(urls[name])}}}\n"
        )

    extra = f", {router}" if router else ""
    return (
        f"router: {{tenantsFile: {tenants}, ledgerPath: {ledger}, eppPort: 0{extra}}}\n"
        "pools:\n"
        + pool("coder-batched", "batched", "coder")
        + pool("coder-premium", "premium", "coder")
        + pool("spark", "wafer-scale", "coder-spark")
        + more
    )


@dataclass
class System:
    """The router (its app, URL, metrics URL, ledger file), its picker's port, the nodes'
    URLs by pool, and the folder Envoy's files go to."""

    app: RouterApp
    url: str
    metrics: str
    ledger: Path
    nodes: dict[str, list[str]]
    folder: Path
    envoys: list[Envoy] = field(default_factory=list)

    @property
    def epp(self) -> EppServer:
        return next(s for s in self.app.services if isinstance(s, EppServer))

    def envoy(self, **settings: Any) -> Envoy:
        """An Envoy in front of this router's picker (GatewayConfig's settings); stopped with
        the system."""
        settings.setdefault("epp_port", self.epp.port)
        envoy = start_envoy(GatewayConfig(**settings), self.folder, f"envoy{len(self.envoys)}")
        self.envoys.append(envoy)
        return envoy

    def rows(self, request_ids: list[str] | None = None) -> list[dict[str, Any]]:
        """The ledger's rows (committed), oldest first."""
        with sqlite3.connect(self.ledger) as db:
            db.row_factory = sqlite3.Row
            rows = [dict(r) for r in db.execute("SELECT * FROM usage ORDER BY id")]
        if request_ids is not None:
            rows = [r for r in rows if r["request_id"] in request_ids]
        return rows

    def final_row(self, request_id: str) -> dict[str, Any]:
        """The request's row once it is final: a stream's is written at its first token as
        `incomplete` and amended when the request ends, which may come after its slot is
        free."""

        def final() -> bool:
            rows = self.rows([request_id])
            return len(rows) == 1 and rows[0]["outcome"] != "incomplete"

        until(final, lambda: f"no final row for the request: {self.rows([request_id])}")
        (row,) = self.rows([request_id])
        return row


def slots_free(system: System) -> bool:
    """No admission slot held and no request in flight at any endpoint."""
    router = system.app.router
    queues = router.admission.queues.values()
    endpoints = router.view().endpoints()
    return all(q.active == 0 for q in queues) and all(e.inflight == 0 for e in endpoints)


def address(url: str) -> str:
    return url.removeprefix("http://")


@contextmanager
def epp_system(
    served: Callable[[Any], AbstractContextManager[str]],
    folder: Path,
    *,
    router: str = "",
    nodes: dict[str, list[NodeConfig]] | None = None,
    pools: str = "",
) -> Iterator[System]:
    """Real sim nodes and the router with its picker on loopback ports; Envoys started with
    `System.envoy` stop first. `pools`: more pool entries for the router's file."""
    tenants = folder / "tenants.yaml"
    tenants.write_text(TENANTS)
    nodes = nodes or {
        "coder-batched": [node(["coder"]), node(["coder"], seed=1)],
        "coder-premium": [node(["coder"])],
        "spark": [node(["coder-spark"])],
    }
    with ExitStack() as stack:
        urls = {
            pool: [stack.enter_context(served(create_app(c))) for c in configs]
            for pool, configs in nodes.items()
        }
        ledger = folder / "ledger.sqlite"
        config = parse_config(config_yaml(urls, tenants, ledger, router, pools))
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        url = stack.enter_context(served(app))
        metrics = stack.enter_context(served(app.metrics_app))
        system = System(app, url, metrics, ledger, urls, folder)
        try:
            yield system
        finally:
            for envoy in system.envoys:
                envoy.stop()


class StandIn:
    """Stands in for the router behind a picker (`Router.completion`, its settings): a
    subclass says what the request path does."""

    settings = RouterSettings()

    async def completion(self, scope: Any, receive: Any, send: Any, **_: Any) -> None:
        raise NotImplementedError


@asynccontextmanager
async def picker_alone(
    server: type[EppServer] = EppServer, **settings: Any
) -> AsyncIterator[EppServer]:
    """A plaintext picker on a free loopback port (`server`, with `settings`), on this event
    loop; stopped on exit."""
    settings.setdefault("router", StandIn())
    picker = server(host="127.0.0.1", port=0, tls=EppTls(enabled=False), **settings)
    await picker.start()
    try:
        yield picker
    finally:
        await picker.stop()


def chat(model: str = "coder", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}], **fields}


def post(base: str, body: Any, headers: dict[str, str] | None = None,
         path: str = "/v1/chat/completions") -> httpx.Response:  # fmt: skip
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        base + path,
        content=content,
        headers={"content-type": "application/json", **ALICE, **(headers or {})},
        timeout=60,
    )
