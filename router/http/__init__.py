"""The HTTP face: the ASGI app, its routes, the OpenAPI document, metrics and the error envelope."""
