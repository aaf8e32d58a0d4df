"""Progress on stderr while the bench runs: a tqdm bar on a terminal, else a few plain lines.

Piped or logged stderr gets one line per tenth of the run instead of a bar redrawn with
carriage returns, so CI logs stay readable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

from tiergate.bench.results import RequestResult

__all__ = ["Progress", "make_progress"]


class Progress:
    """Counts finished requests and shows them; `close()` when the run is over."""

    def __init__(
        self,
        total: int,
        stream: TextIO,
        *,
        bar: bool,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._total = total
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._done = 0
        self._errors = 0
        self._every = max(1, total // 10)
        self._bar: tqdm[Any] | None = None
        if bar:
            self._bar = tqdm(
                total=total, file=stream, unit="req", desc="bench", leave=False, dynamic_ncols=True
            )

    def update(self, result: RequestResult) -> None:
        """Account one finished request."""
        self._done += 1
        self._errors += 0 if result.ok else 1
        if self._bar is not None:
            self._bar.update(1)
            if not result.ok:
                self._bar.set_postfix(errors=self._errors, refresh=False)
        elif self._done % self._every == 0 or self._done == self._total:
            elapsed = self._clock() - self._start
            print(
                f"bench: {self._done}/{self._total} requests, {self._errors} errors, "
                f"{elapsed:.1f}s",
                file=self._stream,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def make_progress(total: int, stream: TextIO | None = None) -> Progress:
    """A bar when `stream` (default stderr) is a terminal, plain lines otherwise."""
    stream = stream if stream is not None else sys.stderr
    return Progress(total, stream, bar=stream.isatty())
