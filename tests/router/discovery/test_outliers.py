"""Outlier detection: consecutive failures, exponential ejections, the last-endpoint guard."""

import pytest
from policy_helpers import endpoint, endpoints

from tiergate.router.discovery.outliers import OutlierDetector
from tiergate.router.endpoints.state import EndpointState


def fail(detector: OutlierDetector, ep: EndpointState, times: int, now_s: float) -> list[bool]:
    return [detector.record_failure(ep, now_s) for _ in range(times)]


def test_ejects_after_n_consecutive_failures() -> None:
    detector = OutlierDetector(consecutive_failures=3, base_ejection_s=10, max_ejection_s=120)
    ep = endpoint()
    assert fail(detector, ep, 3, now_s=0.0) == [False, False, True]
    assert ep.is_ejected(9.9) and not ep.is_ejected(10.0)
    assert ep.consecutive_failures == 0  # a new streak is needed next time


def test_a_success_resets_the_streak() -> None:
    detector = OutlierDetector(consecutive_failures=3)
    ep = endpoint()
    fail(detector, ep, 2, now_s=0.0)
    detector.record_success(ep)
    assert fail(detector, ep, 2, now_s=0.0) == [False, False]
    assert not ep.is_ejected(0.0)


def test_repeated_ejections_double_up_to_the_cap() -> None:
    detector = OutlierDetector(consecutive_failures=1, base_ejection_s=10, max_ejection_s=60)
    ep = endpoint()
    now, lengths = 0.0, []
    for _ in range(5):
        assert detector.record_failure(ep, now)
        lengths.append(ep.ejected_until_s - now)
        now = ep.ejected_until_s + 1.0  # fails again soon after coming back
    assert lengths == [10, 20, 40, 60, 60]


def test_failures_while_ejected_do_not_extend_the_ejection() -> None:
    detector = OutlierDetector(consecutive_failures=1, base_ejection_s=10)
    ep = endpoint()
    detector.record_failure(ep, 0.0)
    assert not detector.record_failure(ep, 5.0)  # panic-mode traffic may still reach it
    assert ep.ejected_until_s == 10.0


def test_failures_while_ejected_do_not_count_toward_the_next_ejection() -> None:
    """A pod dies with 40 streams open: they all fail at once. The fifth ejects it; the other
    35 were sent before, and the first request after the ejection must start a new streak."""
    detector = OutlierDetector(pool_members=lambda pool: peers)
    peers = endpoints(3)
    ep = peers[0]
    assert fail(detector, ep, 40, now_s=100.0).index(True) == 4
    assert ep.ejected_until_s == 110.0 and ep.consecutive_failures == 0
    assert not detector.record_failure(ep, 111.0) and not ep.is_ejected(111.0)


def test_a_long_healthy_spell_forgets_past_ejections() -> None:
    detector = OutlierDetector(consecutive_failures=1, base_ejection_s=10, max_ejection_s=60)
    ep = endpoint()
    detector.record_failure(ep, 0.0)
    detector.record_failure(ep, 11.0)  # 20 s, recent
    assert ep.ejected_until_s == 31.0
    detector.record_failure(ep, 31.0 + 60.0)  # healthy for max_ejection_s: back to base
    assert ep.ejected_until_s == 91.0 + 10.0


def test_never_ejects_the_last_endpoint_in_rotation_of_a_pool() -> None:
    a, b = endpoints(2)
    other_pool = endpoint("http://x", pool="p1")
    members = {"p0": [a, b], "p1": [other_pool]}
    detector = OutlierDetector(consecutive_failures=1, pool_members=members.__getitem__)
    assert detector.record_failure(a, 0.0)
    assert not detector.record_failure(b, 0.0)  # a is out: b is the last one
    assert not b.is_ejected(0.0)
    assert not detector.record_failure(other_pool, 0.0)  # alone in its pool
    # Once a is back, b may go.
    assert detector.record_failure(b, 10.0)


def test_without_pool_members_nothing_is_protected() -> None:
    detector = OutlierDetector(consecutive_failures=1)
    assert detector.record_failure(endpoint(), 0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"consecutive_failures": 0},
        {"base_ejection_s": 0},
        {"base_ejection_s": 10, "max_ejection_s": 5},
    ],
)
def test_rejects_nonsense_settings(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        OutlierDetector(**kwargs)  # type: ignore[arg-type]


def test_ejection_length_stays_finite_after_many_ejections() -> None:
    assert OutlierDetector().ejection_s(10_000) == 120.0
