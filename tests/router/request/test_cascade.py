"""The cascade: parsing, the tool-call check, SSE replay, and escalation end to end."""

from __future__ import annotations

import json
import logging
import socket
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling_helpers import until

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import TIERS
from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.router.http.openapi import openapi_document
from tiergate.router.ledger.sqlite import LedgerError, UsageRecord
from tiergate.router.request.body import parse_completion
from tiergate.router.request.cascade import (
    CASCADE_HEADER,
    as_event_stream,
    cascade_plan,
    parse_cascade,
    the_request_s_fault,
)
from tiergate.router.request.tool_calls import tool_call_problem
from tiergate.router.tenants.registry import ANONYMOUS
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    },
}
REQUEST = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [TOOL]}


def reply(arguments: str, name: str = "run") -> dict[str, Any]:
    call = {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"id": "r", "model": "m", "choices": [{"index": 0, "message": message}]}


def test_parse_cascade() -> None:
    c = parse_cascade("wafer-scale>premium")
    assert (c.first, c.then) == ("wafer-scale", "premium")
    for bad in ("premium", "premium>premium", "fast>premium", "a>b>c"):
        with pytest.raises(RouterError) as caught:
            parse_cascade(bad)
        assert caught.value.status == 400 and caught.value.code == "invalid_cascade"


@pytest.mark.parametrize(
    ("arguments", "name", "problem"),
    [
        ('{"cmd": "ls"}', "run", None),
        ('{"cmd": "ls", "timeout": 3}', "run", None),
        ('{"cmd": "ls"', "run", "not valid JSON"),
        ('{"timeout": 3}', "run", "do not match the tool's schema (required)"),
        ('{"cmd": 3}', "run", "do not match the tool's schema (type)"),
        ('{"cmd": "ls", "extra": 1}', "run", "schema (additionalProperties)"),
        ('{"cmd": "ls"}', "rm", "a tool the request does not offer"),
    ],
)
def test_tool_call_problem(arguments: str, name: str, problem: str | None) -> None:
    found = tool_call_problem(reply(arguments, name), REQUEST)
    assert found is None if problem is None else (found is not None and problem in found)
    # The reason is logged: it never repeats what the model wrote.
    assert found is None or not ({"ls", "extra", "rm", "3"} & set(found.replace("(", " ").split()))


def test_a_tool_schema_resolves_refs_inside_itself_and_never_fetches() -> None:
    """A client's schema names a URL: the router must not fetch it (a blocking fetch on the
    event loop, and a request to any host the client likes). Local refs still count."""
    default_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(2.0)  # a fetch would wait on the silent listener, not forever
    try:
        _refs_stay_inside()
    finally:
        socket.setdefaulttimeout(default_timeout)


def _refs_stay_inside() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        remote = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
        parameters = {
            "type": "object",
            "properties": {"cmd": {"$ref": "#/$defs/cmd"}, "env": {"$ref": remote}},
            "$defs": {"cmd": {"type": "string"}},
        }
        request = {**REQUEST, "tools": [{"type": "function", "function": {
            "name": "run", "parameters": parameters}}]}  # fmt: skip
        problem = tool_call_problem(reply('{"cmd": 3}'), request)
        assert problem is not None and "do not match the tool's schema" in problem
        # The remote ref cannot be judged: no escalation, and nothing was fetched.
        assert tool_call_problem(reply('{"cmd": "ls", "env": 1}'), request) is None
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()


def test_a_text_answer_or_no_tools_has_nothing_to_escalate() -> None:
    text = {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}
    assert tool_call_problem(text, REQUEST) is None
    assert tool_call_problem(reply("{bad"), {"model": "m", "messages": []}) is None


@pytest.mark.parametrize(
    "tools",
    [
        5,
        "run",
        {"function": TOOL["function"]},
        [{"type": "function", "function": {"name": ["run"]}}],
    ],
)
def test_tools_that_are_not_a_list_of_named_functions_have_nothing_to_check(tools: Any) -> None:
    """A node that let malformed `tools` through: the first reply is kept, not a TypeError
    between the reply and its bill."""
    assert tool_call_problem(reply('{"cmd": 3}'), {**REQUEST, "tools": tools}) is None


def test_the_plan_names_a_model_an_endpoint_answers_to() -> None:
    """Mid-rollout, the wafer pool's one ready pod is of the previous spec: it answers to the
    old name (now an alias), not to the new primary name, which would get a 404 from it."""
    text = """
pools:
  - {name: full, tier: premium, model: frontier, accelerator: b200, chips: 8,
     weightDtype: fp8, kvDtype: fp8, batching: {maxNumSeqs: 4}, endpoints: [http://10.0.0.1:1]}
  - {name: spark, tier: wafer-scale, model: frontier-spark, servedModelName: spark-2,
     aliases: [spark], accelerator: wse-3, chips: 2, endpoints: [http://10.0.0.2:1]}
"""
    specs = parse_config(text).pools
    view = build_view(specs, default_catalog(), answers_to=lambda s: (
        {"http://10.0.0.2:1": frozenset({"spark"})} if s.name == "spark" else {}))  # fmt: skip
    body = json.dumps({**REQUEST, "model": "frontier"}).encode()
    plan = cascade_plan(
        {CASCADE_HEADER: "wafer-scale>premium"}, parse_completion(body, chat=True), view, ANONYMOUS
    )
    assert plan is not None and (plan.first_model, plan.then_model) == ("spark", "frontier")


def test_as_event_stream_replays_a_whole_reply() -> None:
    data = {**reply('{"cmd": "ls"}'), "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
    events = as_event_stream(data, include_usage=True).decode().split("\n\n")
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"]["tool_calls"][0]["index"] == 0
    assert json.loads(events[1][6:])["usage"]["completion_tokens"] == 5
    assert events[2] == "data: [DONE]"
    assert "usage" not in as_event_stream(data, include_usage=False).decode()
    assert "usage" not in first  # only a client that asked for it on every chunk gets it there
    every = as_event_stream(data, include_usage=True, continuous_usage=True).decode()
    assert json.loads(every.split("\n\n")[0][6:])["usage"]["completion_tokens"] == 5


Served = Callable[[Any], AbstractContextManager[str]]


@contextmanager
def cascade_system(
    served: Served, tmp: Path, spark_seqs: int, full_seqs: int, router: str = ""
) -> Iterator[dict[str, Any]]:
    """A router over a wafer-scale spark node and a premium full-model node (batch caps
    `spark_seqs`, `full_seqs`); `router` adds settings to the router's YAML map."""
    spark = NodeConfig(
        serving=ServingSpec(model="frontier-spark", accelerator="wse-3", chips=2,
                            batching=BatchingSpec(max_num_seqs=spark_seqs)),
    )  # fmt: skip
    full = NodeConfig(
        serving=ServingSpec(model="frontier", accelerator="b200", chips=8, tensor_parallel=8,
                            weight_dtype="fp8", kv_dtype="fp8",
                            batching=BatchingSpec(max_num_seqs=full_seqs)),
    )  # fmt: skip
    with ExitStack() as stack:
        spark_url = stack.enter_context(served(create_app(spark)))
        full_url = stack.enter_context(served(create_app(full)))
        config = parse_config(
            f"router: {{ledgerPath: {tmp / 'ledger.sqlite'}{router}}}\npools:\n"
            f"  - {{name: spark, tier: wafer-scale, model: frontier-spark, accelerator: wse-3, "
            f"chips: 2, batching: {{maxNumSeqs: {spark_seqs}}}, endpoints: [{spark_url}]}}\n"
            f"  - {{name: full, tier: premium, model: frontier, accelerator: b200, chips: 8, "
            f"tensorParallel: 8, weightDtype: fp8, kvDtype: fp8, "
            f"batching: {{maxNumSeqs: {full_seqs}}}, endpoints: [{full_url}]}}\n"
        )
        app = build_app(config, StaticSource(build_view(config.pools, default_catalog())))
        url = stack.enter_context(served(app))
        metrics = stack.enter_context(served(app.metrics_app))
        yield {"url": url, "metrics": metrics, "ledger": tmp / "ledger.sqlite", "app": app}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, served: Served) -> Iterator[dict[str, Any]]:
    with cascade_system(served, tmp_path_factory.mktemp("cascade"), 8, 4) as system:
        yield system


def tenants_file(tmp: Path, names: tuple[str, ...]) -> Path:
    """A tenants file for `names`; a tenant's API key is `<name>-key-0123456789`."""
    tenants = tmp / "tenants.yaml"
    tenants.write_text(
        "tenants:\n" + "".join(f"  - {{name: {t}, apiKeys: [{t}-key-0123456789]}}\n" for t in names)
    )
    return tenants


def cascade(url: str, seed: int, tenant: str | None = None, **fields: Any) -> httpx.Response:
    """A cascade with tool TOOL (unless `fields` say otherwise), as `tenant` if given."""
    headers = {"x-tiergate-cascade": "wafer-scale>premium"}
    if tenant is not None:
        headers["authorization"] = f"Bearer {tenant}-key-0123456789"
    body = {
        "model": "frontier-spark",
        "messages": [{"role": "user", "content": "list the files"}],
        "tools": [TOOL],
        "seed": seed,
        **fields,
    }
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60, headers=headers)


def test_malformed_tool_calls_escalate_to_the_full_model(router: dict[str, Any]) -> None:
    replies = [cascade(router["url"], seed) for seed in range(40)]
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies][:2]
    escalated = [r for r in replies if r.headers["x-tiergate-escalated"] == "true"]
    kept = [r for r in replies if r.headers["x-tiergate-escalated"] == "false"]
    # spark's quality is 0.73: about a quarter of its tool calls are malformed
    assert 4 <= len(escalated) <= 20
    assert all(r.headers["x-tiergate-tier"] == "wafer-scale" for r in kept)
    assert all(tool_call_problem(r.json(), {"tools": [TOOL]}) is None for r in kept)
    assert all(r.headers["x-tiergate-tier"] == "premium" for r in escalated)
    assert all(r.json()["model"] == "frontier" for r in escalated)
    ids = [r.headers["x-tiergate-request-id"] for r in escalated]
    rows = (
        sqlite3.connect(router["ledger"])
        .execute(
            f"select request_id, attempt, tier_served, escalated, cost_usd from usage "
            f"where request_id in ({','.join('?' * len(ids))})",
            ids,
        )
        .fetchall()
    )
    assert len(rows) == 2 * len(ids)  # both attempts recorded
    assert {(r[1], r[2]) for r in rows} == {(1, "wafer-scale"), (2, "premium")}
    assert all(r[3] and r[4] > 0 for r in rows)  # both escalated, both billed
    metrics = httpx.get(router["metrics"] + "/metrics").text
    series = 'tiergate_cascade_escalations_total{from_tier="wafer-scale",to_tier="premium"}'
    assert f"{series} {float(len(ids))}" in metrics


def test_a_streaming_client_gets_the_kept_reply_as_events(router: dict[str, Any]) -> None:
    kept = next(
        seed
        for seed in range(20)
        if cascade(router["url"], seed).headers["x-tiergate-escalated"] == "false"
    )
    # The same request streamed: the first attempt is a whole reply, so the client's
    # stream_options must not go with it (vLLM refuses them without `stream`).
    r = cascade(router["url"], kept, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert (r.headers["x-tiergate-escalated"], r.headers["x-tiergate-tier"]) == (
        "false",
        "wafer-scale",
    )
    events = [line for line in r.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] > 0


def test_a_request_the_first_tier_refuses_for_a_bad_field_is_not_escalated(
    router: dict[str, Any],
) -> None:
    def escalations() -> float:
        series = 'tiergate_cascade_escalations_total{from_tier="wafer-scale",to_tier="premium"}'
        metrics = httpx.get(router["metrics"] + "/metrics").text
        return sum(float(x.split()[-1]) for x in metrics.splitlines() if x.startswith(series))

    before = escalations()
    r = cascade(router["url"], 1, tool_choice="bogus")
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert r.headers["x-tiergate-escalated"] == "false"
    rows = (
        sqlite3.connect(router["ledger"])
        .execute(
            "select attempt, tier_served, outcome, http_status, cost_usd from usage"
            " where request_id = ?",
            (r.headers["x-tiergate-request-id"],),
        )
        .fetchall()
    )
    assert rows == [(1, "wafer-scale", "rejected", 400, 0.0)]  # no premium attempt
    assert escalations() == before


@pytest.mark.parametrize(
    ("status", "code", "escalates"),
    [
        (400, "invalid_value", False),
        (422, None, False),
        (400, "context_length_exceeded", True),  # the full model's context may be longer
        (404, "model_not_found", True),
        (429, None, True),
        (503, None, True),
    ],
)
def test_which_refusals_of_the_first_tier_escalate(
    status: int, code: str | None, escalates: bool
) -> None:
    body = json.dumps({"error": {"message": "m", "type": "t", "code": code, "param": None}})
    assert the_request_s_fault(status, body.encode()) is not escalates


def vllm_error(message: str) -> dict[str, Any]:
    """vLLM's error body: an envelope whose code is the status."""
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}


def sglang_error(message: str) -> dict[str, Any]:
    """SGLang's: the error's fields at the top level."""
    return {"object": "error", "message": message, "type": "BadRequestError", "param": None,
            "code": 400}  # fmt: skip


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (vllm_error, "This model's maximum context length is 8192 tokens. However, your "
                     "request has 9000 input tokens. Please reduce the length of the input."),
        (sglang_error, "The input (9000 tokens) is longer than the model's context length "
                       "(8192 tokens)."),
    ],
)  # fmt: skip
def test_an_engine_s_context_refusal_escalates_whatever_its_code(
    shape: Callable[[str], dict[str, Any]], message: str
) -> None:
    assert the_request_s_fault(400, json.dumps(shape(message)).encode()) is False
    other = shape("temperature must be at most 2")
    assert the_request_s_fault(400, json.dumps(other).encode()) is True


def test_a_refusal_without_an_envelope_is_taken_as_the_request_s_fault() -> None:
    assert the_request_s_fault(400, b"<html>") is True
    assert the_request_s_fault(502, b"<html>") is False


def test_without_tools_the_cascade_header_changes_nothing(router: dict[str, Any]) -> None:
    body = {"model": "frontier-spark", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3}  # fmt: skip
    r = httpx.post(router["url"] + "/v1/chat/completions", json=body, timeout=30,
                   headers={"x-tiergate-cascade": "wafer-scale>premium"})  # fmt: skip
    assert r.status_code == 200 and r.headers["x-tiergate-tier"] == "wafer-scale"
    bad = httpx.post(router["url"] + "/v1/chat/completions", json=body, timeout=30,
                     headers={"x-tiergate-cascade": "premium"})  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_cascade"


def metric(metrics_port: str, name: str) -> float:
    text = httpx.get(metrics_port + "/metrics").text
    return float(next(x for x in text.splitlines() if x.startswith(name + " ")).split()[-1])


def test_a_ledger_failure_on_the_first_attempt_still_serves_the_second(
    router: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Billing attempt 1 of an escalation fails (disk full): loud (metric, log), and the
    client still gets attempt 2's reply, not a 500."""
    ledger = router["app"].router.ledger
    real, failed = ledger.add, []

    def add(usage: UsageRecord) -> None:
        if usage.attempt == 1 and usage.escalated and not failed:
            failed.append(usage.request_id)
            raise LedgerError("cannot record usage: database or disk is full")
        real(usage)

    monkeypatch.setattr(ledger, "add", add)
    accounting = metric(router["metrics"], "tiergate_accounting_errors_total")
    internal = metric(router["metrics"], "tiergate_internal_errors_total")
    for seed in range(40):
        r = cascade(router["url"], seed)
        assert r.status_code == 200, r.text
        if failed:
            break
    assert failed, "no request escalated"
    assert r.headers["x-tiergate-escalated"] == "true" and r.headers["x-tiergate-tier"] == "premium"
    assert metric(router["metrics"], "tiergate_accounting_errors_total") == accounting + 1
    assert metric(router["metrics"], "tiergate_internal_errors_total") == internal
    rows = sqlite3.connect(router["ledger"]).execute(
        "select attempt from usage where request_id = ?", (failed[0],)
    )
    assert [a for (a,) in rows] == [2]  # attempt 2 billed; attempt 1's failure is on record


@pytest.fixture
def two_tenants_router(tmp_path: Path, served: Served) -> Iterator[dict[str, Any]]:
    """A cascade router with tenants alice and mallory."""
    tenants = tenants_file(tmp_path, ("alice", "mallory"))
    with cascade_system(served, tmp_path, 8, 4, router=f", tenantsFile: {tenants}") as system:
        yield system


def test_a_schema_that_would_take_forever_to_check_does_not_stall_the_router(
    two_tenants_router: dict[str, Any],
) -> None:
    """The node fills `cmd` with x's (minLength); mallory's pattern backtracks exponentially
    on them. Her check is given up at its deadline (or at once, when her checks have spent her
    budget), the reply is served as it is, and the router answers other requests meanwhile,
    alice's cascades checked as usual. (Alice is another tenant: a tenant's own checks run one
    at a time, and one queued behind a slow one may be given up as `busy`.)"""
    evil = {"type": "function", "function": {"name": "run", "parameters": {
        "type": "object", "required": ["cmd"],
        "properties": {"cmd": {"type": "string", "minLength": 60, "pattern": "(x+x+)+y"}},
    }}}  # fmt: skip
    url = two_tenants_router["url"]

    def given_up() -> float:
        metrics = httpx.get(two_tenants_router["metrics"] + "/metrics").text
        line = "tiergate_cascade_unchecked_total{"
        return sum(float(x.split()[-1]) for x in metrics.splitlines() if x.startswith(line))

    before = given_up()
    with ThreadPoolExecutor(1) as pool:
        checked = [pool.submit(cascade, url, seed, "mallory", tools=[evil]) for seed in range(4)]
        # While the checks run (each up to its 1 s deadline), other requests are answered.
        plain = []
        for _ in range(5):
            assert httpx.get(url + "/healthz", timeout=10).status_code == 200
            plain.append(cascade(url, 99, "alice", tools=[TOOL], max_tokens=5))
        replies = [f.result() for f in checked]
    assert all(r.status_code == 200 for r in [*replies, *plain])
    # Cut short at 5 tokens, alice's tool call is not JSON: each was checked, and escalated.
    assert all(r.headers["x-tiergate-escalated"] == "true" for r in plain)
    kept = [r for r in replies if r.headers["x-tiergate-escalated"] == "false"]
    assert kept and given_up() - before == len(kept)  # served unchecked, each counted


def test_the_openapi_document_lists_exactly_the_cascades_the_router_takes() -> None:
    document = openapi_document()
    listed = {
        value
        for path in document["paths"].values()
        for operation in path.values()
        for parameter in operation.get("parameters", [])
        if parameter["name"] == CASCADE_HEADER
        for value in parameter["schema"]["enum"]
    }
    assert len(listed) == len(TIERS) * (len(TIERS) - 1)
    for value in listed:
        parse_cascade(value)
    for refused in ("a>b", "batched>batched", "premium"):
        assert refused not in listed
        with pytest.raises(RouterError):
            parse_cascade(refused)


# `cmd` is a string to the node; to the validator it must also match l0, which refers to l1
# twice (anyOf), and so on down to an integer: a string is tried 2^40 ways.
EXPONENTIAL_TOOL = {"type": "function", "function": {"name": "run", "parameters": {
    "$defs": {**{f"l{n}": {"anyOf": [{"$ref": f"#/$defs/l{n + 1}"}] * 2} for n in range(40)},
              "l40": {"type": "integer"}},
    "type": "object", "required": ["cmd"],
    "properties": {"cmd": {"type": "string", "$ref": "#/$defs/l0"}},
}}}  # fmt: skip
TENANTS = ("alice", "mallory", "trudy")


@pytest.fixture(scope="module")
def tenants_router(
    tmp_path_factory: pytest.TempPathFactory, served: Served
) -> Iterator[dict[str, Any]]:
    """A cascade router with three tenants; `key(name)` is a tenant's API key."""
    tmp = tmp_path_factory.mktemp("cascade-tenants")
    tenants = tenants_file(tmp, TENANTS)
    with cascade_system(served, tmp, 16, 16, router=f", tenantsFile: {tenants}") as system:
        yield system


def tenant_cascade(url: str, tenant: str, seed: int, tool: dict[str, Any]) -> httpx.Response:
    body = {"model": "frontier-spark", "messages": [{"role": "user", "content": "list the files"}],
            "tools": [tool], "seed": seed, "max_tokens": 16}  # fmt: skip
    headers = {"x-tiergate-cascade": "wafer-scale>premium",
               "authorization": f"Bearer {tenant}-key-0123456789"}  # fmt: skip
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_two_tenants_sending_exponential_schemas_leave_a_third_tenant_s_checks_alone(
    tenants_router: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Mallory and trudy send `$ref`-in-`anyOf` schemas nonstop, as many at once as the
    checker has workers; alice's cascades are all checked meanwhile (none of hers is given
    up, none of her malformed tool calls reaches her). Theirs spend their budgets of check
    time and are then given up at once, which the metrics and the log say."""
    url = tenants_router["url"]
    caplog.set_level(logging.INFO, logger="tiergate.router")
    abusing = True

    def abuse(tenant: str, worker: int) -> int:
        sent = 0
        while abusing:
            r = tenant_cascade(url, tenant, 1000 * worker + sent, EXPONENTIAL_TOOL)
            assert r.status_code == 200, r.text  # given up or not, the reply is served
            sent += 1
        return sent

    def spent() -> set[str]:
        """The tenants whose checks have been given up for a spent budget (logged once as
        each episode starts)."""
        messages = [r.getMessage() for r in list(caplog.records)]
        start = "event=cascade_checks_given_up"
        return {m.split("tenant=")[1].split()[0] for m in messages if m.startswith(start)}

    with ThreadPoolExecutor(4) as pool:
        abusers = [pool.submit(abuse, t, w) for t in ("mallory", "trudy") for w in range(2)]
        try:
            # Budgets are CPU time: on a loaded machine a slow check takes longer to spend one.
            until(lambda: spent() == {"mallory", "trudy"}, "both abusers spent their budget",
                  within_s=120)  # fmt: skip
            replies = [tenant_cascade(url, "alice", seed, TOOL) for seed in range(20)]
        finally:
            abusing = False  # a failed wait too: the pool's exit waits for the abusers to stop
        assert all(a.result() > 0 for a in abusers)
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies][:2]
    kept = [r for r in replies if r.headers["x-tiergate-escalated"] == "false"]
    escalated = [r for r in replies if r.headers["x-tiergate-escalated"] == "true"]
    assert kept and escalated  # spark's quality is 0.73: some of its calls are malformed
    assert all(tool_call_problem(r.json(), {"tools": [TOOL]}) is None for r in kept)
    text = httpx.get(tenants_router["metrics"] + "/metrics").text
    assert 'tiergate_cascade_unchecked_total{reason="over_budget"}' in text
    assert "tiergate_cascade_check_budget_spent_tenants " in text
    messages = [r.getMessage() for r in caplog.records]
    assert not any("given_up" in m and "tenant=alice" in m for m in messages)
    # One line when a tenant's checks start being given up, one when they run again: a budget
    # left just below zero refills in a moment, so on a busy machine, while alice is served, an
    # abuser may spend its budget more than once; never a line per check.
    episodes: dict[str, list[str]] = {}
    for m in messages:
        if m.startswith(("event=cascade_checks_given_up", "event=cascade_checks_resumed")):
            episodes.setdefault(m.split("tenant=")[1].split()[0], []).append(m.split()[0])
    assert sorted(episodes) == ["mallory", "trudy"]
    for events in episodes.values():
        assert events[::2] == ["event=cascade_checks_given_up"] * len(events[::2]), events
        assert events[1::2] == ["event=cascade_checks_resumed"] * len(events[1::2]), events
    assert not any("$defs" in m or "list the files" in m for m in messages)


def test_a_first_tier_that_does_not_finish_in_time_is_a_504_not_an_escalation(
    served: Served, tmp_path: Path
) -> None:
    """The second tier would take as long again, so the client has the 504 at once (a stream
    would be served by the second tier otherwise: its wait is not bounded by the limit)."""
    with cascade_system(served, tmp_path, 8, 4, router=", wholeReplyTimeoutS: 0.01") as system:
        # A text reply of 400 tokens: about 0.2 s on the wafer, past the 10 ms limit.
        reply = cascade(system["url"], 0, stream=True, max_tokens=400, tool_choice="none")
        assert reply.status_code == 504, reply.text
        assert reply.json()["error"]["code"] == "upstream_timeout"
        (escalated,) = (
            sqlite3.connect(system["ledger"])
            .execute("select count(*) from usage where escalated")
            .fetchone()
        )
        assert escalated == 0
