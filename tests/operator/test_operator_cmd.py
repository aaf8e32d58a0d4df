"""`tiergate operator`'s flags as kopf options: peering, namespaces, liveness."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_status import exit_status

from tiergate.cli import build_parser
from tiergate.operator.commands.operator_cmd import PEERING_NAME, operator_options
from tiergate.operator.kube import current_namespace

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: here
  context:
    cluster: c
    user: u
    namespace: pools
current-context: here
"""


def options(*argv: str) -> dict[str, object]:
    return operator_options(
        build_parser("operator").parse_args(["operator", "--image", "t:x", *argv]),
        own_namespace=lambda: "tiergate-system",
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


def test_liveness_listens_on_the_health_port() -> None:
    assert options("--health-port", "9000")["liveness_endpoint"] == "http://0.0.0.0:9000/healthz"


def test_every_namespace_is_an_explicit_opt_in() -> None:
    """Without --namespace the operator watches its own namespace, as the chart's default
    grants; only --all-namespaces (the chart's operator.clusterWide) watches every one."""
    own = options()
    assert (own["clusterwide"], own["namespaces"]) == (False, ["tiergate-system"])
    everywhere = options("--all-namespaces")
    assert (everywhere["clusterwide"], everywhere["namespaces"]) == (True, [])
    listed = options("--namespace", "a", "--namespace", "b")
    assert (listed["clusterwide"], listed["namespaces"]) == (False, ["a", "b"])


def test_its_own_namespace_is_the_pod_s_else_the_kubeconfig_s(tmp_path: Path) -> None:
    pod_file = tmp_path / "namespace"
    pod_file.write_text("tiergate-system\n")
    assert current_namespace(namespace_file=pod_file) == "tiergate-system"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    missing = tmp_path / "absent"
    assert current_namespace(str(kubeconfig), namespace_file=missing) == "pools"
    kubeconfig.write_text(KUBECONFIG.replace("    namespace: pools\n", ""))
    assert current_namespace(str(kubeconfig), namespace_file=missing) == "default"
    assert current_namespace(str(tmp_path / "none"), namespace_file=missing) == "default"


def test_the_router_flags_say_where_the_routers_queues_are_read() -> None:
    from tiergate.common.cli import CliError
    from tiergate.operator.autoscale import MetricsScraper
    from tiergate.operator.commands.operator_cmd import routers

    def parse(*argv: str) -> Any:
        return build_parser("operator").parse_args(["operator", "--image", "t:x", *argv])

    assert routers(parse(), lambda: "tiergate-system") is None  # not told: the pods alone
    found = routers(parse("--router-selector", "app=router"), lambda: "tiergate-system")
    assert found is not None
    assert (found.namespace, found.selector, found.serves) == (
        "tiergate-system", "app=router", "tiergate-system",
    )  # fmt: skip
    assert isinstance(found.scrape, MetricsScraper) and found.scrape.port == 8090
    found.scrape.close()
    found = routers(
        parse("--router-selector", "app=router", "--router-namespace", "gw",
              "--router-metrics-port", "9105", "--router-pools-namespace", "pools"),
        lambda: "unused",
    )  # fmt: skip
    assert found is not None and (found.namespace, found.serves) == ("gw", "pools")
    assert isinstance(found.scrape, MetricsScraper) and found.scrape.port == 9105
    found.scrape.close()
    with pytest.raises(CliError, match="--router-metrics-port 0: not a port"):
        routers(parse("--router-selector", "a=b", "--router-metrics-port", "0"), lambda: "x")


@pytest.mark.parametrize(
    ("argv", "seconds"),
    [((), 15), (("--autoscale-interval", "5"), 5), (("--autoscale-interval", "3600"), 3600)],
)
def test_the_autoscaler_decides_every_interval_it_is_given(
    argv: tuple[str, ...], seconds: int
) -> None:
    from tiergate.operator.commands.operator_cmd import autoscale_interval

    args = build_parser("operator").parse_args(["operator", "--image", "t:x", *argv])
    assert autoscale_interval(args) == seconds


@pytest.mark.parametrize("value", ["0", "-5", "3601"])
def test_an_interval_out_of_range_is_one_line(value: str) -> None:
    from tiergate.common.cli import CliError
    from tiergate.operator.commands.operator_cmd import autoscale_interval

    args = build_parser("operator").parse_args(["operator", "--image", "t:x",
                                                "--autoscale-interval", value])  # fmt: skip
    with pytest.raises(CliError, match=rf"^--autoscale-interval {value}: not between 1 and 3600"):
        autoscale_interval(args)


def test_the_timer_ticks_at_the_interval_it_is_registered_with() -> None:
    import kopf

    from tiergate.operator.handlers import inferencepool_autoscale, register_autoscaler

    registry = kopf.OperatorRegistry()
    register_autoscaler(5, registry)
    (timer,) = registry._spawning.get_all_handlers()
    assert timer.fn is inferencepool_autoscale
    assert (timer.interval, timer.initial_delay) == (5, 5)


def operator_status(*argv: str) -> int:
    return exit_status(["operator", "--image", "t:x", "--standalone", *argv])


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--health-port", "-1", "must be at least 1, got -1"),
        ("--health-port", "0", "must be at least 1, got 0"),
        ("--health-port", "99999", "must be at most 65535, got 99999"),
        ("--metrics-port", "70000", "must be in 0..65535, got 70000"),
        ("--metrics-port", "-1", "must be in 0..65535, got -1"),
    ],
)
def test_a_port_out_of_range_is_one_line(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    assert operator_status(flag, value) == 2
    err = capsys.readouterr().err
    assert err == f"tiergate operator: error: argument {flag}: {message}\n"


SECRET = "sekrit-token-0123"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00 not text", "is not UTF-8 text"),
        (b"- a\n- b\n", "is not a kubeconfig"),
        (b"just a word\n", "is not a kubeconfig"),
        (b"current-context: x\ncontexts: [{name: x, context: 5}]\n", "is not a kubeconfig"),
        (f"users: [{{name: u, user: {{token: *{SECRET}}}}}]\n".encode(),
         "is not valid YAML (line 1, column 33)"),
    ],
)  # fmt: skip
def test_a_kubeconfig_that_is_not_one_is_one_line_not_quoting_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    content: bytes,
    message: str,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_bytes(content)
    assert operator_status("--kubeconfig", str(kubeconfig)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tiergate operator: error: no Kubernetes credentials: {kubeconfig} ")
    assert err.count("\n") == 1 and message in err and SECRET not in err
