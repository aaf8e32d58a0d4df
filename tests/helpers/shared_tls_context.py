"""One default TLS context for every httpx client a test process makes.

httpx builds a new default context for each client it creates (`create_ssl_context()`, which
parses certifi's bundle again: about 40 ms of CPU), and every module-level `httpx.get` is a
client of its own, as is every OpenAI SDK client. The suites make thousands of them, mostly to
plain-HTTP servers on loopback: minutes of CPU on a 2-core machine, with nothing verified. One
context built once per trust store (certifi's, or SSL_CERT_FILE's or SSL_CERT_DIR's when set)
verifies exactly as a new one would; anything else asked of httpx (`verify` set, a client
certificate) is built as before.

httpx has no public setting for this, so `share()` replaces the function its transports call
and fails at once if httpx no longer has it.
"""

from __future__ import annotations

import functools
import os
import ssl
from typing import Any

import httpx._config
import httpx._transports.default

__all__ = ["share"]

_ORIGINAL = httpx._config.create_ssl_context


@functools.cache
def _default_context(
    trust_env: bool, cert_file: str | None, cert_dir: str | None
) -> ssl.SSLContext:
    """httpx's default context for these settings (the variables are read by httpx itself)."""
    return _ORIGINAL(trust_env=trust_env)


def _create_ssl_context(
    verify: Any = True, cert: Any = None, trust_env: bool = True
) -> ssl.SSLContext:
    if verify is True and cert is None:
        env = os.environ
        return _default_context(trust_env, env.get("SSL_CERT_FILE"), env.get("SSL_CERT_DIR"))
    return _ORIGINAL(verify=verify, cert=cert, trust_env=trust_env)


def share() -> None:
    """Make httpx's default TLS context one per process (idempotent)."""
    for module in (httpx._config, httpx._transports.default):
        if not hasattr(module, "create_ssl_context"):
            raise RuntimeError(f"{module.__name__} has no create_ssl_context: update {__file__}")
        module.create_ssl_context = _create_ssl_context  # type: ignore[assignment]
