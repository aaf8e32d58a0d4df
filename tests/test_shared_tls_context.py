"""The tests' httpx clients share one default TLS context (tests/helpers/shared_tls_context.py),
which verifies as httpx's own default does; any other setting still gets a context of its own."""

from __future__ import annotations

import ssl

import httpx


def context(client: httpx.Client) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined]


def test_default_clients_share_one_context_that_verifies_as_httpx_s_own() -> None:
    with httpx.Client() as one, httpx.Client() as two:
        shared = context(one)
        assert context(two) is shared
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname
    assert len(shared.get_ca_certs()) > 100  # certifi's bundle, as httpx loads it


def test_any_other_setting_gets_a_context_of_its_own() -> None:
    mine = ssl.create_default_context()
    with httpx.Client() as default, httpx.Client(verify=False) as unverified:
        with httpx.Client(verify=mine) as own:
            assert context(own) is mine
        assert context(unverified) is not context(default)
        assert context(unverified).verify_mode == ssl.CERT_NONE
