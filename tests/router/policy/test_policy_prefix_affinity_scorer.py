"""prefix-affinity-scorer and the prefix_hashes helper."""

import pytest
from policy_helpers import endpoint, request

from tiergate.router.policy import PluginContext, prefix_hashes
from tiergate.router.policy.prefix_affinity_scorer import (
    PrefixAffinityParameters,
    PrefixAffinityScorer,
)


def scorer(**parameters: int) -> PrefixAffinityScorer:
    return PrefixAffinityScorer("p", PrefixAffinityParameters(**parameters), PluginContext())


# -- prefix_hashes ---------------------------------------------------------------------------


def test_hashes_are_stable_across_processes() -> None:
    # Golden values: blake2b, not Python's per-process salted hash().
    assert prefix_hashes("ab" * 256) == (5380698097066116354, 232762876361336747)


def test_hashes_are_cumulative_over_full_blocks() -> None:
    a = prefix_hashes("x" * 8 + "y" * 4 + "z", block_chars=4)
    b = prefix_hashes("x" * 8 + "w" * 4, block_chars=4)
    assert len(a) == 3  # the trailing partial block "z" is not hashed
    assert a[:2] == b[:2] and a[2] != b[2]
    # Same block text at another position: different cumulative hash.
    assert len(set(prefix_hashes("x" * 12, block_chars=4))) == 3


def test_hashes_limits_and_odd_text() -> None:
    assert prefix_hashes("short") == ()
    assert len(prefix_hashes("x" * 10_000, block_chars=10, max_blocks=8)) == 8
    assert prefix_hashes("x" * 100, max_blocks=0) == ()
    # A lone surrogate (legal in JSON strings) must not crash the request path.
    assert len(prefix_hashes("\ud800" * 8, block_chars=4)) == 2
    with pytest.raises(ValueError):
        prefix_hashes("x", block_chars=0)


# -- the scorer ------------------------------------------------------------------------------


def test_scores_the_fraction_of_leading_blocks_served() -> None:
    s = scorer()
    a, b, c = endpoint("http://a"), endpoint("http://b"), endpoint("http://c")
    s.observe(request(prefix_hashes=(1, 2, 3, 4)), a)
    s.observe(request(prefix_hashes=(1, 2, 9)), b)
    assert s.score(request(prefix_hashes=(1, 2, 3, 5)), [a, b, c], 0.0) == [0.75, 0.5, 0.0]


def test_only_a_leading_run_counts() -> None:
    s = scorer()
    a = endpoint("http://a")
    s.observe(request(prefix_hashes=(2, 3)), a)  # blocks 1.. of another prompt, not block 0
    assert s.score(request(prefix_hashes=(1, 2, 3)), [a], 0.0) == [0.0]


def test_no_hashes_or_no_history_scores_zero() -> None:
    s = scorer()
    a = endpoint("http://a")
    assert s.score(request(prefix_hashes=(1,)), [a], 0.0) == [0.0]
    s.observe(request(prefix_hashes=(1,)), a)
    assert s.score(request(), [a], 0.0) == [0.0]


def test_table_is_lru_bounded() -> None:
    s = scorer(capacity=4)
    a = endpoint("http://a")
    s.observe(request(prefix_hashes=(1, 2)), a)
    s.observe(request(prefix_hashes=(3, 4)), a)
    s.observe(request(prefix_hashes=(1, 2)), a)  # refreshes 1 and 2
    s.observe(request(prefix_hashes=(5, 6)), a)  # evicts 3 and 4, the least recent
    assert len(s) == 4
    assert s.score(request(prefix_hashes=(1, 2)), [a], 0.0) == [1.0]
    assert s.score(request(prefix_hashes=(3, 4)), [a], 0.0) == [0.0]


def test_endpoints_per_block_keeps_the_most_recent() -> None:
    s = scorer(endpoints_per_block=2)
    a, b, c = endpoint("http://a"), endpoint("http://b"), endpoint("http://c")
    for ep in (a, b, c):
        s.observe(request(prefix_hashes=(1,)), ep)
    assert s.score(request(prefix_hashes=(1,)), [a, b, c], 0.0) == [0.0, 1.0, 1.0]


def test_favoured_urls_are_the_endpoints_that_score_above_zero() -> None:
    s = scorer(endpoints_per_block=2)
    a, b, c = endpoint("http://a"), endpoint("http://b"), endpoint("http://c")
    assert list(s.favoured_urls(request(prefix_hashes=(1, 2)))) == []
    s.observe(request(prefix_hashes=(1, 2)), a)
    s.observe(request(prefix_hashes=(1, 9)), b)
    s.observe(request(prefix_hashes=(7,)), c)
    ctx = request(prefix_hashes=(1, 2))
    assert set(s.favoured_urls(ctx)) == {"http://a", "http://b"}
    scores = dict(zip("abc", s.score(ctx, [a, b, c], 0.0), strict=True))
    assert {k for k, v in scores.items() if v > 0} == {"a", "b"}
    # Bounded by endpoints_per_block, however many endpoints served the prompt before.
    for i in range(50):
        s.observe(request(prefix_hashes=(1, 2)), endpoint(f"http://x{i}"))
    assert len(s.favoured_urls(ctx)) == 2
    assert list(s.favoured_urls(request())) == []
