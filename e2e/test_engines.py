"""Real engines on a real API server: an `engine: vllm` pool becomes a Deployment running
`vllm serve` with the spec's arguments and GPUs, scheduled on a node advertising
`nvidia.com/gpu` with the accelerator's product label (a kwok node: nothing runs vLLM here,
the scheduler's placement is what is checked); a wafer-scale pool with `engine: vllm` is
refused by `kubectl apply` with the reason."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from release import BACKEND, Release

from tiergate.operator.gpu_pods import VLLM_SHUTDOWN_TIMEOUT_S

pytestmark = [
    pytest.mark.skipif(
        BACKEND != "local", reason="a kwok node stands for the GPU node (kind's nodes have no GPUs)"
    ),
    pytest.mark.usefixtures("pools_removed"),
]


@pytest.fixture(scope="module")
def release(module_release: Release) -> Release:
    """One release for the module: each test's pools are removed after it."""
    return module_release


#: Each test's GPU node gets a name of its own: a node deleted and made again at once under
#: the same name (the next test's) is one kwok may never mark Ready.
GPU_NODE_PREFIX = "kwok-gpu-h100-"
GPU_NODE = """\
apiVersion: v1
kind: Node
metadata:
  name: {name}
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: {name}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
spec:
  taints:
  - {{key: nvidia.com/gpu, value: present, effect: NoSchedule}}
status:
  allocatable: {{cpu: "96", memory: 1Ti, pods: "110", nvidia.com/gpu: "8"}}
  capacity: {{cpu: "96", memory: 1Ti, pods: "110", nvidia.com/gpu: "8"}}
"""

VLLM_POOL = """\
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata:
  name: llama-vllm
spec:
  tier: batched
  engine: vllm
  model: llama-3.1-70b
  accelerator: h100-sxm
  chips: 4
  tensorParallel: 4
  weightDtype: fp8
  kvDtype: fp8
  batching: {maxNumSeqs: 128, maxBatchedTokens: 4096}
  servedModelName: llama-70b
"""

WAFER_VLLM = """\
apiVersion: tiergate.dev/v1alpha1
kind: InferencePool
metadata:
  name: spark-vllm
spec:
  tier: wafer-scale
  engine: vllm
  model: frontier-spark
  accelerator: wse-3
"""


@pytest.fixture
def gpu_node(release: Release) -> Iterator[str]:
    """A node with 8 H100s (as NVIDIA's device plugin and feature discovery advertise them)
    and the usual GPU taint; removed after the test, once the pools whose pods it ran are
    (a pod bound to a node that is gone waits for the pod garbage collector)."""
    cluster = release.cluster
    name = GPU_NODE_PREFIX + uuid.uuid4().hex[:8]
    cluster.kubectl("apply", "-f", "-", input=GPU_NODE.format(name=name))
    try:
        ready(release, name)
        yield name
    finally:
        try:
            release.remove_pools()
        finally:
            cluster.kubectl("delete", "node", name, "--ignore-not-found", check=False)


def ready(release: Release, name: str) -> None:
    """Wait for kwok to mark node `name` Ready; a failure shows the cluster's nodes."""
    cluster = release.cluster
    try:
        release.wait(
            lambda: (
                "True"
                in cluster.kubectl(
                    "get",
                    "node",
                    name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                    check=False,
                )
            ),  # fmt: skip
            f"node {name} Ready",
            60,
        )
    except pytest.fail.Exception as exc:
        nodes = cluster.kubectl("describe", "node", check=False)
        raise pytest.fail.Exception(f"{exc}\n$ kubectl describe node\n{nodes}") from None


def test_a_vllm_pool_runs_vllm_serve_on_a_gpu_node(release: Release, gpu_node: str) -> None:
    release.kubectl("apply", "-f", "-", input=VLLM_POOL)
    release.wait(lambda: release.exists("deployment", "llama-vllm"), "the pool's Deployment")
    pod_spec = release.get("deployment", "llama-vllm")["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    assert container["image"] == "vllm/vllm-openai:v0.32.0"
    assert container["command"] == ["vllm"]
    args = container["args"]
    assert args[:2] == ["serve", "meta-llama/Llama-3.1-70B-Instruct"]
    for flag, value in [("--served-model-name", "llama-70b"), ("--tensor-parallel-size", "4"),
                        ("--max-num-seqs", "128"), ("--max-num-batched-tokens", "4096"),
                        ("--quantization", "fp8"), ("--kv-cache-dtype", "fp8")]:  # fmt: skip
        assert args[args.index(flag) + 1] == value, (flag, args)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert pod_spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}

    def scheduled_on_the_gpu_node() -> bool:
        pods = release.kubectl(
            "get", "pods", "-l", "tiergate.dev/pool=llama-vllm",
            "-o", "jsonpath={.items[*].spec.nodeName}",
        ).split()  # fmt: skip
        return pods == [gpu_node]

    release.wait(scheduled_on_the_gpu_node, f"the vLLM pod scheduled on {gpu_node}", 90)


def test_a_gpu_pool_no_node_can_take_says_why_in_its_status(release: Release) -> None:
    """No node has the pool's GPUs (this test adds none): the scheduler's word for its pod
    reaches the pool's Degraded condition, rather than "starting" for 45 minutes."""
    release.kubectl("apply", "-f", "-", input=VLLM_POOL.replace("llama-vllm", "llama-nowhere"))

    def degraded() -> dict[str, Any]:
        return release.condition("llama-nowhere", "Degraded") or {}

    release.wait(lambda: degraded().get("reason") == "PodsCannotStart", "PodsCannotStart", 90)
    assert degraded()["status"] == "True"
    assert "cannot start: Unschedulable: 0/" in degraded()["message"], degraded()


def test_a_wafer_scale_vllm_pool_is_refused_with_the_reason(release: Release) -> None:
    done = release.apply(WAFER_VLLM)
    assert done.returncode != 0
    assert "engine vllm runs on GPUs" in done.stderr, done.stderr
    assert "wse-3" in done.stderr and "SRAM" in done.stderr, done.stderr
    assert not release.exists("inferencepool.tiergate.dev", "spark-vllm")


def test_the_same_pool_as_sim_renders_the_same_arguments_and_serves(
    release: Release, gpu_node: str
) -> None:
    """`engine: sim` in place of `engine: vllm`: the sim image runs the very `vllm serve`
    arguments, and the pool serves through the router."""
    release.kubectl("apply", "-f", "-", input=VLLM_POOL)
    sim_pool = VLLM_POOL.replace("name: llama-vllm", "name: llama-sim").replace(
        "engine: vllm", "engine: sim"
    )
    release.kubectl("apply", "-f", "-", input=sim_pool)
    release.wait(
        lambda: all(release.exists("deployment", d) for d in ("llama-vllm", "llama-sim")),
        "both pools' Deployments",
    )
    vllm = release.get("deployment", "llama-vllm")["spec"]["template"]["spec"]["containers"][0]
    sim = release.get("deployment", "llama-sim")["spec"]["template"]["spec"]["containers"][0]
    # The same, but for how long vLLM lets its streams finish when stopped (the sim node does
    # of itself).
    assert sim["args"] + ["--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT_S)] == vllm["args"]
    assert sim["image"] != vllm["image"] and sim["command"] != vllm["command"]
    release.kubectl("delete", "inferencepool.tiergate.dev", "llama-vllm", "--wait=true")

    def served() -> bool:
        reply = httpx.post(
            f"{release.router_url()}/v1/chat/completions",
            json={"model": "llama-70b", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 8},
            headers={"x-tiergate-tier": "batched"},
            timeout=60.0,
        )  # fmt: skip
        return reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 8

    release.wait(served, "the sim pool serving llama-70b through the router", 120)
