"""/openapi.json describes what the router accepts: every body the document allows for a
completion endpoint, generated from the document itself, is accepted by the router's own
parsing, and the bodies it refuses are refused by the document too."""

from __future__ import annotations

import json
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tiergate.router.base.errors import RouterError
from tiergate.router.base.tiers import resolve_tier
from tiergate.router.http.openapi import openapi_document
from tiergate.router.request.body import parse_completion, upstream_body

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

SCHEMA = schemathesis.openapi.from_dict(openapi_document())
ENDPOINTS = [("/v1/chat/completions", True), ("/v1/completions", False)]


@pytest.mark.parametrize(("path", "chat"), ENDPOINTS)
def test_every_body_the_document_allows_is_accepted(path: str, chat: bool) -> None:
    cases = SCHEMA[path]["POST"].as_strategy()

    @settings(
        max_examples=150,
        derandomize=True,  # the same bodies every run
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(cases)
    def accepted(case: Any) -> None:
        parse_completion(json.dumps(case.body).encode(), chat=chat)

    accepted()


def _document_allows(path: str, body: dict[str, Any]) -> bool:
    document = openapi_document()
    ref = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    validator = Draft202012Validator({**ref, "components": document["components"]})
    return validator.is_valid(body)


@pytest.mark.parametrize(
    "extra",
    [
        {"model": ""},
        {"model": 7},
        {"stream": "true"},
        {"stream": True, "stream_options": {"include_usage": "yes"}},
        {"max_tokens": 0},
        {"max_tokens": "5"},
        {"max_completion_tokens": 2**31},
        {"n": 0},
        {"service_tier": "turbo"},
        {"speed": "ludicrous"},
    ],
)
@pytest.mark.parametrize(("path", "chat"), ENDPOINTS)
def test_what_the_router_refuses_the_document_refuses(
    path: str, chat: bool, extra: dict[str, Any]
) -> None:
    fine = {"model": "m", **({"messages": [{"role": "user", "content": "hi"}]} if chat else {})}
    fine = {**fine, **({} if chat else {"prompt": "hi"})}
    assert _document_allows(path, fine)
    body = {**fine, **extra}
    refused_by_router = False
    try:  # what the router reads itself: the body, then the tier it asks for
        request = parse_completion(json.dumps(body).encode(), chat=chat)
        resolve_tier({}, request.body, ())
    except RouterError as error:
        assert error.status == 400
        refused_by_router = True
    assert refused_by_router
    assert not _document_allows(path, body)


@given(st.integers(min_value=1, max_value=2**31 - 1))
@settings(max_examples=25, derandomize=True, database=None)
def test_whole_numbers_written_as_floats_are_sent_to_the_node_as_integers(cap: int) -> None:
    raw = json.dumps({"model": "m", "prompt": "hi", "max_tokens": float(cap)}).encode()
    sent = json.loads(upstream_body(parse_completion(raw, chat=False)))
    assert sent["max_tokens"] == cap and type(sent["max_tokens"]) is int
