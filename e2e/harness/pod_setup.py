"""What the pod runner gives a pod's process, as a kubelet gives a container: its command line
and environment, its volumes and service account bind-mounted in a mount namespace of its
own, and an /etc/hosts naming the Services it may reach.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

log = logging.getLogger("pod-runner")

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
API_TIMEOUT_S = 10  # every API call: a stalled call must not freeze the runner's loop
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")


@dataclass
class Runner:
    """Settings shared by every pod."""

    api: client.CoreV1Api
    custom: client.CustomObjectsApi
    state: Path
    tiergate: Path
    shim: Path
    api_host: str
    api_port: str
    ca_file: Path
    image: str = "tiergate"
    # Host paths a pod may not hide with a mount (the runner's own files live there).
    protected: tuple[Path, ...] = ()


def runnable(pod: client.V1Pod) -> bool:
    status = pod.status
    return (
        pod.metadata.deletion_timestamp is None
        and status is not None
        and status.phase == "Running"
        and bool(status.pod_ip)
    )


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, `$$` is a literal `$`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR.sub(sub, value)


def field_ref(pod: client.V1Pod, path: str) -> str:
    meta, spec, status = pod.metadata, pod.spec, pod.status
    simple = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": spec.node_name,
        "spec.serviceAccountName": spec.service_account_name,
        "status.podIP": status.pod_ip,
        "status.hostIP": status.host_ip,
    }
    if path in simple:
        return simple[path] or ""
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return ((meta.labels if m.group(1) == "labels" else meta.annotations) or {}).get(
            m.group(2), ""
        )
    raise ValueError(f"fieldRef {path!r} is not supported by the pod runner")


class PodSetup:
    """Prepares each pod's process; `running(uid)`: whether the runner runs that pod's process
    (only those back a Service in /etc/hosts)."""

    def __init__(self, runner: Runner, running: Callable[[str], bool]) -> None:
        self.r = runner
        self.running = running

    def prepare(self, pod: client.V1Pod) -> tuple[list[str], dict[str, str], Path]:
        """The pod's command line (in its own mount namespace), environment and log file."""
        meta = pod.metadata
        if len(pod.spec.containers) != 1:
            raise ValueError("only pods with one container are supported")
        container = pod.spec.containers[0]
        root = self.r.state / "pods" / meta.namespace / f"{meta.name}-{meta.uid[:8]}"
        root.mkdir(parents=True, exist_ok=True)
        env = self._env(pod, container)
        command = [expand(a, env) for a in (container.command or ["tiergate"])]
        args = [expand(a, env) for a in (container.args or [])]
        if command[0] == "tiergate":
            command[0] = str(self.r.tiergate)
        mounts = self._mounts(pod, container, root)
        script = ["set -e"]
        for host, target, read_only in mounts:
            if host.is_dir():
                script.append(f"mkdir -p {shlex.quote(target)}")
            else:
                parent = shlex.quote(str(Path(target).parent))
                script.append(f"mkdir -p {parent} && touch {shlex.quote(target)}")
            script.append(f"mount --bind {shlex.quote(str(host))} {shlex.quote(target)}")
            if read_only:
                script.append(f"mount -o remount,bind,ro {shlex.quote(target)}")
        script.append('exec "$@"')
        # setpriv: the process gets SIGKILL if the runner dies (it must never outlive the
        # runner, holding a pod IP). unshare: its own mount namespace, for the volumes.
        argv = [
            "setpriv", "--pdeathsig", "KILL", "--",
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", "\n".join(script), "sh",
            *command,
            *args,
        ]  # fmt: skip
        run_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOSTNAME": meta.name,
            "KUBERNETES_SERVICE_HOST": self.r.api_host,
            "KUBERNETES_SERVICE_PORT": self.r.api_port,
            **env,
            "LD_PRELOAD": str(self.r.shim),
            "TIERGATE_POD_IP": pod.status.pod_ip,
        }
        log_file = self.r.state / "logs" / f"{meta.namespace}_{meta.name}.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        return argv, run_env, log_file

    def _env(self, pod: client.V1Pod, container: client.V1Container) -> dict[str, str]:
        ns = pod.metadata.namespace
        env: dict[str, str] = {}
        for source in container.env_from or []:
            prefix = source.prefix or ""
            if source.config_map_ref is not None:
                data = self._config_map(
                    ns, source.config_map_ref.name, source.config_map_ref.optional
                )
            elif source.secret_ref is not None:
                data = self._secret(ns, source.secret_ref.name, source.secret_ref.optional)
            else:
                continue
            env.update({prefix + k: v for k, v in data.items()})
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = expand(var.value or "", env)
                continue
            src = var.value_from
            if src.field_ref is not None:
                env[var.name] = field_ref(pod, src.field_ref.field_path)
            else:
                for ref, kind, read in (
                    (src.secret_key_ref, "secret", self._secret),
                    (src.config_map_key_ref, "configmap", self._config_map),
                ):
                    if ref is None:
                        continue
                    value = read(ns, ref.name, ref.optional).get(ref.key)
                    if value is None and not ref.optional:
                        raise ValueError(f"env {var.name}: key {ref.key} not in {kind} {ref.name}")
                    if value is not None:
                        env[var.name] = value
        return env

    def _config_map(self, ns: str, name: str, optional: bool | None) -> dict[str, str]:
        return self._read("configmap", self.r.api.read_namespaced_config_map, ns, name, optional)

    def _secret(self, ns: str, name: str, optional: bool | None) -> dict[str, str]:
        data = self._read("secret", self.r.api.read_namespaced_secret, ns, name, optional)
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    @staticmethod
    def _read(kind: str, read: Any, ns: str, name: str, optional: bool | None) -> dict[str, str]:
        """A ConfigMap's or Secret's data; {} for a missing optional one."""
        try:
            return dict(read(name, ns, _request_timeout=API_TIMEOUT_S).data or {})
        except client.ApiException as exc:
            if exc.status == 404 and optional:
                return {}
            raise ValueError(f"{kind} {ns}/{name}: {exc.reason}") from None

    def _mounts(
        self, pod: client.V1Pod, container: client.V1Container, root: Path
    ) -> list[tuple[Path, str, bool]]:
        """(host folder or file, path in the pod, read-only), parents before children."""
        volumes = {v.name: v for v in pod.spec.volumes or []}
        out: list[tuple[Path, str, bool]] = []
        for mount in container.volume_mounts or []:
            if mount.mount_path == SA_DIR:
                continue  # the runner mounts the service account itself, below
            volume = volumes.get(mount.name)
            if volume is None:
                raise ValueError(f"volumeMount {mount.name}: no such volume")
            host = self._volume(pod, volume, root / "volumes" / volume.name)
            if mount.sub_path:
                host = host / mount.sub_path
            if self._hides_runner(mount.mount_path):
                log.info(
                    "pod %s: not mounting %s over %s (the runner's own files are there)",
                    pod.metadata.name,
                    mount.name,
                    mount.mount_path,
                )
                continue
            out.append((host, mount.mount_path, bool(mount.read_only)))
        if pod.spec.automount_service_account_token is not False:
            out.append((self._service_account(pod, root / "serviceaccount"), SA_DIR, True))
        out.append((self._hosts(pod, root / "hosts"), "/etc/hosts", True))
        return sorted(out, key=lambda m: m[1].count("/"))

    def _hides_runner(self, mount_path: str) -> bool:
        target = Path(mount_path)
        return any(p == target or target in p.parents for p in self.r.protected)

    def _volume(self, pod: client.V1Pod, volume: client.V1Volume, path: Path) -> Path:
        ns = pod.metadata.namespace
        path.mkdir(parents=True, exist_ok=True)
        if volume.empty_dir is not None:
            return path
        if volume.persistent_volume_claim is not None:
            kept = self.r.state / "pvc" / ns / volume.persistent_volume_claim.claim_name
            kept.mkdir(parents=True, exist_ok=True)
            return kept
        if volume.config_map is not None:
            cm = volume.config_map
            _write_items(path, self._config_map(ns, cm.name, cm.optional), cm.items)
            return path
        if volume.secret is not None:
            s = volume.secret
            _write_items(path, self._secret(ns, s.secret_name, s.optional), s.items)
            return path
        if volume.projected is not None:
            for source in volume.projected.sources or []:
                if source.config_map is not None:
                    cm = source.config_map
                    _write_items(path, self._config_map(ns, cm.name, cm.optional), cm.items)
                elif source.secret is not None:
                    s = source.secret
                    _write_items(path, self._secret(ns, s.name, s.optional), s.items)
                elif source.service_account_token is not None:
                    token = self._token(pod, source.service_account_token.expiration_seconds)
                    _write(path / source.service_account_token.path, token)
                elif source.downward_api is not None:
                    for item in source.downward_api.items or []:
                        if item.field_ref is not None:
                            _write(path / item.path, field_ref(pod, item.field_ref.field_path))
            return path
        raise ValueError(
            f"volume {volume.name}: only emptyDir, configMap, secret, projected "
            "and persistentVolumeClaim volumes are supported"
        )

    def _token(self, pod: client.V1Pod, expiration: int | None = None) -> str:
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=max(expiration or 3600, 3600),
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        sa = pod.spec.service_account_name or "default"
        out = self.r.api.create_namespaced_service_account_token(
            sa, pod.metadata.namespace, request, _request_timeout=API_TIMEOUT_S
        )
        return str(out.status.token)

    def _service_account(self, pod: client.V1Pod, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        _write(path / "token", self._token(pod))
        _write(path / "ca.crt", self.r.ca_file.read_text())
        _write(path / "namespace", pod.metadata.namespace)
        return path

    def _hosts(self, pod: client.V1Pod, path: Path) -> Path:
        """/etc/hosts: localhost, the pod itself, and every Service it can reach by name."""
        lines = [
            "127.0.0.1 localhost",
            "::1 localhost ip6-localhost",
            f"{pod.status.pod_ip} {pod.metadata.name}",
        ]
        ns = pod.metadata.namespace
        for svc in self.r.api.list_service_for_all_namespaces(_request_timeout=API_TIMEOUT_S).items:
            ip = self._service_backend(svc)
            if ip is None:
                continue
            name, svc_ns = svc.metadata.name, svc.metadata.namespace
            names = [f"{name}.{svc_ns}.svc", f"{name}.{svc_ns}.svc.cluster.local"]
            if svc_ns == ns:
                names.insert(0, name)
            lines.append(f"{ip} {' '.join(names)}")
        path.write_text("\n".join(lines) + "\n")
        return path

    def _service_backend(self, svc: client.V1Service) -> str | None:
        """A ready pod behind `svc` when every port equals its target port, else None."""
        selector = svc.spec.selector
        if not selector:
            return None
        pods = self.r.api.list_namespaced_pod(
            svc.metadata.namespace,
            label_selector=",".join(f"{k}={v}" for k, v in selector.items()),
            _request_timeout=API_TIMEOUT_S,
        ).items
        ready = [p for p in pods if runnable(p) and self.running(p.metadata.uid)]
        for pod in ready:
            ports = {p.name: p.container_port for c in pod.spec.containers for p in c.ports or []}
            if all(_target(port, ports) == port.port for port in svc.spec.ports or []):
                return str(pod.status.pod_ip)
        return None


def _target(port: client.V1ServicePort, named: dict[str, int]) -> int | None:
    target = port.target_port
    if target is None:
        return port.port
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    return named.get(str(target))


def _write_items(path: Path, data: dict[str, str], items: list[Any] | None) -> None:
    if items:
        for item in items:
            if item.key in data:
                _write(path / item.path, data[item.key])
        return
    for key, value in data.items():
        _write(path / key, value)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
