"""The local backend's stand-in for a container runtime: runs kwok's pods as local processes.

kwok makes nodes and pods exist (scheduled, Running, a pod IP) but runs nothing. This runner
watches every pod of the tiergate image and, for each Running one, starts the pod's own
`command`/`args`/`env` (the image's entrypoint is `tiergate`) as a local process, stops it when
the pod goes away, and restarts it when it dies, as a kubelet would:

- network: the pod IP (kwok allocates them inside 127.0.0.0/8) is the process's address; an
  LD_PRELOAD shim (bindshim.c) turns its bind(0.0.0.0) into bind(<pod IP>);
- files: the process gets a private mount namespace (`unshare --mount`) where the pod's volumes
  (configMap, secret, emptyDir, projected, PVC as a kept folder) and its service account
  (a TokenRequest token, the cluster CA, the namespace) are bind-mounted at their paths;
- names: the pod's /etc/hosts maps each Service (`name`, `name.ns.svc`, `...cluster.local`)
  whose ports equal their target ports to a ready pod behind it (DNS plus kube-proxy, in one);
- env: `value`, `$(VAR)` expansion, `fieldRef`, `secretKeyRef`, `configMapKeyRef`, `envFrom`,
  plus KUBERNETES_SERVICE_HOST/PORT, as the kubelet sets them;
- deletion: a deleted pod stays Terminating while its process drains (SIGTERM, SIGKILL after
  the grace period); then the runner removes the object, as a kubelet does;
- status: the pod is Ready only while its readinessProbe (httpGet) passes, as the kubelet
  reports it (kwok alone would call it Ready before the process listens); a pod with
  restartPolicy Never/OnFailure (a `helm test` pod) gets phase Succeeded or Failed from its
  exit code;
- `kubectl logs` and `kubectl port-forward`: through kwok, from the per-pod objects and the
  CRI-format log file `pod_debugging` makes.

This module runs the processes; `pod_setup` prepares each one (command line, environment,
mounts, /etc/hosts), `pod_debugging` serves logs and port-forwards.

Mount namespaces need root. Test infrastructure only: it lives in e2e/, never in the product.

    python -P e2e/harness/pod_runner.py --kubeconfig K --state-dir D --tiergate .venv/bin/tiergate
"""

from __future__ import annotations

import argparse
import http.client
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config, watch

# Run as a script with -P: its own folder is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pod_debugging import apply_debugging, pump  # noqa: E402
from pod_setup import API_TIMEOUT_S, PodSetup, Runner, runnable  # noqa: E402

log = logging.getLogger("pod-runner")

RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)
POLL_S = 0.5


@dataclass
class Proc:
    """One pod's running process."""

    uid: str
    namespace: str
    name: str
    popen: subprocess.Popen[bytes]
    log_file: Path
    ip: str
    restarts: int = 0
    started: float = field(default_factory=time.monotonic)
    ready: bool | None = None  # as last reported in the pod's status
    exited: float | None = None  # when the process was seen to have exited
    failures: int = 0  # consecutive readiness probe failures
    next_probe: float = 0.0
    output: threading.Thread | None = None  # copies its output to the log files


def ours(pod: client.V1Pod, image: str) -> bool:
    containers = pod.spec.containers or []
    return bool(containers) and all(_repository(c.image or "") == image for c in containers)


def _repository(ref: str) -> str:
    """`repo` of `registry/repo:tag@sha256:...`, last path element (how the chart names it)."""
    ref = ref.split("@", 1)[0]
    last = ref.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


class PodProcesses:
    """Starts, restarts and stops the processes of the pods the watch reports."""

    def __init__(self, runner: Runner) -> None:
        self.r = runner
        self.setup = PodSetup(runner, lambda uid: uid in self.procs)
        self.pods: dict[str, client.V1Pod] = {}
        self.procs: dict[str, Proc] = {}
        self.stopping: list[tuple[Proc, float]] = []  # SIGTERM sent, with a SIGKILL deadline
        self.done: set[str] = set()  # run-to-completion pods whose process has finished
        self.removed: set[str] = set()  # terminated pods whose object the runner deleted
        self.retry_at: dict[str, float] = {}  # pods whose start failed: try again then
        self.debuggable: set[str] = set()  # pods whose Logs and PortForward objects exist
        self.lock = threading.Lock()

    # -- desired state, from the watch ----------------------------------------------------
    def observe(self, kind: str, pod: client.V1Pod) -> None:
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(pod.metadata.uid, None)
            else:
                self.pods[pod.metadata.uid] = pod

    # -- reconcile ------------------------------------------------------------------------
    def sync(self) -> None:
        """One pass over every pod; an error with one pod is logged and retried next pass."""
        with self.lock:
            pods = dict(self.pods)
        self._reap()
        for uid, proc in list(self.procs.items()):
            pod = pods.get(uid)
            if pod is None or pod.metadata.deletion_timestamp is not None:
                self._stop(proc, pod)
                del self.procs[uid]
        stopping = {p.uid for p, _ in self.stopping}
        for uid, pod in pods.items():
            # Terminating with nothing (left) running here: remove the object, as a kubelet
            # does once the containers are gone (kwok's own pod-delete stage is replaced).
            if pod.metadata.deletion_timestamp is not None and uid not in stopping:
                self._remove(pod.metadata.namespace, pod.metadata.name, uid)
            if not ours(pod, self.r.image) or not runnable(pod) or uid in self.done:
                continue
            try:
                self._step(uid, pod)
            except Exception as exc:  # noqa: BLE001 - the API, the file system: next pass
                log.warning("pod %s/%s: %s: %s", pod.metadata.namespace, pod.metadata.name,
                            type(exc).__name__, exc)  # fmt: skip

    def _step(self, uid: str, pod: client.V1Pod) -> None:
        proc = self.procs.get(uid)
        if proc is None:
            # kwok hands a deleted pod's IP to the next pod at once: wait until the old
            # process has let go of it, or the new one could not bind.
            held = any(p.ip == pod.status.pod_ip for p, _ in self.stopping)
            retry_at = self.retry_at.get(uid, 0.0)
            if not self._finished(pod) and not held and time.monotonic() >= retry_at:
                self._start(pod)
            return
        code = proc.popen.poll()
        if code is None:
            self._debuggable(pod)
            self._probe(pod, proc)
            return
        if proc.exited is None:
            proc.exited = time.monotonic()
            self._report_ready(pod, proc, False)
        policy = pod.spec.restart_policy or "Always"
        if policy == "Never" or (policy == "OnFailure" and code == 0):
            self._finish(pod, proc, code)
            return
        # CrashLoopBackOff, as a kubelet counts it: from the exit, growing with restarts.
        delay = RESTART_BACKOFF_S[min(proc.restarts, len(RESTART_BACKOFF_S) - 1)]
        if time.monotonic() - proc.exited < delay:
            return
        log.warning(
            "pod %s/%s exited %s; restarting", pod.metadata.namespace, pod.metadata.name, code
        )
        del self.procs[uid]
        if self._start(pod):
            self.procs[uid].restarts = proc.restarts + 1

    def stop_all(self) -> None:
        for proc in self.procs.values():
            self._stop(proc, None)
        self.procs.clear()
        while self.stopping:
            self._reap()
            time.sleep(0.1)

    def _probe(self, pod: client.V1Pod, proc: Proc) -> None:
        """The readiness probe (httpGet), as the kubelet runs it; no probe: ready when running."""
        now = time.monotonic()
        if now < proc.next_probe:
            return
        container = pod.spec.containers[0]
        probe = container.readiness_probe
        if probe is None or probe.http_get is None:
            self._report_ready(pod, proc, True)
            proc.next_probe = now + 3600
            return
        proc.next_probe = now + max(1, min(probe.period_seconds or 10, 5))
        if now - proc.started < (probe.initial_delay_seconds or 0):
            return
        ports = {p.name: p.container_port for p in container.ports or [] if p.name}
        port = probe.http_get.port
        port = ports.get(port, port) if isinstance(port, str) and not port.isdigit() else int(port)
        try:
            conn = http.client.HTTPConnection(pod.status.pod_ip, port, timeout=2)
            conn.request("GET", probe.http_get.path or "/")
            ok = 200 <= conn.getresponse().status < 400
            conn.close()
        except OSError:
            ok = False
        proc.failures = 0 if ok else proc.failures + 1
        if ok:
            self._report_ready(pod, proc, True)
        elif proc.failures >= (probe.failure_threshold or 3) or proc.ready is None:
            self._report_ready(pod, proc, False)

    def _report_ready(self, pod: client.V1Pod, proc: Proc, ready: bool) -> None:
        if proc.ready == ready:
            return
        value = "True" if ready else "False"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {"type": t, "status": value, "lastTransitionTime": now}
            for t in ("Ready", "ContainersReady")
        ]
        c = pod.spec.containers[0]
        since = time.gmtime(time.time() - (time.monotonic() - proc.started))
        running = {"running": {"startedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", since)}}
        # containerStatuses has no merge key: the whole list is replaced (one container).
        statuses = [
            {"name": c.name, "image": c.image, "imageID": "", "ready": ready, "started": True,
             "restartCount": proc.restarts, "state": running}
        ]  # fmt: skip
        body = {"status": {"conditions": conditions, "containerStatuses": statuses}}
        try:
            self.r.api.patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, body, _request_timeout=API_TIMEOUT_S
            )
        except client.ApiException as exc:
            log.warning(
                "pod %s/%s: cannot report ready=%s: %s",
                proc.namespace,
                proc.name,
                value,
                exc.reason,
            )
            return
        proc.ready = ready
        log.info("pod %s/%s: ready=%s", proc.namespace, proc.name, value)

    @staticmethod
    def _finished(pod: client.V1Pod) -> bool:
        return pod.status is not None and pod.status.phase in ("Succeeded", "Failed")

    def _start(self, pod: client.V1Pod) -> bool:
        meta = pod.metadata
        where = f"{meta.namespace}/{meta.name}"
        try:
            argv, env, log_file = self.setup.prepare(pod)
            popen = subprocess.Popen(  # noqa: S603 - the pod's own command, as a kubelet's
                argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a missing secret may appear: retry
            self.retry_at[meta.uid] = time.monotonic() + RESTART_BACKOFF_S[-1]
            log.error("pod %s cannot be started (retrying in %.0f s): %s", where,
                      RESTART_BACKOFF_S[-1], exc)  # fmt: skip
            self._waiting(pod, "CreateContainerConfigError", str(exc))
            return False
        self.retry_at.pop(meta.uid, None)
        proc = Proc(meta.uid, meta.namespace, meta.name, popen, log_file, pod.status.pod_ip)
        assert popen.stdout is not None
        proc.output = pump(popen.stdout, log_file, self._cri_log(pod))
        self.procs[meta.uid] = proc
        # kwok marked the pod Ready when it made it Running; the process only now starts.
        self._report_ready(pod, proc, False)
        log.info(
            "pod %s: started pid %d on %s (log %s)", where, popen.pid, pod.status.pod_ip, log_file
        )
        return True

    def _cri_log(self, pod: client.V1Pod) -> Path:
        """The pod's log in the CRI format, which `kubectl logs` reads through kwok."""
        meta = pod.metadata
        path = self.r.state / "cri-logs" / f"{meta.namespace}_{meta.name}_{meta.uid}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _debuggable(self, pod: client.V1Pod) -> None:
        """Make the pod's Logs and PortForward objects once (retried on the next pass)."""
        uid = pod.metadata.uid
        if uid in self.debuggable:
            return
        try:
            apply_debugging(self.r.custom, pod, self._cri_log(pod))
        except client.ApiException as exc:
            log.warning("pod %s/%s: no logs or port-forward yet: %s",
                        pod.metadata.namespace, pod.metadata.name, exc.reason)  # fmt: skip
            return
        self.debuggable.add(uid)

    def _waiting(self, pod: client.V1Pod, reason: str, message: str) -> None:
        """Say in the pod's status why its container is not running (kubectl describe)."""
        c = pod.spec.containers[0]
        state = {"waiting": {"reason": reason, "message": message[-1000:]}}
        status = [{"name": c.name, "image": c.image, "imageID": "", "ready": False,
                   "restartCount": 0, "state": state}]  # fmt: skip
        try:
            self.r.api.patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace,
                {"status": {"containerStatuses": status}}, _request_timeout=API_TIMEOUT_S,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - best effort: the runner's log has it too
            log.warning("pod %s: cannot report %s: %s", pod.metadata.name, reason, exc)

    def _stop(self, proc: Proc, pod: client.V1Pod | None) -> None:
        """SIGTERM now, SIGKILL after the grace period (in `_reap`); the loop never waits."""
        grace = 10
        if pod is not None and pod.spec.termination_grace_period_seconds is not None:
            grace = min(pod.spec.termination_grace_period_seconds, 30)
        if proc.popen.poll() is None:
            _signal_group(proc.popen, signal.SIGTERM)
        self.stopping.append((proc, time.monotonic() + grace))

    def _reap(self) -> None:
        still: list[tuple[Proc, float]] = []
        for proc, deadline in self.stopping:
            if proc.popen.poll() is not None:
                log.info("pod %s/%s: stopped (exit %s)", proc.namespace, proc.name,
                         proc.popen.returncode)  # fmt: skip
                self._remove(proc.namespace, proc.name, proc.uid)
                continue
            if time.monotonic() > deadline:
                _signal_group(proc.popen, signal.SIGKILL)
            still.append((proc, deadline))
        self.stopping = still

    def _remove(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod object now (grace 0), only if it is still the same pod (uid)."""
        if uid in self.removed:
            return
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        try:
            self.r.api.delete_namespaced_pod(
                name, namespace, body=options, _request_timeout=API_TIMEOUT_S
            )
        except client.ApiException as exc:
            if exc.status not in (404, 409):  # gone already, or a new pod of that name
                log.warning("pod %s/%s: cannot remove: %s", namespace, name, exc.reason)
                return
        self.removed.add(uid)

    def _finish(self, pod: client.V1Pod, proc: Proc, code: int) -> None:
        """A run-to-completion pod's process ended: report it the way the kubelet does."""
        phase = "Succeeded" if code == 0 else "Failed"
        if proc.output is not None:
            proc.output.join(timeout=5)  # the last lines reach the file first
        tail = proc.log_file.read_text(errors="replace")[-2000:]
        container = pod.spec.containers[0].name
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
                "containerStatuses": [
                    {
                        "name": container,
                        "ready": False,
                        "restartCount": proc.restarts,
                        "image": pod.spec.containers[0].image,
                        "imageID": "",
                        "state": {
                            "terminated": {
                                "exitCode": code,
                                "reason": "Completed" if code == 0 else "Error",
                                "message": tail,
                                "finishedAt": now,
                            }
                        },
                    }
                ],
            }
        }
        try:
            self.r.api.patch_namespaced_pod_status(
                pod.metadata.name, pod.metadata.namespace, body, _request_timeout=API_TIMEOUT_S
            )
        except client.ApiException as exc:
            log.warning(
                "pod %s/%s: cannot report %s: %s", proc.namespace, proc.name, phase, exc.reason
            )
        log.info("pod %s/%s: %s (exit %d)", proc.namespace, proc.name, phase, code)
        del self.procs[proc.uid]
        self.done.add(proc.uid)  # never start it again


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)
    except ProcessLookupError:
        pass


def watch_pods(api: client.CoreV1Api, procs: PodProcesses, stop: threading.Event) -> None:
    """List, then watch from the list's version; on any error, list again."""
    while not stop.is_set():
        try:
            listed = api.list_pod_for_all_namespaces(_request_timeout=API_TIMEOUT_S)
            with procs.lock:
                procs.pods = {p.metadata.uid: p for p in listed.items}
            version = listed.metadata.resource_version
            for event in watch.Watch().stream(
                api.list_pod_for_all_namespaces,
                resource_version=version,
                timeout_seconds=60,
                _request_timeout=90,
            ):
                procs.observe(event["type"], event["object"])
                if stop.is_set():
                    return
        except Exception as exc:  # noqa: BLE001 - keep watching whatever went wrong
            log.warning("pod watch: %s; listing again", exc)
            stop.wait(1.0)


def build_shim(state: Path) -> Path:
    source = Path(__file__).with_name("bindshim.c")
    out = state / "bindshim.so"
    if not out.exists() or out.stat().st_mtime < source.stat().st_mtime:
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O2", "-o", str(out), str(source), "-ldl"], check=True
        )
    return out


def preflight() -> str | None:
    """Why this machine cannot run pods, in one line; None when it can."""
    if os.geteuid() != 0:
        return "needs root (each pod gets its own mount namespace); use the kind backend otherwise"
    missing = [c for c in ("cc", "setpriv", "unshare", "mount") if shutil.which(c) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH (a C compiler and util-linux)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--state-dir", required=True, type=Path)
    p.add_argument("--tiergate", required=True, type=Path, help="the image's entrypoint, locally")
    p.add_argument("--image", default="tiergate", help="run pods of this image repository")
    p.add_argument("--ready-file", type=Path, help="written once the runner is watching pods")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s pod-runner %(levelname)s %(message)s"
    )
    try:
        problem = preflight()
        if problem:
            raise RunnerError(problem)
        runner = make_runner(args)
    except RunnerError as exc:
        print(f"pod-runner: {exc}", file=sys.stderr)
        return 2
    procs = PodProcesses(runner)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watcher = threading.Thread(target=watch_pods, args=(runner.api, procs, stop), daemon=True)
    watcher.start()
    log.info("running pods of image %r with %s", args.image, runner.tiergate)
    if args.ready_file is not None:
        args.ready_file.write_text(str(os.getpid()))
    try:
        while not stop.is_set():
            try:
                procs.sync()
            except Exception:  # noqa: BLE001 - the runner must outlive any one bad pass
                log.exception("sync failed; next pass in %.1f s", POLL_S)
            stop.wait(POLL_S)
    finally:
        procs.stop_all()
    return 0


class RunnerError(Exception):
    """The runner cannot start; the message is one line."""


def make_runner(args: argparse.Namespace) -> Runner:
    state = args.state_dir.resolve()
    state.mkdir(parents=True, exist_ok=True)
    try:
        api_client = config.new_client_from_config(args.kubeconfig)
    except (config.ConfigException, OSError) as exc:
        raise RunnerError(f"kubeconfig {args.kubeconfig}: {exc}") from None
    host = api_client.configuration.host
    m = re.fullmatch(r"https://([^:/]+):(\d+)", host)
    if not m:
        raise RunnerError(f"the API server must be https://HOST:PORT, not {host}")
    try:
        shim = build_shim(state)
    except subprocess.CalledProcessError as exc:
        raise RunnerError(f"cannot build the bind shim: {exc}") from None
    tiergate = args.tiergate.resolve()
    return Runner(
        api=client.CoreV1Api(api_client),
        custom=client.CustomObjectsApi(api_client),
        state=state,
        tiergate=tiergate,
        shim=shim,
        api_host=m.group(1),
        api_port=m.group(2),
        ca_file=Path(api_client.configuration.ssl_ca_cert),
        image=args.image,
        protected=(tiergate.parent.parent, Path(__file__).resolve().parent, state),
    )


if __name__ == "__main__":
    sys.exit(main())
