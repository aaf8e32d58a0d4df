"""The fleet's allotment of a tier's slots (router/fleet_allotment.py): weighted max-min fair
over the tenants' demand across processes, whole slots adding up to the tier's, spare slots
for the live processes, and what it refuses."""

from __future__ import annotations

import math

import pytest

from tiergate.router.fleet_allotment import Claim, HolderSlots, allot, water_fill


def claim(holder: str, tenant: str, weight: float = 1.0, holding: int = 0, waiting: int = 0,
          served: float = 0.0) -> Claim:  # fmt: skip
    return Claim(holder, tenant, weight, holding, waiting, served)


def totals(allotment: dict[str, HolderSlots]) -> dict[str, int]:
    """Tenant -> its slots over every process."""
    out: dict[str, int] = {}
    for slots in allotment.values():
        for tenant, n in slots.tenants.items():
            out[tenant] = out.get(tenant, 0) + n
    return out


def test_water_fill_gives_each_its_weights_share_and_no_one_more_than_it_asks() -> None:
    shares = water_fill(8, {"a": 20, "b": 20, "c": 20}, {"a": 1, "b": 1, "c": 2})
    assert shares == pytest.approx({"a": 2, "b": 2, "c": 4})
    # A tenant asking for one slot gets it; the others split the rest by weight.
    shares = water_fill(8, {"a": 20, "light": 1, "c": 20}, {"a": 1, "light": 1, "c": 2})
    assert shares == pytest.approx({"a": 7 / 3, "light": 1, "c": 14 / 3})
    # Less demand than slots: everyone gets what it asks.
    assert water_fill(8, {"a": 2, "b": 3}, {"a": 1, "b": 5}) == {"a": 2, "b": 3}


def test_a_tenant_without_demand_gets_nothing_and_takes_nothing() -> None:
    assert water_fill(8, {"a": 0, "b": 20}, {"a": 1, "b": 1}) == {"b": 8}
    found = allot(8, [claim("p", "idle", served=500.0), claim("q", "b", waiting=20)])
    assert found["p"] == HolderSlots({}, 0) and found["q"] == HolderSlots({"b": 8}, 0)


def test_three_processes_with_a_tenant_each_get_slots_by_weight() -> None:
    found = allot(
        8,
        [claim("p1", "a", 1, 8, 10), claim("p2", "b", 1, 8, 10), claim("p3", "c", 2, 8, 10)],
    )
    assert {h: s.tenants for h, s in found.items()} == {
        "p1": {"a": 2}, "p2": {"b": 2}, "p3": {"c": 4},
    }  # fmt: skip
    assert sum(s.total for s in found.values()) == 8


def test_the_slot_a_fraction_leaves_goes_to_the_tenant_served_least_per_weight() -> None:
    # 7 slots by 1:1:2 is 1.75, 1.75, 3.5: 5 whole ones, and 2 for the fractions.
    def of(served: dict[str, float]) -> dict[str, int]:
        claims = [
            claim("p1", "a", 1, 2, 9, served["a"]),
            claim("p2", "b", 1, 2, 9, served["b"]),
            claim("p3", "c", 2, 2, 9, served["c"]),
        ]
        return totals(allot(7, claims))

    assert of({"a": 100, "b": 100, "c": 400}) == {"a": 2, "b": 2, "c": 3}  # c's 200 per weight
    assert of({"a": 100, "b": 300, "c": 300}) == {"a": 2, "b": 1, "c": 4}
    # Followed period after period, the extra slots go round by the fractions: 3:3:2.
    served = {"a": 0.0, "b": 0.0, "c": 0.0}
    got = {"a": 0, "b": 0, "c": 0}
    for _ in range(400):
        for tenant, n in of(served).items():
            got[tenant] += n
            served[tenant] += n * 10
    assert got["a"] / 400 == pytest.approx(1.75, abs=0.01)
    assert got["b"] / 400 == pytest.approx(1.75, abs=0.01)
    assert got["c"] / 400 == pytest.approx(3.5, abs=0.01)


def test_a_tenant_in_two_processes_is_split_by_its_demand_there() -> None:
    found = allot(
        8, [claim("p1", "a", 1, 0, 3), claim("p2", "a", 1, 1, 8), claim("p2", "b", 1, 4, 4)]
    )
    assert totals(found) == {"a": 4, "b": 4}
    assert found["p1"].tenants["a"] + found["p2"].tenants["a"] == 4
    assert found["p1"].tenants["a"] == 1  # 4 x 3/11, rounded: p2 has the larger fraction
    assert found["p2"].tenants == {"a": 3, "b": 4}


def test_spare_slots_are_split_over_the_live_processes_and_add_up_to_the_tier() -> None:
    found = allot(8, [claim("p1", "a", 1, 1, 0)], holders=["p1", "p2", "p3"])
    assert found["p1"].tenants == {"a": 1}
    assert [found[h].spare for h in ("p1", "p2", "p3")] == [3, 2, 2]
    assert sum(s.total for s in found.values()) == 8


def test_a_process_that_vanished_leaves_its_slots_to_the_others() -> None:
    everyone = [claim("p1", "a", 1, 4, 9), claim("p2", "b", 1, 4, 9)]
    assert {h: s.total for h, s in allot(8, everyone).items()} == {"p1": 4, "p2": 4}
    # p2's claims expired: the same tier, the same tenants' weights, all for p1's.
    assert allot(8, everyone[:1]) == {"p1": HolderSlots({"a": 8}, 0)}


def test_no_slots_and_no_claims() -> None:
    assert allot(0, [claim("p1", "a", 1, 0, 5)]) == {"p1": HolderSlots({}, 0)}
    assert allot(8, []) == {}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (claim("p", "a", weight=0.0, waiting=1), "positive"),
        (claim("p", "a", weight=-1.0, waiting=1), "positive"),
        (claim("p", "a", weight=math.nan, waiting=1), "positive"),
        (claim("p", "a", weight=math.inf, waiting=1), "positive"),
        (claim("p", "a", waiting=-1), "negative"),
        (claim("p", "a", holding=-2), "negative"),
        (claim("p", "a", waiting=1, served=-5.0), "negative"),
    ],
)
def test_claims_that_make_no_sense_are_refused(bad: Claim, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        allot(8, [claim("q", "b", waiting=2), bad])


def test_a_tenant_claimed_twice_by_one_process_and_negative_slots_are_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        allot(8, [claim("p", "a", waiting=1), claim("p", "a", waiting=2)])
    with pytest.raises(ValueError, match="negative"):
        allot(-1, [claim("p", "a", waiting=1)])
