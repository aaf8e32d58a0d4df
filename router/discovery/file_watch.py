"""What the router's reloadable files share: telling a changed file by its content, and the
loop that looks at it (pools: router/discovery/view.py; tenants: router/tenants/reload.py)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

__all__ = ["WatchedFile", "watch"]

log = logging.getLogger("tiergate.router")


#: The most looks a refused content waits before it is tried again (a minute at 1 s a look).
MAX_RETRY_LOOKS = 64


class WatchedFile:
    """A file's content as last seen, and how its reloads went.

    A content whose reload was refused is tried again, after 1, 2, 4... looks, up to
    `MAX_RETRY_LOOKS`: a reload may fail for what another file says (a key file a Secret's
    volume has not updated yet), and once that is there the content must not wait for an edit.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._digest = _digest(path)  # the content applied
        self._seen = self._digest  # the content at the previous look
        self._refused: bytes | None = None  # the content whose reload failed last
        self._error = ""  # and why
        self._wait = 0  # looks it waits before it is tried again
        self._waited = 0
        self.reloads = 0  # applied
        self.reload_errors = 0  # contents refused: the previous content kept

    def changed(self) -> bool:
        """True once for each change of content (including the file going or coming back),
        at the first look that finds it as the previous look did: a file written in place
        (`cat > file`, an editor that does not rename) may be read half-written, and a half
        that parses (the first of two pools) would be applied. So a change waits one more
        reload interval and is applied only if it held still. A refused content is True again
        when its wait is over. Say how its reload went: `applied()` or `refused()`."""
        digest = _digest(self.path)
        seen, self._seen = self._seen, digest
        if digest == self._digest or digest != seen:
            return False
        if digest == self._refused:
            self._waited += 1
            if self._waited < self._wait:
                return False
            self._waited, self._wait = 0, min(2 * self._wait, MAX_RETRY_LOOKS)
        return True

    def applied(self) -> None:
        """The content `changed()` found is in service."""
        self._digest, self._refused = self._seen, None
        self.reloads += 1

    def refused(self, error: str) -> bool:
        """The content `changed()` found was not applied, for `error`; whether to log it (not
        when a retry failed as the try before it did)."""
        new = self._seen != self._refused
        if new:
            self._refused, self._wait, self._waited = self._seen, 1, 0
            self.reload_errors += 1
        news, self._error = new or error != self._error, error
        return news


async def watch(reload: Callable[[], object], interval_s: Callable[[], float], name: str) -> None:
    """Call `reload` every `interval_s()` seconds, forever; an exception is logged, never let
    out: a dead watcher is a silent one."""
    while True:
        await asyncio.sleep(interval_s())
        try:
            reload()
        except Exception:
            log.exception("event=%s_watch_error", name)


def _digest(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None
