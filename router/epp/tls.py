"""TLS on the endpoint picker's port, as gateways expect it.

Gateways reach an endpoint picker over TLS without checking its certificate (Envoy AI Gateway
and the Gateway API Inference Extension's own Envoy render an `UpstreamTlsContext` with an
empty validation context; Istio's guide a DestinationRule with `insecureSkipVerify`), and the
extension's picker serves a self-signed certificate unless it is given one. tiergate does the
same: `eppTls.enabled` (the default) with no files serves a certificate made at start (an
ECDSA P-256 key that never leaves the process); `certFile`/`keyFile` (a cert-manager Secret's
`tls.crt`/`tls.key`) serve those, read again for the next connection when either file changes,
so a renewed certificate needs no restart. A pair that cannot be read or does not match is an
error at start; after start, the last good pair stays and the failure is logged.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["TlsFiles", "TlsProblem", "self_signed", "server_credentials"]

log = logging.getLogger("tiergate.router")

#: Names in the self-signed certificate (gateways do not check them).
COMMON_NAME = "tiergate-endpoint-picker"
#: How long the self-signed certificate is valid: the process's life, and then some.
SELF_SIGNED_DAYS = 3650


class TlsProblem(Exception):
    """A certificate or key that cannot be served; the message is one line for people."""


def self_signed() -> tuple[bytes, bytes]:
    """A new (private key PEM, certificate PEM) pair, made now."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(COMMON_NAME)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, certificate.public_bytes(serialization.Encoding.PEM)


@dataclass
class TlsFiles:
    """A certificate and key on disk, read again when either changes."""

    cert_file: Path
    key_file: Path

    def __post_init__(self) -> None:
        #: The files' identity when last served, and when last refused (a refused pair is
        #: not read again, nor logged again, until the files change).
        self._served: _Stamp | None = None
        self._refused: _Stamp | None = None

    def _stamp(self) -> _Stamp:
        stamps = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
            except OSError:
                stamps.append((-1, -1, -1))  # missing: a stamp of its own
                continue
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(stamps)

    def read(self) -> tuple[bytes, bytes]:
        """(key PEM, certificate PEM), checked to be a pair; TlsProblem says what is wrong."""
        try:
            cert_pem, key_pem = self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as exc:
            raise TlsProblem(f"cannot read {exc.filename}: {exc.strerror}") from None
        try:
            certificate = x509.load_pem_x509_certificate(cert_pem)
        except ValueError:
            raise TlsProblem(f"{self.cert_file} holds no PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError):
            raise TlsProblem(f"{self.key_file} holds no unencrypted PEM private key") from None
        if _public(key.public_key()) != _public(certificate.public_key()):
            raise TlsProblem(f"{self.key_file} is not the key of {self.cert_file}")
        return key_pem, cert_pem

    def read_if_changed(self) -> tuple[bytes, bytes] | None:
        """The pair when the files changed since they were last served, else None; TlsProblem
        once for a pair that cannot be served (None for it afterwards, until they change)."""
        stamp = self._stamp()
        if stamp in (self._served, self._refused):
            return None
        try:
            pair = self.read()
        except TlsProblem:
            self._refused = stamp
            raise
        self._served = stamp
        return pair


_Stamp = tuple[tuple[int, int, int], ...]


def _public(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def server_credentials(files: TlsFiles | None) -> grpc.ServerCredentials:
    """TLS credentials for the picker's port: `files` (read again when they change) or, for
    None, a self-signed certificate made now. TlsProblem when the files cannot be served."""
    if files is None:
        return grpc.ssl_server_credentials([self_signed()])
    first = files.read_if_changed()
    assert first is not None

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        # Called by gRPC before each new connection's handshake; None keeps the current pair.
        try:
            pair = files.read_if_changed()
        except TlsProblem as problem:
            log.warning("event=epp_tls_reload_failed problem=%s", problem)
            return None
        if pair is None:
            return None
        log.info("event=epp_tls_reloaded cert_file=%s", files.cert_file)
        return grpc.ssl_server_certificate_configuration([pair])

    # gRPC documents None from the fetcher as "no change"; its type stub leaves None out.
    return grpc.dynamic_ssl_server_credentials(
        grpc.ssl_server_certificate_configuration([first]),
        fetch,  # type: ignore[arg-type]
    )
