"""The shared ledger's bounds on real processes: three `tiergate router` processes (each on
`--port 0`, one config with one ledgerUrl, one tenants file) in front of one sim node.

- A burst of 300 requests spread round robin over them spends at most a tenant's budget plus
  one request's hold per router (router/tenants/fleet_budgets.py), and admits at most its
  requests per minute plus the bucket's refill over the burst (fleet_ratelimit.py). The same
  routers each on a SQLite ledger of its own (per-process state) let the tenant have up to
  three times as much: the `sqlite` cases assert that they do, so it is the shared ledger that
  keeps the bound.
- A router SIGKILLed under load: every reply a client had whole is in PostgreSQL, the other
  routers go on serving, and the budget holds.
- PostgreSQL stopped and started under load: no whole reply goes unrecorded once the routers
  have written what they held, no request hangs, and the budget holds throughout.
- `/v1/usage` answers the same from every router.
- A ledger `tiergate router` cannot use at start: one line, exit 2, no password.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_clients import Load, Reply, answered, burst, usage, whole
from fleet_helpers import Fleet, fleet, hold_usd, tenant_yaml
from loopback_ports import free_port
from polling_helpers import until
from postgres_server import PASSWORD, PostgresServer, started_server

from tiergate.router.ledger.postgres import open_check

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

ROUTERS = 3
BURST = 300
#: Every request asks for at most this many tokens, so its budget hold is HOLD_USD.
MAX_TOKENS = 4
#: The most one request may cost, which its budget holds while it runs: max_tokens x the
#: output price (the pool bills no input tokens; fleet_helpers.py). The ledger's rows are
#: checked against it (no request cost more), so the bound below is the stated one.
HOLD_USD = hold_usd(MAX_TOKENS)
#: The overshoot router/tenants/fleet_budgets.py states: one request's hold per replica.
OVERSHOOT_USD = ROUTERS * HOLD_USD
#: alice's budget: 40 requests' worth, of the 300 the burst sends.
BUDGET_USD = 40 * HOLD_USD
#: bob's requests per minute.
RPM = 60
#: Rounding of the ledger's sums of float prices.
USD_EPS = 1e-9
#: The longest the routers may take to write what they held while the database was down.
WRITTEN_WITHIN_S = 60.0

TENANTS = [
    tenant_yaml("alice", budgetUsd=BUDGET_USD, budgetPeriod="total"),
    tenant_yaml("bob", requestsPerMinute=RPM),
    tenant_yaml("carol"),
]


@pytest.fixture(scope="module", params=["postgres", "sqlite"])
def three(
    request: pytest.FixtureRequest,
    postgres: PostgresServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Fleet]:
    """Three routers on one PostgreSQL ledger, or (`sqlite`) each on a SQLite file of its
    own; each test that uses them has a tenant of its own."""
    dsn = postgres.dsn(postgres.create_database()) if request.param == "postgres" else None
    with fleet(tmp_path_factory.mktemp(f"fleet-{request.param}"), TENANTS, dsn) as routers:
        yield routers


def outcomes(replies: list[Reply]) -> set[tuple[int, str | None, bool, str | None]]:
    return {(r.status, r.code, r.whole, r.failure) for r in replies}


def test_a_burst_over_three_routers_spends_at_most_the_budget_plus_a_hold_each_if_shared(
    three: Fleet,
) -> None:
    replies = asyncio.run(burst(three.urls, "alice", BURST, MAX_TOKENS))
    assert outcomes(replies) <= {(200, None, True, None), (429, "budget_exceeded", False, None)}
    billed = three.rows("alice")
    assert max(billed.values()) <= HOLD_USD + USD_EPS  # no request cost more than its hold
    spent = sum(billed.values())
    # Every reply is billed: what the clients were told they spent is what the ledger has.
    assert sum(r.cost_usd for r in replies) == pytest.approx(spent, abs=USD_EPS)
    served = sum(r.whole for r in replies)
    bound = BUDGET_USD + OVERSHOOT_USD
    print(f"budget: ${spent:.3f} spent by {served} requests of {BURST}, bound ${bound:.3f}")
    if three.dsn is not None:
        assert spent <= bound + USD_EPS
        assert spent >= BUDGET_USD / 2  # what stopped the burst is the budget
    else:  # each router's own ledger and budget: up to three budgets
        assert spent > bound


def test_a_burst_over_three_routers_admits_at_most_the_rate_plus_its_refill_if_shared(
    three: Fleet,
) -> None:
    started = time.monotonic()
    replies = asyncio.run(burst(three.urls, "bob", BURST, MAX_TOKENS))
    elapsed_s = time.monotonic() - started
    assert outcomes(replies) <= {(200, None, True, None), (429, "rate_limit_exceeded", False, None)}
    admitted = sum(r.status == 200 for r in replies)
    # A token bucket's bound: a minute's allowance at once, then RPM per minute; the shared
    # bucket is made full at the burst's first request and refilled until its last.
    bound = RPM + RPM * elapsed_s / 60
    print(f"rate: {admitted} admitted in {elapsed_s:.1f} s, bound {bound:.1f}")
    if three.dsn is not None:
        assert admitted <= bound
        assert admitted >= RPM / 2  # what stopped the burst is the limit
    else:  # each router's own bucket: up to three allowances
        assert admitted > bound


def test_usage_is_the_same_from_every_router_if_shared(three: Fleet) -> None:
    replies = asyncio.run(burst(three.urls, "carol", 30, MAX_TOKENS))
    assert all(r.whole for r in replies)
    answers = [usage(url, "carol") for url in three.urls]
    if three.dsn is not None:
        assert answers[1] == answers[0] and answers[2] == answers[0]
        assert answers[0]["totals"]["requests"] == 30
        billed = sum(r.cost_usd for r in replies)
        assert answers[0]["totals"]["cost_usd"] == pytest.approx(billed, abs=1e-6)
    else:  # each router knows only the requests it served
        assert [answer["totals"]["requests"] for answer in answers] == [10, 10, 10]


def test_a_router_killed_under_load_loses_no_reply_and_the_others_keep_the_budget(
    tmp_path: Path, pg_dsn: str
) -> None:
    budget = 120 * HOLD_USD
    tenants = [tenant_yaml("dave", budgetUsd=budget, budgetPeriod="total")]
    with fleet(tmp_path, tenants, pg_dsn) as routers:
        load = Load(routers.urls, ["dave"], total=BURST, clients=24, max_tokens=MAX_TOKENS)
        victim = routers.routers[0]

        def from_victim(reply: Reply) -> bool:
            return reply.router == 0 and reply.whole

        async def scenario() -> list[Reply]:
            running = asyncio.create_task(load.run())
            await load.until(from_victim, 10, "router 0 served 10 replies")
            victim.process.kill()  # SIGKILL, with requests in flight
            load.phase = "killed"
            return await running

        replies = asyncio.run(scenario())
        rows = routers.rows("dave")
    assert victim.process.returncode == -9
    # Every reply a client had whole is on record, the killed router's included.
    had = {r.request_id for r in replies if r.whole}
    assert had <= set(rows), f"{len(had - set(rows))} whole replies have no row"
    assert {r.stream for r in replies if from_victim(r)} == {False, True}
    assert not [r for r in replies if r.failure == "timeout"]
    survivors = [r for r in replies if r.router != 0]
    assert outcomes(survivors) <= {(200, None, True, None), (429, "budget_exceeded", False, None)}
    after = [r for r in survivors if r.sent_in == "killed"]
    assert sum(r.whole for r in after) >= 1, "the other routers stopped serving"
    spent = sum(rows.values())
    refused = sum(r.code == "budget_exceeded" for r in after)
    print(f"kill: ${spent:.3f} spent, bound ${budget + OVERSHOOT_USD:.3f}; {refused} refused")
    assert spent <= budget + OVERSHOOT_USD + USD_EPS
    assert refused >= 1  # the budget ran out after the kill, and was kept


@pytest.fixture
def private_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, to stop and start."""
    server = started_server("tiergate-pg-restart-")
    try:
        yield server
    finally:
        server.close()


#: Replies while the database is down: about 5 s of the load on this 2-core machine, half of
#: them served with their records held in the routers' memory (counted, not timed: a slower
#: machine only takes longer).
OUTAGE_REPLIES = 1600


def test_postgres_restarted_under_load_loses_no_reply_and_keeps_the_budget(
    tmp_path: Path, private_postgres: PostgresServer
) -> None:
    """erin has a budget, frank none: frank's requests are served throughout, the outage's
    records held in the routers' memory; erin's are admitted within the routers' leases."""
    server = private_postgres
    budget = 150 * HOLD_USD
    tenants = [tenant_yaml("erin", budgetUsd=budget, budgetPeriod="total"), tenant_yaml("frank")]
    with fleet(tmp_path, tenants, server.dsn(server.create_database())) as routers:
        load = Load(routers.urls, ["erin", "frank"], total=2000, clients=24, max_tokens=MAX_TOKENS)

        async def scenario() -> list[Reply]:
            running = asyncio.create_task(load.run())
            await load.until(whole, 60, "60 replies before the outage")
            load.phase = "stopping"
            await asyncio.to_thread(server.stop)
            load.phase = "down"
            until_up = load.count(answered) + OUTAGE_REPLIES
            await load.until(answered, until_up, "replies while the database is down")
            load.phase = "starting"
            await asyncio.to_thread(server.start)
            load.phase = "up"
            return await running

        replies = asyncio.run(scenario())
        unanswered = [r for r in replies if r.status == 0]
        assert not unanswered, [(r.failure, r.router, r.sent_in, r.answered_in) for r in unanswered]
        erin = [r for r in replies if r.tenant == "erin"]
        assert outcomes(erin) <= {
            (200, None, True, None),
            (429, "budget_exceeded", False, None),
            (503, "budget_store_unavailable", False, None),
        }
        assert all(r.whole for r in replies if r.tenant == "frank")
        down = [r for r in replies if r.sent_in == r.answered_in == "down"]
        # While the database was down, erin's requests were admitted within the leases (and
        # billed from memory) or refused for the budget store's absence, never as over budget.
        assert outcomes([r for r in down if r.tenant == "erin"]) <= {
            (200, None, True, None),
            (503, "budget_store_unavailable", False, None),
        }, {r.message for r in down if r.status == 429}
        assert sum(r.whole and r.tenant == "frank" for r in down) >= 1
        had = {r.request_id for r in replies if r.whole}

        def all_written() -> bool:
            return had <= set(routers.rows("erin")) | set(routers.rows("frank"))

        until(all_written, "the routers did not write the replies they held", WRITTEN_WITHIN_S)
        spent = routers.spent_usd("erin")
    unavailable = sum(r.code == "budget_store_unavailable" for r in erin)
    print(
        f"restart: erin ${spent:.3f} spent, bound ${budget + OVERSHOOT_USD:.3f}; while down "
        f"({load.phase_s('down', 'starting'):.1f} s) {sum(r.whole for r in down)} served, "
        f"{unavailable} refused; {len(had)} whole replies, all on record"
    )
    assert spent <= budget + OVERSHOOT_USD + USD_EPS


def newer_schema(server: PostgresServer) -> str:
    name = server.create_database()
    asyncio.run(open_check(server.dsn(name)))
    server.psql("UPDATE tiergate_schema SET version = 99", name)
    return server.dsn(name)


#: A ledger URL the router cannot use, and what its line must say of why.
BAD_LEDGERS: dict[str, tuple[Callable[[PostgresServer], str], str]] = {
    "unreachable": (
        lambda server: f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/tiergate",
        "Connect call failed",
    ),
    "wrong password": (
        lambda server: server.dsn("postgres", password="not-the-password-0x5eed"),
        "password authentication failed",
    ),
    "newer schema": (newer_schema, "has schema version 99"),
}


@pytest.mark.parametrize("ledger", list(BAD_LEDGERS))
def test_a_ledger_the_router_cannot_use_is_one_line_and_exit_2(
    tmp_path: Path, postgres: PostgresServer, ledger: str
) -> None:
    make_url, reason = BAD_LEDGERS[ledger]
    dsn = make_url(postgres)
    config = tmp_path / "router.yaml"
    config.write_text(
        f"router: {{ledgerUrl: '{dsn}'}}\npools:\n"
        "  - {name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3,\n"
        "     batching: {maxNumSeqs: 4}, endpoints: ['http://127.0.0.1:9']}\n"
    )
    argv = [sys.executable, "-P", "-m", "tiergate", "router", "--config", str(config),
            "--port", "0", "--metrics-port", "0"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and done.stdout == "", done.stderr
    assert "postgresql://127.0.0.1:" in lines[0] and reason in lines[0]  # which and why
    for secret in (PASSWORD, "not-the-password-0x5eed"):
        assert secret not in done.stderr + done.stdout
    print(f"{ledger}: {lines[0]}")
