"""The real engine told to stop mid-stream, as a rollout or a scale-down stops a pod: with the
`--shutdown-timeout` the operator renders, vLLM lets the streams in flight run to their end
before it exits (its default, 0, would abort them).

It runs after the hosted tests (file order), on their engine, which it leaves stopped."""

from __future__ import annotations

import json
import threading

import httpx
from engine_process import EngineProcess
from engine_router import MODEL, PROVIDER_KEY
from polling_helpers import until

from tiergate.operator.gpu_pods import VLLM_SHUTDOWN_TIMEOUT_S

MAX_TOKENS = 150


def test_an_engine_told_to_stop_finishes_the_stream_in_flight(
    keyed_engine: EngineProcess,
) -> None:
    url = keyed_engine.ensure_started()
    assert VLLM_SHUTDOWN_TIMEOUT_S > 0
    events: list[dict[str, object]] = []
    done = threading.Event()

    def read() -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,  # vLLM's: the stream runs its full length
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"authorization": f"Bearer {PROVIDER_KEY}"}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                          timeout=300) as reply:  # fmt: skip
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if line == "data: [DONE]":
                    done.set()
                elif line.startswith("data: "):
                    events.append(json.loads(line[6:]))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    until(lambda: len(events) >= 3, "the stream sent no token", 120)
    keyed_engine.terminate()
    reader.join(300)
    assert not reader.is_alive(), "the stream never ended"
    usage = [e["usage"] for e in events if e.get("usage")]
    assert done.is_set() and usage, events[-3:]
    assert usage[-1]["completion_tokens"] == MAX_TOKENS, usage[-1]  # type: ignore[index]
    assert keyed_engine.wait_exit(120) == 0, keyed_engine.log_text()[-2000:]
