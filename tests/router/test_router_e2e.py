"""The router end to end: real sim nodes and the real router, each on its own socket."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tiergate.router.build import build_app
from tiergate.router.config import parse_config
from tiergate.router.discovery.view import StaticSource, build_view
from tiergate.sim_nodes.catalogs import default_catalog
from tiergate.sim_nodes.perf import BatchingSpec, ServingSpec
from tiergate.sim_nodes.server import NodeConfig, create_app

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

TENANTS = """
tenants:
  - name: alice
    apiKeys: [alice-key-0123456789]
    allowedTiers: [batched, premium, wafer-scale]
  - name: bob
    apiKeys: [bob-key-0123456789]
    allowedTiers: [batched]
    requestsPerMinute: 3
"""


def node(names: list[str], **overrides: Any) -> NodeConfig:
    """Fast tokens: the 8B model on one wafer-scale chip."""
    serving = ServingSpec(
        model="llama-3.1-8b", accelerator="wse-3", batching=BatchingSpec(max_num_seqs=16)
    )
    return NodeConfig(
        serving=serving, served_model_names=names, fault_header_enabled=True, **overrides
    )


def pools_yaml(urls: dict[str, list[str]], tenants: Path, ledger: Path) -> str:
    def pool(name: str, tier: str, served: str) -> str:
        return (
            f"  - {{name: {name}, tier: {tier}, model: llama-3.1-8b, accelerator: wse-3, "
            f"servedModelName: {served}, batching: {{maxNumSeqs: 16}}, "
            f"endpoints: {json.dumps(urls[name])}}}\n"
        )

    return (
        f"router: {{tenantsFile: {tenants}, ledgerPath: {ledger}, forwardFaultHeader: true}}\n"
        "pools:\n"
        + pool("coder-batched", "batched", "coder")
        + pool("coder-premium", "premium", "coder")
        + pool("spark", "wafer-scale", "coder-spark")
    )


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, served: Callable[[Any], AbstractContextManager[str]]
) -> Iterator[dict[str, Any]]:
    serve_app = served
    tmp = tmp_path_factory.mktemp("router")
    tenants = tmp / "tenants.yaml"
    tenants.write_text(TENANTS)
    with ExitStack() as stack:
        urls = {
            # the first batched node always fails: the router must retry and then eject it
            "coder-batched": [
                stack.enter_context(serve_app(create_app(node(["coder"], failure_rate=1.0)))),
                stack.enter_context(serve_app(create_app(node(["coder"], seed=1)))),
            ],
            "coder-premium": [stack.enter_context(serve_app(create_app(node(["coder"]))))],
            "spark": [stack.enter_context(serve_app(create_app(node(["coder-spark"]))))],
        }
        config = parse_config(pools_yaml(urls, tenants, tmp / "ledger.sqlite"))
        view = build_view(config.pools, default_catalog())
        app = build_app(config, StaticSource(view))
        router = stack.enter_context(serve_app(app))
        metrics = stack.enter_context(serve_app(app.metrics_app))
        yield {"url": router, "metrics": metrics, "app": app, "nodes": urls,
               "ledger": tmp / "ledger.sqlite"}  # fmt: skip


ALICE = {"authorization": "Bearer alice-key-0123456789"}
BOB = {"authorization": "Bearer bob-key-0123456789"}


def chat(model: str = "coder", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}], **fields}


def post(system: dict[str, Any], body: Any, headers: dict[str, str] | None = None,
         path: str = "/v1/chat/completions") -> httpx.Response:  # fmt: skip
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        system["url"] + path,
        content=content,
        headers={"content-type": "application/json", **ALICE, **(headers or {})},
        timeout=30,
    )


@pytest.mark.parametrize(
    ("headers", "body", "tier", "service_tier"),
    [
        ({}, chat(max_tokens=5), "batched", "default"),
        ({"x-tiergate-tier": "premium"}, chat(max_tokens=5), "premium", "priority"),
        ({}, chat(max_tokens=5, speed="fast"), "premium", "priority"),
        ({}, chat(max_tokens=5, service_tier="priority"), "premium", "priority"),
        ({}, chat(max_tokens=5, service_tier="flex"), "batched", "flex"),
        ({}, chat("coder-spark", max_tokens=5), "wafer-scale", "default"),
    ],
)
def test_requests_land_on_the_tier_they_ask_for(
    system: dict[str, Any],
    headers: dict[str, str],
    body: dict[str, Any],
    tier: str,
    service_tier: str,
) -> None:
    """The tier's name is in x-tiergate-tier; the body's service_tier is OpenAI's word."""
    r = post(system, body, headers)
    assert r.status_code == 200, r.text
    assert r.headers["x-tiergate-tier"] == tier
    assert r.json()["service_tier"] == service_tier
    assert r.headers["x-tiergate-pool"] in system["nodes"]
    cost = float(r.headers["x-tiergate-cost-usd"])
    assert cost > 0 and r.json()["usage"]["cost_usd"] == pytest.approx(cost, rel=1e-6)


def test_retries_before_the_first_byte_and_ejects_a_failing_endpoint(
    system: dict[str, Any],
) -> None:
    bad = system["nodes"]["coder-batched"][0]
    for _ in range(12):
        r = post(system, chat(max_tokens=2))
        assert r.status_code == 200, r.text
    metrics = httpx.get(system["metrics"] + "/metrics").text
    assert "tiergate_upstream_retries_total" in metrics
    retries = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("tiergate_upstream_retries_total")
    )
    assert retries >= 1
    endpoint = next(e for e in system["app"].router.view().endpoints() if e.url == bad)
    assert endpoint.consecutive_failures >= 1 or endpoint.ejected_until_s > 0


def test_streaming_relays_chunks_with_the_tier_and_usage_only_when_asked(
    system: dict[str, Any],
) -> None:
    def stream(body: dict[str, Any]) -> list[str]:
        with httpx.stream("POST", system["url"] + "/v1/chat/completions", json=body,
                          headers=ALICE, timeout=30) as r:  # fmt: skip
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            return [line for line in r.iter_lines() if line.startswith("data: ")]

    plain = stream(chat(max_tokens=4, stream=True, speed="fast"))
    assert plain[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in plain[:-1]]
    assert all(c["service_tier"] == "priority" for c in chunks)
    assert not any("usage" in c for c in chunks)  # the router asked for it, the client did not
    with_usage = stream(chat(max_tokens=4, stream=True, stream_options={"include_usage": True}))
    last = json.loads(with_usage[-2][6:])
    assert last["usage"]["completion_tokens"] == 4 and last["usage"]["cost_usd"] > 0


def test_a_midstream_failure_ends_the_stream_with_an_error_event(system: dict[str, Any]) -> None:
    body = chat("coder-spark", max_tokens=50, stream=True)
    headers = {**ALICE, "x-tiergate-fault": "midstream"}
    url = system["url"] + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert any('"error"' in e for e in events)
    assert post(system, chat("coder-spark", max_tokens=2)).status_code == 200  # still serving


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_request"),
        (b'{"model": "coder", "messages": [{"content": "\xff\xfe"}]}', 400, "invalid_request"),
        (b"[1, 2]", 400, "invalid_request"),
        (json.dumps({"model": 7, "messages": [{"role": "user", "content": "x"}]}).encode(),
         400, "invalid_request"),
        (json.dumps(chat(max_tokens=-3)).encode(), 400, "invalid_request"),
        (json.dumps(chat(max_tokens=True)).encode(), 400, "invalid_request"),
        (json.dumps({"model": "coder", "messages": []}).encode(), 400, "invalid_request"),
        (b'{"model": "coder", "messages": [{"role": "user", "content": "x"}], "x": '
         + b"[" * 3000 + b"]" * 3000 + b"}", 400, "invalid_request"),
        (json.dumps(chat()).encode()[:-1] + b', "seed": ' + b"9" * 4301 + b"}",
         400, "invalid_request"),
        (json.dumps(chat()).encode()[:-1] + b', "max_tokens": 1' + b"0" * 309 + b"}",
         400, "invalid_request"),
        (json.dumps(chat(max_tokens=2**31)).encode(), 400, "invalid_request"),
        (json.dumps({"model": "coder", "messages": [
            {"role": "user", "content": [{"type": "text", "text": None}]}]}).encode(),
         400, "invalid_request"),
        (json.dumps({"model": "coder", "messages": [
            {"role": "user", "content": [{"type": "text", "text": 5}]}]}).encode(),
         400, "invalid_request"),
        (json.dumps(chat("gpt-9")).encode(), 404, "model_not_found"),
        (json.dumps(chat(service_tier="turbo")).encode(), 400, "unknown_tier"),
        (json.dumps(chat("coder-spark", service_tier="priority")).encode(), 400, "tier_not_served"),
        (b'{"model": "coder", "messages": [{"role": "user", "content": "'
         + b"x" * (5 * 1024 * 1024) + b'"}]}', 413, "request_too_large"),
    ],
)  # fmt: skip
def test_bad_input_gets_a_clear_error_and_the_router_keeps_serving(
    system: dict[str, Any], body: bytes, status: int, code: str
) -> None:
    r = post(system, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    assert post(system, chat(max_tokens=1)).status_code == 200


def test_a_token_id_prompt_is_served_and_billed_at_its_length(system: dict[str, Any]) -> None:
    body = {"model": "coder", "prompt": list(range(1, 41)), "max_tokens": 3}
    r = post(system, body, path="/v1/completions")
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 40
    r = post(system, {**body, "prompt": [1, -1]}, path="/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_a_node_refusal_is_passed_through(system: dict[str, Any]) -> None:
    r = post(system, chat(max_tokens=10_000_000))  # beyond the model's context
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_tenants_are_authenticated_authorized_and_limited(system: dict[str, Any]) -> None:
    assert post(system, chat(), {"authorization": ""}).status_code == 401
    r = post(system, chat(), {"authorization": "Bearer nope"})
    assert r.status_code == 401 and "nope" not in r.text
    r = post(system, chat(speed="fast"), BOB)
    assert r.status_code == 403 and "batched" in r.json()["error"]["message"]
    statuses = [post(system, chat(max_tokens=1), BOB).status_code for _ in range(4)]
    assert statuses[-1] == 429
    limited = post(system, chat(max_tokens=1), BOB)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1


def test_two_authorization_headers_are_no_key_at_all(system: dict[str, Any]) -> None:
    """A proxy in front may read one and the router another: neither is taken."""
    two = [("authorization", ALICE["authorization"]), ("authorization", BOB["authorization"])]
    for headers in (two, [two[0], two[0]]):
        r = httpx.post(system["url"] + "/v1/chat/completions", json=chat(max_tokens=1),
                       headers=headers, timeout=30)  # fmt: skip
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key", r.text
        usage = httpx.get(system["url"] + "/v1/usage", headers=headers, timeout=30)
        assert usage.status_code == 401, usage.text


def test_usage_shows_only_the_callers_own_and_the_ledger_is_on_disk(
    system: dict[str, Any],
) -> None:
    for body in (
        chat(max_tokens=3),
        chat(max_tokens=3, speed="fast"),
        chat("coder-spark", max_tokens=3),
    ):
        assert post(system, body).status_code == 200
    mine = httpx.get(system["url"] + "/v1/usage", headers=ALICE).json()
    assert mine["tenant"] == "alice" and mine["totals"]["completion_tokens"] >= 3
    assert httpx.get(system["url"] + "/v1/usage").status_code == 401
    rows = (
        sqlite3.connect(system["ledger"])
        .execute(
            "select tenant, tier_served, outcome from usage "
            "where tenant = 'alice' and outcome = 'ok'"
        )
        .fetchall()
    )
    assert rows and {r[1] for r in rows} >= {"batched", "premium", "wafer-scale"}
    wal_file = system["ledger"].with_name(system["ledger"].name + "-wal")
    before = wal_file.stat().st_size
    metrics = httpx.get(system["metrics"] + "/metrics").text
    wal = next(x for x in metrics.splitlines() if x.startswith("tiergate_ledger_wal_bytes "))
    # What the file held when scraped (it only grows meanwhile, far below its size limit).
    assert 0 < before <= float(wal.split()[-1]) <= wal_file.stat().st_size


def test_models_health_and_openapi(system: dict[str, Any]) -> None:
    models = httpx.get(system["url"] + "/v1/models").json()["data"]
    assert {m["id"]: m["tiers"] for m in models} == {
        "coder": ["batched", "premium"],
        "coder-spark": ["wafer-scale"],
    }
    assert httpx.get(system["url"] + "/healthz").status_code == 200
    assert httpx.get(system["url"] + "/readyz").status_code == 200
    spec = httpx.get(system["url"] + "/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/usage", "/v1/models"} <= set(spec["paths"])
    # What the router reads and sends is what the document says.
    op = spec["paths"]["/v1/chat/completions"]["post"]
    assert {p["name"] for p in op["parameters"]} == {
        "x-tiergate-tier", "x-tiergate-cascade", "x-slo-ttft-ms", "x-slo-tpot-ms",
        "x-tiergate-spill-to", "x-tiergate-spill-max-usd-per-mtok",
    }  # fmt: skip
    documented = set(op["responses"]["200"]["headers"])
    for headers in ({}, {"x-tiergate-cascade": "wafer-scale>premium"}):
        r = post(system, chat("coder-spark", max_tokens=2), headers)
        assert r.status_code == 200
        assert {h for h in r.headers if h.startswith("x-tiergate-")} <= documented
    for status in ("429", "503"):
        assert "Retry-After" in op["responses"][status]["headers"]
    assert "default" in op["responses"]  # a node's own refusal, passed through
    assert httpx.get(system["url"] + "/nope").status_code == 404
    metrics = httpx.get(system["metrics"] + "/metrics").text
    young = 'tiergate_gc_pause_seconds_count{generation="0"} '
    # installed when the app started: the requests served since then made young collections
    assert float(next(x for x in metrics.splitlines() if x.startswith(young)).split()[-1]) > 0


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"x-slo-tpot-ms": "100", "x-slo-ttft-ms": "5000"}, 200, None),
        ({"x-slo-tpot-ms": "0.001"}, 503, "slo_unattainable"),
        ({"x-slo-ttft-ms": "0.001"}, 503, "slo_unattainable"),
        ({"x-slo-ttft-ms": "soon"}, 400, "invalid_request"),
        ({"x-slo-tpot-ms": "-5"}, 400, "invalid_request"),
    ],
)
def test_slo_headers_reject_early_what_the_model_says_will_be_late(
    system: dict[str, Any], headers: dict[str, str], status: int, code: str | None
) -> None:
    r = post(system, chat("coder-spark", max_tokens=5), headers)
    assert r.status_code == status, r.text
    if code is not None:
        assert r.json()["error"]["code"] == code
    if code == "slo_unattainable":
        assert "best predicted" in r.json()["error"]["message"]
        assert r.headers["retry-after"] == "1"
        # Refused by admission (the router's own call), not an upstream failure.
        (outcome,) = (
            sqlite3.connect(system["ledger"])
            .execute(
                "select outcome from usage where request_id = ?",
                (r.headers["x-tiergate-request-id"],),
            )
            .fetchone()
        )
        assert outcome == "shed"


def test_head_answers_like_get_and_a_wrong_method_says_which_are_allowed(
    system: dict[str, Any],
) -> None:
    for path in ("/healthz", "/readyz", "/v1/models", "/openapi.json"):
        head = httpx.head(system["url"] + path, headers=ALICE)
        get = httpx.get(system["url"] + path, headers=ALICE)
        assert head.status_code == get.status_code == 200, path
        assert head.content == b"" and head.headers["content-type"] == get.headers["content-type"]
    r = httpx.request("OPTIONS", system["url"] + "/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["code"] == "method_not_allowed"
    r = httpx.delete(system["url"] + "/healthz")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"
