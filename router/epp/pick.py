"""The pick, as a gateway carries it: the request path's way to its endpoint (an `Opener`,
router/upstream/reply.py) when Envoy, not tiergate, sends the request.

The handler picks endpoints as for its own proxy; `GatewayOpener` narrows the candidates to
what the gateway can reach and allows (an `ip:port`, not a hosted API, in the gateway's subset
hint), tells the gateway the pick (and `fallbacks` more, in order), and waits for the reply's
headers. The gateway sends the request once: a pick that fails is not tried elsewhere by
tiergate (a gateway that reads the fallbacks may), so it has one attempt. A reply the gateway
made itself because the endpoint failed (502, 503, 504) is the endpoint's failure and the
client's 503, in the OpenAI error envelope, as the proxy's would be. A whole reply larger than
`max_reply_bytes` is refused as it arrives (`ReplyTooLarge`), as the proxy refuses it; once a
reply is closed, the stream drops what is left of its body as it comes.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlsplit

from tiergate.router.base.errors import RouterError
from tiergate.router.config import MAX_REPLY_BYTES
from tiergate.router.endpoints.hosted import HostedApi
from tiergate.router.endpoints.state import CandidateSet, EndpointState
from tiergate.router.upstream.proxy import ReplyTooLarge, UpstreamUnavailable, WholeReplyTimeout

__all__ = ["Gateway", "GatewayOpener", "GatewayReply", "ReplyHead", "address_of"]

log = logging.getLogger("tiergate.router")

#: Statuses the gateway answers with itself when the endpoint cannot be reached or failed.
ENDPOINT_FAILED = frozenset({502, 503, 504})
#: What the gateway answers when its route's timeout runs out before the reply's headers: on a
#: whole reply, a long generation on a busy endpoint (as the router's own
#: whole_reply_timeout_s), not a broken one; on a stream, whose headers come at once, a hung one.
GATEWAY_TIMEOUT = 504
#: Request headers never passed to an endpoint: the tenant's key stays at the gateway and
#: tiergate, as with the proxy; the fault header only when the router passes it on.
NEVER_FORWARDED = ("authorization", "x-tiergate-fault")
#: Request headers the picker sets on every request it picks: the picker reads the reply to
#: bill it, and does not decompress it, so the endpoint is asked for it uncompressed (not the
#: client's `accept-encoding`, which the gateway would pass on).
ALWAYS_SENT = {"accept-encoding": "identity"}


@dataclass(frozen=True, slots=True)
class ReplyHead:
    """The reply's status and headers as the gateway got them, and the `ip:port` that served
    it (None: the gateway did not say)."""

    status: int
    headers: dict[str, str]
    served: str | None


class Gateway(Protocol):
    """What the opener needs of the ext_proc stream (router/epp/stream.py)."""

    subset: frozenset[str] | None
    #: What the picker answered in the request path's stead (a pick not made in time).
    refusal: RouterError | None

    def send_pick(self, destination: str, headers: dict[str, str], body: bytes) -> None:
        """Tell the gateway where the request goes, with the headers to set and the body."""

    async def reply_head(self) -> ReplyHead:
        """The reply's headers, once they came."""
        ...

    async def reply_chunk(self) -> tuple[bytes, bool]:
        """The reply's next body chunk, and whether it is the last."""
        ...

    def close_reply(self) -> None:
        """The reply's body is read no more: what came of it and what comes are dropped."""


def address_of(endpoint: EndpointState) -> str | None:
    """`ip:port` of a plain-HTTP endpoint with an IP address (what a gateway's original
    destination cluster can reach); None for any other."""
    if endpoint.hosted is not None:
        return None
    return _address_of_url(endpoint.url)


@functools.lru_cache(maxsize=4096)  # asked of every candidate on every request
def _address_of_url(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.path not in ("", "/") or parts.hostname is None:
        return None
    try:
        ip = ipaddress.ip_address(parts.hostname)
        port = parts.port or 80
    except ValueError:
        return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def in_subset(address: str, subset: frozenset[str]) -> bool:
    """Whether the gateway's subset allows `address`: by `ip:port`, or by its bare IP."""
    host = address.rpartition(":")[0]
    return address in subset or host in subset or host.strip("[]") in subset


@dataclass
class GatewayOpener:
    """One gateway request's way to its endpoint (an `Opener`)."""

    gateway: Gateway
    fallbacks: int = 0
    on_failure: Callable[[EndpointState], object] = lambda e: None
    max_reply_bytes: int = MAX_REPLY_BYTES
    attempts: int = 1  # the gateway sends the request once
    #: Every endpoint the router knows now, of any pool: where the gateway's own retry may go.
    everywhere: Callable[[], Sequence[EndpointState]] = lambda: ()

    def usable(self, endpoints: Sequence[EndpointState]) -> Sequence[EndpointState]:
        """The candidates the gateway can reach and allows."""
        subset = self.gateway.subset
        out = []
        for endpoint in endpoints:
            address = address_of(endpoint)
            if address is not None and (subset is None or in_subset(address, subset)):
                out.append(endpoint)
        if isinstance(endpoints, CandidateSet):  # still one (model, tier): the filters know it
            return CandidateSet(out, endpoints.model, endpoints.tier)
        return out

    async def open(
        self,
        endpoints: Sequence[EndpointState],
        path: str,
        body: bytes,
        headers: dict[str, str],
        hosted_body: Callable[[HostedApi], bytes] | None = None,
        *,
        whole: bool = False,  # the gateway's own timeouts bound the wait for the reply
    ) -> GatewayReply:
        chosen = list(self.usable(endpoints))[: 1 + self.fallbacks]
        if not chosen:
            raise UpstreamUnavailable("no endpoint the gateway can reach was picked", 0)
        addresses = [address_of(e) or "" for e in chosen]
        sent = {**headers, **ALWAYS_SENT, "content-length": str(len(body))}
        self.gateway.send_pick(",".join(addresses), sent, body)
        picked = chosen[0]
        picked.inflight += 1
        try:
            head = await self.gateway.reply_head()
        except BaseException:
            picked.inflight -= 1
            raise
        served, attempts = picked, 1
        if head.served is not None and head.served != addresses[0]:
            other = next((e for e in endpoints if address_of(e) == head.served), None)
            if other is None:  # the gateway's own retry, past the pick: to any pod of its pool
                other = next((e for e in self.everywhere() if address_of(e) == head.served), None)
            if other is None:
                log.warning(
                    "event=served_by_unknown_endpoint served=%s picked=%s", head.served,
                    addresses[0],
                )  # fmt: skip
            else:  # a fallback, or the gateway's own retry elsewhere
                at = addresses.index(head.served) if head.served in addresses else len(chosen)
                served, attempts = other, at + 1
                for failed in chosen[:at]:  # the gateway went past them: they failed it
                    self.on_failure(failed)
                picked.inflight -= 1
                served.inflight += 1
        reply = GatewayReply(served, attempts, head, self.gateway, self.max_reply_bytes)
        if head.status == GATEWAY_TIMEOUT and whole:
            await reply.close()
            raise WholeReplyTimeout(served.tier, None, attempts)
        if head.status in ENDPOINT_FAILED:
            await reply.close()
            self.on_failure(served)
            raise UpstreamUnavailable(
                f"the {served.tier} tier's endpoint could not serve the request "
                f"(the gateway's HTTP {head.status})",
                attempts,
            )
        return reply

    def failed(self, endpoint: EndpointState) -> None:
        self.on_failure(endpoint)

    @property
    def refusal(self) -> RouterError | None:
        return self.gateway.refusal


@dataclass
class GatewayReply:
    """A reply passing through the gateway (a `Reply`): its body is what the gateway streams
    to the picker, which sends on what the relay makes of it."""

    endpoint: EndpointState
    attempts: int
    head: ReplyHead
    gateway: Gateway
    max_reply_bytes: int = MAX_REPLY_BYTES
    closed: bool = field(default=False)
    _ended: bool = field(default=False)

    @property
    def status(self) -> int:
        return self.head.status

    @property
    def content_type(self) -> str:
        return self.head.headers.get("content-type", "")

    async def read(self) -> bytes:
        """The whole body; ReplyTooLarge past `max_reply_bytes` (the rest is not read)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > self.max_reply_bytes:
                raise ReplyTooLarge(self.max_reply_bytes)
            parts.append(chunk)
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self._ended:
            chunk, self._ended = await self.gateway.reply_chunk()
            if chunk:
                yield chunk

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.endpoint.inflight -= 1
            self.gateway.close_reply()
