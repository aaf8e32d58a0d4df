"""Progress on stderr: a bar on a terminal, a line per tenth of the run otherwise."""

from __future__ import annotations

import io

from tiergate.bench.progress import make_progress
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
