"""Spending past a budget, against real router and sim-node processes: every way a request may
ask for more output than the router held against the budget (a second spelling of the cap,
none at all, many sequences, many prompts, many requests at once) is held at what the node may
produce, and the node is sent the cap the router decided.

A request is admitted while the tenant's spend plus the holds of its requests in flight is under
its budget (router/tenants/budgets.py): a period's spend stays under the budget plus the hold of
the last request admitted, whatever the interleaving. Output costs $1 a token here and prompts
nothing: a tenant's $5 a day is five tokens, and a request's hold its cap in dollars.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from adversarial_helpers import Pool, System, assert_refused, assert_serves, bearer, running_system

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

BUDGET_USD = 5.0
#: One tenant per test (a spent budget stays spent for the day).
NAMES = [
    "both-text",
    "both-chat",
    "both-stream",
    "larger-chat",
    "larger-text",
    "uncapped-chat",
    "uncapped-text",
    "sequences",
]
TENANTS = (
    "tenants:\n"
    + "".join(
        f"  - {{name: {n}, apiKeys: [{n}-key-0123456789], budgetUsd: {BUDGET_USD}, "
        "budgetPeriod: day}\n"
        for n in NAMES
    )
    + "  - {name: bystander, apiKeys: [bystander-key-0123456789]}\n"
)  # no budget: served after


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    metered = Pool("m", "batched", "metered", max_num_seqs=32,
                   extra="billing: {outputPerMillionUsd: 1000000}")  # fmt: skip
    tmp = tmp_path_factory.mktemp("budgets")
    with running_system(tmp, [metered], tenants=TENANTS) as running:
        yield running


def key(name: str) -> dict[str, str]:
    return bearer(f"{name}-key-0123456789")


def spent(system: System, name: str) -> float:
    usage = httpx.get(system.url + "/v1/usage", headers=key(name), timeout=30).json()
    return float(usage["budget"]["spent_usd"])


def at_once(system: System, name: str, path: str, body: dict[str, Any], n: int) -> list[Any]:
    def ask(_: int) -> httpx.Response:
        return httpx.post(system.url + path, json=body, headers=key(name), timeout=60)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(ask, range(n)))


@pytest.mark.parametrize(
    ("name", "path", "extra"),
    [
        ("both-text", "/v1/completions", {"prompt": "hi"}),
        ("both-chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ],
)
def test_ten_requests_at_once_with_a_second_larger_cap_spend_at_most_the_budget(
    system: System, name: str, path: str, extra: dict[str, Any]
) -> None:
    """The issue's attack: `max_completion_tokens: 1` held, `max_tokens: 2000` generated; ten
    at once spent 7.6 times a day's budget."""
    body = {"model": "metered", "max_completion_tokens": 1, "max_tokens": 2000,
            "ignore_eos": True, **extra}  # fmt: skip
    replies = at_once(system, name, path, body, 10)
    served = [r for r in replies if r.status_code == 200]
    assert served, [r.text for r in replies]
    for r in served:  # the node was sent the cap the router held
        assert r.json()["usage"]["completion_tokens"] == 1
    for r in replies:
        if r.status_code != 200:
            assert_refused(r, 429, "budget_exceeded", system)
            assert int(r.headers["retry-after"]) >= 1
    assert spent(system, name) <= BUDGET_USD + 1  # the budget, and one request's hold
    assert_serves(system, key("bystander"), "metered")


def test_a_stream_with_a_second_larger_cap_is_sent_the_smaller(system: System) -> None:
    body = {"model": "metered", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}, "max_completion_tokens": 1,
            "max_tokens": 2000, "ignore_eos": True}  # fmt: skip
    r = httpx.post(system.url + "/v1/chat/completions", json=body, headers=key("both-stream"),
                   timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    assert '"completion_tokens":1,' in r.text.replace(" ", "")
    assert spent(system, "both-stream") == pytest.approx(1.0)


CHAT_FIELDS = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("name", "path", "fields", "tokens"),
    [
        # max_completion_tokens wins: the larger cap is the one held, and the one generated.
        ("larger-chat", "/v1/chat/completions",
         {**CHAT_FIELDS, "max_completion_tokens": 2000, "max_tokens": 1}, 2000),
        ("larger-text", "/v1/completions",
         {"prompt": "hi", "max_completion_tokens": 2000, "max_tokens": 1}, 2000),
        # No cap: held at the rest of the model's context, what a node may fill.
        ("uncapped-chat", "/v1/chat/completions", CHAT_FIELDS, None),
        ("uncapped-text", "/v1/completions", {"prompt": "hi", "max_tokens": None}, None),
    ],
)  # fmt: skip
def test_while_a_request_that_may_spend_the_rest_runs_no_other_is_admitted(
    system: System, name: str, path: str, fields: dict[str, Any], tokens: int | None
) -> None:
    body = {"model": "metered", "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **fields}  # fmt: skip
    small = {"model": "metered", **fields, "max_tokens": 1, "max_completion_tokens": None}
    with httpx.stream("POST", system.url + path, json=body, headers=key(name), timeout=60) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()  # kept: a dropped iterator closes the stream
        assert next(line for line in lines if line.startswith("data: "))
        # In flight, holding more than the budget: even a one-token request waits. The stream's
        # bill is brought up to date every second while it runs, so on a machine slow to send
        # this request it may already be past the budget: refused for that instead.
        refused = httpx.post(system.url + path, json=small, headers=key(name), timeout=60)
        error = assert_refused(refused, 429, "budget_exceeded", system)
        if "has spent" not in error["message"]:
            assert "in flight" in error["message"] and refused.headers["retry-after"] == "1"
        events = [
            json.loads(x[6:]) for x in lines if x.startswith("data: ") and x != "data: [DONE]"
        ]
    generated = events[-1]["usage"]["completion_tokens"]
    if tokens is None:
        assert generated > 0  # the node's own default cap, far below the hold
    else:
        assert generated == tokens
    assert spent(system, name) == pytest.approx(generated)  # over the budget: by one hold
    # Spent: refused until the day ends.
    refused = httpx.post(system.url + path, json=small, headers=key(name), timeout=60)
    error = assert_refused(refused, 429, "budget_exceeded", system)
    assert "has spent its daily budget" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    assert_serves(system, key("bystander"), "metered")


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        # The sim nodes generate one sequence of one prompt: they refuse more (best_of
        # above 1 too).
        ("/v1/chat/completions", {**CHAT_FIELDS, "n": 4}),
        ("/v1/completions", {"prompt": ["hi"] * 4}),
        ("/v1/completions", {"prompt": [[1, 2]] * 4}),
        ("/v1/completions", {"prompt": "hi", "best_of": 4}),
    ],
)
def test_many_sequences_or_prompts_are_refused_and_bill_nothing(
    system: System, path: str, fields: dict[str, Any]
) -> None:
    before = spent(system, "sequences")
    body = {"model": "metered", "ignore_eos": True, "max_tokens": 1, **fields}
    r = httpx.post(system.url + path, json=body, headers=key("sequences"), timeout=60)
    assert_refused(r, 400, None, system)
    assert spent(system, "sequences") == pytest.approx(before)
