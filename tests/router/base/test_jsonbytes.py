"""JSON on the request path: orjson, and Python's json for what orjson will not do."""

import json

import pytest

from tiergate.router.base.jsonbytes import dumps, loads_reply


def test_nesting_orjson_will_not_write_is_written_by_json() -> None:
    deep: object = "x"
    for _ in range(400):  # orjson writes 254 levels at most
        deep = [deep]
    assert json.loads(dumps({"a": deep})) == {"a": deep}
    assert dumps({"a": 10**30}) == b'{"a":1000000000000000000000000000000}'


def test_a_reply_with_what_python_writes_but_json_forbids_is_written_back_as_it_came() -> None:
    raw = b'{"logprob": -Infinity, "score": NaN, "text": "\\ud800", "n": 1}'
    data, write = loads_reply(raw)
    assert data["logprob"] == float("-inf") and data["n"] == 1
    data["service_tier"] = "batched"
    assert write(data).startswith(b'{"logprob":-Infinity,"score":NaN,"text":"\\ud800"')


def test_a_plain_reply_is_read_and_written_by_orjson() -> None:
    data, write = loads_reply(b'{"text": "caf\xc3\xa9", "n": 1.5}')
    assert write(data) == b'{"text":"caf\xc3\xa9","n":1.5}'


@pytest.mark.parametrize("raw", [b"{", b'{"a": }', b"\xff", b""])
def test_what_is_not_json_by_any_measure_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        loads_reply(raw)


@pytest.mark.usefixtures("router_recursion_limit")
def test_replies_nested_past_what_either_library_reads_or_writes_are_a_value_error() -> None:
    with pytest.raises(ValueError):
        loads_reply(b"[" * 1100 + b"]" * 1100)  # orjson: 1,024 levels; json: recursion limit
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError):
        dumps(deep)
