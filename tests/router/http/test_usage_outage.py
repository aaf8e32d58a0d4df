"""`GET /v1/usage` while the shared PostgreSQL ledger is down, on real processes: a
`tiergate router` on a PostgreSQL server of the test's own, which is stopped after the router
has served (so its connection pool exists and holds connections the server then drops).

The tenant gets 503 `ledger_unavailable` in the OpenAI error envelope with `Retry-After`, the
router logs one line (no traceback, no internal error), and usage answers again once the
server is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet_helpers import fleet, key, tenant_yaml
from polling_helpers import until
from postgres_server import PostgresServer, started_server

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

#: The longest the router may take to read usage again once the database is back.
BACK_WITHIN_S = 60.0


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, to stop and start."""
    server = started_server("tiergate-pg-usage-")
    try:
        yield server
    finally:
        server.close()


def get_usage(url: str, tenant: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key(tenant)}"}
    return httpx.get(url + "/v1/usage", headers=headers, timeout=30)


def chat(url: str, tenant: str) -> httpx.Response:
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {key(tenant)}"}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


@pytest.mark.parametrize("budgeted", [True, False], ids=["budget", "no-budget"])
def test_usage_while_postgres_is_down_is_503_ledger_unavailable_without_a_traceback(
    tmp_path: Path, private_postgres: PostgresServer, budgeted: bool
) -> None:
    server = private_postgres
    limits: dict[str, object] = {"budgetUsd": 100, "budgetPeriod": "day"} if budgeted else {}
    tenants = [tenant_yaml("erin", **limits)]
    with fleet(tmp_path, tenants, server.dsn(server.create_database()), routers=1) as routers:
        (router,) = routers.routers
        assert chat(router.url, "erin").status_code == 200
        before = get_usage(router.url, "erin")
        assert before.status_code == 200, before.text
        assert before.json()["totals"]["requests"] == 1

        server.stop()
        down = get_usage(router.url, "erin")
        assert down.status_code == 503, down.text
        assert down.headers["retry-after"] == "1"
        error = down.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "ledger_unavailable")
        assert "\n" not in error["message"]

        server.start()
        until(
            lambda: get_usage(router.url, "erin").status_code == 200,
            "usage did not answer again once the database was back",
            BACK_WITHIN_S,
        )
        assert get_usage(router.url, "erin").json()["totals"]["requests"] == 1
        log = router.log_text()
    assert "event=usage_unavailable" in log
    assert "Traceback" not in log
    assert "internal_error" not in log
