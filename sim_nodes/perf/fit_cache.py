"""Fits kept on disk between runs, keyed by everything a fit depends on.

Fitting a group is deterministic: the same rows, catalog, starting values, group and code give
the same values, to the last bit. So a fit is kept in the user's cache folder
(`$XDG_CACHE_HOME/tiergate/fits`, else `~/.cache/tiergate/fits`) under a hash of all of these,
the code being the source of every module of the simulated nodes (the performance model and the
catalogs' loader); a change to any of them is a new key, and the fit runs again. A leave-one-out
pass (a fit per row) then costs its tens of seconds once per change, not once per
`tiergate calibrate` or test run.

A folder that cannot be written, or a file that cannot be read back as values, leaves the fit
uncached: the answer is computed as if no cache existed.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
from pathlib import Path

__all__ = ["cache_folder", "fit_key", "load", "store"]


def cache_folder() -> Path:
    """Where fits are kept (read on every call, so a test may point it elsewhere)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tiergate" / "fits"


@functools.cache
def _code_digest() -> str:
    """A hash of every module of the simulated nodes' package, paths included."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def fit_key(*parts: str) -> str:
    """The key of a fit of `parts` (each a stable text of one input) with the current code."""
    digest = hashlib.sha256(_code_digest().encode())
    for part in parts:
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()


def load(key: str) -> dict[str, float] | None:
    """The values kept under `key`, or None (not kept, or not values)."""
    try:
        data = json.loads((cache_folder() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in data.values()
    ):
        return None
    return {str(k): float(v) for k, v in data.items()}


def store(key: str, values: dict[str, float]) -> None:
    """Keep `values` under `key` (written whole or not at all: concurrent runs may share it)."""
    folder = cache_folder()
    staged = folder / f".{key}.{os.getpid()}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staged.write_text(json.dumps(values))
        os.replace(staged, folder / f"{key}.json")
    except OSError:
        with contextlib.suppress(OSError):
            staged.unlink(missing_ok=True)
