"""Envoy's external processing messages, read and written: the one module that imports the
generated protobuf code (xds-protos), so the rest of the picker deals in plain Python values.

The names and places are the Gateway API Inference Extension's endpoint picker protocol: the
pick goes out as the `x-gateway-destination-endpoint` header and, equal to it, in the
`envoy.lb` dynamic metadata; the gateway's subset hint comes in as
`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`, and the endpoint that
served as `envoy.lb` / `x-gateway-destination-endpoint-served` (or, from Envoy's own
attributes, `upstream.address`). Bodies sent back are cut into chunks of at most
`BODY_CHUNK_BYTES`, as the reference picker does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from envoy.type.v3 import http_status_pb2

__all__ = [
    "BODY_CHUNK_BYTES",
    "DESTINATION",
    "SERVICE",
    "ProcessingRequest",
    "ProcessingResponse",
    "ack",
    "add_servicer",
    "body_modes",
    "headers_of",
    "immediate",
    "phase",
    "pick_in_body",
    "pick_in_headers",
    "reply_headers",
    "served_of",
    "streamed_body",
    "subset_of",
]

#: The gRPC service a gateway calls, and the health service name the protocol gives it.
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
DESTINATION = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
#: Some gateways take at most 64 KiB of body a message.
BODY_CHUNK_BYTES = 62_000

#: The messages, as the generated classes (untyped: xds-protos has no stubs).
ProcessingRequest = Any
ProcessingResponse = Any


def add_servicer(servicer: Any, server: Any) -> None:
    """Serve `servicer` (an `ExternalProcessorServicer`) on the gRPC `server`."""
    ext_grpc.add_ExternalProcessorServicer_to_server(servicer, server)


def phase(request: ProcessingRequest) -> str | None:
    """Which part of the HTTP exchange `request` carries: `request_headers`, `request_body`,
    `request_trailers`, `response_headers`, `response_body`, `response_trailers`; None."""
    which: str | None = request.WhichOneof("request")
    return which


def body_modes(request: ProcessingRequest) -> tuple[str, str] | None:
    """(request, response) body send modes the gateway said (on its first message only),
    e.g. `FULL_DUPLEX_STREAMED`; None when this message does not say."""
    if not request.HasField("protocol_config"):
        return None
    config = request.protocol_config
    name = processing_mode_pb2.ProcessingMode.BodySendMode.Name
    return name(config.request_body_mode), name(config.response_body_mode)


def headers_of(part: Any) -> dict[str, str]:
    """An `HttpHeaders` message's headers, names lower-cased, values as latin-1 text (Envoy
    fills `raw_value`; a `value` is taken as its UTF-8 bytes); a repeated header's values
    joined by commas. Pseudo-headers (`:path`, `:status`) included."""
    found: dict[str, str] = {}
    for header in part.headers.headers:
        raw = header.raw_value or header.value.encode()
        value = raw.decode("latin-1")
        key = header.key.lower()
        found[key] = f"{found[key]},{value}" if key in found else value
    return found


def _metadata(request: ProcessingRequest, namespace: str) -> Any | None:
    if not request.HasField("metadata_context"):
        return None
    return request.metadata_context.filter_metadata.get(namespace)


def subset_of(request: ProcessingRequest) -> frozenset[str] | None:
    """The gateway's subset hint: the `ip:port` (or bare `ip`: any port) it allows; None when
    it gives none (every endpoint may be picked). A list or one comma-separated string."""
    fields = _metadata(request, SUBSET_NAMESPACE)
    if fields is None or SUBSET_KEY not in fields.fields:
        return None
    value = fields.fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        items = [v.string_value for v in value.list_value.values]
    elif kind == "string_value":
        items = value.string_value.split(",")
    else:
        items = []
    return frozenset(item.strip() for item in items if item.strip())


def served_of(request: ProcessingRequest) -> str | None:
    """The `ip:port` that served the reply, as the gateway says it: the protocol's metadata,
    else Envoy's `upstream.address` attribute; None when it says neither."""
    fields = _metadata(request, LB_NAMESPACE)
    if fields is not None and SERVED_KEY in fields.fields:
        return str(fields.fields[SERVED_KEY].string_value) or None
    attributes = request.attributes.get(EXT_PROC_ATTRIBUTES)
    if attributes is not None and UPSTREAM_ADDRESS in attributes.fields:
        return str(attributes.fields[UPSTREAM_ADDRESS].string_value) or None
    return None


def _fill_mutation(mutation: Any, set_headers: Mapping[str, str], remove: Iterable[str]) -> None:
    # Filled in place: building a HeaderValueOption per header and copying it in costs 3x.
    mutation.SetInParent()
    add = mutation.set_headers.add
    for key, value in set_headers.items():
        header = add().header
        header.key = key
        header.raw_value = value.encode("latin-1")
    mutation.remove_headers.extend([name for name in remove if name not in set_headers])


def _with_pick(response: ProcessingResponse, destination: str) -> ProcessingResponse:
    lb = response.dynamic_metadata.fields[LB_NAMESPACE].struct_value
    lb.fields[DESTINATION].string_value = destination
    return response


def pick_in_headers(
    destination: str, set_headers: Mapping[str, str], remove: Iterable[str]
) -> ProcessingResponse:
    """The answer to the request's headers that carries the pick (full-duplex mode): sent
    once the body has been read, which holds the request at the gateway until then."""
    response = ext.ProcessingResponse()
    common = response.request_headers.response
    _fill_mutation(common.header_mutation, {**set_headers, DESTINATION: destination}, remove)
    common.clear_route_cache = True
    return _with_pick(response, destination)


def pick_in_body(
    destination: str, set_headers: Mapping[str, str], remove: Iterable[str], body: bytes
) -> ProcessingResponse:
    """The answer to a buffered request body that carries the pick (buffered mode: the
    headers were answered at once, and still wait at the gateway with the body)."""
    response = ext.ProcessingResponse()
    common = response.request_body.response
    _fill_mutation(common.header_mutation, {**set_headers, DESTINATION: destination}, remove)
    common.body_mutation.body = body
    common.clear_route_cache = True
    return _with_pick(response, destination)


def reply_headers(set_headers: Mapping[str, str], remove: Iterable[str]) -> ProcessingResponse:
    """The answer to the reply's headers: what tiergate adds to (or takes from) them."""
    response = ext.ProcessingResponse()
    _fill_mutation(response.response_headers.response.header_mutation, set_headers, remove)
    return response


def streamed_body(part: str, data: bytes, end: bool) -> list[ProcessingResponse]:
    """`data` sent on as the request's or the reply's body (`part`: `request_body` or
    `response_body`), in chunks of at most BODY_CHUNK_BYTES; `end` on the last."""
    out = []
    at = 0
    while True:
        piece = (
            data if at == 0 and len(data) <= BODY_CHUNK_BYTES else data[at : at + BODY_CHUNK_BYTES]
        )
        at += BODY_CHUNK_BYTES
        last = at >= len(data)
        response = ext.ProcessingResponse()
        streamed = getattr(response, part).response.body_mutation.streamed_response
        streamed.SetInParent()
        streamed.body = piece
        streamed.end_of_stream = end and last
        out.append(response)
        if last:
            return out


def ack(part: str) -> ProcessingResponse:
    """An answer that changes nothing: `request_headers` (buffered mode's at once),
    `request_trailers` or `response_trailers`."""
    kind = ext.TrailersResponse() if part.endswith("trailers") else ext.HeadersResponse()
    return ext.ProcessingResponse(**{part: kind})


def immediate(
    status: int, headers: Mapping[str, str], body: bytes, details: str
) -> ProcessingResponse:
    """The gateway answers the client itself with `status`, `headers` and `body`, and sends
    the request nowhere; `details` goes to the gateway's access log."""
    response = ext.ProcessingResponse(
        immediate_response=ext.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=status),
            body=body,
            details=details,
        )
    )
    _fill_mutation(response.immediate_response.headers, headers, ())
    return response
