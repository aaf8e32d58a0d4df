"""Runs with --tenants and --duration against scripted replies (httpx.MockTransport): each
tenant's key on its requests, the shared request count, the end of a timed run, and the pause
after a 429 on an event loop of virtual time (no test waits on wall time)."""

from __future__ import annotations

import asyncio
import selectors
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from bench_helpers import TickingClock, models_response, small_workload, sse, text_chunks
from cli_status import run_cli

from tiergate.bench import BenchReport, BenchSettings, BenchTenant, run_bench
from tiergate.bench.errors import BenchError
from tiergate.bench.pacing import MAX_RETRY_AFTER_S, Schedule, pause_after_429

SSE = {"content-type": "text/event-stream"}
#: Prompt tokens each key's replies report, so a tenant's row shows whose key it sent.
PROMPT_TOKENS = {"Bearer key-heavy": 1, "Bearer key-light": 1000}
TENANTS = (BenchTenant("heavy", "key-heavy", 3), BenchTenant("light", "key-light", 1))


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when it would wait: `asyncio.sleep(60)` returns at
    once, 60 virtual seconds later, and every sleeper wakes in its turn."""

    def __init__(self) -> None:
        self.now = 0.0
        loop = self

        class Selector(selectors.DefaultSelector):
            def select(self, timeout: float | None = None) -> Any:
                ready = super().select(0)
                if not ready:
                    assert timeout is not None, "nothing scheduled: the run would hang"
                    loop.now += timeout
                return ready

        super().__init__(Selector())

    def time(self) -> float:
        return self.now


def settings(**overrides: object) -> BenchSettings:
    fields: dict[str, object] = {
        "url": "http://router",
        "requests": 40,
        "concurrency": 1,
        "workload": small_workload(),
        "tenants": TENANTS,
    }
    fields.update(overrides)
    return BenchSettings(**fields)  # type: ignore[arg-type]


class Router:
    """Answers chat requests with `status` (and `headers`), counting them per Authorization."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers or {}
        self.chats: Counter[str] = Counter()
        self.model_lists: Counter[str] = Counter()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        key = request.headers.get("authorization", "")
        if request.url.path == "/v1/models":
            self.model_lists[key] += 1
            return models_response([{"id": "m", "object": "model"}])
        self.chats[key] += 1
        assert sum(self.chats.values()) <= 1000, "a closed loop that does not pause"
        if self.status != 200:
            body = {"error": {"message": "tier queue full", "type": "x", "code": "shed"}}
            return httpx.Response(self.status, json=body, headers=self.headers)
        usage = {"prompt_tokens": PROMPT_TOKENS.get(key, 0), "completion_tokens": 2}
        chunks = [*text_chunks(2)[:-1], {"choices": [], "usage": usage}]
        return httpx.Response(200, content=sse(*chunks), headers=SSE)


async def run(router: Router, **overrides: object) -> BenchReport:
    clock = overrides.pop("clock", TickingClock())
    return await run_bench(
        settings(**overrides),
        transport=httpx.MockTransport(router),
        clock=clock,  # type: ignore[arg-type]
    )


def run_in_virtual_time(router: Router, **overrides: object) -> BenchReport:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(run(router, clock=loop.time, **overrides))
    finally:
        loop.close()


async def test_each_tenant_sends_its_own_key() -> None:
    router = Router()
    report = await run(router)
    rows = {row.tenant: row for row in report.tenants}
    assert list(rows) == ["heavy", "light"]
    assert set(router.chats) <= set(PROMPT_TOKENS)  # no request without a tenant's key
    assert router.model_lists == {key: 1 for key in PROMPT_TOKENS}  # each key checked first
    for key, name in (("Bearer key-heavy", "heavy"), ("Bearer key-light", "light")):
        assert rows[name].requests == router.chats[key]
        assert rows[name].prompt_tokens == PROMPT_TOKENS[key] * rows[name].ok
    assert report.run.tenants == {"heavy": 3, "light": 1} and report.run.concurrency == 4


async def test_requests_is_the_total_of_all_tenants() -> None:
    router = Router()
    report = await run(router, requests=7)
    assert sum(router.chats.values()) == 7 == report.total.requests
    assert sum(row.requests for row in report.tenants) == 7


async def test_a_timed_run_stops_sending_and_reports_every_request_sent() -> None:
    router = Router()
    report = await run(router, requests=None, duration_s=30.0)
    assert 0 < report.total.requests == sum(router.chats.values())
    assert report.total.errors == 0
    assert report.run.requests is None and report.run.duration_s == 30.0


async def test_the_first_of_requests_and_duration_ends_the_run() -> None:
    router = Router()
    report = await run(router, requests=3, duration_s=1e6)
    assert report.total.requests == 3 == sum(router.chats.values())


@pytest.mark.parametrize(
    ("retry_after", "pause_s"),
    [("2", 2.0), (None, 1.0), ("60", MAX_RETRY_AFTER_S), ("Wed, 21 Oct 2015 07:28:00 GMT", 1.0)],
)
def test_a_worker_waits_retry_after_before_its_next_request(
    retry_after: str | None, pause_s: float
) -> None:
    """20 virtual seconds of 429s: each of heavy's 3 workers and light's 1 sends once per
    pause, however fast the refusals come."""
    router = Router(429, {"retry-after": retry_after} if retry_after is not None else {})
    report = run_in_virtual_time(router, requests=None, duration_s=20.0)
    per_worker = round(20.0 / pause_s)  # at 0, pause_s, 2 * pause_s, ... before 20 s
    assert router.chats == {"Bearer key-heavy": 3 * per_worker, "Bearer key-light": per_worker}
    rows = {row.tenant: row for row in report.tenants}
    assert rows["heavy"].shed == 3 * per_worker and rows["heavy"].errors == 0
    assert rows["light"].shed == per_worker and rows["light"].ok == 0
    assert report.wall_s == pytest.approx(20.0 - pause_s)  # to the last reply


def test_a_worker_still_pausing_does_not_lengthen_a_run_of_n_requests() -> None:
    router = Router(429, {"retry-after": "5"})
    report = run_in_virtual_time(router, requests=4)  # one each; then all of them pause
    assert report.total.requests == 4 and report.wall_s == 0.0


def test_pause_spaces_each_worker_s_requests_and_a_longer_retry_after_wins() -> None:
    """--pause 4 over 20 virtual seconds: each worker sends at 0, 4, ..., 16; after a 429
    saying 5 s, it waits the 5 s instead."""
    served = Router()
    report = run_in_virtual_time(served, requests=None, duration_s=20.0, pause_s=4.0)
    assert served.chats == {"Bearer key-heavy": 3 * 5, "Bearer key-light": 5}
    assert report.run.pause_s == 4.0 and report.total.errors == 0
    shed = Router(429, {"retry-after": "5"})
    run_in_virtual_time(shed, requests=None, duration_s=20.0, pause_s=4.0)
    assert shed.chats == {"Bearer key-heavy": 3 * 4, "Bearer key-light": 4}


@pytest.mark.parametrize("value", ["-1", "nan", "soon"])
def test_a_pause_must_be_a_number_of_seconds(
    capsys: pytest.CaptureFixture[str], value: str
) -> None:
    code, out, err = cli(capsys, "--pause", value)
    assert code == 2 and out == "" and "--pause" in err


def test_the_pause_after_a_429_is_capped_and_ends_with_the_run() -> None:
    assert pause_after_429(None) == 1.0
    assert pause_after_429(0.5) == 0.5 and pause_after_429(3600) == MAX_RETRY_AFTER_S
    now = [0.0]
    schedule = Schedule(iter(small_workload().plan(3)), lambda: now[0], duration_s=10.0)
    now[0] = 8.5
    assert schedule.pause_s(5.0) == 1.5  # no pause past the end of the run
    assert schedule.next_request() is not None
    now[0] = 10.0
    assert schedule.pause_s(5.0) == 0.0 and schedule.next_request() is None


async def test_a_tenant_whose_key_is_refused_stops_the_run_before_any_load() -> None:
    router = Router()

    def refuse_light(request: httpx.Request) -> httpx.Response:
        if request.headers["authorization"] == "Bearer key-light":
            return httpx.Response(401, json={"error": {"message": "unknown key"}})
        return router(request)

    with pytest.raises(BenchError, match=r"\(401\): unknown key; check the key of tenant 'light'"):
        await run_bench(settings(), transport=httpx.MockTransport(refuse_light))
    assert not router.chats


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, "bench", "--router", "http://127.0.0.1:9", *argv)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--concurrency", "4"], "--concurrency cannot be given with --tenants"),
        (["--api-key", "sk-on-the-command-line"], "--api-key cannot be given with --tenants"),
    ],
)
def test_per_caller_flags_are_refused_with_tenants(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], message: str
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("tenants: [{name: a, apiKey: sk-in-the-file, concurrency: 1}]")
    code, out, err = cli(capsys, "--tenants", str(path), *flags)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "sk-" not in err


def test_a_bad_tenants_file_is_one_line_before_any_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TIERGATE_TEST_UNSET_KEY", raising=False)
    path = tmp_path / "t.yaml"
    path.write_text("tenants: [{name: a, apiKeyEnv: TIERGATE_TEST_UNSET_KEY, concurrency: 1}]")
    code, out, err = cli(capsys, "--tenants", str(path))  # port 9 is never contacted
    assert code == 2 and out == ""
    assert err == (
        f"tiergate bench: error: --tenants {path}: tenants[0].apiKeyEnv: "
        "environment variable TIERGATE_TEST_UNSET_KEY is not set\n"
    )
