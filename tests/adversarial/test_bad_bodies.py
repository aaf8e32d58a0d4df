"""Bodies no client library would send: broken JSON and UTF-8, numbers and nesting that break
parsers, huge or lying sizes, fields of the wrong type. Each is refused by the real router
process with the OpenAI error envelope, and a stream it had already accepted, and the next
legitimate request, are served whole."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from adversarial_helpers import (
    Pool,
    System,
    assert_refused,
    assert_serves,
    bearer,
    chat,
    in_flight_stream,
    one_reply,
    running_system,
)

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

ALICE = bearer("alice-key-0123456789")
TENANTS = "tenants:\n  - {name: alice, apiKeys: [alice-key-0123456789]}\n"
#: The router's default body limit (router.maxBodyBytes).
LIMIT = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    tmp = tmp_path_factory.mktemp("bad-bodies")
    with running_system(tmp, [Pool("b", "batched", "coder")], tenants=TENANTS) as running:
        yield running


def raw(body: dict[str, object]) -> bytes:
    return json.dumps(body).encode()


def nested(depth: int, leaf: bytes = b"{}") -> bytes:
    return b'{"d":' * depth + leaf + b"}" * depth


CHAT = raw(chat("coder", max_tokens=2))
HEAD = CHAT[:-1]  # a chat body, open for one more field

#: (path, body, status, code, what it attacks)
CASES = [
    ("chat", b"{not json", 400, "invalid_request", "not JSON"),
    ("chat", b"", 400, "invalid_request", "empty"),
    ("chat", b"[1, 2]", 400, "invalid_request", "not an object"),
    ("chat", b"null", 400, "invalid_request", "null"),
    ("chat", HEAD + b', "user": "\xff\xfe"}', 400, "invalid_request", "invalid UTF-8"),
    ("chat", HEAD + b', "user": "\\ud800"}', 400, "invalid_request", "lone surrogate"),
    ("chat", b"\xef\xbb\xbf\xef\xbb\xbf" + CHAT, 400, "invalid_request", "two byte-order marks"),
    ("chat", HEAD + b', "temperature": NaN}', 400, "invalid_request", "NaN"),
    ("chat", HEAD + b', "top_p": -Infinity}', 400, "invalid_request", "Infinity"),
    ("chat", HEAD + b', "x": 1e400}', 400, "invalid_request", "a float JSON overflows"),
    ("chat", HEAD + b', "seed": ' + b"9" * 4301 + b"}", 400, "invalid_request",
     "an integer Python will not read"),
    ("chat", HEAD + b', "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "invalid_request",
     "arrays nested 100,000 deep"),
    ("chat", HEAD + b', "x": ' + nested(1030) + b"}", 400, "invalid_request",
     "objects nested 1,030 deep"),
    ("chat", HEAD + b', "stream": true, "stream_options": {}, "x": ' + nested(1000) + b"}", 400,
     "invalid_request", "a stream the router must rewrite, nested 1,000 deep"),
    ("chat", raw({**chat("coder"), "model": ""}), 400, "invalid_request", "model empty"),
    ("chat", raw({**chat("coder"), "model": 7}), 400, "invalid_request", "model a number"),
    ("chat", raw({**chat("coder"), "model": ["coder"]}), 400, "invalid_request", "model a list"),
    ("chat", raw({"model": "coder", "messages": []}), 400, "invalid_request", "no messages"),
    ("chat", raw({"model": "coder", "messages": "hi"}), 400, "invalid_request", "messages text"),
    ("chat", raw(chat("coder", stream=True, stream_options={"include_usage": "yes"})), 400,
     "invalid_request", "include_usage a string"),
    ("chat", raw(chat("coder", stream="true")), 400, "invalid_request", "stream a string"),
    ("chat", raw(chat("coder", max_tokens="5")), 400, "invalid_request", "cap a string"),
    ("chat", raw(chat("coder", max_tokens=True)), 400, "invalid_request", "cap a boolean"),
    ("chat", raw(chat("coder", max_tokens=-1)), 400, "invalid_request", "cap negative"),
    ("chat", raw(chat("coder", max_tokens=2**31)), 400, "invalid_request", "cap past int32"),
    ("chat", raw(chat("coder", max_tokens=2.5)), 400, "invalid_request", "cap a fraction"),
    ("chat", raw(chat("coder", n=0)), 400, "invalid_request", "n zero"),
    ("chat", raw(chat("coder", n=10**6)), 400, "invalid_request", "n a million"),
    ("chat", raw(chat("coder", max_tokens=10_000_000)), 400, "context_length_exceeded",
     "a cap past the model's context (the node's refusal, passed on)"),
    ("chat", raw(chat("gpt-9")), 404, "model_not_found", "a model not served"),
    ("completions", raw({"model": "coder", "prompt": [1, -2]}), 400, "invalid_request",
     "a negative token id"),
    ("completions", raw({"model": "coder", "prompt": [[]]}), 400, "invalid_request",
     "an empty token list"),
    ("completions", raw({"model": "coder", "prompt": {"text": "hi"}}), 400, "invalid_request",
     "a prompt object"),
    ("completions", raw({"model": "coder", "prompt": "hi", "best_of": -1}), 400,
     "invalid_request", "best_of negative"),
    ("chat", HEAD + b', "user": "' + b"x" * (LIMIT + 1) + b'"}', 413, "request_too_large",
     "a body over the limit"),
]  # fmt: skip


def post(system: System, path: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{system.url}/v1/{'chat/completions' if path == 'chat' else 'completions'}",
        content=body,
        headers={**ALICE, "content-type": "application/json"},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [pytest.param(*case[:4], id=case[4]) for case in CASES],
)
def test_a_bad_body_is_refused_and_the_next_request_served(
    system: System, path: str, body: bytes, status: int, code: str
) -> None:
    assert_refused(post(system, path, body), status, code, system)
    assert_serves(system, ALICE, "coder")


def test_a_stream_accepted_before_every_bad_body_ends_whole(system: System) -> None:
    # 4,000 tokens: some seconds of decoding, the bad bodies sent meanwhile.
    with in_flight_stream(system, ALICE, "coder", tokens=4000):
        for path, body, status, _, _ in CASES:
            assert post(system, path, body).status_code == status


def test_a_body_over_the_limit_sent_in_chunks_is_refused(system: System) -> None:
    """No Content-Length to refuse it by: counted as it arrives."""

    def chunks() -> Iterator[bytes]:
        yield HEAD + b', "user": "'
        for _ in range(LIMIT // 65536 + 1):
            yield b"x" * 65536
        yield b'"}'

    r = httpx.post(system.url + "/v1/chat/completions", content=chunks(), headers=ALICE)
    assert_refused(r, 413, "request_too_large", system)
    assert_serves(system, ALICE, "coder")


def test_a_content_length_of_a_petabyte_is_refused_before_any_body(system: System) -> None:
    parts = urlsplit(system.url)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: router\r\n"
        b"authorization: " + ALICE["authorization"].encode() + b"\r\n"
        b"content-type: application/json\r\ncontent-length: 1000000000000000\r\n\r\n"
    )
    with socket.create_connection((parts.hostname, parts.port), timeout=15) as sock:
        sock.sendall(head)  # and no body: the reply comes without waiting for one
        reply = one_reply(sock)
    assert_refused(reply, 413, "request_too_large", system)
    assert_serves(system, ALICE, "coder")


@pytest.mark.parametrize("depth", [513, 990, 1000, 1023])
@pytest.mark.parametrize("stream", [False, True])
def test_nesting_deeper_than_the_node_reads_is_the_router_s_400(
    system: System, depth: int, stream: bool
) -> None:
    """orjson reads 1,023 levels, Python's json (the node's) fewer: the router refuses a body
    past the limit both share (512 levels) itself, saying why, rather than forwarding it and
    passing on the node's "could not parse"."""
    body = HEAD + (b', "stream": true' if stream else b"") + b', "x": ' + nested(depth) + b"}"
    r = httpx.post(system.url + "/v1/chat/completions", content=body, headers=ALICE, timeout=60)
    error = assert_refused(r, 400, "invalid_request", system)
    assert "more than 512 levels deep" in error["message"], error
    assert_serves(system, ALICE, "coder")


@pytest.mark.parametrize("field", ["x", "tools"])
def test_a_body_of_a_million_arrays_is_refused_without_stalling_the_router(
    system: System, field: str
) -> None:
    """4 MiB of empty arrays is 1.3 million of them: walking each (their depth, a prompt
    each) took seconds of the router's one event loop per request, and every other request
    waited. A body holds at most 50,000 arrays and objects."""
    body = HEAD + f', "{field}": ['.encode() + b"[]," * 1_300_000 + b"[]]}"
    r = httpx.post(system.url + "/v1/chat/completions", content=body, headers=ALICE, timeout=60)
    error = assert_refused(r, 400, "invalid_request", system)
    assert "holds more than 50,000 arrays and objects" in error["message"], error
    assert_serves(system, ALICE, "coder")


def test_nesting_up_to_the_limit_is_served(system: System) -> None:
    body = HEAD + b', "x": ' + nested(510) + b"}"  # 512 levels, the body and the leaf too
    r = httpx.post(system.url + "/v1/chat/completions", content=body, headers=ALICE, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\xef\xbb\xbf" + CHAT, id="a byte-order mark"),
        pytest.param(HEAD + b', "x": ' + nested(300) + b"}", id="a field nested 300 deep"),
        pytest.param(
            HEAD + b', "stream": true, "x": ' + nested(300) + b"}", id="a stream nested 300 deep"
        ),
        pytest.param(HEAD + b', "user": "\\ud83d\\ude00 \\u00e9"}', id="escaped non-ASCII"),
        pytest.param(HEAD + b', "seed": 18446744073709551616}', id="a seed past 64 bits"),
    ],
)
def test_odd_but_valid_json_is_served(system: System, body: bytes) -> None:
    """What JSON allows, however odd, the router reads as JSON does and the node is sent."""
    r = httpx.post(
        system.url + "/v1/chat/completions",
        content=body,
        headers={**ALICE, "content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    if b'"stream": true' in body:
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
    else:
        assert r.json()["choices"][0]["message"]["content"]
