"""The routing policy in the router's configuration file (`router.policy`): validated when the
file is read, one line naming the plugin when it is wrong, and applied when the file is
reloaded, over real sockets."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling_helpers import until

from tiergate.router.build import build_app, file_source
from tiergate.router.config import ConfigError, parse_config
from tiergate.router.policy import default_policy
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

POOL = "pools: [{name: b, tier: batched, model: llama-3.1-8b, accelerator: h100-sxm}]\n"

#: Every request goes where the first one went: prefix affinity alone, the best score wins.
STICKY = (
    "{filters: [], scorers: [{type: prefix-affinity-scorer}], picker: {type: max-score-picker}}"
)
#: No scores: the weighted-random picker spreads requests uniformly.
SPREAD = "{filters: [], scorers: [], picker: {type: weighted-random-picker}}"


def test_a_file_without_a_policy_gets_the_default() -> None:
    assert parse_config(POOL).router.policy == default_policy()


def test_a_policy_is_read_with_its_plugins_parameters_and_weights() -> None:
    text = (
        "router:\n  policy:\n"
        "    filters: [{type: random-sample, parameters: {size: 3}}]\n"
        "    scorers:\n"
        "      - {name: load, type: queue-depth-scorer, weight: 3}\n"
        "      - {type: kv-cache-utilization-scorer, parameters: {unknownScore: 0.2}}\n"
        "    picker: {type: weighted-random-picker}\n" + POOL
    )
    policy = parse_config(text).router.policy
    assert [(f.type, f.parameters) for f in policy.filters] == [("random-sample", {"size": 3})]
    assert [(s.name, s.weight) for s in policy.scorers] == [
        ("load", 3.0),
        ("kv-cache-utilization-scorer", 1.0),
    ]
    assert policy.picker.type == "weighted-random-picker"
    assert policy.summary() == (
        "filters=random-sample scorers=load*3,kv-cache-utilization-scorer*1 "
        "picker=weighted-random-picker"
    )


def test_a_part_left_out_or_null_is_the_default_s() -> None:
    text = "router: {policy: {picker: {type: weighted-random-picker}}}\n" + POOL
    policy = parse_config(text).router.policy
    default = default_policy()
    assert (policy.filters, policy.scorers) == (default.filters, default.scorers)
    assert policy.picker.type == "weighted-random-picker"
    text = "router: {policy: {scorers: []}}\n" + POOL  # none, said so
    policy = parse_config(text).router.policy
    assert (policy.scorers, policy.picker) == ([], default.picker)
    # `policy:` or a part with all under it commented out
    assert parse_config("router: {policy: null}\n" + POOL).router.policy == default
    assert parse_config("router: {policy: {scorers: null}}\n" + POOL).router.policy == default


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("{scorers: [{type: queue-scorer}]}",
         r"router\.policy\.scorers: scorer 'queue-scorer': unknown type 'queue-scorer'; known "
         r"scorer types: kv-cache-utilization-scorer, predicted-latency-scorer, "),
        ("{filters: [{type: max-score-picker}]}",
         r"type 'max-score-picker' is a picker, not a filter"),
        ("{filters: [{type: random-sample, parameters: {size: 0}}]}",
         r"filter 'random-sample' \(type 'random-sample'\): bad parameters: size: .*equal to 1"),
        ("{filters: [{type: random-sample, parameters: {size: 1000000}}]}",
         r"size: Input should be less than or equal to 4096"),
        ("{scorers: [{type: prefix-affinity-scorer, parameters: {capacity: 100000000}}]}",
         r"capacity: Input should be less than or equal to 1048576"),
        ("{scorers: [{type: kv-cache-utilization-scorer, parameters: {unknownScore: .nan}}]}",
         r"unknownScore: Input should be a finite number"),
        ("{scorers: [{type: queue-depth-scorer, weight: .inf}]}",
         r"router\.policy\.scorers\.0\.weight: Input should be a finite number"),
        ("{scorers: [{type: queue-depth-scorer, weight: 0}]}", r"weight: .*greater than 0"),
        ("{scorers: [{type: queue-depth-scorer, weight: 1e300}]}",
         r"weight: .*less than or equal to 1000000"),
        ("{scorers: [{type: queue-depth-scorer}, {type: queue-depth-scorer}]}",
         r"router\.policy: plugin name 'queue-depth-scorer' is used twice"),
        ("{picker: {type: weighted-random-picker, parameters: {seed: 1}}}",
         r"picker 'weighted-random-picker' .*seed: Extra inputs are not permitted"),
        ("{filter: []}", r"router\.policy\.filter: Extra inputs are not permitted"),
        ("[max-score-picker]", r"router\.policy: Input should be a valid dictionary"),
    ],
)  # fmt: skip
def test_a_bad_policy_is_one_message_naming_the_plugin(policy: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        parse_config(f"router: {{policy: {policy}}}\n" + POOL)
    assert "\n" not in str(caught.value) and "Value error" not in str(caught.value)


def test_tiergate_router_exits_2_with_one_line_on_a_bad_policy(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("router: {policy: {picker: {type: fastest}}}\n" + POOL)
    argv = [sys.executable, "-P", "-m", "tiergate", "router", "--config", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "picker 'fastest': unknown type 'fastest'" in lines[0], lines


def node_requests(url: str) -> float:
    """Requests a sim node has finished, from its own /metrics."""
    text = httpx.get(url + "/metrics").text
    return sum(
        float(v) for v in re.findall(r"^vllm:request_success_total\{.*\} (\S+)$", text, re.M)
    )


def test_a_reloaded_policy_is_applied_and_a_bad_one_is_not(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    serving = ServingSpec(
        model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec(max_num_seqs=4)
    )
    with ExitStack() as stack:
        nodes = [
            stack.enter_context(served(create_app(NodeConfig(serving=serving)))) for _ in range(2)
        ]
        path = tmp_path / "router.yaml"

        def write(policy: str) -> None:
            path.write_text(
                f"router: {{reloadIntervalS: 0.05, ledgerPath: {tmp_path / 'ledger.sqlite'}, "
                f"policy: {policy}}}\n"
                "pools: [{name: b, tier: batched, model: llama-3.1-8b, accelerator: wse-3, "
                f"batching: {{maxNumSeqs: 4}}, endpoints: [{nodes[0]}, {nodes[1]}]}}]\n"
            )

        write(SPREAD)
        config, source = file_source(path, default_catalog())
        app = build_app(config, source)
        url = stack.enter_context(served(app))
        metrics_url = stack.enter_context(served(app.metrics_app))
        body = {
            "model": "llama-3.1-8b",
            # Two of prefix affinity's 256-character blocks: a prompt shorter than one has none.
            "messages": [{"role": "user", "content": "the same prompt every time. " * 20}],
            "max_tokens": 2,
        }

        def send(n: int) -> list[float]:
            before = [node_requests(node) for node in nodes]
            for _ in range(n):
                r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
                assert r.status_code == 200, r.text
            return [node_requests(node) - b for node, b in zip(nodes, before, strict=True)]

        spread = send(24)  # the file's policy from the start: the default would stick
        assert sum(spread) == 24 and min(spread) > 0, spread

        def reloads(result: str, n: int) -> bool:
            counted = f'tiergate_config_reloads_total{{config="pools",result="{result}"}} {n}.0'
            return counted in httpx.get(metrics_url + "/metrics").text

        write(STICKY)
        until(lambda: reloads("applied", 1), "no reload")
        assert sorted(send(8)) == [0, 8]  # affinity: all where the first went

        write("{picker: {type: sticky-picker}}")  # refused: the last good policy stays
        until(lambda: reloads("failed", 1), "no failed reload")
        assert sorted(send(8)) == [0, 8]

        write(SPREAD)
        until(lambda: reloads("applied", 2), "no reload")
        spread = send(24)
        assert sum(spread) == 24 and min(spread) > 0, spread


def test_a_policy_without_filters_over_a_pool_with_no_endpoints_is_a_503(
    tmp_path: Path, served: Callable[[Any], AbstractContextManager[str]]
) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(
        f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}, policy: {{filters: []}}}}\n" + POOL
    )
    config, source = file_source(path, default_catalog())
    with served(build_app(config, source)) as url:
        body = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "no_capacity"
