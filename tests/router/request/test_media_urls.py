"""Media URLs a node would fetch: refused unless their host is allowed (media_urls.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tiergate.router.base.errors import RouterError
from tiergate.router.config import RouterSettings
from tiergate.router.request.body import parse_completion
from tiergate.router.request.media_urls import check_media_urls, host_allowed

PNG = "data:image/png;base64,iVBORw0KGgo="


def chat(*parts: dict[str, Any]) -> bytes:
    content = [{"type": "text", "text": "what is it?"}, *parts]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]}).encode()


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def refusal(raw: bytes, allowed: tuple[str, ...] = ()) -> RouterError | None:
    try:
        check_media_urls(parse_completion(raw, chat=True), allowed)
    except RouterError as error:
        return error
    return None


@pytest.mark.parametrize(
    "part",
    [
        image(PNG),
        image("DATA:image/png;base64,AAAA"),
        {"type": "image_url", "image_url": PNG},  # the URL as a string
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "text", "text": "https://internal.svc/not-media"},  # text is not fetched
    ],
)
def test_inline_media_and_text_pass_with_no_host_allowed(part: dict[str, Any]) -> None:
    assert refusal(chat(part)) is None


@pytest.mark.parametrize(
    "part",
    [
        image("https://169.254.169.254/latest/meta-data/"),
        image("http://tiergate-router.tiergate.svc:8090/metrics"),
        {"type": "image_url", "image_url": "https://internal.svc/cat.png"},
        {"type": "input_image", "image_url": "https://internal.svc/cat.png"},
        {"type": "video_url", "video_url": {"url": "https://internal.svc/cat.mp4"}},
        {"type": "audio_url", "audio_url": {"url": "https://internal.svc/cat.wav"}},
        # vLLM reads a part with no type (or one it does not know) by its URL field.
        {"image_url": "https://internal.svc/cat.png"},
        {"uuid": "u-1", "video_url": {"url": "https://internal.svc/cat.mp4"}},
        {"type": "text", "text": "hi", "image_url": "https://internal.svc/cat.png"},
    ],
)
def test_a_url_a_node_would_fetch_is_a_400_naming_where_and_the_host(part: dict[str, Any]) -> None:
    error = refusal(chat(image(PNG), part))
    assert error is not None
    assert (error.status, error.code, error.param) == (400, "media_url_not_allowed", "messages")
    assert "`messages[0].content[2]`" in str(error) and "data: URL" in str(error)
    assert "meta-data" not in str(error) and "/metrics" not in str(error)  # the host only


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "ftp://example.com/cat.png", "gopher://example.com", "https://",
     "http://[::1/cat.png", "example.com/cat.png",
     # Where parsers differ (urllib3 fetches from 169.254.169.254 here; urlsplit reads
     # images.example.com), or a host no parser should be trusted with:
     "http://169.254.169.254\\@images.example.com/latest/meta-data/",
     "http://images.example.com /cat.png", "http://images.example.com\t/cat.png",
     "http://ímages.example.com/cat.png", " data:image/png;base64,AAAA"],
)  # fmt: skip
def test_only_http_and_https_urls_of_plain_characters_are_ever_fetched(url: str) -> None:
    error = refusal(chat(image(url)), ("images.example.com", "*.example.com"))
    assert error is not None and error.code == "media_url_not_allowed"
    assert "must be a data: URL, or an http(s) URL" in str(error)


def test_allowed_hosts_exact_subdomains_or_any() -> None:
    allowed = ("images.example.com", "*.cdn.example.net")
    assert host_allowed("images.example.com", allowed)
    assert host_allowed("IMAGES.Example.COM.", allowed)  # case and a trailing dot
    assert host_allowed("a.b.cdn.example.net", allowed)
    assert not host_allowed("cdn.example.net", allowed)  # `*.` is the subdomains only
    assert not host_allowed("evilcdn.example.net", allowed)
    assert not host_allowed("example.com", allowed)
    assert not host_allowed("images.example.com.evil.io", allowed)
    assert host_allowed("10.0.0.1", ("*",))
    ok = chat(image("https://IMAGES.example.com/cat.png?sig=abc"))
    assert refusal(ok, allowed) is None
    assert refusal(chat(image("https://other.example.com/cat.png")), allowed) is not None


@pytest.mark.parametrize(
    "bad", ["Example.com", "*.", "*example.com", "ex ample.com", "a..b", "", "*.0.0.1", "a.com:80"]
)
def test_an_allowed_domain_that_is_no_host_name_is_refused_by_the_config(bad: str) -> None:
    with pytest.raises(ValidationError, match="allowedMediaDomains"):
        RouterSettings.model_validate({"allowedMediaDomains": ["ok.example.com", bad]})
    settings = RouterSettings.model_validate({"allowedMediaDomains": ["*", "*.a.io", "b-1.io"]})
    assert settings.allowed_media_domains == ("*", "*.a.io", "b-1.io")
    assert RouterSettings().allowed_media_domains == ()  # by default no URL is fetched
