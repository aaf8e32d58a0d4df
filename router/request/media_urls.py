"""Which media URLs a request may ask a node to fetch.

vLLM and SGLang fetch an image, audio or video part's http(s) URL themselves, from the model
pod, inside the cluster: a tenant could make the pods send requests to internal addresses
(other services, a cloud's metadata endpoint) and learn from the errors or the timing what
answers there. So a request whose media part has a URL that is not inline (`data:`) is refused
with a 400, unless its host is one the router's `allowedMediaDomains` names: `example.com` (that
host), `*.example.com` (its subdomains) or `*` (any host, as the engines do by themselves).
Schemes other than http and https (`file:`) are always refused, and so is a URL with a
character RFC 3986 does not allow (a backslash, a space, a non-ASCII host): parsers differ on
those, and the host the router reads must be the one the engine's parser (urllib3, requests)
fetches from. An allowed host is allowed on any port. The URL itself is never logged.

The check cannot see where an allowed host sends the engine next: vLLM and SGLang follow
redirects, so allow only hosts you control, and none that serves open redirects.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from urllib.parse import urlsplit

from tiergate.router.base.errors import RouterError
from tiergate.router.request.body import CompletionRequest

__all__ = ["ANY_HOST", "check_media_urls", "host_allowed"]

#: The entry of `allowedMediaDomains` that allows every host.
ANY_HOST = "*"
#: A URL of RFC 3986's characters only: unreserved, reserved and `%`.
_URL_CHARACTERS = re.compile(r"[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+")


def host_allowed(host: str, allowed: Collection[str]) -> bool:
    """Whether `allowed` (router.allowedMediaDomains) lets a node fetch from `host`."""
    host = host.lower().rstrip(".")
    return any(
        entry == ANY_HOST or entry == host or (entry.startswith("*.") and host.endswith(entry[1:]))
        for entry in allowed
    )


def check_media_urls(request: CompletionRequest, allowed: Collection[str]) -> None:
    """Refuse `request` (a 400) if one of its media parts has a URL a node may not fetch."""
    for where, url in request.media_urls:
        try:
            parts = urlsplit(url) if _URL_CHARACTERS.fullmatch(url) else None
            host = parts.hostname if parts is not None else None
        except ValueError:  # an unparsable address (a bad IPv6 literal, a bad port)
            parts, host = None, None
        if parts is None or parts.scheme not in ("http", "https") or not host:
            raise _refused(
                f"`{where}`: a media part's URL must be a data: URL, or an http(s) URL of a "
                "host this gateway allows"
            )
        if not host_allowed(host, allowed):
            raise _refused(
                f"`{where}`: media URLs of host {host!r} are not fetched here; send the "
                "media inline as a data: URL (base64), or ask the gateway's operator to allow "
                "the host (router.allowedMediaDomains)"
            )


def _refused(message: str) -> RouterError:
    return RouterError(400, message, code="media_url_not_allowed", param="messages")
