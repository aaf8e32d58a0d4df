"""When a bench worker sends its next request: the run's shared plan, its end, the pause after
a 429. Pure but for the clock it is given.

Every worker of every tenant takes its next request from one `Schedule`, so `--requests N` is
N in all, taken by whichever worker is free; `--duration S` ends the run for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from tiergate.bench.workload import PlannedRequest

__all__ = ["DEFAULT_RETRY_AFTER_S", "MAX_RETRY_AFTER_S", "Schedule", "pause_after_429"]

#: A 429 that does not say when to come back (or says it as a date) is retried after this.
DEFAULT_RETRY_AFTER_S = 1.0
#: The longest a worker waits after a 429, whatever it says: the run should go on measuring.
MAX_RETRY_AFTER_S = 5.0


def pause_after_429(retry_after_s: float | None) -> float:
    """Seconds a worker waits after a 429 whose Retry-After gave `retry_after_s`."""
    if retry_after_s is None:
        return DEFAULT_RETRY_AFTER_S
    return min(retry_after_s, MAX_RETRY_AFTER_S)


class Schedule:
    """The requests of a run, handed out one at a time until the plan or the time runs out."""

    def __init__(
        self,
        planned: Iterator[PlannedRequest],
        clock: Callable[[], float],
        *,
        duration_s: float | None = None,
    ) -> None:
        self._planned = planned
        self._clock = clock
        self._deadline = None if duration_s is None else clock() + duration_s

    def next_request(self) -> PlannedRequest | None:
        """The next request to send, or None when the run is over."""
        if self._deadline is not None and self._clock() >= self._deadline:
            return None
        return next(self._planned, None)

    def pause_s(self, wanted_s: float) -> float:
        """`wanted_s`, cut short at the end of the run (a pause past it would only delay the
        report)."""
        if self._deadline is None:
            return wanted_s
        return max(0.0, min(wanted_s, self._deadline - self._clock()))
