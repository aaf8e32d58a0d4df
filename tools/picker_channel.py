"""gRPC channels to tiergate's endpoint picker as a gateway opens them: over TLS trusting
whatever certificate the picker serves (a gateway does not check it), or plaintext.

gRPC's Python client cannot skip the check, so the certificate is first read from the port and
then trusted by name (its subject's common name). The tests and the e2e suite use it.
"""

from __future__ import annotations

import socket
import ssl

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID


def served_certificate(host: str, port: int) -> bytes:
    """The certificate (PEM) the picker at `host:port` serves now."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host.strip("[]"), port), timeout=5) as raw,
        context.wrap_socket(raw) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return ssl.DER_cert_to_PEM_cert(der).encode()


def common_name(pem: bytes) -> str:
    names = x509.load_pem_x509_certificate(pem).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value)


def _tls(host: str, port: int) -> tuple[grpc.ChannelCredentials, list[tuple[str, str]]]:
    pem = served_certificate(host, port)
    credentials = grpc.ssl_channel_credentials(root_certificates=pem)
    return credentials, [("grpc.ssl_target_name_override", common_name(pem))]


def aio_channel(host: str, port: int, *, tls: bool = True) -> grpc.aio.Channel:
    """An asyncio channel to the picker (use `async with`)."""
    target = f"{host}:{port}"
    if not tls:
        return grpc.aio.insecure_channel(target)
    credentials, options = _tls(host, port)
    return grpc.aio.secure_channel(target, credentials, options=options)


def channel(host: str, port: int, *, tls: bool = True) -> grpc.Channel:
    """A blocking channel to the picker (use `with`)."""
    target = f"{host}:{port}"
    if not tls:
        return grpc.insecure_channel(target)
    credentials, options = _tls(host, port)
    return grpc.secure_channel(target, credentials, options=options)
