"""The router's ledger in the chart: SQLite for one router process, PostgreSQL for several.

What `helm install` refuses (several replicas, autoscaling or workers on SQLite; contradictory
PostgreSQL values), each as one line naming the value to set; how each mode renders; what
NOTES.txt says; and that the database's credentials never reach the ConfigMap.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from chart_helpers import (
    CHART,
    NAMESPACE,
    RELEASE,
    ROUTER,
    VARIANT,
    Helm,
    HelmFailed,
    Manifest,
    find,
    one,
)

from tiergate.router.config import RouterConfig

#: Real processes and servers, or seconds of work: left out of `make test-fast`.
pytestmark = pytest.mark.slow

POSTGRES_HOST = [
    "router.ledger.postgres.host=db.example.com",
    "router.ledger.postgres.passwordSecret.name=tiergate-db",
]
POSTGRES_DSN = ["router.ledger.postgres.existingSecret=tiergate-dsn"]
SHARED = "(one ledger shared by every replica); the SQLite ledger serves one router process"
#: Kubernetes' own defaults for a Deployment's strategy, as the chart writes them out.
ROLLING_UPDATE = {
    "type": "RollingUpdate",
    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"},
}


def install(helm: Helm, sets: Sequence[str] = (), values: Sequence[Path] = ()) -> str:
    """`helm install --dry-run=client`'s output (manifests, then NOTES)."""
    args = ["install", RELEASE, str(CHART), "--dry-run=client", "--namespace", NAMESPACE]
    for path in values:
        args += ["--values", str(path)]
    for assignment in sets:
        args += ["--set", assignment]
    return helm.run(*args)


def refusal(helm: Helm, sets: Sequence[str]) -> str:
    """What `helm install` says when it refuses these values: its one line's message."""
    with pytest.raises(HelmFailed) as failure:
        install(helm, sets)
    lines = str(failure.value).splitlines()
    assert len(lines) == 1, lines
    found = re.fullmatch(
        r"Error: INSTALLATION FAILED: execution error at \([^)]*\): (.*)", lines[0]
    )
    assert found, lines[0]
    return found.group(1)


def notes(helm: Helm, sets: Sequence[str] = (), values: Sequence[Path] = ()) -> str:
    return install(helm, sets, values).split("NOTES:", 1)[1]


def router_settings(manifests: list[Manifest]) -> dict[str, Any]:
    config = yaml.safe_load(one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"])
    assert isinstance(config, dict)
    return dict(config["router"])


def router_pod(manifests: list[Manifest]) -> dict[str, Any]:
    return dict(one(manifests, "Deployment", ROUTER)["spec"]["template"]["spec"])


def router_container(manifests: list[Manifest]) -> dict[str, Any]:
    (container,) = router_pod(manifests)["containers"]
    return dict(container)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["router.replicas=3"], f"router.replicas: 3 needs router.ledger.postgres {SHARED}"),
        (
            ["router.autoscaling.enabled=true"],
            f"router.autoscaling.enabled needs router.ledger.postgres {SHARED}",
        ),
        (
            ["router.workers=4"],
            "router.workers: 4 needs router.ledger.postgres (one ledger shared by every "
            "worker); the SQLite ledger serves one router process",
        ),
        # A persistent SQLite volume does not make the ledger shareable.
        (
            ["router.ledger.persistence.enabled=true", "router.replicas=2"],
            f"router.replicas: 2 needs router.ledger.postgres {SHARED}",
        ),
    ],
    ids=["replicas", "autoscaling", "workers", "persistent-replicas"],
)
def test_install_refuses_several_router_processes_on_sqlite(
    helm: Helm, sets: list[str], message: str
) -> None:
    assert refusal(helm, sets) == message


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            [*POSTGRES_DSN, *POSTGRES_HOST],
            "router.ledger.postgres: set existingSecret (a Secret holding the whole DSN) or "
            "host, not both",
        ),
        (
            ["router.ledger.postgres.host=db.example.com"],
            "router.ledger.postgres.host needs router.ledger.postgres.passwordSecret.name "
            "(the Secret holding the database password)",
        ),
        (
            [*POSTGRES_DSN, "router.ledger.persistence.enabled=true"],
            "router.ledger.persistence.enabled is for the SQLite ledger: set it to false with "
            "router.ledger.postgres",
        ),
        (
            ["router.ledger.postgres.passwordSecret.name=tiergate-db"],
            "router.ledger.postgres.passwordSecret needs router.ledger.postgres.host (or "
            "existingSecret) to say which database",
        ),
        (
            ["router.ledger.postgres.sslmode=require"],
            "router.ledger.postgres.sslmode needs router.ledger.postgres.host (with "
            "existingSecret, put sslmode in the DSN)",
        ),
    ],
    ids=["both-sources", "no-password", "persistence", "password-alone", "sslmode-alone"],
)
def test_install_refuses_contradictory_postgres_values(
    helm: Helm, sets: list[str], message: str
) -> None:
    assert refusal(helm, sets) == message


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["router.workers=0"], "/router/workers"),
        (["router.ledger.postgres.port=0"], "/router/ledger/postgres/port"),
        (["router.ledger.postgres.sslmode=on"], "/router/ledger/postgres/sslmode"),
        (["router.ledger.postgres.host=db:5432"], "/router/ledger/postgres/host"),
        (["router.ledger.postgres.user=a@b"], "/router/ledger/postgres/user"),
        (["router.ledger.postgres.database=a/b"], "/router/ledger/postgres/database"),
        (["router.ledger.postgres.existingSecret=Not_A_Name"], "existingSecret"),
        # No value holds a password: it comes from a Secret.
        (["router.ledger.postgres.password=hunter2"], "'password' not allowed"),
    ],
)
def test_schema_refuses_bad_ledger_values(helm: Helm, sets: list[str], field: str) -> None:
    with pytest.raises(HelmFailed) as failure:
        helm.template(sets=sets)
    assert "schema" in str(failure.value) and field in str(failure.value), str(failure.value)


def test_postgres_by_host_renders_a_passwordless_url_and_pgpassword(
    variant_manifests: list[Manifest],
) -> None:
    settings = router_settings(variant_manifests)
    url = "postgresql://tiergate_router@db.example.com:6432/billing?sslmode=verify-full"
    assert settings["ledgerUrl"] == url
    assert {"ledgerPath", "ledgerUrlFile", "ledgerMaxSize"}.isdisjoint(settings)
    assert urlsplit(settings["ledgerUrl"]).password is None
    parsed = RouterConfig.model_validate({"router": settings, "pools": []}).router
    assert parsed.ledger_dsn() == url
    env = router_container(variant_manifests)["env"]
    assert [e for e in env if e["name"] == "PGPASSWORD"] == [
        {
            "name": "PGPASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "tiergate-db", "key": "router-password"}},
        }
    ]


def test_postgres_by_host_leaves_sslmode_to_the_driver_unless_set(helm: Helm) -> None:
    manifests = helm.template(sets=POSTGRES_HOST)
    url = router_settings(manifests)["ledgerUrl"]
    assert url == "postgresql://tiergate@db.example.com:5432/tiergate"


def test_postgres_by_existing_secret_mounts_the_dsn_as_the_url_file(helm: Helm) -> None:
    manifests = helm.template(
        sets=[*POSTGRES_DSN, "router.ledger.postgres.secretKey=uri", "router.replicas=3"]
    )
    settings = router_settings(manifests)
    assert settings["ledgerUrlFile"] == "/etc/tiergate/ledger-url"
    assert {"ledgerPath", "ledgerUrl", "ledgerMaxSize"}.isdisjoint(settings)
    assert settings["ledgerRetentionDays"] == 90  # retention applies to either ledger
    parsed = RouterConfig.model_validate({"router": settings, "pools": []}).router
    assert str(parsed.ledger_url_file) == "/etc/tiergate/ledger-url"
    container = router_container(manifests)
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/tiergate"]
    (volume,) = [v for v in router_pod(manifests)["volumes"] if v["name"] == mount["name"]]
    assert mount["readOnly"] is True
    assert {
        "secret": {"name": "tiergate-dsn", "items": [{"key": "uri", "path": "ledger-url"}]}
    } in (volume["projected"]["sources"])
    assert "PGPASSWORD" not in {e["name"] for e in container["env"]}


def test_a_password_secret_also_serves_a_dsn_without_one(helm: Helm) -> None:
    """A DSN Secret may leave the password out, for the driver to read from PGPASSWORD."""
    manifests = helm.template(
        sets=[*POSTGRES_DSN, "router.ledger.postgres.passwordSecret.name=tiergate-db"]
    )
    env = {e["name"]: e.get("valueFrom") for e in router_container(manifests)["env"]}
    assert env["PGPASSWORD"] == {"secretKeyRef": {"name": "tiergate-db", "key": "password"}}


@pytest.mark.parametrize("sets", [POSTGRES_DSN, POSTGRES_HOST], ids=["dsn-secret", "host"])
def test_postgres_mode_spools_to_an_emptydir_and_rolls_updates(helm: Helm, sets: list[str]) -> None:
    """No claim (nothing to keep across pods), but a pod volume for the processes' spool files,
    which a restarted worker or container of the same pod replays."""
    manifests = helm.template(sets=[*sets, "router.replicas=2"])
    assert find(manifests, "PersistentVolumeClaim") == []
    (volume,) = [v for v in router_pod(manifests)["volumes"] if v["name"] == "ledger"]
    assert volume == {"name": "ledger", "emptyDir": {}}
    mounts = {m["mountPath"]: m["name"] for m in router_container(manifests)["volumeMounts"]}
    assert mounts["/var/lib/tiergate"] == "ledger"
    settings = router_settings(manifests)
    assert settings["ledgerSpoolDir"] == "/var/lib/tiergate/spool"
    assert settings["ledgerSpoolMaxSize"] == "256Mi"
    deployment = one(manifests, "Deployment", ROUTER)["spec"]
    assert deployment["replicas"] == 2 and deployment["strategy"] == ROLLING_UPDATE


def test_the_router_s_strategy_is_written_out_so_persistence_can_turn_it_to_recreate(
    default_manifests: list[Manifest], persistent_manifests: list[Manifest]
) -> None:
    """A ReadWriteOnce ledger needs Recreate, which the API server refuses beside a
    rollingUpdate block. Under server-side apply a block Kubernetes defaulted belongs to no
    one, so it would stay when persistence is turned on and `helm upgrade` would fail; written
    out by the chart, it is the release's, and the upgrade to Recreate drops it."""
    assert one(default_manifests, "Deployment", ROUTER)["spec"]["strategy"] == ROLLING_UPDATE
    strategy = one(persistent_manifests, "Deployment", ROUTER)["spec"]["strategy"]
    assert strategy == {"type": "Recreate"}


def test_sqlite_mode_keeps_its_file_and_size_limit(
    default_manifests: list[Manifest], persistent_manifests: list[Manifest]
) -> None:
    for manifests in (default_manifests, persistent_manifests):
        settings = router_settings(manifests)
        assert settings["ledgerPath"] == "/var/lib/tiergate/ledger.sqlite"
        assert settings["ledgerMaxSize"] == "768Mi"
        assert {"ledgerUrl", "ledgerUrlFile", "ledgerSpoolDir"}.isdisjoint(settings)
        assert "PGPASSWORD" not in {e["name"] for e in router_container(manifests)["env"]}


def test_the_configmap_never_holds_database_credentials(
    helm: Helm, variant_manifests: list[Manifest]
) -> None:
    """The chart only ever names the Secrets: no password value exists in the values, and the
    ConfigMap holds a URL without one, or the path of the mounted DSN."""
    dsn_manifests = helm.template(sets=POSTGRES_DSN)
    for manifests in (variant_manifests, dsn_manifests):
        text = one(manifests, "ConfigMap", ROUTER)["data"]["router.yaml"]
        assert "password" not in text.lower() and "tiergate-db" not in text
        assert "tiergate-dsn" not in text
        assert "@" not in text.replace("tiergate_router@db.example.com", "")
        # No Secret of the chart carries the database's credentials either.
        secrets = [m["metadata"]["name"] for m in find(manifests, "Secret")]
        assert all(name.endswith("-tenants") for name in secrets), secrets


def test_workers_become_the_router_s_flag(
    default_manifests: list[Manifest], variant_manifests: list[Manifest]
) -> None:
    assert "--workers" not in router_container(default_manifests)["args"]
    args = router_container(variant_manifests)["args"]
    assert args[-2:] == ["--workers", "2"]


def test_workers_have_a_writable_tmp_for_their_shared_metrics(
    variant_manifests: list[Manifest],
) -> None:
    """`--workers` keeps the workers' metrics in a folder it makes under TMPDIR: the root
    filesystem is read-only, so that must be the pod's /tmp emptyDir."""
    container = router_container(variant_manifests)
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TMPDIR"] == "/tmp"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert not mount.get("readOnly")
    (volume,) = [v for v in router_pod(variant_manifests)["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume


def test_the_real_cli_accepts_the_workers_flag(variant_manifests: list[Manifest]) -> None:
    """`tiergate router` parses the chart's arguments, `--workers` with them."""
    from tiergate.cli import build_parser

    parsed = build_parser("router").parse_args(router_container(variant_manifests)["args"])
    assert str(parsed.config) == "/etc/tiergate/router.yaml"
    assert parsed.workers == 2


def test_notes_say_sqlite_serves_one_router_process(helm: Helm) -> None:
    text = notes(helm)
    assert (
        "  ledger    SQLite: one router process, its ledger on an emptyDir (lost with the pod);\n"
        "            more replicas or workers need router.ledger.postgres\n"
    ) in text
    kept = notes(helm, ["router.ledger.persistence.enabled=true"])
    assert f"its ledger on PVC {ROUTER}-ledger (kept on uninstall);" in kept


def test_notes_say_replicas_and_workers_share_the_postgres_ledger(helm: Helm) -> None:
    text = notes(helm, [*POSTGRES_HOST, "router.replicas=3", "router.workers=2"])
    assert (
        "  ledger    PostgreSQL (db.example.com:5432/tiergate as tiergate), shared by\n"
        "            3 replicas x 2 workers: usage, budgets and rate limits hold across them all\n"
    ) in text
    assert "SQLite" not in text
    autoscaled = notes(helm, values=[VARIANT])
    assert "PostgreSQL (db.example.com:6432/billing as tiergate_router), shared by" in autoscaled
    assert "2-6 replicas (autoscaled) x 2 workers:" in autoscaled
    from_secret = notes(helm, POSTGRES_DSN)
    assert "PostgreSQL (the DSN in Secret tiergate-dsn, key dsn), shared by" in from_secret
    assert "1 replica x 1 worker:" in from_secret
