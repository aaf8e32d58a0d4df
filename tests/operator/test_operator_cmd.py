"""`tiergate operator`'s flags as kopf options: peering, namespaces, liveness."""

from __future__ import annotations

from tiergate.cli import build_parser
from tiergate.operator.commands.operator_cmd import PEERING_NAME, operator_options


def options(*argv: str) -> dict[str, object]:
    return operator_options(
        build_parser("operator").parse_args(["operator", "--image", "t:x", *argv])
    )


def test_replicas_peer_under_the_charts_peering_object_with_random_priorities() -> None:
    first, second = options("--namespace", "team-a"), options("--namespace", "team-a")
    assert first["peering_name"] == PEERING_NAME and not first["standalone"]
    assert first["clusterwide"] is False and first["namespaces"] == ["team-a"]
    assert isinstance(first["priority"], int) and first["priority"] != second["priority"]


def test_standalone_names_no_peering() -> None:
    """A peering name makes kopf's peering mandatory: standalone would stay paused forever."""
    opts = options("--standalone")
    assert opts["standalone"] is True
    assert "peering_name" not in opts and "priority" not in opts
    assert opts["clusterwide"] is True


def test_liveness_listens_on_the_health_port() -> None:
    assert options("--health-port", "9000")["liveness_endpoint"] == "http://0.0.0.0:9000/healthz"
