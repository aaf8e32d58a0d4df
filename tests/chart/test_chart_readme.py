"""The chart's README states what the chart and the router do: the connection limits' defaults
are the router's own, and the router's RBAC row names everything its Role grants."""

from __future__ import annotations

import re
from dataclasses import fields

from chart_helpers import CHART, ROUTER, Helm, one

from tiergate.common.connection_limits import ConnectionGate, ConnectionLimits

README = CHART / "README.md"


def paragraph(starting: str) -> str:
    """The README's paragraph that begins with `starting`, on one line."""
    text = README.read_text(encoding="utf-8")
    (found,) = [p for p in text.split("\n\n") if p.startswith(starting)]
    return " ".join(found.split())


def test_the_connection_limits_are_the_router_s_defaults() -> None:
    limits = ConnectionLimits()
    text = paragraph("Client connections:")
    seconds = {float(s) for s in re.findall(r"(\d+(?:\.\d+)?) s\b", text)}
    expected = {
        limits.header_timeout_s,
        limits.body_timeout_s,
        limits.idle_timeout_s,
        next(f.default for f in fields(ConnectionGate) if f.name == "log_every_s"),
    }
    assert seconds == expected
    assert f"closed after {limits.idle_timeout_s:g} s" in text
    assert f"{limits.max_connections:,} open connections" in text


def test_the_router_s_rbac_row_names_every_grant(helm: Helm) -> None:
    manifests = helm.template(sets=["router.providerKeySecrets={openai-key}"])
    role = one(manifests, "Role", ROUTER)
    (row,) = [line for line in README.read_text().splitlines() if line.startswith("| router RBAC")]
    for rule in role["rules"]:
        for resource in rule["resources"]:
            assert re.search(resource, row, re.IGNORECASE), f"{resource} not in the RBAC row"
            for verb in rule["verbs"]:
                assert verb in row, f"{verb} {resource} not in the RBAC row"
    assert "router.providerKeySecrets" in row
