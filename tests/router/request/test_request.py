"""What the router sends upstream: the client's bytes unless it must change the body."""

import json
from typing import Any

import pytest

from tiergate.router.base.errors import RouterError
from tiergate.router.request.body import (
    MEDIA_TOKENS,
    MEDIA_TOKENS_MOST,
    cap_output,
    hosted_body,
    parse_completion,
    upstream_body,
)


def test_unchanged_bodies_are_forwarded_byte_for_byte() -> None:
    raw = b'{"model": "m",   "messages": [{"role": "user", "content": "hi"}], "x": 1}'
    assert upstream_body(parse_completion(raw, chat=True)) == raw
    options = b'"stream_options": {"include_usage": true, "continuous_usage_stats": true}'
    streaming = raw.replace(b'"x": 1', b'"stream": true, ' + options)
    assert upstream_body(parse_completion(streaming, chat=True)) == streaming


@pytest.mark.parametrize(
    "options",
    [None, {}, {"include_usage": True}, {"continuous_usage_stats": True},
     {"include_usage": False, "continuous_usage_stats": True}],
)  # fmt: skip
def test_every_stream_asks_the_node_for_the_usage_on_every_chunk(
    options: dict[str, bool] | None,
) -> None:
    # A stream cut short is billed the node's counts of its last chunk, not an estimate.
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"stream": True} | ({"stream_options": options} if options is not None else {})
    request = parse_completion(json.dumps(body).encode(), chat=True)
    assert json.loads(upstream_body(request))["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    # What the client asked for, which is what it gets (vLLM's rule: only with include_usage).
    assert request.include_usage is bool(options and options.get("include_usage"))
    assert request.continuous_usage is False


def test_a_stream_without_usage_is_asked_for_usage_and_keeps_its_other_fields() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, "x": 1}'
    sent = json.loads(upstream_body(parse_completion(raw, chat=True)))
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert sent["x"] == 1 and sent["messages"][0]["content"] == "hi"


def test_token_id_prompts_are_accepted_and_counted_exactly() -> None:
    ids = list(range(100, 1100))  # 1,000 ids: ~4,500 characters written out
    one = parse_completion(json.dumps({"model": "m", "prompt": ids}).encode(), chat=False)
    assert one.prompt_tokens_estimate == 1000
    batch = {"model": "m", "prompt": [ids, [7, 8, 9]]}
    assert parse_completion(json.dumps(batch).encode(), chat=False).prompt_tokens_estimate == 1003
    # Prefix affinity: the same leading ids give the same prefix, whatever follows.
    other_end = parse_completion(
        json.dumps({"model": "m", "prompt": ids[:900] + [1] * 100}).encode(), chat=False
    )
    assert other_end.prefix_text == one.prefix_text and one.prefix_text.startswith("100 101 ")
    assert (
        parse_completion(b'{"model": "m", "prompt": [0]}', chat=False).prompt_tokens_estimate == 1
    )


def test_every_content_part_with_text_counts_in_the_prompt_estimate() -> None:
    # The node counts the text of any part (`input_text` too): so does the router's estimate.
    parts = [{"type": "input_text", "text": "a" * 400}, {"type": "text", "text": "b" * 400},
             {"type": "image_url", "image_url": {"url": "x" * 4000}}]  # fmt: skip
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    request = parse_completion(json.dumps(body).encode(), chat=True)
    assert request.prompt_tokens_estimate == 200 + MEDIA_TOKENS  # and the image
    bad = {"model": "m", "messages": [{"role": "user", "content": [{"type": "x", "text": 5}]}]}
    with pytest.raises(RouterError):  # the node refuses it too
        parse_completion(json.dumps(bad).encode(), chat=True)


@pytest.mark.parametrize(
    "prompt",
    [[], [1, -2], [1, True], [1, 2.5], [1, "a"], [[]], [[1], []], [[1], 2], ["a", 1], None, 5, {}],
)
def test_prompts_that_are_neither_text_nor_token_ids_are_refused(prompt: Any) -> None:
    with pytest.raises(RouterError) as caught:
        parse_completion(json.dumps({"model": "m", "prompt": prompt}).encode(), chat=False)
    assert caught.value.status == 400 and caught.value.param == "prompt"


CHAT = b'{"model": "m", "messages": [{"role": "user", "content": %s}]%s}'


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (CHAT % (b'"\xff\xfe"', b""), "the request body is not valid UTF-8"),
        (CHAT % (b'"hi"', b', "temperature": NaN'), "the request body is not valid JSON"),
        (CHAT % (b'"hi"', b', "top_p": Infinity'), "the request body is not valid JSON"),
        (CHAT % (b'"\\ud800"', b""), "the request body is not valid JSON"),
        (CHAT % (b'"hi"', b', "x": 1e400'), "the request body is not valid JSON"),
        (b'{"model": "m", "messages": ' + b"[" * 2000, "more than 512 levels deep"),
        (b'{"model": "m",', "the request body is not valid JSON"),
        (b"", "the request body is not valid JSON"),
    ],
)
def test_bodies_that_are_not_json_get_a_400_saying_why(raw: bytes, says: str) -> None:
    with pytest.raises(RouterError) as caught:
        parse_completion(raw, chat=True)
    assert caught.value.status == 400 and says in caught.value.message


def test_json_that_python_reads_and_orjson_reads_alike_is_accepted() -> None:
    emoji = parse_completion(CHAT % (b'"\\ud83d\\ude00 and \\u00e9"', b""), chat=True)
    assert emoji.body["messages"][0]["content"] == "\U0001f600 and \u00e9"
    big = parse_completion(CHAT % (b'"hi"', b', "seed": 123456789012345678901234567890'), chat=True)
    assert upstream_body(big) == big.raw  # the node gets the client's own digits


def test_a_stream_asked_for_usage_keeps_the_clients_bytes_and_numbers() -> None:
    raw = b'{"model": "m", "stream": true, "seed": 18446744073709551616, "messages": []} \n'
    raw = raw.replace(b"[]", b'[{"role": "user", "content": "hi"}]')
    sent = upstream_body(parse_completion(raw, chat=True))
    assert sent.startswith(raw.rstrip()[:-1])  # nothing before the appended field changes
    assert json.loads(sent)["seed"] == 18446744073709551616
    assert json.loads(sent)["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


def test_bodies_nested_deeper_than_orjson_writes_are_forwarded() -> None:
    deep: Any = {}
    for _ in range(300):
        deep = {"d": deep}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    raw = json.dumps({**body, "stream_options": {"continuous_usage_stats": False}, "x": deep})
    sent = json.loads(upstream_body(parse_completion(raw.encode(), chat=True)))
    assert sent["x"] == deep
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_a_utf8_byte_order_mark_is_dropped_as_json_skips_it() -> None:
    raw = CHAT % (b'"hi"', b"")
    request = parse_completion(b"\xef\xbb\xbf" + raw, chat=True)
    assert request.model == "m"
    assert upstream_body(request) == raw  # a node reading a str with json.loads refuses a BOM


@pytest.mark.usefixtures("router_recursion_limit")
def test_a_body_orjson_reads_but_the_node_would_not_is_the_router_s_400() -> None:
    deep = b'{"d":' * 1000 + b"{}" + b"}" * 1000  # orjson reads 1,024 levels, json fewer
    raw = (
        b'{"model": "m", "prompt": "hi", "stream": true, "stream_options": {}, "x": ' + deep + b"}"
    )
    with pytest.raises(RouterError) as caught:
        parse_completion(raw, chat=False)
    assert caught.value.status == 400 and "512 levels deep" in caught.value.message
    shallow = b'{"d":' * 500 + b"{}" + b"}" * 500  # within the limit: read, and written back
    raw = raw.replace(deep, shallow)
    assert json.loads(upstream_body(parse_completion(raw, chat=False)))["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


def sent(body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The body the node is sent for `body`."""
    return dict(json.loads(upstream_body(parse_completion(json.dumps(body).encode(), chat=chat))))


CHAT_ = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
TEXT_ = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize(
    ("body", "chat", "cap", "caps_sent"),
    [
        # Both spellings: max_completion_tokens wins, and the node is told it in both.
        ({**CHAT_, "max_completion_tokens": 1, "max_tokens": 2000}, True, 1,
         {"max_completion_tokens": 1, "max_tokens": 1}),
        ({**CHAT_, "max_completion_tokens": 2000, "max_tokens": 1}, True, 2000,
         {"max_completion_tokens": 2000, "max_tokens": 2000}),
        # A completions endpoint reads max_tokens only: the cap goes there.
        ({**TEXT_, "max_completion_tokens": 1, "max_tokens": 2000}, False, 1, {"max_tokens": 1}),
        ({**TEXT_, "max_completion_tokens": 7}, False, 7, {"max_tokens": 7}),
        ({**TEXT_, "max_completion_tokens": 7, "max_tokens": None}, False, 7, {"max_tokens": 7}),
        ({**TEXT_, "max_tokens": 7}, False, 7, {"max_tokens": 7}),
        # One spelling a chat endpoint reads: sent as it came.
        ({**CHAT_, "max_completion_tokens": 9}, True, 9, {"max_completion_tokens": 9}),
        ({**CHAT_, "max_tokens": 9}, True, 9, {"max_tokens": 9}),
        # None: the node's own cap, the rest of the model's context (budgets hold that).
        (CHAT_, True, None, {}),
        (TEXT_, False, None, {}),
    ],
)  # fmt: skip
def test_the_router_decides_the_output_cap_and_the_node_is_sent_exactly_it(
    body: dict[str, Any], chat: bool, cap: int | None, caps_sent: dict[str, int]
) -> None:
    assert parse_completion(json.dumps(body).encode(), chat=chat).max_tokens == cap
    upstream = sent(body, chat=chat)
    assert {k: upstream[k] for k in ("max_completion_tokens", "max_tokens") if k in upstream} == (
        caps_sent
    )
    assert {k: v for k, v in upstream.items() if not k.startswith("max_")} == {
        k: v for k, v in body.items() if not k.startswith("max_")
    }


def test_a_body_that_needs_no_new_cap_is_forwarded_byte_for_byte() -> None:
    raw = b'{"model": "m",  "prompt": "hi", "max_tokens": 5}'
    assert upstream_body(parse_completion(raw, chat=False)) == raw


@pytest.mark.parametrize(
    ("body", "chat", "sequences"),
    [
        (CHAT_, True, 1),
        ({**CHAT_, "n": 3}, True, 3),
        ({**TEXT_, "n": 2, "best_of": 5}, False, 5),
        ({**TEXT_, "prompt": ["a", "b", "c"], "n": 2}, False, 6),
        ({**TEXT_, "prompt": [[1, 2], [3]]}, False, 2),
    ],
)
def test_a_request_counts_every_sequence_the_node_generates(
    body: dict[str, Any], chat: bool, sequences: int
) -> None:
    request = parse_completion(json.dumps({**body, "max_tokens": 10}).encode(), chat=chat)
    assert request.sequences == sequences
    assert request.tokens_expected == request.prompt_tokens_estimate + 10 * sequences


def test_tools_calls_and_images_count_in_the_prompt_estimate() -> None:
    """An agent's request is mostly its tools' schemas and the calls it made: left out of the
    estimate, 500 of them at once took 2 tokens each from a 1,000 tokens-per-minute limit,
    and then locked the tenant out for a week once their real usage was counted."""
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "d" * 1600,
              "parameters": {"type": "object", "properties": {}}}} for i in range(50)]  # fmt: skip
    arguments = json.dumps({"path": "p" * 4000})
    call = {"id": "c1", "type": "function",
            "function": {"name": "tool_0", "arguments": arguments}}  # fmt: skip
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 40_000}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "hi"}, image]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    raw = json.dumps({"model": "m", "messages": messages, "tools": tools, "max_tokens": 1})
    estimate = parse_completion(raw.encode(), chat=True).prompt_tokens_estimate
    least = len(json.dumps(tools, separators=(",", ":"))) // 4 + 4000 // 4 + MEDIA_TOKENS
    assert least <= estimate < least + 100


def test_the_prompt_bound_is_the_bodys_bytes_whatever_the_text_tokenises_to() -> None:
    # Punctuation is a token a character for most tokenizers: 4x the estimate.
    raw = json.dumps({**CHAT_, "messages": [{"role": "user", "content": "!" * 4000}]}).encode()
    request = parse_completion(raw, chat=True)
    assert request.prompt_tokens_estimate == 1000
    assert request.prompt_tokens_most >= 4000 + 3 + 3  # every character, and the template's


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"n": 0}, "`n` must be an integer from 1 to 128"),
        ({"n": "2"}, "`n` must be an integer from 1 to 128"),
        ({"n": True}, "`n` must be an integer from 1 to 128"),
        ({"n": 2.5}, "`n` must be an integer from 1 to 128"),
        ({"best_of": -1}, "`best_of` must be an integer from 1 to 128"),
        ({"n": 129}, "`n` must be an integer from 1 to 128"),
        ({"max_completion_tokens": 0, "max_tokens": 5}, "`max_completion_tokens` must be at least"),
        ({"max_completion_tokens": 5, "max_tokens": "5"}, "`max_tokens` must be an integer"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}},
         "`stream_options.include_usage` must be a boolean"),
        ({"stream": True, "stream_options": {"continuous_usage_stats": 1}},
         "`stream_options.continuous_usage_stats` must be a boolean"),
    ],
)  # fmt: skip
def test_bad_sequence_counts_caps_and_usage_flags_are_400s(
    extra: dict[str, Any], says: str
) -> None:
    with pytest.raises(RouterError) as caught:
        parse_completion(json.dumps({**TEXT_, **extra}).encode(), chat=False)
    assert caught.value.status == 400 and says in caught.value.message


def test_tools_nested_deeper_than_orjson_writes_are_estimated_too() -> None:
    """The body may nest 512 deep; orjson writes at most 254."""
    schema: dict[str, Any] = {}
    inner = schema
    for _ in range(300):
        inner["items"] = {}
        inner = inner["items"]
    tools = [{"type": "function", "function": {"name": "t", "parameters": schema}}]
    messages = [{"role": "user", "content": "hi"}]
    raw = json.dumps({"model": "m", "messages": messages, "tools": tools})
    estimate = parse_completion(raw.encode(), chat=True).prompt_tokens_estimate
    assert estimate >= len(json.dumps(tools, separators=(",", ":"))) // 4


def test_the_prompt_bound_counts_each_image_at_its_most_and_a_video_as_the_context() -> None:
    """The budget holds a request's most possible prompt: an image URL is 60 bytes of the body
    and up to 16,384 tokens of the prompt. Held at its bytes, 8 requests of 20 images each
    spent $9.19 of a $1 budget at once."""
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "what is it?"}, *[image] * 20]}
    ]
    raw = json.dumps({"model": "m", "messages": messages}).encode()
    request = parse_completion(raw, chat=True)
    assert request.prompt_tokens_most >= 20 * MEDIA_TOKENS_MOST
    assert request.prompt_tokens_estimate >= 20 * MEDIA_TOKENS
    video = {"type": "video_url", "video_url": {"url": "https://example.com/cat.mp4"}}
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": [video]}]}).encode()
    assert parse_completion(raw, chat=True).prompt_tokens_most >= 2**31 - 1


@pytest.mark.parametrize("field", ["max_completion_tokens", "max_tokens"])
def test_a_hosted_body_says_a_chat_cap_in_the_pool_s_field_alone(field: str) -> None:
    both = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":9,'
    request = parse_completion(both + b'"max_completion_tokens":5}', chat=True)
    sent = json.loads(hosted_body(request, "prov", field))
    assert (sent["model"], sent[field]) == ("prov", 5)  # max_completion_tokens wins, as in OpenAI
    assert len({"max_tokens", "max_completion_tokens"} & set(sent)) == 1
    uncapped = parse_completion(b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
                                chat=True)  # fmt: skip
    caps = {"max_tokens", "max_completion_tokens"}
    assert not caps & set(json.loads(hosted_body(uncapped, "p", field)))
    cap_output(uncapped, 3)  # a budget's cap
    assert json.loads(hosted_body(uncapped, "p", field))[field] == 3
    completion = parse_completion(b'{"model":"m","prompt":"hi","max_tokens":4}', chat=False)
    assert json.loads(hosted_body(completion, "p", field))["max_tokens"] == 4  # its only field
