"""A fleet of real `tiergate router` processes in front of one sim node: all on one PostgreSQL
ledger (as a Deployment's replicas run), or each on a SQLite file of its own (per-process
state, to show what sharing changes). Clients for it are in fleet_clients.py (a uniquely
named module: conftest names clash).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from process_helpers import ROUTER_LISTENING, Running, launch, start_sim_node, wait_listening

#: USD per output token the fleet's pool bills; input tokens are free, so a request's budget
#: hold (`most_it_may_cost`: prompt x input price + max_tokens x output price) is exactly
#: `max_tokens` x this, whatever its prompt.
PRICE_PER_TOKEN_USD = 0.001
#: Batch cap of the node; each router admits this many at once and queues as many (admission).
MAX_NUM_SEQS = 64

CONFIG = """\
router:
  tenantsFile: {tenants}
  {ledger}
pools:
  - {{name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, servedModelName: coder,
      batching: {{maxNumSeqs: {seqs}}}, endpoints: [{node}],
      billing: {{outputPerMillionUsd: {per_million}, inputPerMillionUsd: 0}}}}
"""


def hold_usd(max_tokens: int) -> float:
    """The budget hold of one of the fleet's requests (see PRICE_PER_TOKEN_USD)."""
    return max_tokens * PRICE_PER_TOKEN_USD


def key(tenant: str) -> str:
    return f"{tenant}-key-0123456789"


def tenant_yaml(name: str, **limits: object) -> str:
    """One entry of a tenants file: `name` (key `key(name)`) with `limits` as its camelCase
    fields (budgetUsd=..., requestsPerMinute=...)."""
    fields = "".join(f", {field}: {value}" for field, value in limits.items())
    return f"  - {{name: {name}, apiKeys: [{key(name)}]{fields}}}\n"


@dataclass
class Fleet:
    """The routers (the clients' round robin goes in this order), the node, and where the
    routers keep their ledgers: one PostgreSQL URL, or one SQLite file each."""

    routers: list[Running]
    node: Running
    dsn: str | None
    sqlite_files: list[Path]

    @property
    def urls(self) -> list[str]:
        return [router.url for router in self.routers]

    def rows(self, tenant: str) -> dict[str, float]:
        """Request id -> cost of every row of `tenant` in the fleet's ledger(s)."""
        if self.dsn is not None:
            return asyncio.run(pg_rows(self.dsn, tenant))
        rows: dict[str, float] = {}
        for path in self.sqlite_files:
            db = sqlite3.connect(path)
            try:
                query = "SELECT request_id, cost_usd FROM usage WHERE tenant = ?"
                rows |= dict(db.execute(query, (tenant,)).fetchall())
            finally:
                db.close()
        return rows

    def spent_usd(self, tenant: str) -> float:
        """What the ledger(s) billed `tenant`: what its budget counts."""
        return sum(self.rows(tenant).values())


async def pg_rows(dsn: str, tenant: str) -> dict[str, float]:
    conn = await asyncpg.connect(dsn)
    try:
        found = await conn.fetch("SELECT request_id, cost_usd FROM usage WHERE tenant = $1", tenant)
    finally:
        await conn.close()
    return {str(row[0]): float(row[1]) for row in found}


@contextmanager
def fleet(
    tmp_path: Path, tenants: list[str], dsn: str | None, *, routers: int = 3
) -> Iterator[Fleet]:
    """`routers` routers over one sim node, with the tenants `tenants` (tenant_yaml entries),
    on the PostgreSQL ledger at `dsn` (one config file for all), or, without it, each on a
    SQLite file of its own. Every process is stopped on exit."""
    tenants_file = tmp_path / "tenants.yaml"
    tenants_file.write_text("tenants:\n" + "".join(tenants))
    node = start_sim_node(
        tmp_path / "node.log", "--model", "llama-3.1-8b", "--accelerator", "wse-3",
        "--served-model-name", "coder", "--max-num-seqs", str(MAX_NUM_SEQS),
    )  # fmt: skip
    files = [] if dsn is not None else [tmp_path / f"ledger-{i}.sqlite" for i in range(routers)]
    started: list[Running] = []
    try:
        for i in range(routers):
            ledger = f"ledgerUrl: '{dsn}'" if dsn is not None else f"ledgerPath: {files[i]}"
            config = tmp_path / ("router.yaml" if dsn is not None else f"router-{i}.yaml")
            config.write_text(
                CONFIG.format(
                    tenants=tenants_file,
                    ledger=ledger,
                    seqs=MAX_NUM_SEQS,
                    node=node.url,
                    per_million=PRICE_PER_TOKEN_USD * 1e6,
                )  # fmt: skip
            )
            # Started together (each takes a second or more to import), waited for after.
            command = ["router", "--config", str(config), "--port", "0", "--metrics-port", "0"]
            started.append(launch(command, tmp_path / f"router-{i}.log"))
        for router in started:
            wait_listening(router, ROUTER_LISTENING)
        yield Fleet(started, node, dsn, files)
    finally:
        for router in started:
            router.stop()
        node.stop()
