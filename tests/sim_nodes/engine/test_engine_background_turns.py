"""Background turnover: a lone request on a busy node sees the perf model's busy-tier speed."""

import pytest

from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.engine.engine import Background, Engine
from tiergate.sim_nodes.engine.errors import EngineCapacityError
from tiergate.sim_nodes.engine.request import EngineRequest
from tiergate.sim_nodes.perf import Batching, Deployment, Workload, evaluate


def frontier_on_b200() -> Deployment:
    catalog = default_catalog()
    return Deployment(catalog.model("frontier"), catalog.accelerator("b200"), 8, 8, "fp8", "fp8")


def lone_request_tpot(background: Background) -> float:
    engine = Engine(frontier_on_b200(), Batching(max_num_seqs=60), background=background)
    engine.add(EngineRequest("r", prompt_tokens=100, max_output_tokens=1000))
    now, first, last = 0.0, None, 0.0
    while (outcome := engine.step(now)) is not None:
        now = outcome.end_s
        if outcome.emitted:
            first = now if first is None else first
            last = now
    assert first is not None
    return (last - first) / 999


def test_turnover_reproduces_the_steady_state_tpot() -> None:
    busy = Background(59, 30_000, turn_input_tokens=3_000, turn_output_tokens=1_000)
    predicted = evaluate(frontier_on_b200(), Workload(30_000, 1_000, 27_000, 60)).tpot_s
    assert lone_request_tpot(busy) == pytest.approx(predicted, rel=0.1)


def test_turnover_slows_decoding_against_resident_load_alone() -> None:
    resident = Background(59, 30_000)
    churning = Background(59, 30_000, turn_input_tokens=3_000, turn_output_tokens=1_000)
    assert lone_request_tpot(churning) > 1.2 * lone_request_tpot(resident)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"turn_input_tokens": 10}, "need turn_output_tokens"),
        ({"turn_input_tokens": 50_000, "turn_output_tokens": 10}, "cannot exceed"),
        ({"turn_input_tokens": -1}, "must not be negative"),
    ],
)
def test_bad_turnover_is_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(EngineCapacityError, match=message):
        Background(4, 30_000, **kwargs)
