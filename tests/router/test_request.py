"""What the router sends upstream: the client's bytes unless it must change the body."""

import json

from tiergate.router.request import parse_completion, upstream_body


def test_unchanged_bodies_are_forwarded_byte_for_byte() -> None:
    raw = b'{"model": "m",   "messages": [{"role": "user", "content": "hi"}], "x": 1}'
    assert upstream_body(parse_completion(raw, chat=True)) == raw
    streaming = raw.replace(b'"x": 1', b'"stream": true, "stream_options": {"include_usage": true}')
    assert upstream_body(parse_completion(streaming, chat=True)) == streaming


def test_a_stream_without_usage_is_asked_for_usage_and_keeps_its_other_fields() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "x": 1}'
    sent = json.loads(upstream_body(parse_completion(raw, chat=True)))
    assert sent["stream_options"] == {"include_usage": True}
    assert sent["x"] == 1 and sent["messages"][0]["content"] == "hi"
