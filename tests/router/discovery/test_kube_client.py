"""The real Kubernetes API adapter (`KubernetesApi` on the `kubernetes` client) over HTTP.

A few paths of an API server, served for real: list bodies, and watches streamed with
chunked transfer encoding the way the API server streams them (one JSON event per line,
lines free to straddle chunks). The source runs on the real client from a real kubeconfig.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from kube_helpers import eventually, recorded, urls

from tiergate.router.discovery.kube import KubeSource
from tiergate.router.discovery.kube_client import KubernetesApi, _lines, load_api_client
from tiergate.router.discovery.kube_state import INFERENCE_POOLS, PODS, KubeApiError, WatchExpired
from tiergate.sim_nodes.catalogs import default_catalog

POOLS_PATH = "/apis/tiergate.dev/v1alpha1/namespaces/tiergate/inferencepools"
PODS_PATH = "/api/v1/namespaces/tiergate/pods"
END = {"end": True}  # the server ends the watch
TOKEN = "not-a-real-token"


def _true(value: str | None) -> bool:
    """A boolean query parameter as the API server reads it (Go's strconv.ParseBool)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


class FakeApiServer:
    """Answers list and watch GETs from what the test queues per path."""

    def __init__(self) -> None:
        self.lists: dict[str, tuple[int, Any]] = {}
        self.watches: dict[str, queue.Queue[Any]] = {}
        self.requests: list[tuple[str, dict[str, str], str | None]] = []
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def watch_queue(self, path: str) -> queue.Queue[Any]:
        return self.watches.setdefault(path, queue.Queue())

    def watch_queries(self, path: str) -> list[dict[str, str]]:
        return [q for p, q, _ in self.requests if p == path and _true(q.get("watch"))]

    def list_queries(self, path: str) -> list[dict[str, str]]:
        return [q for p, q, _ in self.requests if p == path and not _true(q.get("watch"))]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                auth = self.headers.get("authorization")
                server.requests.append((parts.path, query, auth))
                if _true(query.get("watch")):
                    self._watch(server.watch_queue(parts.path))
                else:
                    status, body = server.lists.get(parts.path, (404, {"kind": "Status"}))
                    self._send(status, body)

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _watch(self, items: queue.Queue[Any]) -> None:
                first = self._next(items)
                if isinstance(first, int):  # the watch request itself fails
                    self._send(first, {"kind": "Status", "code": first, "reason": "Expired"})
                    return
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                item = first
                while item is not None and item is not END:
                    line = json.dumps(item).encode() + b"\n"
                    half = len(line) // 2  # one event over two chunks
                    for chunk in (line[:half], line[half:]):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    item = self._next(items)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _next(self, items: queue.Queue[Any]) -> Any:
                while not server.stopping.is_set():
                    try:
                        return items.get(timeout=0.02)
                    except queue.Empty:
                        continue
                return None

        return Handler

    def __enter__(self) -> FakeApiServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api(server: FakeApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubernetesApi:
    """The real adapter, configured from a kubeconfig like a developer's."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        })
    )  # fmt: skip
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    client, origin = load_api_client()
    assert origin == "kubeconfig"
    return KubernetesApi(client, "tiergate")


async def test_the_source_lists_and_watches_over_http(
    server: FakeApiServer, api: KubernetesApi, caplog: pytest.LogCaptureFixture
) -> None:
    server.lists[POOLS_PATH] = (200, recorded("inferencepools_list"))
    server.lists[PODS_PATH] = (200, recorded("pods_list"))
    source = KubeSource(api, default_catalog(), namespace="tiergate", debounce_s=0.0)
    await source.start()
    try:
        await eventually(lambda: source.synced)
        assert urls(source, "coder-batched") == [
            "http://10.244.1.17:8000",
            "http://10.244.2.9:8000",
        ]
        server.watch_queue(PODS_PATH).put(recorded("pod_batched_ready"))
        await eventually(lambda: "http://10.244.3.4:8000" in urls(source, "coder-batched"))
        server.watch_queue(POOLS_PATH).put(recorded("pool_premium_deleted"))
        await eventually(lambda: "coder-premium" not in source.view.pools)
        threads = list(source._threads)
    finally:
        await source.stop()  # both watches are open and silent: stop must cut them
    assert threads and not any(t.is_alive() for t in threads)

    watch = server.watch_queries(PODS_PATH)[0]
    assert watch["resourceVersion"] == "48250" and _true(watch["allowWatchBookmarks"])
    assert watch["timeoutSeconds"] == "120"
    # only sim-node pods, listed and watched: the server filters, not the router
    selectors = [q.get("labelSelector") for q in server.list_queries(PODS_PATH)]
    selectors += [q.get("labelSelector") for q in server.watch_queries(PODS_PATH)]
    assert selectors == ["app.kubernetes.io/name=tiergate-sim-node"] * 2
    # every InferencePool in the namespace
    pool_queries = server.list_queries(POOLS_PATH) + server.watch_queries(POOLS_PATH)
    assert pool_queries and not any("labelSelector" in q for q in pool_queries)
    assert {auth for _, _, auth in server.requests} == {f"Bearer {TOKEN}"}
    assert TOKEN not in caplog.text


def test_http_errors_become_the_watchers_errors(server: FakeApiServer, api: KubernetesApi) -> None:
    server.lists[POOLS_PATH] = (500, {"kind": "Status", "message": "etcd is down", "code": 500})
    with pytest.raises(KubeApiError) as raised:
        api.list(INFERENCE_POOLS)
    assert raised.value.status == 500
    assert TOKEN not in str(raised.value) and "\n" not in str(raised.value)

    server.watch_queue(PODS_PATH).put(410)
    with pytest.raises(WatchExpired):
        list(api.watch(PODS, "100", 60))

    server.watch_queue(PODS_PATH).put(recorded("pods_bookmark"))
    server.watch_queue(PODS_PATH).put(END)
    assert list(api.watch(PODS, "100", 60)) == [recorded("pods_bookmark")]


def test_interrupt_wakes_a_watch_blocked_in_a_read(
    server: FakeApiServer, api: KubernetesApi
) -> None:
    server.watch_queue(POOLS_PATH).put(recorded("pool_spark_added"))  # then silence
    got: list[Any] = []
    failed: list[BaseException] = []

    def consume() -> None:
        try:
            for event in api.watch(INFERENCE_POOLS, "48250", 60):
                got.append(event)
        except KubeApiError as exc:
            failed.append(exc)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    deadline = threading.Event()
    for _ in range(500):
        if got:
            break
        deadline.wait(0.01)
    assert got, "the first event did not arrive"
    api.interrupt()
    thread.join(5)
    assert not thread.is_alive()
    with pytest.raises(KubeApiError, match="stopping"):  # and it stays stopped
        api.list(INFERENCE_POOLS)


def test_a_watch_that_goes_silent_past_its_timeout_fails(
    server: FakeApiServer, api: KubernetesApi
) -> None:
    """A stalled connection (the server should have ended the watch long ago) must not hang."""
    stalling = KubernetesApi(api._custom.api_client, "tiergate", watch_read_margin_s=0.1)
    server.watch_queue(POOLS_PATH).put(recorded("pool_spark_added"))  # then nothing, ever
    events: list[Any] = []
    with pytest.raises(KubeApiError, match="watch inferencepools: ReadTimeoutError"):
        for event in stalling.watch(INFERENCE_POOLS, "48250", 1):  # read timeout 1.1 s
            events.append(event)
    assert events == [recorded("pool_spark_added")]


def test_lines_may_straddle_chunks() -> None:
    chunks = [b'{"a":', b' 1}\n{"b"', b": 2}\n\n", '{"c": 3}']
    assert [json.loads(line) for line in _lines(chunks)] == [{"a": 1}, {"b": 2}, {"c": 3}]
