"""Progress on stderr: a bar on a terminal, a line per tenth of the run otherwise."""

from __future__ import annotations

import io

from tiergate.bench.progress import Progress, make_progress
from tiergate.bench.results import RequestResult


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def result(error: str | None = None) -> RequestResult:
    return RequestResult(
        index=0, requested_tier="batched", served_tier="batched", model="m", error=error
    )


def test_a_terminal_gets_a_bar() -> None:
    stream = Terminal()
    progress = make_progress(20, stream)
    for i in range(20):
        progress.update(result("503" if i == 3 else None))
    progress.close()
    text = stream.getvalue()
    # tqdm redraws at most every 0.1 s: the first frame is what a fast test sees.
    assert "bench:" in text and "0/20" in text and "req/s" in text and "\r" in text


def test_a_pipe_gets_ten_plain_lines() -> None:
    stream = io.StringIO()
    progress = make_progress(100, stream)
    for i in range(100):
        progress.update(result("503" if i < 5 else None))
    progress.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in stream.getvalue()
    assert lines[0].startswith("bench: 10/100 requests, 5 errors, ")
    assert lines[-1].startswith("bench: 100/100 requests, 5 errors, ")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_timed_run_gets_a_line_per_tenth_of_its_duration() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = Progress(None, stream, bar=False, clock=clock, duration_s=20.0)
    for second in range(25):  # two requests a second; the last ones finish after the end
        clock.now = second + 0.5
        progress.update(result("429" if second == 0 else None))
        progress.update(result())
    lines = stream.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0] == "bench: 5 requests, 1 errors, 2.5s of 20s"
    assert lines[-1] == "bench: 41 requests, 1 errors, 20.5s of 20s"


def test_a_terminal_gets_a_bar_of_seconds_in_a_timed_run() -> None:
    stream = Terminal()
    progress = make_progress(None, stream, duration_s=30.0)
    progress.update(result())
    progress.close()
    assert "bench:" in stream.getvalue() and "/30" in stream.getvalue()
