"""The adversarial suite's system under attack: real `tiergate sim-node` processes, a real
`tiergate router` process in front of them, all on loopback; and what every refusal must look
like (a uniquely named module: conftest names clash).

Every node runs the 8B model on one wafer-scale chip (~1,800 tokens/s a stream): replies are
quick, so attacks and the legitimate requests that follow them cost little time.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from connection_helpers import read_until_closed
from loopback_ports import refused_url
from polling_helpers import until
from process_helpers import Running, start_router, start_sim_nodes

MODEL, ACCELERATOR = "llama-3.1-8b", "wse-3"
#: Anything that would tell a client where the router's nodes are.
INTERNAL = re.compile(r"https?://|127\.0\.0\.1|localhost")


@dataclass(frozen=True)
class Pool:
    """One pool of the system: `replicas` sim-node processes serving `served`, and `urls` as
    further endpoints (addresses nothing listens on, say)."""

    name: str
    tier: str
    served: str
    replicas: int = 1
    max_num_seqs: int = 16
    node_flags: tuple[str, ...] = ()
    #: YAML fields added to the pool's map in the router's config (e.g. its billing).
    extra: str = ""
    urls: tuple[str, ...] = ()


@dataclass
class System:
    """The running system: the router's URL, each pool's nodes, the router's files."""

    url: str
    router: Running
    nodes: dict[str, list[Running]]
    tenants: Path
    ledger: Path
    endpoints: list[str] = field(default_factory=list)

    def log(self) -> str:
        return self.router.log_text()


@contextmanager
def running_system(
    tmp: Path, pools: Sequence[Pool], *, tenants: str | None = None, router: str = ""
) -> Iterator[System]:
    """Start `pools`' nodes, then a router over them; stop everything at the end. `tenants`
    is the tenants file's YAML (None: authentication off); `router` adds fields to the
    router's settings (YAML, e.g. "connections: {idleTimeoutS: 1}")."""
    tenants_file, ledger = tmp / "tenants.yaml", tmp / "ledger.sqlite"
    with ExitStack() as stack:
        wanted = [
            (tmp / f"{pool.name}-{i}.log", node_flags(pool))
            for pool in pools
            for i in range(pool.replicas)
        ]
        started = iter(start_sim_nodes(wanted))
        nodes: dict[str, list[Running]] = {}
        for pool in pools:
            nodes[pool.name] = [next(started) for _ in range(pool.replicas)]
            for node in nodes[pool.name]:
                stack.callback(node.stop)
        settings = [f"ledgerPath: {ledger}", "reloadIntervalS: 0.1"]
        if tenants is not None:
            tenants_file.write_text(tenants)
            settings.append(f"tenantsFile: {tenants_file}")
        if router:
            settings.append(router)
        lines = [f"router: {{{', '.join(settings)}}}", "pools:"]
        endpoints: list[str] = []
        for pool in pools:
            urls = [n.url for n in nodes[pool.name]] + list(pool.urls)
            endpoints += urls
            fields = [
                f"name: {pool.name}, tier: {pool.tier}, model: {MODEL}",
                f"accelerator: {ACCELERATOR}, servedModelName: {pool.served}",
                f"batching: {{maxNumSeqs: {pool.max_num_seqs}}}, endpoints: {json.dumps(urls)}",
                *([pool.extra] if pool.extra else []),
            ]
            lines.append(f"  - {{{', '.join(fields)}}}")
        config = tmp / "router.yaml"
        config.write_text("\n".join(lines) + "\n")
        process = start_router(config, tmp / "router.log")
        stack.callback(process.stop)
        until(lambda: ready(process.url), "the router is not ready", 60)
        yield System(process.url, process, nodes, tenants_file, ledger, endpoints)


def nothing_listens() -> str:
    """The URL of a loopback port nothing listens on."""
    return refused_url()


def node_flags(pool: Pool) -> list[str]:
    return [
        "--model", MODEL, "--accelerator", ACCELERATOR, "--served-model-name", pool.served,
        "--max-num-seqs", str(pool.max_num_seqs), "--log-level", "warning", *pool.node_flags,
    ]  # fmt: skip


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def chat(model: str, content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **fields}


def raw_request(
    url: str, method: str, path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes = b""
) -> httpx.Response:
    """Send a request as bytes, headers exactly as given (no client library would send some
    of them), on a connection of its own; its reply, read until the server closes."""
    parts = urlsplit(url)
    head = b"%s %s HTTP/1.1\r\nhost: router\r\nconnection: close\r\n" % (
        method.encode(),
        path.encode(),
    )
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    if body or method == "POST":
        head += b"content-length: %d\r\n" % len(body)
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(head + b"\r\n" + body)
        return as_response(read_until_closed(sock))


def one_reply(sock: socket.socket) -> httpx.Response:
    """One reply with a Content-Length read from `sock`, which stays open (a kept-alive
    connection, or one whose request body was never sent)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole head: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = as_response(head + b"\r\n\r\n").headers["content-length"]
    while len(body) < int(length):
        chunk = sock.recv(65536)
        assert chunk, f"closed before a whole body: {received + body!r}"
        body += chunk
    return as_response(head + b"\r\n\r\n" + body)


def as_response(reply: bytes) -> httpx.Response:
    """The HTTP reply in `reply` (a whole one, with a Content-Length) as an httpx.Response."""
    status_line, _, rest = reply.partition(b"\r\n")
    head_lines, _, content = rest.partition(b"\r\n\r\n")
    fields = [line.split(b":", 1) for line in head_lines.split(b"\r\n") if line]
    return httpx.Response(
        int(status_line.split()[1]),
        headers=[(name.strip(), value.strip()) for name, value in fields],
        content=content,
    )


def assert_refused(
    reply: httpx.Response, status: int, code: str | None, system: System | None = None
) -> dict[str, Any]:
    """`reply` is the OpenAI error envelope with `status` and `code` (None: any code, a node's
    refusal may have none), and gives nothing away: no traceback, no node address (any of
    `system`'s). Returns the envelope's `error`."""
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/json"), reply.headers
    error: dict[str, Any] = reply.json()["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert "code" in error and (code is None or error["code"] == code), error
    assert "Traceback" not in reply.text and not INTERNAL.search(reply.text), reply.text
    if system is not None:
        ports = "|".join(url.rsplit(":", 1)[1] for url in system.endpoints)
        assert not re.search(rf"\b({ports})\b", reply.text), reply.text
    return error


def assert_serves(system: System, headers: dict[str, str], model: str) -> None:
    """A legitimate request, after an attack, is served whole."""
    r = httpx.post(
        system.url + "/v1/chat/completions",
        json=chat(model, max_tokens=3, ignore_eos=True),
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3


@contextmanager
def in_flight_stream(
    system: System, headers: dict[str, str], model: str, tokens: int = 400
) -> Iterator[None]:
    """A stream accepted before the block, whose first token has arrived: after the block it
    must still end whole (every token, then [DONE]), whatever was done meanwhile."""
    body = chat(model, max_tokens=tokens, ignore_eos=True, stream=True,
                stream_options={"include_usage": True})  # fmt: skip
    with httpx.stream(
        "POST", system.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()  # kept: a dropped iterator closes the stream
        assert next(line for line in lines if line.startswith("data: "))
        yield
        events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    assert json.loads(events[-2])["usage"]["completion_tokens"] == tokens


def metric(system: System, sample: str) -> float:
    """The value of `sample` (a name with its labels, as exposed) on the router's /metrics
    (its metrics port)."""
    url = system.router.metrics_url
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rpartition(" ")[2])
    raise AssertionError(f"no sample {sample} on {url}")
