"""How long a gateway waits for the pick, and how long the picker lets a request wait for it.

A gateway that buffers request bodies (an InferencePool's FailOpen) times the picker's answer
to the body, which carries the pick, with its ext_proc `message_timeout`; past it, the gateway
sends the request on unpicked, to its fallback, past tiergate's admission, budgets and ledger.
Before its pick a request waits for a slot in its tier's queue, and for a round trip to the
shared ledger when its budget or rate limit needs a lease. Nothing in the router's settings
bounds that wait in time (a tier's queue is bounded in requests, which wait while the ones
ahead decode), so the picker bounds it: a buffered body not picked within `PICK_WITHIN_S` is
refused by the picker (router/epp/stream.py), and the gateway's `message_timeout` is set to
`MESSAGE_TIMEOUT_S`, past it. The documented gateway configuration and the test gateway
(tools/envoy_gateway.py) take it from here.
"""

from __future__ import annotations

__all__ = ["MESSAGE_TIMEOUT_S", "PICK_WITHIN_S"]

#: The longest a buffered request body waits for its pick before the picker refuses it.
PICK_WITHIN_S = 55.0
#: For the answer's way to the gateway, and an event loop busy with other streams.
MARGIN_S = 5.0
#: The ext_proc `message_timeout` a gateway must set (seconds).
MESSAGE_TIMEOUT_S = PICK_WITHIN_S + MARGIN_S
