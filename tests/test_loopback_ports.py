"""The test helper that names ports before a server binds them (tests/helpers/loopback_ports.py):
outside the kernel's ephemeral range, one slice per pytest process, never given twice."""

from __future__ import annotations

import socket

import loopback_ports
import pytest
from loopback_ports import free_port, free_ports, refused_url


def test_ports_come_from_below_the_ephemeral_range_and_are_never_given_twice() -> None:
    ephemeral = loopback_ports._ephemeral_start()
    given = [free_port() for _ in range(50)]
    assert len(set(given)) == 50
    assert all(loopback_ports.LOWEST <= p < ephemeral for p in given)


def test_consecutive_ports_are_all_free_and_bindable() -> None:
    first = free_ports(6)
    for port in range(first, first + 6):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if taken
    assert free_port() not in range(first, first + 6)


def test_each_xdist_worker_has_a_slice_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = []
    for worker in (None, "gw0", "gw1", "gw2", "gw6"):
        if worker is None:
            monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        else:
            monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        slices.append(set(loopback_ports._slice()))
    for i, one in enumerate(slices):
        for other in slices[i + 1 :]:
            assert one.isdisjoint(other)


def test_a_port_held_by_a_listener_is_never_given(monkeypatch: pytest.MonkeyPatch) -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # a port this helper never gave: only the bind check stops it
    held.listen()
    taken = held.getsockname()[1]
    # The first two picks land on the held port; the ones after are random again.
    picks = [taken, taken]
    randrange = loopback_ports.random.randrange
    monkeypatch.setattr(
        loopback_ports.random,
        "randrange",
        lambda low, high: picks.pop() if picks else randrange(low, high),
    )
    try:
        assert loopback_ports.free_port() != taken
        assert not picks  # both picks of the held port were passed over
    finally:
        held.close()


def test_a_refused_url_is_refused() -> None:
    url = refused_url()
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0
