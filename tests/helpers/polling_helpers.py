"""Waiting for something the router does in the background (a uniquely named module:
conftest names clash)."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(
    condition: Callable[[], bool],
    what: str | Callable[[], str],
    within_s: float = 10.0,
    *,
    every_s: float = 0.05,
) -> None:
    """Return once `condition()` holds, looking every `every_s`; fail with `what` after
    `within_s` seconds (a callable: the message as it is then, e.g. a log's tail)."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(every_s)


def settled(reload_if_changed: Callable[[], bool]) -> bool:
    """What a reload does with a file just written: the first look only notes the change (a
    file may be read half-written), the second applies it if the content held still
    (router/discovery/file_watch.py)."""
    assert not reload_if_changed(), "a change applied at the first look"
    return reload_if_changed()
