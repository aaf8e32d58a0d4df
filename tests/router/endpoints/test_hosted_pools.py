"""Hosted pools against a real router process and two fake providers on loopback ports: the
router sends the provider's key and model name (never the tenant's key), asks a stream for its
usage the way OpenAI's API does, bills at the pool's stated price from the provider's usage,
never scrapes a provider, logs no key, and fails over from a provider that errs or hangs,
ejecting it. Bad hosted pools in a file stop the CLI with one line."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_provider import COMPLETION_TOKENS, PROMPT_TOKENS, Provider, running_provider
from polling_helpers import until
from process_helpers import Running, start_ready_router

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

TENANT_KEY = "tenant-key-0123456789abcdef"
KEYS = {"a": "sk-provider-a-secret-0123456789", "b": "sk-provider-b-secret-9876543210"}
INPUT_USD, OUTPUT_USD = 2.0, 10.0  # per million tokens
COST_USD = (PROMPT_TOKENS * INPUT_USD + COMPLETION_TOKENS * OUTPUT_USD) / 1e6
TENANT = {"authorization": f"Bearer {TENANT_KEY}"}
#: A tenant whose budget caps a request that sets no cap of its own.
THRIFTY_KEY = "thrifty-key-0123456789abcdef"


@dataclass
class Hosted:
    url: str
    router: Running
    providers: dict[str, Provider]
    ledger: Path

    def chat(self, headers: dict[str, str] | None = None, **fields: Any) -> httpx.Response:
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **fields}
        return httpx.post(self.url + "/v1/chat/completions", json=body,
                          headers={**TENANT, **(headers or {})}, timeout=30)  # fmt: skip

    def provider_of(self, reply: httpx.Response | httpx.Headers) -> Provider:
        """The provider that served a reply (its response, or its headers)."""
        headers = reply if isinstance(reply, httpx.Headers) else reply.headers
        return self.providers[headers["x-tiergate-pool"].removeprefix("hosted-")]

    def stream(self, **fields: Any) -> tuple[list[str], httpx.Headers]:
        """A streamed chat request's `data:` payloads, and the reply's headers."""
        body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}],
                "stream": True, **fields}  # fmt: skip
        with httpx.stream(
            "POST", self.url + "/v1/chat/completions", json=body, headers=TENANT, timeout=30
        ) as reply:
            assert reply.status_code == 200, reply.read()
            events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
        return events, reply.headers


def pool_yaml(name: str, provider: Provider, key_file: Path, timeout_s: float) -> str:
    endpoint = (
        f"{{url: {json.dumps(provider.url)}, model: {provider.model}, "
        f"apiKeyFile: {json.dumps(str(key_file))}, timeoutS: {timeout_s}, "
        f"outputCapField: {provider.cap_field}}}"
    )
    return (
        f"  - {{name: hosted-{name}, tier: batched, model: llama-3.1-8b, servedModelName: chat, "
        f"billing: {{inputPerMillionUsd: {INPUT_USD}, outputPerMillionUsd: {OUTPUT_USD}}}, "
        f"endpoint: {endpoint}}}\n"
    )


@pytest.fixture(scope="module")
def hosted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosted]:
    tmp = tmp_path_factory.mktemp("hosted")
    with (
        running_provider(KEYS["a"], "prov-model-a") as a,
        running_provider(KEYS["b"], "prov-model-b", cap_field="max_tokens") as b,
    ):
        (tmp / "tenants.yaml").write_text(
            f"tenants:\n  - {{name: acme, apiKeys: [{TENANT_KEY}]}}\n"
            f"  - {{name: thrifty, apiKeys: [{THRIFTY_KEY}], budgetUsd: 0.5}}\n"
        )
        pools = ""
        for name, provider in (("a", a), ("b", b)):
            key_file = tmp / f"{name}.key"
            key_file.write_text(KEYS[name] + "\n")
            pools += pool_yaml(name, provider, key_file, 0.5 if name == "a" else 5.0)
        config = tmp / "router.yaml"
        config.write_text(
            f"router: {{ledgerPath: {tmp / 'ledger.sqlite'}, tenantsFile: {tmp / 'tenants.yaml'},"
            " scrapeIntervalS: 0.1, wholeReplyTimeoutS: 2}\npools:\n" + pools
        )
        router = start_ready_router(config, tmp / "router.log", "--log-level", "debug")
        try:
            yield Hosted(router.url, router, {"a": a, "b": b}, tmp / "ledger.sqlite")
        finally:
            router.stop()


def billed(hosted: Hosted, request_id: str) -> tuple[int, int, float]:
    rows: list[tuple[int, int, float]] = []
    query = (
        "SELECT prompt_tokens, completion_tokens, cost_usd FROM usage "
        "WHERE request_id = ? AND outcome = 'ok'"
    )

    def written() -> bool:
        with contextlib.closing(sqlite3.connect(hosted.ledger)) as db:
            rows[:] = db.execute(query, (request_id,)).fetchall()
        return bool(rows)

    until(written, "the request was never billed", 30)
    return rows[0]


def test_the_provider_gets_its_key_and_model_and_never_the_tenants_key(hosted: Hosted) -> None:
    reply = hosted.chat(max_tokens=5)
    assert reply.status_code == 200, reply.text
    provider = hosted.provider_of(reply)
    sent = provider.requests()[-1]
    assert sent.headers["authorization"] == f"Bearer {provider.key}"
    assert sent.body is not None and sent.body["model"] == provider.model
    assert not any(TENANT_KEY in value for value in sent.headers.values()), sent.headers
    assert not any(k.lower().startswith("x-tiergate") for k in sent.headers), sent.headers
    assert reply.json()["model"] == "chat"  # the name the client asked for, not the provider's


@pytest.mark.parametrize("cap", ["max_tokens", "max_completion_tokens", "both", "budget"])
def test_the_output_cap_reaches_each_provider_in_the_one_spelling_it_takes(
    hosted: Hosted, cap: str
) -> None:
    """Provider a takes max_completion_tokens alone (as OpenAI's reasoning models do), b
    max_tokens alone; either refuses the other. Whichever the client wrote, or the cap a
    tenant's budget sets, each gets the cap in its own."""
    fields: dict[str, int] = {"max_tokens": 7, "max_completion_tokens": 7}
    given = {"both": fields, "budget": {}}.get(cap, {cap: 7})
    key = THRIFTY_KEY if cap == "budget" else TENANT_KEY
    served: set[str] = set()
    for _ in range(40):  # until both providers have served it
        reply = hosted.chat({"authorization": f"Bearer {key}"}, **given)
        assert reply.status_code == 200, reply.text
        provider = hosted.provider_of(reply)
        sent = provider.requests()[-1].body
        assert sent is not None and set(fields) & set(sent) == {provider.cap_field}, sent
        assert sent[provider.cap_field] == 7 or cap == "budget", sent
        served.add(provider.model)
        if len(served) == 2:
            return
    pytest.fail(f"only {served} served it")


def test_the_provider_is_never_asked_for_its_priority_price_or_to_keep_the_prompt(
    hosted: Hosted,
) -> None:
    """`service_tier: priority` would be billed by the provider at its priority price while
    the router bills the tier it served; `store` would keep the tenant's prompts in the
    operator's account. Neither, nor `metadata`, reaches the provider (the tier is the
    header's, which the body's `service_tier` does not override)."""
    reply = hosted.chat(
        {"x-tiergate-tier": "batched"},
        max_tokens=5, service_tier="priority", store=True, metadata={"x": "y"},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    sent = hosted.provider_of(reply).requests()[-1].body
    assert sent is not None and sent["messages"] == [{"role": "user", "content": "hi"}]
    assert not {"service_tier", "store", "metadata"} & set(sent), sent


def test_a_whole_reply_is_billed_at_the_stated_price_from_the_providers_usage(
    hosted: Hosted,
) -> None:
    reply = hosted.chat(max_tokens=COMPLETION_TOKENS)  # the most the provider may produce
    assert reply.status_code == 200, reply.text
    usage = reply.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (PROMPT_TOKENS,
                                                                    COMPLETION_TOKENS)  # fmt: skip
    assert usage["cost_usd"] == pytest.approx(COST_USD)
    assert float(reply.headers["x-tiergate-cost-usd"]) == pytest.approx(COST_USD)
    prompt, completion, cost = billed(hosted, reply.headers["x-tiergate-request-id"])
    assert (prompt, completion) == (PROMPT_TOKENS, COMPLETION_TOKENS)
    assert cost == pytest.approx(COST_USD)


def test_a_stream_asks_for_usage_as_openai_does_and_is_billed_from_its_last_chunk(
    hosted: Hosted,
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    events, headers = hosted.stream(stream_options=options)
    request_id = headers["x-tiergate-request-id"]
    provider = hosted.provider_of(headers)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]) == "hello"
    assert {c["model"] for c in chunks} == {"chat"}
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["cost_usd"] == pytest.approx(COST_USD)
    sent = provider.requests()[-1].body
    assert sent is not None and sent["stream_options"] == {"include_usage": True}
    assert billed(hosted, request_id)[2] == pytest.approx(COST_USD)


def test_a_stream_that_did_not_ask_for_usage_gets_none_and_is_billed_all_the_same(
    hosted: Hosted,
) -> None:
    events, headers = hosted.stream()
    request_id = headers["x-tiergate-request-id"]
    assert all("usage" not in json.loads(e) or not json.loads(e)["usage"] for e in events[:-1])
    assert billed(hosted, request_id)[2] == pytest.approx(COST_USD)


def test_a_provider_s_error_chunk_ends_the_stream_in_the_client_s_model_name(
    hosted: Hosted,
) -> None:
    """OpenRouter's mid-stream error: a chunk with `error` beside its choices, then the end
    of the stream. The client gets it as the stream's end, naming the model it asked for; the
    router adds no error of its own and bills what was relayed as a stream that failed."""
    for provider in hosted.providers.values():
        provider.fail = "error-chunk"
    try:
        events, headers = hosted.stream()
        request_id = headers["x-tiergate-request-id"]
    finally:
        for provider in hosted.providers.values():
            provider.fail = None
    first, last = (json.loads(e) for e in events)  # the token, then the error: nothing else
    assert first["choices"][0]["delta"]["content"] == "hel"
    assert last["error"] == {"code": 502, "message": "chat disconnected"}, last
    assert last["model"] == "chat" and last["service_tier"] == "default"
    assert last["choices"][0]["finish_reason"] == "error"
    query = "SELECT outcome, completion_tokens FROM usage WHERE request_id = ?"
    rows: list[tuple[str, int]] = []

    def written() -> bool:
        with contextlib.closing(sqlite3.connect(hosted.ledger)) as db:
            rows[:] = db.execute(query, (request_id,)).fetchall()
        return bool(rows) and rows[-1][0] != "incomplete"

    until(written, "the stream was never billed", 30)
    assert rows[-1] == ("error", 1), rows  # its one token, at the pool's price


def test_a_provider_is_never_scraped(hosted: Hosted) -> None:
    reply = hosted.chat(max_tokens=5)
    assert reply.status_code == 200, reply.text
    ledger_rounds = hosted.router.log_text().count("event=")  # the router has been running
    assert ledger_rounds > 0
    for provider in hosted.providers.values():
        assert provider.paths() <= {"/v1/chat/completions"}, provider.paths()


def test_a_stream_that_does_not_begin_within_the_timeout_fails_over(hosted: Hosted) -> None:
    a = hosted.providers["a"]
    a.fail, a.hang_s = "hang", 3.0  # its timeout is 0.5 s
    try:
        before = len(a.requests())

        def a_was_tried() -> bool:
            started = time.monotonic()
            reply = hosted.chat(max_tokens=5, stream=True)
            assert reply.status_code == 200, reply.text
            assert reply.headers["x-tiergate-pool"] == "hosted-b"
            assert time.monotonic() - started < 2.5  # a's timeout, not its late reply
            return len(a.requests()) > before

        until(a_was_tried, "provider a was never tried", 60)
    finally:
        a.fail = None


def served_by_b(hosted: Hosted) -> None:
    """A chat, served whole by provider b (a failing or ejected: the router went to b)."""
    reply = hosted.chat(max_tokens=5)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-tiergate-pool"] == "hosted-b"


def test_a_cdn_s_5xx_in_front_of_a_provider_fails_over(hosted: Hosted) -> None:
    """Cloudflare answers 520-524 for the provider behind it: the provider's failure."""
    a = hosted.providers["a"]
    a.fail = 522
    try:
        before = len(a.requests())

        def a_was_tried() -> bool:
            served_by_b(hosted)
            return len(a.requests()) > before

        until(a_was_tried, "provider a was never tried", 60)
    finally:
        a.fail = None


def test_a_provider_s_404_is_logged_for_the_operator(hosted: Hosted) -> None:
    """The client names neither the provider's path nor its model: a 404 says the pool's
    endpoint is wrong, which the log tells whoever runs the router (the key never)."""
    with refusing(hosted, 404, message="The model `{model}` does not exist"):
        reply = hosted.chat(max_tokens=5)
    assert reply.status_code == 404, reply.text
    pool = reply.headers["x-tiergate-pool"]

    def logged() -> bool:
        return f"event=provider_not_found pool={pool} status=404" in hosted.router.log.read_text()

    until(logged, "the provider's 404 was not logged")
    assert not any(key in hosted.router.log.read_text() for key in KEYS.values())


def test_a_whole_reply_longer_than_the_timeout_is_awaited_and_sent_nowhere_else(
    hosted: Hosted,
) -> None:
    """A whole reply begins once generated: a provider generating for longer than its
    timeoutS is not failing, and another would generate (and charge) it again."""
    a, b = hosted.providers["a"], hosted.providers["b"]
    a.fail, a.hang_s = "slow", 1.0  # past its 0.5 s timeoutS, within wholeReplyTimeoutS 2
    try:

        def served_by_a() -> bool:
            asked_b = len(b.requests())
            reply = hosted.chat(max_tokens=5)
            assert reply.status_code == 200, reply.text
            if reply.headers["x-tiergate-pool"] != "hosted-a":
                return False
            assert len(b.requests()) == asked_b, "sent to b as well"
            return True

        until(served_by_a, "provider a never served a whole reply", 60)
    finally:
        a.fail = None


def test_a_whole_reply_past_the_whole_reply_timeout_is_a_504_sent_nowhere_else(
    hosted: Hosted,
) -> None:
    a, b = hosted.providers["a"], hosted.providers["b"]
    a.fail, a.hang_s = "hang", 3.0  # past wholeReplyTimeoutS 2
    try:

        def timed_out_at_a() -> bool:
            asked_b = len(b.requests())
            reply = hosted.chat(max_tokens=5)
            if reply.status_code == 200:
                return False  # b was picked
            assert reply.status_code == 504, reply.text
            assert reply.json()["error"]["code"] == "upstream_timeout", reply.text
            assert len(b.requests()) == asked_b, "sent to b as well"
            return True

        until(timed_out_at_a, "no whole reply timed out at provider a", 60)
    finally:
        a.fail = None


def test_when_every_provider_fails_the_client_gets_an_openai_error(hosted: Hosted) -> None:
    for provider in hosted.providers.values():
        provider.fail = 502
    try:
        reply = hosted.chat(max_tokens=5)
    finally:
        for provider in hosted.providers.values():
            provider.fail = None
    assert reply.status_code == 503, reply.text
    error = reply.json()["error"]
    assert error["code"] == "upstream_unavailable" and error["type"] == "server_error"
    assert "127.0.0.1" not in reply.text and "prov-model" not in reply.text


def ejected(hosted: Hosted, pool: str) -> bool:
    text = httpx.get(hosted.router.metrics_url, timeout=10).text
    line = f'tiergate_pool_endpoints{{pool="{pool}",state="ejected",tier="batched"}} 1.0'
    return line in text


@pytest.mark.parametrize("status", [400, 404])
def test_a_providers_refusal_names_the_pools_model_and_ejects_nothing(
    hosted: Hosted, status: int
) -> None:
    until(  # no provider ejected: one that failed earlier has served its ejection
        lambda: not ejected(hosted, "hosted-a") and not ejected(hosted, "hosted-b"),
        "a provider stayed ejected",
        150,
    )
    message = "The model `{model}` does not support tools"
    with refusing(hosted, status, message=message, param="{model}"):
        replies = [hosted.chat(max_tokens=5) for _ in range(12)]  # > consecutive failures
        for reply in replies:
            assert reply.status_code == status, reply.text
            assert "prov-model" not in reply.text, reply.text
            error = reply.json()["error"]
            assert error["message"] == "The model `chat` does not support tools", error
            assert error["param"] == "chat" and error["type"] == "invalid_request_error", error
        assert not ejected(hosted, "hosted-a") and not ejected(hosted, "hosted-b")
    served = {hosted.chat(max_tokens=5).headers["x-tiergate-pool"] for _ in range(12)}
    assert served == {"hosted-a", "hosted-b"}  # both still in rotation


def test_a_providers_refusal_that_is_no_envelope_becomes_one(hosted: Hosted) -> None:
    with refusing(hosted, 400, body=b"<html>prov-model-a: bad request</html>"):
        reply = hosted.chat(max_tokens=5)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "HTTP 400" in error["message"], error
    assert "prov-model" not in reply.text


def test_no_key_reaches_the_log(hosted: Hosted) -> None:
    assert hosted.chat(max_tokens=5).status_code == 200
    log = hosted.router.log_text()
    assert "event=" in log  # it logs, at debug level
    for key in (*KEYS.values(), TENANT_KEY):
        assert key not in log


# -- bad files ---------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "tiergate", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


BAD_POOLS = {
    "no key file": (
        "endpoint: {url: 'https://api.example.com/v1', model: m, apiKeyFile: KEY}, "
        "billing: {outputPerMillionUsd: 1}",
        "endpoint.apiKeyFile: cannot read the key file",
    ),
    "no billing": (
        "endpoint: {url: 'https://api.example.com/v1', model: m, apiKeyFile: KEY}",
        "a hosted pool (endpoint) needs billing.outputPerMillionUsd",
    ),
    "no key at all": (
        "endpoint: {url: 'https://api.example.com/v1', model: m}, "
        "billing: {outputPerMillionUsd: 1}",
        "endpoint.apiKeyFile is required",
    ),
    "a Secret in a file": (
        "endpoint: {url: 'https://api.example.com/v1', model: m, "
        "apiKeySecretRef: {name: s, key: k}}, billing: {outputPerMillionUsd: 1}",
        "a router file gives endpoint.apiKeyFile",
    ),
    "an accelerator too": (
        "accelerator: h100-sxm, endpoint: {url: 'https://api.example.com/v1', model: m, "
        "apiKeyFile: KEY}, billing: {outputPerMillionUsd: 1}",
        "accelerator describes the pool's pods or hardware",
    ),
}


@pytest.mark.parametrize("command", ["router", "up"])
@pytest.mark.parametrize("case", list(BAD_POOLS))
def test_a_bad_hosted_pool_stops_the_cli_with_one_line(
    tmp_path: Path, command: str, case: str
) -> None:
    fields, expected = BAD_POOLS[case]
    fields = fields.replace("KEY", str(tmp_path / "missing.key"))
    config = tmp_path / "pools.yaml"
    config.write_text(
        f"router: {{ledgerPath: {tmp_path / 'ledger.sqlite'}}}\n"
        f"pools:\n  - {{name: h, tier: batched, model: llama-3.1-8b, {fields}}}\n"
    )
    done = run_cli(command, "--config", str(config), "--port", "0", "--metrics-port", "0")
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "spec." not in lines[0], lines[0]  # a file's pool has no `spec`: its fields are its own


def _spent(hosted: Hosted) -> float:
    reply = httpx.get(hosted.url + "/v1/usage", headers=TENANT, timeout=10)
    return float(reply.json()["totals"]["cost_usd"])


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (401, None, 503),  # the router's key refused: the provider's failure, not the request's
        (429, None, 503),  # the provider's own limit: tried elsewhere, then unavailable
        (500, None, 503),
        (200, b"}}not json at all", 502),  # garbage with a 200
    ],
    ids=["401", "429", "500", "garbage"],
)
def test_a_provider_that_fails_is_a_clear_envelope_and_bills_nothing(
    hosted: Hosted, status: int, body: bytes | None, expected: int
) -> None:
    """Every provider answering so: the client gets an OpenAI error naming no provider, model
    or key, and the tenant's spend does not move."""
    until(
        lambda: not ejected(hosted, "hosted-a") and not ejected(hosted, "hosted-b"),
        "a provider stayed ejected",
        150,
    )
    before = _spent(hosted)
    with refusing(hosted, status, body=body):
        reply = hosted.chat(max_tokens=5)
    assert reply.status_code == expected, reply.text
    error = reply.json()["error"]
    assert error["type"] == "server_error" and error["message"], error
    for secret in ("prov-model", "127.0.0.1", *KEYS.values()):
        assert secret not in reply.text
    assert _spent(hosted) == before


def test_a_provider_that_fails_is_ejected_and_its_requests_fail_over(hosted: Hosted) -> None:
    """Last in the module: the ejection lasts its 10 s after the test, which a later test
    of this router would wait out first."""
    a = hosted.providers["a"]
    a.fail = 503
    try:
        before = len(a.requests())

        def a_is_ejected() -> bool:
            served_by_b(hosted)
            return ejected(hosted, "hosted-a")

        until(a_is_ejected, "provider a was never ejected", 60)
        assert len(a.requests()) > before
        tried = len(a.requests())
        for _ in range(10):  # ejected: no request goes its way
            served_by_b(hosted)
        assert len(a.requests()) == tried
    finally:
        a.fail = None


@contextlib.contextmanager
def refusing(hosted: Hosted, status: int, **how: Any) -> Iterator[None]:
    """Every provider refuses every request with `status` (as `Provider.fail_*` say)."""
    for provider in hosted.providers.values():
        provider.fail = status
        for field, value in how.items():
            setattr(provider, f"fail_{field}", value)
    try:
        yield
    finally:
        for provider in hosted.providers.values():
            provider.fail, provider.fail_param, provider.fail_body = None, None, None
            provider.fail_message = "the provider is unwell"
