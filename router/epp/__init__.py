"""The endpoint picker: tiergate behind a Gateway API gateway (Envoy ext_proc over gRPC, the
Gateway API Inference Extension's endpoint picker protocol).

A second way into the router's one request path (router/handler.py): `server` serves the gRPC
services, `stream` turns one ext_proc stream into the request path's input and output, `pick`
is the request path's way to its endpoint through the gateway, `protocol` reads and writes
Envoy's messages (the only module that imports them), and `deadline` says how long the gateway
and the picker wait for a pick.
"""
