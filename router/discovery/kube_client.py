"""The Kubernetes API as discovery calls it, on the official `kubernetes` client.

Responses are read raw (`_preload_content=False`) and parsed as JSON, not deserialized into
the client's model classes: InferencePools have no model class, and raw dicts keep the API
server's own (camelCase) shape, which is what `kube_state` and the recorded test data use.

Imported only when `discovery.kubernetes` is configured: the client is a heavy import that
the other commands do not need.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from tiergate.router.config import ConfigError
from tiergate.router.discovery.kube_state import (
    INFERENCE_POOLS,
    PODS,
    KubeApiError,
    Object,
    Resource,
    WatchExpired,
)

log = logging.getLogger("tiergate.router.kube")

#: Where Kubernetes mounts the pod's own namespace.
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
CONNECT_TIMEOUT_S = 10.0
#: A list that has not answered in this long is retried (with backoff).
LIST_TIMEOUT_S = 60.0
#: The socket read timeout of a watch is the server's watch timeout plus this: only a watch
#: the server should long have ended (a silent, stalled connection) trips it.
WATCH_READ_MARGIN_S = 30.0


def resolve_namespace(configured: str | None, namespace_file: Path = NAMESPACE_FILE) -> str:
    """The configured namespace, else the pod's own, else `default`."""
    if configured:
        return configured
    try:
        namespace = namespace_file.read_text(encoding="utf-8").strip()
    except OSError:
        namespace = ""
    return namespace or "default"


def load_api_client() -> tuple[k8s_client.ApiClient, str]:
    """An API client from the in-cluster service account, else the kubeconfig.

    Returns the client and where its configuration came from (`in-cluster`/`kubeconfig`).
    Raises ConfigError if there is neither.
    """
    configuration = k8s_client.Configuration()
    # The client's config loaders are untyped; they fill `configuration` in place.
    try:
        k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        origin = "in-cluster"
    except k8s_config.ConfigException:
        try:
            # KUBECONFIG (or ~/.kube/config), its current context. KUBECONFIG is passed
            # explicitly: the client reads it only once, when it is imported.
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.environ.get("KUBECONFIG") or None,
                client_configuration=configuration,
            )
        except (k8s_config.ConfigException, OSError) as exc:
            raise ConfigError(
                "discovery.kubernetes: no Kubernetes API: not running in a cluster, and no "
                f"usable kubeconfig (KUBECONFIG or ~/.kube/config): {exc}"
            ) from None
        origin = "kubeconfig"
    return k8s_client.ApiClient(configuration), origin


class KubernetesApi:
    """`kube_watch.KubeApi` for one namespace of a real API server.

    Once interrupted it stays so (every later call fails at once): the router stops it only
    when it stops for good.
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        namespace: str,
        *,
        list_timeout_s: float = LIST_TIMEOUT_S,
        watch_read_margin_s: float = WATCH_READ_MARGIN_S,
    ) -> None:
        self.namespace = namespace
        self.list_timeout_s = list_timeout_s
        self.watch_read_margin_s = watch_read_margin_s
        self._custom = k8s_client.CustomObjectsApi(api_client)
        self._core = k8s_client.CoreV1Api(api_client)
        self._lock = threading.Lock()
        self._open: set[urllib3.BaseHTTPResponse] = set()
        self._interrupted = False

    def list(self, resource: Resource) -> Object:
        timeouts = (CONNECT_TIMEOUT_S, self.list_timeout_s)
        response = self._request(resource, _request_timeout=timeouts)
        try:
            body = json.loads(response.data)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise KubeApiError(f"list {resource.plural}: {type(exc).__name__}") from None
        finally:
            self._close(response)
        if not isinstance(body, dict):
            raise KubeApiError(f"list {resource.plural}: the response is not a JSON object")
        return body

    def watch(self, resource: Resource, resource_version: str, timeout_s: int) -> Iterator[Object]:
        response = self._request(
            resource,
            watch=True,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            _request_timeout=(CONNECT_TIMEOUT_S, timeout_s + self.watch_read_margin_s),
        )
        try:
            for line in _lines(response.stream(amt=None, decode_content=False)):
                try:
                    event = json.loads(line)
                except ValueError:
                    raise KubeApiError(f"watch {resource.plural}: a line is not JSON") from None
                if isinstance(event, dict):
                    yield event
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # A read timeout lands here: the watch stalled; the watcher retries.
            raise KubeApiError(f"watch {resource.plural}: {type(exc).__name__}") from None
        finally:
            self._close(response)

    def read_secret(self, name: str) -> dict[str, str]:
        """The data of the Secret `name`, decoded (a hosted pool's provider key). KubeApiError
        says what failed, by status (403: the router's Role does not name the Secret) and
        never with the Secret's content."""
        if self._interrupted:
            raise KubeApiError("stopping")
        try:
            secret = self._core.read_namespaced_secret(
                name, self.namespace, _request_timeout=(CONNECT_TIMEOUT_S, self.list_timeout_s)
            )
        except ApiException as exc:
            # Only status and reason: the exception's text includes the response's body.
            status = exc.status if isinstance(exc.status, int) else None
            raise KubeApiError(f"Secret {name}: HTTP {status} {exc.reason}", status) from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise KubeApiError(f"Secret {name}: {_describe(exc)}") from None
        data = getattr(secret, "data", None)
        decoded: dict[str, str] = {}
        for key, value in (data if isinstance(data, dict) else {}).items():
            try:
                decoded[str(key)] = base64.b64decode(str(value)).decode("utf-8").strip()
            except (ValueError, UnicodeDecodeError):
                continue  # not a text key: no API key
        return decoded

    def interrupt(self) -> None:
        """Shut the sockets of open watches: their blocked reads return at once."""
        with self._lock:
            self._interrupted = True
            responses = list(self._open)
        for response in responses:
            try:
                response.shutdown()
            except Exception:  # already closed or released: nothing left to wake
                log.debug("event=watch_shutdown_skipped")

    def _request(self, resource: Resource, **kwargs: Any) -> urllib3.BaseHTTPResponse:
        """One GET of `resource`'s collection (its label selector applied), unread."""
        if self._interrupted:
            raise KubeApiError("stopping")
        if resource.label_selector:
            kwargs["label_selector"] = resource.label_selector
        try:
            if resource == INFERENCE_POOLS:
                response = self._custom.list_namespaced_custom_object(
                    resource.group, resource.version, self.namespace, resource.plural,
                    _preload_content=False, **kwargs,
                )  # fmt: skip
            elif resource == PODS:
                response = self._core.list_namespaced_pod(
                    self.namespace, _preload_content=False, **kwargs
                )
            else:
                raise KubeApiError(f"no API call for {resource.plural}")
        except ApiException as exc:
            # Only status and reason: the exception's text includes response headers.
            if exc.status == 410:
                raise WatchExpired(f"{resource.plural}: {exc.reason}") from None
            status = exc.status if isinstance(exc.status, int) else None
            raise KubeApiError(f"{resource.plural}: HTTP {status} {exc.reason}", status) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeApiError(f"{resource.plural}: {_describe(exc)}") from None
        if not isinstance(response, urllib3.BaseHTTPResponse):
            raise KubeApiError(f"{resource.plural}: unexpected client response {type(response)}")
        with self._lock:
            if self._interrupted:
                response.release_conn()
                raise KubeApiError("stopping")
            self._open.add(response)
        return response

    def _close(self, response: urllib3.BaseHTTPResponse) -> None:
        with self._lock:
            self._open.discard(response)
        # Not back to the pool: a watch cut short may still have bytes in flight.
        response.close()


def _lines(chunks: Iterable[bytes | str]) -> Iterator[bytes]:
    """Newline-separated lines of a chunked stream (a JSON event may span chunks)."""
    buffer = bytearray()
    for chunk in chunks:
        buffer.extend(chunk.encode() if isinstance(chunk, str) else chunk)
        while (end := buffer.find(b"\n")) != -1:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.strip():
                yield line
    if buffer.strip():
        yield bytes(buffer)


def _describe(exc: BaseException) -> str:
    # urllib3's messages name the host and path, never credentials; keep them short.
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."
