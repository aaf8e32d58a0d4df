"""The endpoint picker: tiergate behind a Gateway API gateway (Envoy ext_proc)."""
