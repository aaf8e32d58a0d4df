"""random-sample: a bounded, seeded sample that keeps favoured endpoints and passes over
ejected ones; small pools pass through untouched."""

import random
from collections import Counter

import pytest
from policy_helpers import MODEL, endpoint, endpoints, request
from pydantic import ValidationError

from tiergate.router.endpoints.state import CandidateSet
from tiergate.router.policy import PluginContext, PolicyConfig
from tiergate.router.policy.random_sample import RandomSample, RandomSampleParameters


def sampler(size: int = 8, seed: int = 0) -> RandomSample:
    return RandomSample(
        "s", RandomSampleParameters(size=size), PluginContext(rng=random.Random(seed))
    )


def pool(n: int, **fields: object) -> CandidateSet:
    return CandidateSet(endpoints(n, **fields), MODEL, "batched")


def urls(sample: object) -> list[str]:
    assert isinstance(sample, (list, tuple))
    return [ep.url for ep in sample]


def test_sample_is_bounded_distinct_and_drawn_from_the_candidates() -> None:
    candidates = pool(300)
    sample = sampler(size=8).sample(request(), candidates, (), 0.0)
    assert len(sample) == 8 and len(set(urls(sample))) == 8
    assert all(ep in candidates for ep in sample)


def test_small_pools_pass_through_untouched() -> None:
    s = sampler(size=8)
    for n in (0, 1, 8):
        candidates = pool(n)
        assert s.sample(request(), candidates, (), 0.0) is candidates
    # Favoured endpoints come on top of the size: 10 candidates, 2 favoured, size 8.
    ten = pool(10)
    assert s.sample(request(), ten, ("http://e3", "http://e7"), 0.0) is ten


def test_favoured_endpoints_are_always_in_the_sample() -> None:
    candidates = pool(300)
    favoured = ("http://e17", "http://e250", "http://elsewhere")  # the last: not a candidate
    for seed in range(20):
        sample = sampler(size=8, seed=seed).sample(request(), candidates, favoured, 0.0)
        assert urls(sample)[:2] == ["http://e17", "http://e250"]
        assert len(sample) == 10 and len(set(urls(sample))) == 10
    # Any sequence, not only the view's indexed sets (looked up by a scan there).
    sample = sampler(size=8).sample(request(), list(candidates), favoured, 0.0)
    assert urls(sample)[:2] == ["http://e17", "http://e250"] and len(sample) == 10


def test_same_seed_same_sample() -> None:
    candidates = pool(300)

    def run(seed: int) -> list[list[str]]:
        s = sampler(size=8, seed=seed)
        return [urls(s.sample(request(), candidates, (), 0.0)) for _ in range(20)]

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_every_endpoint_is_equally_likely() -> None:
    candidates = pool(300)
    s = sampler(size=8, seed=1)
    counts = Counter(url for _ in range(3000) for url in urls(s.filter(request(), candidates, 0.0)))
    # 3000 samples x 8 / 300 endpoints = 80 each on average.
    assert len(counts) == 300
    assert 40 < min(counts.values()) and max(counts.values()) < 130


def test_ejected_endpoints_are_passed_over_while_others_turn_up() -> None:
    candidates = pool(300)
    for ep in candidates[:150]:  # half the pool ejected
        ep.ejected_until_s = 100.0
    for seed in range(10):
        sample = sampler(size=8, seed=seed).sample(request(), candidates, (), 50.0)
        assert len(sample) == 8 and not any(ep.is_ejected(50.0) for ep in sample)
    # Once the ejections have run out, those endpoints are drawn again.
    s = sampler(size=8)
    drawn = {url for _ in range(50) for url in urls(s.filter(request(), candidates, 100.0))}
    assert any(int(url.removeprefix("http://e")) < 150 for url in drawn)


def test_with_most_ejected_the_sample_still_holds_healthy_ones() -> None:
    # 80% ejected: 4 draws per slot find some healthy endpoints (the ejected-filter after the
    # sample keeps only those); ejected ones fill the rest of the sample.
    candidates = pool(300)
    for ep in candidates[:240]:
        ep.ejected_until_s = 100.0
    for seed in range(10):
        sample = sampler(size=8, seed=seed).sample(request(), candidates, (), 50.0)
        healthy = [ep for ep in sample if not ep.is_ejected(50.0)]
        assert len(sample) == 8 and healthy
        assert sample[: len(healthy)] == healthy  # the healthy ones first


def test_all_ejected_still_fills_the_sample() -> None:
    # So the ejected-filter after it sees only ejected endpoints and keeps them (panic mode).
    candidates = pool(300, ejected_until_s=100.0)
    sample = sampler(size=8).sample(request(), candidates, (), 50.0)
    assert len(sample) == 8 and len(set(urls(sample))) == 8


def test_size_is_validated() -> None:
    with pytest.raises(ValidationError, match="size"):
        PolicyConfig.model_validate(
            {"filters": [{"type": "random-sample", "parameters": {"size": 0}}]}
        )
    config = PolicyConfig.model_validate(
        {"filters": [{"name": "k", "type": "random-sample", "parameters": {"size": 12}}]}
    )
    assert config.filters[0].parameters == {"size": 12}


def test_favoured_lookup_in_an_indexed_set_is_by_url() -> None:
    # A CandidateSet finds favoured endpoints through its URL index: an endpoint object that
    # is not the set's own member for that URL is never returned.
    members = endpoints(20)
    candidates = CandidateSet(members, MODEL, "batched")
    sample = sampler(size=4).sample(request(), candidates, (endpoint("http://e5").url,), 0.0)
    assert sample[0] is members[5]
