"""ScrapeSchedule: scrapes spread over the period, driven tick by tick with a fake time."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import pytest
from policy_helpers import endpoint

from tiergate.router.discovery.scrape_schedule import ScrapeSchedule, ScrapeTick
from tiergate.router.endpoints.state import EndpointState

INTERVAL_S = 0.5
MAX_SCRAPES_PER_S = 50.0


def period_s(n: int) -> float:
    """As the Scraper stretches it: 300 endpoints -> 6 s."""
    return max(INTERVAL_S, n / MAX_SCRAPES_PER_S)


def fleet(n: int, prefix: str = "e") -> list[EndpointState]:
    return [endpoint(f"http://{prefix}{i}:9000") for i in range(n)]


def schedule() -> ScrapeSchedule:
    return ScrapeSchedule(period_s, min_tick_s=0.01, max_tick_s=INTERVAL_S)


Scrapes = dict[str, list[float]]


def drive(
    sched: ScrapeSchedule,
    endpoints: Callable[[float], Sequence[EndpointState]],
    until_s: float,
    *,
    late_s: Callable[[int], float] = lambda i: 0.0,
) -> tuple[Scrapes, list[tuple[float, ScrapeTick]]]:
    """Tick as the scraper would (sleeping `wait_s`, plus `late_s(i)` of event-loop lag)."""
    now_s, i = 0.0, 0
    scraped: Scrapes = defaultdict(list)
    ticks: list[tuple[float, ScrapeTick]] = []
    while now_s < until_s:
        tick = sched.tick(now_s, endpoints(now_s))
        ticks.append((now_s, tick))
        for ep in tick.endpoints:
            scraped[ep.url].append(now_s)
        now_s += tick.wait_s + late_s(i)
        i += 1
    return scraped, ticks


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_300_endpoints_are_scraped_one_per_tick_each_once_per_period() -> None:
    eps = fleet(300)
    scraped, ticks = drive(schedule(), lambda now_s: eps, until_s=30.0)
    # A steady trickle: 50 scrapes/s, one per tick, never a burst.
    assert max(len(t.endpoints) for _, t in ticks) == 1
    assert all(t.wait_s == pytest.approx(6.0 / 300) for _, t in ticks)
    assert set(scraped) == {ep.url for ep in eps}
    for times in scraped.values():
        assert len(times) in (5, 6)  # 30 s at one scrape per 6 s
        assert all(g == pytest.approx(6.0) for g in gaps(times))
    # Any 1 s window holds ~1/6 of the fleet, not all of it or none.
    for start_s in range(29):
        in_window = sum(start_s <= t < start_s + 1 for times in scraped.values() for t in times)
        assert 49 <= in_window <= 51


def test_a_late_event_loop_catches_up_in_bounded_ticks() -> None:
    eps = fleet(300)
    # Every 7th wake-up comes 45 ms late (the event loop was busy with requests).
    scraped, ticks = drive(
        schedule(), lambda now_s: eps, until_s=30.0, late_s=lambda i: 0.045 if i % 7 == 0 else 0
    )
    # 45 ms late at 50 scrapes/s owes ~2.25 more scrapes: at most 4 in a tick.
    assert max(len(t.endpoints) for _, t in ticks) <= math.ceil(1 + 0.045 * 50)
    for times in scraped.values():
        # The staleness bound holds, give or take the lag and one slot.
        assert max(gaps(times)) <= 6.0 + 0.045 + 1 / 50 + 1e-9


def test_few_endpoints_are_spread_over_the_interval() -> None:
    eps = fleet(3)
    scraped, ticks = drive(schedule(), lambda now_s: eps, until_s=5.0)
    assert max(len(t.endpoints) for _, t in ticks) == 1
    assert [t for t, _ in ticks[:4]] == pytest.approx([0.0, 1 / 6, 2 / 6, 3 / 6])
    for times in scraped.values():
        assert all(g == pytest.approx(INTERVAL_S) for g in gaps(times))


def test_new_endpoints_are_scraped_within_an_interval_and_removed_ones_dropped() -> None:
    old, new = fleet(300), fleet(30, prefix="new")
    removed = old[:10]

    def current(now_s: float) -> list[EndpointState]:
        if now_s < 7.3:
            return old
        return old[10:] + new

    scraped, ticks = drive(schedule(), current, until_s=30.0)
    # The new ones go first, one per tick from the next tick on: all 30 within 0.6 s.
    firsts = sorted(scraped[ep.url][0] for ep in new)
    assert 7.3 <= firsts[0] <= 7.3 + 0.02 + 1e-9
    assert firsts[-1] <= firsts[0] + 30 / 50
    for ep in removed:
        assert all(t < 7.3 for t in scraped[ep.url])
    assert max(len(t.endpoints) for _, t in ticks) == 1
    # The others keep about a period between scrapes (320 endpoints: 6.4 s), across the change
    # too: the 30 new ones went ahead of them once.
    for ep in old[10:]:
        assert max(gaps(scraped[ep.url])) <= 6.4 + 30 / 50 + 1e-9


def test_no_endpoints_then_some_appear() -> None:
    eps: list[EndpointState] = []
    sched = schedule()
    first = sched.tick(0.0, eps)
    assert first == ScrapeTick((), pass_done=False, wait_s=INTERVAL_S)
    eps.extend(fleet(2))
    second = sched.tick(0.5, eps)
    assert [ep.url for ep in second.endpoints] == ["http://e0:9000"]


def test_a_pass_completes_once_per_period() -> None:
    eps = fleet(300)
    _, ticks = drive(schedule(), lambda now_s: eps, until_s=30.0)
    done_at = [now_s for now_s, t in ticks if t.pass_done]
    assert len(done_at) == 5
    assert all(g == pytest.approx(6.0) for g in gaps(done_at))


def test_tick_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        ScrapeSchedule(period_s, min_tick_s=0.0, max_tick_s=1.0)
    with pytest.raises(ValueError):
        ScrapeSchedule(period_s, min_tick_s=2.0, max_tick_s=1.0)


def test_a_catch_up_stops_at_the_end_of_a_pass() -> None:
    eps = fleet(3)
    sched = schedule()
    assert [ep.url for ep in sched.tick(0.0, eps).endpoints] == ["http://e0:9000"]
    # The loop stalled for 2 s: a whole pass is owed, but e1 and e2 end this one.
    late = sched.tick(2.0, eps)
    assert [ep.url for ep in late.endpoints] == ["http://e1:9000", "http://e2:9000"]
    assert late.pass_done and late.wait_s == pytest.approx(0.01)
    # The rest of the catch-up starts the next pass, at the next tick.
    after = sched.tick(2.01, eps)
    assert [ep.url for ep in after.endpoints] == ["http://e0:9000"]
    assert not after.pass_done
