"""The HTTP face: the ASGI app, its routes (the usage API among them), the OpenAPI document and
metrics."""
