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


class WatchedFile:
    """A file's content as last seen, and how its reloads went."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._digest = _digest(path)  # the content applied
        self._seen = self._digest  # the content at the previous look
        self.reloads = 0  # applied
        self.reload_errors = 0  # refused: the previous content kept

    def changed(self) -> bool:
        """True once for each change of content (including the file going or coming back),
        at the first look that finds it as the previous look did: a file written in place
        (`cat > file`, an editor that does not rename) may be read half-written, and a half
        that parses (the first of two pools) would be applied. So a change waits one more
        reload interval and is applied only if it held still."""
        digest = _digest(self.path)
        seen, self._seen = self._seen, digest
        if digest == self._digest or digest != seen:
            return False
        self._digest = digest
        return True


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
