"""Fixtures every test folder may use: a real PostgreSQL server (tests/helpers/postgres_server.py),
started once per run on its own port and data directory, and a fresh database per test.

httpx clients share one default TLS context (tests/helpers/shared_tls_context.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import shared_tls_context
from postgres_server import PostgresServer, started_server

shared_tls_context.share()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The run's PostgreSQL server (never skipped: a missing server fails the tests)."""
    server = started_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_dsn(postgres: PostgresServer) -> str:
    """The URL of a new, empty database on the run's server."""
    return postgres.dsn(postgres.create_database())
