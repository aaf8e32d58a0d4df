"""What the request path needs of a way to its endpoints, whoever carries the bytes.

The router's own proxy (router/upstream/proxy.py) opens the request itself; behind a gateway
the gateway does, and the endpoint picker (router/epp) only says where and watches the reply
go by. Both give the handler the same two things: an `Opener` that sends a request to the
first of the picked endpoints that answers, and the `Reply` it opened, whose body the relay
reads (router/request/relay.py). The stages before and after are the same code either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from tiergate.router.base.errors import RouterError
from tiergate.router.endpoints.hosted import HostedApi
from tiergate.router.endpoints.state import EndpointState

__all__ = ["Opener", "Reply"]


class Reply(Protocol):
    """A reply whose headers have arrived; its body is still to be read. The endpoint counts
    it in flight until `close()`, which the caller awaits once the body is read or abandoned."""

    @property
    def endpoint(self) -> EndpointState: ...

    @property
    def attempts(self) -> int: ...

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes:
        """The whole body; UpstreamError if it is cut short."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; UpstreamError if it is cut short."""
        ...

    async def close(self) -> None: ...


class Opener(Protocol):
    """Sends a request to the first of the picked endpoints that answers."""

    @property
    def attempts(self) -> int:
        """The most endpoints one request is tried on."""
        ...

    def usable(self, endpoints: Sequence[EndpointState]) -> Sequence[EndpointState]:
        """The candidates this way can send a request to (before the policy picks)."""
        ...

    async def open(
        self,
        endpoints: Sequence[EndpointState],
        path: str,
        body: bytes,
        headers: dict[str, str],
        hosted_body: Callable[[HostedApi], bytes] | None = None,
        *,
        whole: bool = False,
    ) -> Reply:
        """The first well enough answer of `endpoints` (in order); UpstreamUnavailable (503)
        when none answered. `whole`: the reply is not streamed (its head comes once it is
        generated)."""
        ...

    def failed(self, endpoint: EndpointState) -> None:
        """`endpoint`'s reply failed after it started: its failure, for outlier detection."""
        ...

    @property
    def refusal(self) -> RouterError | None:
        """What this way answered the client in the request path's stead, if it did (behind
        a gateway: a pick not made in time), so that the request is recorded as refused, not
        as a client that left."""
        ...
