"""`kubectl logs` and `kubectl port-forward` for the pod runner's pods, through kwok.

The API server sends both to the pod's node, here kwok's controller, which serves them from
per-pod objects the cluster's KwokctlConfiguration enables (`enableCRDs: [Logs, PortForward]`):
a `Logs` object names the file holding the container's log in the CRI format (the one the
kubelet reads: `<RFC 3339 time> stdout F <line>`), a `PortForward` one the address to connect
a forwarded port to. The runner writes that file beside its plain log and makes both objects,
named after the pod and owned by it, so they go when the pod goes.
"""

from __future__ import annotations

import datetime
import logging
import threading
from pathlib import Path
from typing import IO, Any

from kubernetes import client

log = logging.getLogger("pod-runner")

KWOK_GROUP = "kwok.x-k8s.io"
KWOK_VERSION = "v1alpha1"
FIELD_MANAGER = "tiergate-pod-runner"
API_TIMEOUT_S = 10


def cri_line(line: bytes, now: datetime.datetime) -> bytes:
    """One line of output as the CRI log format has it (always a whole line: `F`)."""
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return stamp.encode() + b" stdout F " + line.rstrip(b"\n") + b"\n"


def pump(output: IO[bytes], plain: Path, cri: Path) -> threading.Thread:
    """Copy a process's output, line by line, to `plain` as it is and to `cri` in the CRI
    format, until it closes; a daemon thread, started."""

    def run() -> None:
        with output, plain.open("ab") as raw, cri.open("ab") as formatted:
            for line in iter(output.readline, b""):
                raw.write(line)
                raw.flush()
                formatted.write(cri_line(line, datetime.datetime.now(datetime.UTC)))
                formatted.flush()

    thread = threading.Thread(target=run, name=f"log {plain.name}", daemon=True)
    thread.start()
    return thread


def debugging_objects(pod: client.V1Pod, cri_log: Path) -> list[dict[str, Any]]:
    """The pod's Logs and PortForward objects: its container's log file, and each declared
    container port forwarded to the same port on the pod's IP."""
    meta = pod.metadata
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": meta.name,
        "uid": meta.uid,
    }
    metadata = {"name": meta.name, "namespace": meta.namespace, "ownerReferences": [owner]}
    containers = [c.name for c in pod.spec.containers]
    ports = sorted({p.container_port for c in pod.spec.containers for p in c.ports or []})
    logs = {
        "apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}",
        "kind": "Logs",
        "metadata": metadata,
        "spec": {"logs": [{"containers": containers, "logsFile": str(cri_log), "follow": True}]},
    }
    forward = {
        "apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}",
        "kind": "PortForward",
        "metadata": metadata,
        "spec": {
            "forwards": [
                {"ports": [port], "target": {"port": port, "address": pod.status.pod_ip}}
                for port in ports
            ]
        },
    }
    return [logs] if not ports else [logs, forward]


def apply_debugging(api: client.CustomObjectsApi, pod: client.V1Pod, cri_log: Path) -> None:
    """Create or update the pod's Logs and PortForward objects (server-side apply: the same
    pod name with a new pod replaces the old pod's)."""
    plurals = {"Logs": "logs", "PortForward": "portforwards"}
    for obj in debugging_objects(pod, cri_log):
        meta = obj["metadata"]
        api.patch_namespaced_custom_object(
            KWOK_GROUP, KWOK_VERSION, meta["namespace"], plurals[obj["kind"]], meta["name"], obj,
            field_manager=FIELD_MANAGER, force=True,
            _content_type="application/apply-patch+yaml", _request_timeout=API_TIMEOUT_S,
        )  # fmt: skip
