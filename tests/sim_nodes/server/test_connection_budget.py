"""The connection cap's arithmetic (fitted in the open-file limit) and the gate that enforces it,
on a fake clock."""

from __future__ import annotations

import logging
import resource

import pytest

from tiergate.common.connection_limits import (
    DEFAULT_MAX_CONNECTIONS,
    ConnectionGate,
    ConnectionLimits,
)
from tiergate.common.fd_budget import (
    FdBudgetError,
    connection_cap,
    max_connections,
    raise_open_file_limit,
)


@pytest.mark.parametrize(
    ("open_files", "upstream_pool", "cap"),
    [
        (1024, 1024, (1024 - 256) // 2),  # few: half for clients, half for their upstreams
        (65536, 1024, 65536 - 256 - 1024),  # many: the whole upstream pool fits beside them
        (2304, 1024, 1024),  # the point where both rules agree
        (256, 1024, 0),  # nothing left beside the reserve
        (1024, 0, 1024 - 256),  # no upstream (a sim node)
    ],
)
def test_the_cap_leaves_the_reserve_and_an_upstream_connection_per_client(
    open_files: int, upstream_pool: int, cap: int
) -> None:
    assert connection_cap(open_files, reserve=256, upstream_pool=upstream_pool) == cap


def test_a_cap_asked_for_must_fit_the_open_file_limit() -> None:
    with pytest.raises(FdBudgetError) as exc:
        max_connections(10**9, setting="router.connections.maxConnections", reserve=256)
    message = str(exc.value)
    assert message.startswith("router.connections.maxConnections is ") and "\n" not in message
    assert "RLIMIT_NOFILE" in message
    cap, open_files = max_connections(None, setting="--max-connections", reserve=16)
    assert cap == min(DEFAULT_MAX_CONNECTIONS, open_files - 16)
    assert max_connections(1, setting="--max-connections", reserve=16)[0] == 1


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard open-file limit to raise the soft one to")
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard - 1), hard))
    try:
        assert raise_open_file_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class Clock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_refusals_are_counted_each_and_logged_at_most_every_ten_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    gate = ConnectionGate(
        ConnectionLimits(max_connections=2), logging.getLogger("test.gate"), clock=clock
    )
    assert gate.admit() and gate.admit()
    with caplog.at_level(logging.WARNING, logger="test.gate"):
        assert not any(gate.admit() for _ in range(5))
        clock.now_s = 9.9
        assert not gate.admit()
        clock.now_s = 10.0
        assert not gate.admit()
    assert gate.refused == 7 and gate.open == 2
    first, second = caplog.messages
    assert "open=2 max_connections=2 refused=1 refused_total=1" in first
    assert "refused=6 refused_total=7" in second  # the ones since the first line
    gate.release()
    assert gate.admit() and gate.open == 2
