"""Request ids: unique across router processes, replicas and restarts, and cheap to make.

`uuid.uuid4()` reads 16 bytes from the kernel on every call: a system call on every request.
An id here is 64 random bits drawn once per process (again in a forked child) followed by a
64-bit counter: 32 hex digits, like uuid4's. Two processes share ids only if their random halves
collide. Ids are not secrets (the ledger keys attempts by them; a tenant sees only its own).
"""

from __future__ import annotations

import itertools
import os

_prefix = ""
_counter = itertools.count(1)


def _draw() -> None:
    global _prefix, _counter
    _prefix = os.urandom(8).hex()
    _counter = itertools.count(1)


_draw()
os.register_at_fork(after_in_child=_draw)


def new_request_id() -> str:
    return f"{_prefix}{next(_counter):016x}"
