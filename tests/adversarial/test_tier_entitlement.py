"""Tiers and keys against real router and sim-node processes: a tenant allowed the batched
tier only reaches no other tier by any of the ways a request names one; unknown tier names are
400s; a revoked key stops working, and a broken tenants file revokes nothing and opens
nothing; a reply's `service_tier` is OpenAI's word for the tier, `x-tiergate-tier` its name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from adversarial_helpers import (
    Pool,
    System,
    assert_refused,
    assert_serves,
    bearer,
    chat,
    raw_request,
    running_system,
)
from polling_helpers import until

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

ALICE, BOB, DAVE = (bearer(f"{name}-key-0123456789") for name in ("alice", "bob", "dave"))
BOB_KEY = BOB["authorization"].encode()
CHAT_BYTES = json.dumps(chat("coder", max_tokens=2)).encode()
TENANTS = """\
tenants:
  - {name: alice, apiKeys: [alice-key-0123456789]}
  - {name: bob, apiKeys: [bob-key-0123456789], allowedTiers: [batched]}
"""
DAVE_TOO = TENANTS + "  - {name: dave, apiKeys: [dave-key-0123456789]}\n"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    pools = [
        Pool("b", "batched", "coder"),
        Pool("p", "premium", "coder"),
        Pool("w", "wafer-scale", "coder-spark"),
        Pool("next", "batched", "coder-next", replicas=0),  # made, no endpoint ready yet
    ]
    tmp = tmp_path_factory.mktemp("tiers")
    with running_system(tmp, pools, tenants=DAVE_TOO) as running:
        yield running


def post(
    system: System, body: dict[str, Any] | bytes, headers: dict[str, str], chat_path: bool = True
) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    path = "/v1/chat/completions" if chat_path else "/v1/completions"
    return httpx.post(system.url + path, content=content, headers=headers, timeout=60)


def text(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hi", **fields}


#: (headers, body, chat endpoint, how it names a tier other than batched)
OTHER_TIERS = [
    ({"x-tiergate-tier": "premium"}, chat("coder"), True, "header"),
    ({"x-tiergate-tier": "Premium"}, chat("coder"), True, "header, other case"),
    ({"x-tiergate-tier": "wafer-scale"}, chat("coder-spark"), True, "header, wafer-scale"),
    ({"x-tiergate-tier": "premium"}, text("coder"), False, "header, completions"),
    ({}, chat("coder", speed="fast"), True, "speed"),
    ({}, text("coder", speed="fast"), False, "speed, completions"),
    ({}, chat("coder", service_tier="priority"), True, "service_tier"),
    ({}, text("coder", service_tier="priority"), False, "service_tier, completions"),
    ({}, chat("coder", speed="fast", service_tier="flex"), True, "speed over service_tier"),
    ({}, chat("coder-spark"), True, "a model only wafer-scale serves"),
    ({}, text("coder-spark"), False, "a model only wafer-scale serves, completions"),
    ({"x-tiergate-cascade": "batched>premium"}, chat("coder", tools=TOOLS), True,
     "cascade to premium"),
    ({"x-tiergate-cascade": "wafer-scale>batched"}, chat("coder", tools=TOOLS), True,
     "cascade from wafer-scale"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("headers", "body", "chat_path"), [pytest.param(*c[:3], id=c[3]) for c in OTHER_TIERS]
)
def test_a_tenant_allowed_batched_reaches_no_other_tier(
    system: System, headers: dict[str, str], body: dict[str, Any], chat_path: bool
) -> None:
    error = assert_refused(
        post(system, body, {**BOB, **headers}, chat_path), 403, "tier_not_allowed", system
    )
    assert error["type"] == "permission_error" and "allowed tiers: batched" in error["message"]
    assert_serves(system, BOB, "coder")


def test_a_tier_header_padded_with_blanks_is_still_checked(system: System) -> None:
    """Blanks around a header's value are not part of it (RFC 9110): the router reads the
    tier, and checks it."""
    headers = [(b"x-tiergate-tier", b" \t PREMIUM \t "), (b"authorization", BOB_KEY)]
    r = raw_request(system.url, "POST", "/v1/chat/completions", headers, CHAT_BYTES)
    assert_refused(r, 403, "tier_not_allowed", system)
    assert_serves(system, BOB, "coder")


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        pytest.param({}, chat("coder", service_tier="auto"), id="auto"),
        pytest.param({}, chat("coder", service_tier="flex"), id="flex"),
        pytest.param(
            {"x-tiergate-tier": "batched"}, chat("coder", speed="fast"), id="the header over speed"
        ),  # fmt: skip
        pytest.param(
            {"x-tiergate-cascade": "premium>wafer-scale"},
            chat("coder"),
            id="a cascade without tools (not a cascade)",
        ),  # fmt: skip
        pytest.param(
            {},
            b'{"model": "coder", "messages": [{"role": "user", "content": "hi"}], '
            b'"service_tier": "priority", "service_tier": "default"}',
            id="a repeated key, the last one batched",
        ),  # fmt: skip
    ],
)
def test_what_a_batched_tenant_may_ask_is_served_on_batched(
    system: System, headers: dict[str, str], body: dict[str, Any] | bytes
) -> None:
    r = post(system, body, {**BOB, **headers})
    assert r.status_code == 200, r.text
    assert r.headers["x-tiergate-tier"] == "batched"


def test_a_repeated_key_naming_premium_last_is_refused(system: System) -> None:
    """The router reads what JSON parsers read (the last of repeated keys)."""
    body = (
        b'{"model": "coder", "messages": [{"role": "user", "content": "hi"}], '
        b'"service_tier": "default", "service_tier": "priority"}'
    )
    assert_refused(post(system, body, BOB), 403, "tier_not_allowed", system)
    assert_serves(system, BOB, "coder")


def test_a_repeated_tier_header_cannot_name_a_tier_unchecked(system: System) -> None:
    with httpx.Client(timeout=60) as client:
        request = client.build_request(
            "POST",
            system.url + "/v1/chat/completions",
            json=chat("coder", max_tokens=2),
            headers=[
                ("x-tiergate-tier", "batched"),
                ("x-tiergate-tier", "premium"),
                ("authorization", BOB["authorization"]),
            ],  # fmt: skip
        )
        r = client.send(request)
    # The router reads both, as one value (RFC 9110): no tier of that name, whatever order.
    error = assert_refused(r, 400, "unknown_tier", system)
    assert error["param"] == "x-tiergate-tier", error


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({"x-tiergate-tier": "turbo"}, chat("coder"), "x-tiergate-tier"),
        ({"x-tiergate-tier": ""}, chat("coder"), "x-tiergate-tier"),
        ({"x-tiergate-tier": "pre mium"}, chat("coder"), "x-tiergate-tier"),
        ({}, chat("coder", speed="ludicrous"), "speed"),
        ({}, chat("coder", speed=1), "speed"),
        ({}, chat("coder", service_tier="turbo"), "service_tier"),
        ({}, chat("coder", service_tier=["priority"]), "service_tier"),
        ({"x-tiergate-cascade": "premium"}, chat("coder", tools=TOOLS), "x-tiergate-cascade"),
        ({"x-tiergate-cascade": "premium>premium"}, chat("coder", tools=TOOLS),
         "x-tiergate-cascade"),
        ({"x-tiergate-cascade": "batched>turbo"}, chat("coder", tools=TOOLS),
         "x-tiergate-cascade"),
    ],
)  # fmt: skip
def test_an_unknown_tier_is_a_400_naming_where_it_was(
    system: System, headers: dict[str, str], body: dict[str, Any], param: str
) -> None:
    error = assert_refused(post(system, body, {**ALICE, **headers}), 400, None, system)
    assert error["code"] in ("unknown_tier", "invalid_cascade", "invalid_request")
    assert error["param"] == param
    assert_serves(system, ALICE, "coder")


@pytest.mark.parametrize(
    ("headers", "body", "tier", "service_tier"),
    [
        ({}, chat("coder"), "batched", "default"),
        ({}, chat("coder", service_tier="flex"), "batched", "flex"),
        ({}, chat("coder", service_tier="priority"), "premium", "priority"),
        ({"x-tiergate-tier": "premium"}, chat("coder"), "premium", "priority"),
        ({}, chat("coder", speed="fast"), "premium", "priority"),
        ({}, chat("coder-spark"), "wafer-scale", "default"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_s_service_tier_is_openai_s_word_and_the_header_the_tier(
    system: System,
    headers: dict[str, str],
    body: dict[str, Any],
    tier: str,
    service_tier: str,
    stream: bool,
) -> None:
    r = post(system, {**body, "max_tokens": 2, "stream": stream}, {**ALICE, **headers})
    assert r.status_code == 200, r.text
    assert r.headers["x-tiergate-tier"] == tier
    if stream:
        events = [x[6:] for x in r.text.splitlines() if x.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert {json.loads(e)["service_tier"] for e in events[:-1]} == {service_tier}
    else:
        assert r.json()["service_tier"] == service_tier


def test_a_served_name_with_no_endpoint_ready_is_a_503_with_retry_after(system: System) -> None:
    """A pool made and not yet ready (tests/router/discovery/test_kube_router.py: a name a
    rollout is bringing): the client is told to come back, not that it asked for something wrong."""
    r = post(system, chat("coder-next"), ALICE)
    assert_refused(r, 503, "no_capacity", system)
    assert r.headers["retry-after"] == "1"
    assert_serves(system, ALICE, "coder")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        b"",
        b"Bearer",
        b"Bearer ",
        b"Bearer nope",
        b"Bearer alice-key-012345678",  # one character short
        b"Bearer alice-key-0123456789x",
        b"Bearer alice-key-0123456789 alice-key-0123456789",
        b"Bearer alice-key-0123456789,alice-key-0123456789",
        b"Basic YWxpY2U6YWxpY2Uta2V5LTAxMjM0NTY3ODk=",
        b"alice-key-0123456789",
        b"Bearer ALICE-KEY-0123456789",
        b"Bearer alice-key-0123456789\xff",
        b"Bearer " + b"a" * 60000,
    ],
)
def test_anything_but_a_known_key_is_a_401_that_echoes_nothing(
    system: System, authorization: bytes | None
) -> None:
    headers = [] if authorization is None else [(b"authorization", authorization)]
    for method, path, body in [("POST", "/v1/chat/completions", CHAT_BYTES),
                               ("GET", "/v1/usage", b"")]:  # fmt: skip
        r = raw_request(system.url, method, path, headers, body)
        error = assert_refused(r, 401, None, system)
        assert error["code"] in ("missing_api_key", "invalid_api_key")
        assert error["type"] == "authentication_error"
        assert "key-0123456789" not in r.text.lower() and "nope" not in r.text
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert_serves(system, ALICE, "coder")


def test_a_revoked_key_stops_working_and_a_broken_file_changes_nothing(system: System) -> None:
    assert_serves(system, DAVE, "coder")
    system.tenants.write_text(TENANTS)  # dave's key revoked
    until(lambda: post(system, chat("coder"), DAVE).status_code == 401, "dave still served")
    assert_refused(post(system, chat("coder"), DAVE), 401, "invalid_api_key", system)
    assert httpx.get(system.url + "/v1/usage", headers=DAVE).status_code == 401
    assert_serves(system, ALICE, "coder")

    reloads = system.log().count("event=tenants_reloaded")
    for broken in ("tenants: [", "tenants: []\n", "tenants:\n  - {name: x}\n", ""):
        failed = system.log().count("event=tenants_reload_failed")
        system.tenants.write_text(broken)
        until(lambda: system.log().count("event=tenants_reload_failed") > failed,  # noqa: B023
              f"{broken!r} was not refused")  # fmt: skip
        # The tenants before it hold: no key revoked, none added, authentication still on.
        assert_serves(system, ALICE, "coder")
        assert_refused(post(system, chat("coder"), DAVE), 401, "invalid_api_key", system)
        assert_refused(post(system, chat("coder"), {}), 401, "missing_api_key", system)
        assert_refused(post(system, chat("coder", speed="fast"), BOB), 403, "tier_not_allowed")
    assert system.log().count("event=tenants_reloaded") == reloads
    system.tenants.write_text(DAVE_TOO)
    until(lambda: post(system, chat("coder", max_tokens=1), DAVE).status_code == 200,
          "dave's key not restored")  # fmt: skip
