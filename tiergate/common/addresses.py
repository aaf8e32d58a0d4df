"""A pod's IP as the host of a URL: an IPv6 address goes in brackets (`http://[fd00::5]:8000`),
or the URL would not parse. The router's discovery and the operator's autoscaler both build
URLs from the `status.podIP` the API server reports."""

from __future__ import annotations

import ipaddress


def url_host(ip: object) -> str | None:
    """`ip` as a URL host (IPv6 in brackets, in its compressed form); None when it is absent
    or not an IP address."""
    if not isinstance(ip, str):
        return None
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None
    return f"[{address}]" if address.version == 6 else str(address)
