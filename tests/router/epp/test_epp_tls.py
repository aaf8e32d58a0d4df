"""TLS on the picker's port, as gateways reach it: a self-signed certificate by default, a
mounted pair (a cert-manager Secret) read again when it is renewed, plaintext when asked; and
the clear refusals of a pair that cannot be served."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from epp_system import System, chat, epp_system, post
from picker_channel import common_name, served_certificate
from polling_helpers import until

from tiergate.router.config import ConfigError, parse_config
from tiergate.router.epp.tls import COMMON_NAME, TlsFiles, TlsProblem, self_signed

#: Real servers on real sockets: left out of `make test-fast`.
pytestmark = pytest.mark.slow


def write_pair(folder: Path, name: str = "tls") -> tuple[Path, Path]:
    """A new key and certificate as files, as a mounted kubernetes.io/tls Secret holds them."""
    key, cert = self_signed()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.crt").write_bytes(cert)
    (folder / f"{name}.key").write_bytes(key)
    return folder / f"{name}.crt", folder / f"{name}.key"


def through_envoy(system: System, **settings: Any) -> int:
    envoy = system.envoy(**settings)
    return post(envoy.url, chat(max_tokens=2)).status_code


@pytest.fixture
def system(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> Iterator[System]:
    with epp_system(served, tmp_path) as s:
        yield s


def test_by_default_the_picker_serves_tls_with_a_certificate_of_its_own(system: System) -> None:
    pem = served_certificate("127.0.0.1", system.epp.port)
    assert common_name(pem) == COMMON_NAME
    assert system.epp.url.startswith("grpcs://")
    assert through_envoy(system) == 200
    # A gateway speaking plaintext to it gets no pick: Envoy answers, nothing is served.
    assert through_envoy(system, epp_tls=False) >= 500


def test_a_picker_without_tls_serves_a_plaintext_gateway(
    served: Callable[[Any], AbstractContextManager[str]], tmp_path: Path
) -> None:
    with epp_system(served, tmp_path, router="eppTls: {enabled: false}") as system:
        assert system.epp.url.startswith("grpc://")
        assert through_envoy(system, epp_tls=False) == 200
        with pytest.raises(ssl.SSLError):
            served_certificate("127.0.0.1", system.epp.port)


def test_a_mounted_pair_is_served_and_a_renewed_one_from_the_next_connection(
    served: Callable[[Any], AbstractContextManager[str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    mounted = tmp_path / "epp-tls"
    cert, key = write_pair(mounted)
    router = f"eppTls: {{certFile: {cert}, keyFile: {key}}}"
    with epp_system(served, tmp_path, router=router) as system:
        port = system.epp.port
        assert served_certificate("127.0.0.1", port) == cert.read_bytes()
        assert through_envoy(system) == 200

        # Renewed the way the kubelet updates a Secret volume: both files at once.
        new_cert, new_key = write_pair(tmp_path / "renewed")
        shutil.copy(new_key, key)
        shutil.copy(new_cert, cert)
        until(lambda: served_certificate("127.0.0.1", port) == cert.read_bytes(),
              "the renewed certificate was not served")  # fmt: skip
        assert through_envoy(system) == 200

        # A broken renewal (a key of another pair) is refused once; the last good pair stays.
        served_now = cert.read_bytes()
        _, other_key = write_pair(tmp_path / "other")
        shutil.copy(other_key, key)
        for _ in range(3):
            assert served_certificate("127.0.0.1", port) == served_now
        assert through_envoy(system) == 200
    refused = [r for r in caplog.records if "event=epp_tls_reload_failed" in r.getMessage()]
    assert len(refused) == 1 and "is not the key of" in refused[0].getMessage()
    assert "PRIVATE KEY" not in caplog.text


@pytest.mark.parametrize(
    ("router", "message"),
    [
        ("eppTls: {certFile: /nowhere/tls.crt}", "certFile and keyFile go together"),
        ("eppTls: {enabled: false, certFile: /a, keyFile: /b}", "need enabled: true"),
        ("eppTls: {enabled: maybe}", "eppTls.enabled"),
        ("eppTls: {certfile: /a}", "eppTls.certfile"),
    ],
    ids=["cert-without-key", "files-without-tls", "not-a-bool", "unknown-key"],
)
def test_a_tls_setting_that_cannot_work_is_a_config_error(router: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(f"router: {{eppPort: 9002, {router}}}\npools: []\n")


@pytest.mark.parametrize("problem", ["missing", "not-pem", "another-key"])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_pair_that_cannot_be_served_stops_the_router_with_one_line(
    tmp_path: Path, problem: str, workers: int
) -> None:
    cert, key = write_pair(tmp_path / "tls")
    expected = {
        "missing": "cannot read",
        "not-pem": "holds no PEM certificate",
        "another-key": "is not the key of",
    }[problem]
    if problem == "missing":
        key.unlink()
    elif problem == "not-pem":
        cert.write_text("hello")
    else:
        shutil.copy(write_pair(tmp_path / "other")[1], key)
    ledger = "ledgerUrl: postgresql://127.0.0.1:9/x" if workers > 1 else "ledgerPath: l.sqlite"
    config = tmp_path / "router.yaml"
    config.write_text(
        f"router: {{{ledger}, eppPort: 0, eppTls: {{certFile: {cert}, keyFile: {key}}}}}\n"
        "pools: []\n"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-m", "tiergate", "router", "--config", str(config),
         "--port", "0", "--metrics-port", "0", "--workers", str(workers)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "error" in line]
    assert "router.eppTls" in line and expected in line, done.stderr
    assert "Traceback" not in done.stderr and "PRIVATE" not in done.stderr


def test_the_files_are_read_again_only_when_they_change(tmp_path: Path) -> None:
    cert, key = write_pair(tmp_path)
    files = TlsFiles(cert, key)
    first = files.read_if_changed()
    assert first == (key.read_bytes(), cert.read_bytes())
    assert files.read_if_changed() is None  # unchanged
    key.unlink()
    with pytest.raises(TlsProblem, match="cannot read"):
        files.read_if_changed()
    assert files.read_if_changed() is None  # refused once, then quiet until they change
    new_cert, new_key = write_pair(tmp_path / "new")
    shutil.copy(new_key, key)
    shutil.copy(new_cert, cert)
    assert files.read_if_changed() == (key.read_bytes(), cert.read_bytes())
