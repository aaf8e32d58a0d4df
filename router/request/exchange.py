"""One client request on its way through the router: what each stage reads and fills in."""

from __future__ import annotations

from dataclasses import dataclass, field

from tiergate.router.base.asgi import Receive, Send
from tiergate.router.base.tiers import TierChoice
from tiergate.router.request.body import CompletionRequest
from tiergate.router.request.progress import Progress
from tiergate.router.request.spill import Spill
from tiergate.router.tenants.registry import Tenant
from tiergate.router.upstream.disconnect import DisconnectGuard
from tiergate.router.upstream.reply import Opener

__all__ = ["Exchange"]


@dataclass
class Exchange:
    """A request and its reply channel, with what the stages learnt so far.

    `done` is the attempt being served: a cascade accounts for its first attempt on its own
    and then serves the request again with a fresh one. `tenant`, `request` and `choice` are
    None until the stages that decide them have run (a request refused before has none).
    """

    request_id: str
    started_s: float  # the router's clock (monotonic)
    headers: dict[str, str]  # lower-case names
    receive: Receive
    send: Send
    done: Progress = field(default_factory=Progress)
    tenant: Tenant | None = None
    request: CompletionRequest | None = None
    choice: TierChoice | None = None
    guard: DisconnectGuard | None = None
    #: Held against the tenant's budget while the request is in flight
    #: (router/tenants/budgets.py); None until the budget check took a hold.
    hold_usd: float | None = None
    #: Where spill-over moved the request, once it was admitted there.
    spill: Spill | None = None
    #: The request's way to its endpoint when another proxy carries it (a gateway that asked
    #: the endpoint picker, router/epp); None: the router's own proxy. Such a request is
    #: sent once, where the pick says: no second attempt, so no cascade.
    upstream: Opener | None = None
