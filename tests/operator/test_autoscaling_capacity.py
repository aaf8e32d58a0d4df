"""One replica's capacity beside its background: the engine reserves batch slots and KV cache
for the background sequences and decodes them every step, so the autoscaler must not count
them as room for requests (examples/premium.yaml: batch cap 4, 2 background sequences)."""

from __future__ import annotations

from typing import Any

from operator_helpers import pool, tpot_ms

from tiergate.operator.autoscaling import RequestShape, replica_capacity
from tiergate.pools import InferencePoolSpec
from tiergate.sim_nodes.catalogs import default_catalog


def premium(**changes: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate(pool("premium", **changes)["spec"])


def test_the_background_takes_its_batch_slots_off_the_capacity() -> None:
    with_background = replica_capacity(premium(), default_catalog())
    without = replica_capacity(premium(background=None), default_catalog())
    assert without.concurrency == 4  # maxNumSeqs
    assert with_background.concurrency == 2  # 4 slots, 2 held by the background


def test_the_background_slows_every_step_so_the_slo_holds_fewer_requests() -> None:
    # A TPOT target met at 3 streams, not at 4: alone, 3 requests; beside the background's 2
    # sequences (2 of the streams), 1.
    assert tpot_ms(3) < tpot_ms(4)
    slo = {"tpotMs": (tpot_ms(3) + tpot_ms(4)) / 2}
    assert replica_capacity(premium(slo=slo, background=None), default_catalog()).concurrency == 3
    assert replica_capacity(premium(slo=slo), default_catalog()).concurrency == 1


def test_an_slo_only_met_without_the_background_is_unreachable() -> None:
    slo = {"tpotMs": (tpot_ms(2) + tpot_ms(3)) / 2}  # met at 2 streams, not at 3
    assert replica_capacity(premium(slo=slo, background=None), default_catalog()).concurrency == 2
    capacity = replica_capacity(premium(slo=slo), default_catalog())
    assert capacity.concurrency is None and capacity.problem is not None
    reason, message = capacity.problem
    assert reason == "SloUnreachable"
    # Batch 1 beside the background is 3 streams.
    assert "even at batch 1 beside the background" in message
    assert f"TPOT {tpot_ms(3):.2f} ms" in message


def test_a_background_that_leaves_no_slot_is_reported() -> None:
    background = {"sequences": 4, "contextTokens": 30000}
    capacity = replica_capacity(premium(background=background), default_catalog())
    assert capacity.concurrency is None and capacity.problem is not None
    reason, message = capacity.problem
    assert reason == "ModelDoesNotFit"
    assert "background (4 sequences of 30000 tokens) leaves no batch slot" in message


def test_the_background_takes_its_kv_cache_off_the_capacity() -> None:
    # The same replica as a batched pool with a cap its KV cache never reaches: the cache
    # bounds the requests, less what the background holds.
    big = {"tier": "batched", "batching": {"maxNumSeqs": 1024}}
    alone = replica_capacity(premium(**big, background=None), default_catalog())
    background = {"sequences": 10, "contextTokens": 31000}
    beside = replica_capacity(premium(**big, background=background), default_catalog())
    assert alone.concurrency is not None and beside.concurrency is not None
    assert beside.concurrency == alone.concurrency - 10


def test_the_capacity_is_of_the_layout_the_pods_run_not_one_sized_for_the_observed_shape() -> None:
    # wafer-scale.yaml: chips auto, sized by its workload (30,000-token prompts) so that the
    # KV cache holds the background's 4 sequences of 30,000 tokens beside the requests. Short
    # observed requests must not shrink the wafers the capacity is computed on.
    spec = InferencePoolSpec.model_validate(pool("wafer-scale")["spec"])
    short = RequestShape(512, 200, "observed")
    assert replica_capacity(spec, default_catalog(), short).concurrency == 4  # 8 slots - 4
