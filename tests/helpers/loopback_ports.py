"""Loopback ports for servers a test names before they start, and for URLs nothing listens on.

A port found by binding port 0 comes from the kernel's ephemeral range, which the kernel also
hands to every other socket bound to port 0: the local end of each outgoing connection and
each server started with `--port 0`, in any test on the machine. Between the moment a test
picks such a port and the moment its server binds it, another socket may take it ("Address
already in use"); a URL meant to be refused may find a server there.

The ports here come from below the ephemeral range, where the kernel hands out nothing. Each
pytest process takes them from a slice of its own (the xdist worker's number picks the slice),
so two processes never pick the same port, and one process never gives a port twice. Each is
checked free by binding it.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

#: The range the slices share: from here up to the ephemeral range's start.
LOWEST = 16384
#: Linux's default ephemeral range starts here (used when /proc does not say).
EPHEMERAL_START = 32768
#: Slices: the serial pass (no xdist worker) and workers gw0..gw6; more workers wrap around.
SLICES = 8
ATTEMPTS = 200

_given: set[int] = set()


def _ephemeral_start() -> int:
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_START


def _slice() -> range:
    """This process's ports."""
    top = min(_ephemeral_start(), 65536)
    if top - LOWEST < SLICES * 64:
        raise AssertionError(
            f"the kernel's ephemeral ports start at {top}: no room below it for test ports"
        )
    width = (top - LOWEST) // SLICES
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = (int(worker[2:]) + 1) % SLICES if worker[2:].isdigit() else 0
    start = LOWEST + index * width
    return range(start, start + width)


def _bindable(port: int) -> bool:
    # No SO_REUSEADDR: a port still in TIME_WAIT counts as taken, which is the safe side.
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports, none given out before."""
    ports = _slice()
    for _ in range(ATTEMPTS):
        first = random.randrange(ports.start, ports.stop - count)
        wanted = range(first, first + count)
        if _given.isdisjoint(wanted) and all(_bindable(p) for p in wanted):
            _given.update(wanted)
            return first
    raise AssertionError(f"no {count} consecutive free ports in {ports}")


def free_port() -> int:
    """A free loopback port, none given out before."""
    return free_ports(1)


def refused_url() -> str:
    """The base URL of a loopback port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}"
