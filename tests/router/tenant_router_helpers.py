"""A router over one sim node, with one tenant: for tests of billing (a uniquely named module:
conftest names clash)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.http.app import RouterApp
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

KEY = {"authorization": "Bearer alice-key-0123456789"}


@contextmanager
def tenant_router(
    served: Callable[[Any], AbstractContextManager[str]],
    ledger: Path,
    tmp_path: Path,
    *,
    budget: str,
    router: str = "",
    pool: str = "",
    max_num_seqs: int = 4,
    premium: str | None = None,
    node_default_max_tokens: int = 256,
    accelerator: str = "wse-3",
    node_max_num_seqs: int | None = None,
) -> Iterator[tuple[RouterApp, str]]:
    """The router app and its URL. Tenant `alice` (key `KEY`) has `budget` (e.g. "budgetUsd:
    5, budgetPeriod: day", or any other fields of her entry); model `coder` is served by pool
    `b` (batched, one sim node). `router` and `pool` add settings to the router's and the
    pool's YAML maps. `premium`, if given, adds pool `p` (premium, wse-3) on the same node with
    those settings (e.g. its billing). `accelerator`: what the router is told pool `b` runs on
    (its latency predictions; the node is the same). `node_default_max_tokens`: what the node
    generates for a request with no output cap; `node_max_num_seqs`: the node's own batch
    cap (default `max_num_seqs`; room for both pools' batches when they share it)."""
    tenants = tmp_path / "tenants.yaml"
    fields = ", ".join(x for x in ("name: alice", "apiKeys: [alice-key-0123456789]", budget) if x)
    tenants.write_text(f"tenants:\n  - {{{fields}}}\n")
    batching = BatchingSpec(max_num_seqs=node_max_num_seqs or max_num_seqs)
    serving = ServingSpec(model="llama-3.1-8b", accelerator="wse-3", batching=batching)
    node_config = NodeConfig(
        serving=serving,
        served_model_names=["coder"],
        default_max_tokens=node_default_max_tokens,
    )
    with served(create_app(node_config)) as node:
        router_fields = ", ".join(
            x for x in (f"tenantsFile: {tenants}", f"ledgerPath: {ledger}", router) if x
        )

        def pool_yaml(head: str, extra: str, accelerator: str = "wse-3") -> str:
            fields = (
                f"{head}, model: llama-3.1-8b, accelerator: {accelerator}, servedModelName: coder",
                f"batching: {{maxNumSeqs: {max_num_seqs}}}, endpoints: [{node}]",
                extra,
            )
            return "  - {" + ", ".join(x for x in fields if x) + "}\n"

        pools = pool_yaml("name: b, tier: batched", pool, accelerator)
        if premium is not None:
            pools += pool_yaml("name: p, tier: premium", premium)
        config = parse_config(f"router: {{{router_fields}}}\npools:\n{pools}")
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        with served(app) as url:
            yield app, url
