"""A real `tiergate router` process in front of the real engine (a uniquely named module:
conftest names clash): its configuration file, tenants, and reading its ledger."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import httpx
from polling_helpers import until
from process_helpers import Running, start_router

#: Prices large enough that a few tokens make a visible cost (USD per million tokens).
INPUT_PER_MILLION_USD = 1000.0
OUTPUT_PER_MILLION_USD = 2000.0
BILLING = (
    f"billing: {{inputPerMillionUsd: {INPUT_PER_MILLION_USD}, "
    f"outputPerMillionUsd: {OUTPUT_PER_MILLION_USD}}}"
)
#: Tenant name -> API key.
KEYS = {
    "alice": "alice-key-0123456789",
    "carol": "carol-key-0123456789",
    "dave": "dave-key-01234567890",
    "erin": "erin-key-01234567890",
}
TENANTS = f"""tenants:
  - {{name: alice, apiKeys: [{KEYS["alice"]}], budgetUsd: 100, budgetPeriod: day}}
  - {{name: carol, apiKeys: [{KEYS["carol"]}], budgetUsd: 100, budgetPeriod: day}}
  - {{name: erin, apiKeys: [{KEYS["erin"]}], budgetUsd: 100, budgetPeriod: day}}
  # A tenth of a cent: one short request spends it all.
  - {{name: dave, apiKeys: [{KEYS["dave"]}], budgetUsd: 0.001, budgetPeriod: day}}
"""
#: The key the keyed engine requires on /v1, as a hosted provider's API does.
PROVIDER_KEY = "sk-engine-provider-0123456789"
#: The model the engine serves (tools/real_engine.py `SERVED_MODEL_NAME`).
MODEL = "smollm2"


def pool_yaml(name: str, endpoint: str, *, model: str, accelerator: str) -> str:
    """One static pool serving `MODEL` at the batched tier. `model` and `accelerator` are
    catalog names for the router's latency predictions: the catalog has no CPU accelerator
    nor SmolLM2, so they only rank pools, never predict the engine's speed."""
    return (
        f"  - {{name: {name}, tier: batched, model: {model}, accelerator: {accelerator}, "
        f"servedModelName: {MODEL}, batching: {{maxNumSeqs: 16}}, {BILLING}, "
        f"endpoints: [{json.dumps(endpoint)}]}}\n"
    )


def start_engine_router(folder: Path, pools: str, router_settings: str = "") -> Running:
    """`tiergate router` over `pools` (YAML list items), tenants `TENANTS`, an SQLite ledger
    in `folder`."""
    (folder / "tenants.yaml").write_text(TENANTS)
    settings = f"tenantsFile: {folder / 'tenants.yaml'}, ledgerPath: {folder / 'ledger.sqlite'}"
    if router_settings:
        settings += ", " + router_settings
    config = folder / "router.yaml"
    config.write_text(f"router: {{{settings}}}\npools:\n{pools}")
    return start_router(config, folder / "router.log")


def ledger_rows(folder: Path, count: int, where: str = "1 = 1") -> list[dict[str, Any]]:
    """The ledger's rows matching `where`, once there are `count` of them (the router writes
    its ledger in the background)."""
    rows: list[dict[str, Any]] = []

    def enough() -> bool:
        nonlocal rows
        with sqlite3.connect(folder / "ledger.sqlite") as db:
            db.row_factory = sqlite3.Row
            try:
                rows = [dict(r) for r in db.execute(f"select * from usage where {where}")]
            except sqlite3.OperationalError:  # the table is not there yet
                return False
        return len(rows) >= count

    until(enough, f"fewer than {count} ledger rows where {where}: {rows}", 30.0)
    return rows


def cost_usd(prompt_tokens: int, completion_tokens: int) -> float:
    """What the pools' `billing` charges for these tokens."""
    return (
        prompt_tokens * INPUT_PER_MILLION_USD + completion_tokens * OUTPUT_PER_MILLION_USD
    ) / 1e6


def engine_counter(engine_url: str, name: str) -> float:
    """A counter of the engine's own /metrics, summed over its series."""
    total = 0.0
    for line in httpx.get(engine_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total
