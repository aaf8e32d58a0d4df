"""The fleet's allotment of a tier's slots (router/fleet_allotment.py): weighted max-min fair
over the tenants' demand across processes, whole slots adding up to the tier's, spare slots
for the live processes, and what it refuses."""

from __future__ import annotations

import itertools
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
    # 7 slots by 1:1:2 is 1.75, 1.75, 3.5: 5 whole ones, and 2 for the fractions (nobody
    # holds a slot yet, so none waits for another's request to end).
    def of(served: dict[str, float]) -> dict[str, int]:
        claims = [
            claim("p1", "a", 1, 0, 11, served["a"]),
            claim("p2", "b", 1, 0, 11, served["b"]),
            claim("p3", "c", 2, 0, 11, served["c"]),
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
    assert found["p1"].tenants["a"] == 1  # 4 x 3/12
    assert found["p2"].tenants == {"a": 3, "b": 4}


def turns(clients: dict[str, int], exchanges: int) -> dict[str, int]:
    """How many requests of tenant x each process runs on x's one slot over `exchanges`
    exchanges, with `clients` of x asking in each, as their queues run them: at an exchange a
    process starts what its part allows; before the next, the requests it holds end (100
    tokens each), and a process still allotted the slot hands it straight to its next client.
    Checks at every exchange that the slot is never handed out twice."""
    holding = dict.fromkeys(clients, 0)
    served = dict.fromkeys(clients, 0.0)
    ran = dict.fromkeys(clients, 0)
    for _ in range(exchanges):
        claims = [
            claim(h, "x", 1, holding[h], n - holding[h], served[h]) for h, n in clients.items()
        ]
        part = {h: s.tenants.get("x", 0) for h, s in allot(1, claims).items()}
        assert sum(max(holding[h], part[h]) for h in clients) <= 1, (holding, part)
        for h in clients:
            served[h] += 100 * holding[h]
            ran[h] += part[h]
        holding = part
    return ran


def test_with_equal_demand_the_processes_take_turns_at_a_tenants_slot() -> None:
    # A slot a fraction leaves, which the process holding it would otherwise hand to its
    # next client at every turn.
    ran = turns({"p1": 2, "p2": 2, "p3": 2}, 30)
    assert min(ran.values()) >= 6 and max(ran.values()) - min(ran.values()) <= 2, ran


def test_over_time_a_tenants_slot_goes_to_its_processes_by_their_demand() -> None:
    ran = turns({"p1": 1, "p2": 3}, 400)
    assert ran["p1"] / (ran["p1"] + ran["p2"]) == pytest.approx(0.25, abs=0.03)


def test_a_slot_whose_turn_moved_waits_for_the_request_holding_it() -> None:
    # p1 served x, and its part is over, but its request holds the slot still: p2, next, waits
    # for it, and it is no one's spare either.
    first = [claim("p1", "x", 1, 1, 1, 100.0), claim("p2", "x", 1, 0, 2), claim("p3", "x", 1, 0, 2)]
    assert {h: s.total for h, s in allot(1, first).items()} == {"p1": 0, "p2": 0, "p3": 0}
    # p1's request ended: the slot is p2's.
    ended = [claim("p1", "x", 1, 0, 2, 100.0), *first[1:]]
    assert {h: s.total for h, s in allot(1, ended).items()} == {"p1": 0, "p2": 1, "p3": 0}


def test_a_slot_whose_turn_moved_to_another_tenant_waits_for_the_request_holding_it() -> None:
    # 7 slots by 1:1:2 with b served most lately per weight: the fractions' slots go to a and
    # c. b still holds 2 from its last turn, so c's fourth waits for one of b's to end.
    held = [claim("p1", "a", 1, 2, 9, 100.0), claim("p2", "b", 1, 2, 9, 300.0),
            claim("p3", "c", 2, 3, 9, 300.0)]  # fmt: skip
    found = allot(7, held)
    assert totals(found) == {"a": 2, "b": 1, "c": 3}
    # b's process may count the slot it holds over its part apart from its headroom.
    assert found["p2"].held_over == {"b": 1} and not found["p3"].held_over
    ended = [held[0], claim("p2", "b", 1, 1, 10, 300.0), held[2]]
    found = allot(7, ended)
    assert totals(found) == {"a": 2, "b": 1, "c": 4} and not found["p2"].held_over


def test_a_tenant_asking_less_than_its_share_is_not_made_to_wait_for_a_moved_slot() -> None:
    # a, b and c hold all 8 slots; light asks for one, less than its share, and gets it at
    # once although c still holds the slot it gives up: light's request waits at the engine
    # for the next slot to free, as it would in one process, not for the next exchange.
    held = [claim("p1", "a", 1, 2, 9, 100.0), claim("p1", "light", 1, 0, 1, 10.0),
            claim("p2", "b", 1, 2, 9, 100.0), claim("p3", "c", 2, 4, 9, 200.0)]  # fmt: skip
    found = allot(8, held)
    assert totals(found)["light"] == 1 and sum(totals(found).values()) == 8
    # Nothing holds the slot c keeps over its part back: c's process counts it as ever.
    assert not any(slots.held_over for slots in found.values())


def test_the_fleet_never_fills_more_than_the_tier_as_turns_move_between_tenants() -> None:
    # a, b and c (weights 1:1:2) flood 7 slots through a process each; at every exchange each
    # starts what its part allows, and its requests end before the next (so a tenant whose
    # turn moved away still holds its slot at the exchange that moves it).
    weights, holder = {"a": 1, "b": 1, "c": 2}, {"a": "p1", "b": "p2", "c": "p3"}
    holding, served, ran = dict.fromkeys(weights, 0), dict.fromkeys(weights, 0.0), {}
    for _ in range(400):
        found = allot(7, [claim(holder[t], t, w, holding[t], 12 - holding[t], served[t])
                          for t, w in weights.items()])  # fmt: skip
        part = {t: found[holder[t]].tenants.get(t, 0) for t in weights}
        assert sum(max(holding[t], part[t]) for t in weights) <= 7, (holding, part)
        for t in weights:
            served[t] = served[t] * 0.97 + 100 * part[t]
            ran[t] = ran.get(t, 0) + part[t]
        holding = part
    total = sum(ran.values())
    assert {t: n / total for t, n in ran.items()} == pytest.approx(
        {"a": 0.25, "b": 0.25, "c": 0.5}, abs=0.01
    )


def test_every_order_of_the_same_claims_gives_the_same_allotment() -> None:
    # a and b tie on service (0.1 + 0.2 + 0.3 against 0.6) and fraction (1.5 slots each):
    # the extra slot goes by name, whichever order the claims come in.
    claims = [
        claim("p1", "a", 1, 0, 2, 0.1),
        claim("p2", "a", 1, 0, 2, 0.2),
        claim("p3", "a", 1, 0, 2, 0.3),
        claim("p4", "b", 1, 0, 6, 0.6),
    ]
    found = {
        tuple(sorted(totals(allot(3, order)).items())) for order in itertools.permutations(claims)
    }
    assert found == {(("a", 2), ("b", 1))}


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
