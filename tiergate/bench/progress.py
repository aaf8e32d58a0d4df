"""Progress on stderr while the bench runs: a tqdm bar on a terminal, else a few plain lines.

Piped or logged stderr gets one line per tenth of the run instead of a bar redrawn with
carriage returns, so CI logs stay readable. A run of a known number of requests counts them;
a run by time only (`--duration` without `--requests`) counts its seconds.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm import tqdm

from tiergate.bench.results import RequestResult

__all__ = ["Progress", "make_progress"]


class Progress:
    """Counts finished requests and shows them; `close()` when the run is over.

    `total` requests, or with `total` None, `duration_s` seconds make the whole run.
    """

    def __init__(
        self,
        total: int | None,
        stream: TextIO,
        *,
        bar: bool,
        clock: Callable[[], float] = time.perf_counter,
        duration_s: float | None = None,
    ) -> None:
        if total is None and duration_s is None:
            raise ValueError("progress of what: give a total or a duration")
        self._total = total
        self._duration_s = duration_s if total is None else None
        self._stream = stream
        self._clock = clock
        self._start = clock()
        self._done = 0
        self._errors = 0
        self._tenths_shown = 0
        self._bar: tqdm[Any] | None = None
        if bar:
            self._bar = tqdm(
                total=total if total is not None else duration_s,
                file=stream,
                unit="req" if total is not None else "s",
                desc="bench",
                leave=False,
                dynamic_ncols=True,
            )

    def update(self, result: RequestResult) -> None:
        """Account one finished request."""
        self._done += 1
        self._errors += 0 if result.ok else 1
        elapsed = self._clock() - self._start
        if self._bar is not None:
            self._update_bar(elapsed)
            return
        # How far the run is, in tenths: of its requests, or of its duration.
        if self._total is not None:
            tenths = 10 if self._done == self._total else self._done * 10 // self._total
        else:
            assert self._duration_s is not None
            tenths = min(10, math.floor(elapsed * 10 / self._duration_s))
        if tenths <= self._tenths_shown:
            return
        self._tenths_shown = tenths
        done = f"{self._done}" if self._total is None else f"{self._done}/{self._total}"
        line = f"bench: {done} requests, {self._errors} errors, {elapsed:.1f}s"
        if self._duration_s is not None:
            line += f" of {self._duration_s:g}s"
        print(line, file=self._stream, flush=True)

    def _update_bar(self, elapsed: float) -> None:
        assert self._bar is not None
        postfix = {"errors": self._errors} if self._errors else {}
        if self._total is not None:
            self._bar.update(1)
        else:
            assert self._duration_s is not None
            self._bar.update(max(0.0, min(elapsed, self._duration_s) - self._bar.n))
            postfix = {"requests": self._done, **postfix}
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def make_progress(
    total: int | None, stream: TextIO | None = None, *, duration_s: float | None = None
) -> Progress:
    """A bar when `stream` (default stderr) is a terminal, plain lines otherwise."""
    stream = stream if stream is not None else sys.stderr
    return Progress(total, stream, bar=stream.isatty(), duration_s=duration_s)
