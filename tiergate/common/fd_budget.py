"""How many client connections a server may hold within its open-file limit (RLIMIT_NOFILE).

Each client connection is a file descriptor, and so is each upstream connection a proxied
request holds, each idle connection the router keeps to an endpoint it scrapes, the ledger's
files, a reloaded file while it is read, the event loop's own. A process at its limit can
neither accept nor connect nor open a file: the cap on client connections leaves `reserve`
descriptors (and one upstream connection per client connection, up to the upstream pool's
size) for the rest.
"""

from __future__ import annotations

import resource

from .connection_limits import DEFAULT_MAX_CONNECTIONS

__all__ = ["FdBudgetError", "connection_cap", "max_connections", "raise_open_file_limit"]


class FdBudgetError(ValueError):
    """The connection cap asked for does not fit in the open-file limit (one line says so)."""


def max_connections(
    wanted: int | None, *, setting: str, reserve: int, upstream_pool: int = 0
) -> tuple[int, int]:
    """The connection cap to serve with, and the open-file limit it was fitted in (raised to
    the hard limit first): `wanted` (the value of `setting`), or the default if the limit
    allows it, else what the limit allows. FdBudgetError when `wanted` does not fit."""
    open_files = raise_open_file_limit()
    fits = connection_cap(open_files, reserve=reserve, upstream_pool=upstream_pool)
    room = f"the open-file limit ({open_files}, RLIMIT_NOFILE) leaves room for {fits}"
    if wanted is not None and wanted > fits:
        raise FdBudgetError(
            f"{setting} is {wanted}, but {room}: lower it, or raise the limit "
            "(ulimit -n; a container's nofile limit)"
        )
    if fits < 1:
        raise FdBudgetError(f"{room} connections: raise it (ulimit -n)")
    return (wanted if wanted is not None else min(DEFAULT_MAX_CONNECTIONS, fits)), open_files


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (as Go's runtime does for every
    program; a container's soft limit may be 1024 under a far higher hard one); returns the
    soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
        return hard
    return soft


def connection_cap(open_files: int, *, reserve: int, upstream_pool: int = 0) -> int:
    """The most client connections that fit in `open_files` descriptors beside `reserve` of
    the process's own, when each connection may also hold one upstream connection from a pool
    of at most `upstream_pool` (0: a server with no upstream). 0 when nothing fits."""
    available = open_files - reserve
    if available <= 0:
        return 0
    if available >= 2 * upstream_pool:
        return available - upstream_pool
    return available // 2
