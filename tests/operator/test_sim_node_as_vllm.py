"""The sim node as a drop-in for vLLM: started as a real process with the command line the
operator renders for an `engine: vllm` pool (`vllm serve MODEL ...`, with `tiergate sim-node`
in place of `vllm`), told only the accelerator by the environment, it serves vLLM's paths:
/health, /v1/models (the pool's names), /v1/chat/completions and /metrics under vLLM's names.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from process_helpers import NODE_LISTENING, launch, wait_listening

from tiergate.operator.engine_args import vllm_args
from tiergate.operator.status import assess
from tiergate.pools import InferencePoolSpec
from tiergate.sim_nodes.catalogs import default_catalog


def test_a_sim_node_serves_the_rendered_vllm_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = InferencePoolSpec.model_validate(
        {
            "tier": "premium",
            "engine": "vllm",
            "model": "llama-3.1-70b",
            "accelerator": "h100-sxm",
            "weightDtype": "fp8",
            "kvDtype": "fp8",
            "batching": {"maxNumSeqs": 8, "maxBatchedTokens": 4096},
            "maxContextTokens": 32768,
            "speculativeDecoding": {"draftModel": "llama-3.2-1b", "tokens": 3,
                                    "acceptanceRate": 0.7},
            "servedModelName": "llama-fast",
            "aliases": ["llama-premium"],
        }
    )  # fmt: skip
    layout = assess(spec, default_catalog()).layout
    assert layout is not None
    args = vllm_args(spec, layout)
    assert args[0] == "serve" and "--speculative-config" in args
    # What vLLM's flags cannot say: the accelerator (environment) and the draft's acceptance.
    monkeypatch.setenv("TIERGATE_ACCELERATOR", "h100-sxm")
    monkeypatch.delenv("TIERGATE_POOL_JSON", raising=False)
    command = ["sim-node", *args, "--acceptance-rate", "0.7", "--host", "127.0.0.1", "--port", "0"]
    node = wait_listening(launch(command, tmp_path / "node.log"), NODE_LISTENING)
    try:
        assert httpx.get(f"{node.url}/health", timeout=30).status_code == 200
        models = httpx.get(f"{node.url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["llama-fast", "llama-premium"]
        assert {m["max_model_len"] for m in models["data"]} == {32768}  # --max-model-len
        reply = httpx.post(
            f"{node.url}/v1/chat/completions",
            json={"model": "llama-premium", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 4},
            timeout=30,
        )  # fmt: skip
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        metrics = httpx.get(f"{node.url}/metrics", timeout=30).text
        assert "vllm:generation_tokens_total" in metrics
        assert "vllm:num_requests_running" in metrics
    finally:
        node.stop()
    log = node.log_text()
    assert "model=llama-fast" in log, log
