"""What the bench sends: the tier mix, synthetic prompts, the tool, per-request draws.

Pure and seeded: `Workload.stream()` (and `plan(n)`, its first n) with the same seed always
yields the same requests, so a bench run is reproducible down to the sim nodes' replies (each
request carries a `seed`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tiergate.bench.errors import BenchError
from tiergate.router.request.tiers import TIERS
from tiergate.sim_nodes.tiers import DEFINITIONS

__all__ = [
    "DEFAULT_MIX",
    "TOOL_NAME",
    "TOOL_MIN_MAX_TOKENS",
    "TOOL_SCHEMA",
    "PlannedRequest",
    "Workload",
    "parse_max_tokens",
    "parse_mix",
    "synthetic_prompt",
    "tool_definition",
]

#: Every tier with a traffic share (sim_nodes/tiers.py), e.g. `batched=.6,premium=.3,...`.
DEFAULT_MIX = ",".join(
    f"{d.name}={d.traffic_share:g}".replace("=0.", "=.")
    for d in DEFINITIONS.values()
    if d.traffic_share > 0
)

TOOL_NAME = "run_shell_command"

#: The bench's tool: an agent's typical call, with typed, bounded and required fields so that
#: a call can be wrong in more ways than being unparseable.
TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "minLength": 1, "description": "the command line"},
        "timeout_s": {"type": "integer", "minimum": 1, "maximum": 600},
        "background": {"type": "boolean", "description": "run without waiting"},
    },
    "required": ["command", "timeout_s"],
    "additionalProperties": False,
}

#: Output cap of a tool request at least: the call's arguments take ~30 tokens, and a call
#: cut off by a small --max-tokens would count as the model's mistake.
TOOL_MIN_MAX_TOKENS = 64

#: Chat overhead of one user message (OpenAI's accounting, as the sim nodes count it).
_CHAT_OVERHEAD_TOKENS = 6

#: Short words: each, with its leading space, is one token for BPE tokenizers and the sim
#: nodes' alike, so a prompt of k words is about k tokens anywhere.
_WORDS = (
    "the", "tier", "fast", "slow", "chip", "pool", "node", "step", "page", "load",
    "busy", "idle", "time", "cost", "plan", "list", "file", "test", "code", "data",
    "run", "job", "log", "key", "map", "set", "row", "bit", "hop", "bus",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request of the run, fully decided before the run starts."""

    index: int
    tier: str
    with_tools: bool
    seed: int
    prompt: str
    max_tokens: int | None = None  # drawn for this request (a range of caps), else the run's


@dataclass(frozen=True, slots=True)
class Workload:
    """The shape of the load: tier mix, prompt size, output cap, share of tool requests.

    With `min_max_tokens`, each request's output cap is drawn from `min_max_tokens` to
    `max_tokens` (replies of varied lengths end at different times, as real ones do)."""

    mix: dict[str, float]
    input_tokens: int
    max_tokens: int
    tools_fraction: float
    seed: int
    min_max_tokens: int | None = None

    def plan(self, requests: int) -> list[PlannedRequest]:
        """The first `requests` requests of `stream()`."""
        return list(itertools.islice(self.stream(), requests))

    def stream(self) -> Iterator[PlannedRequest]:
        """Planned requests without end (a run by duration), drawn from one
        `random.Random(seed)`: the same seed gives the same sequence."""
        rng = random.Random(self.seed)
        tiers = list(self.mix)
        weights = [self.mix[t] for t in tiers]
        for index in itertools.count():
            tier = rng.choices(tiers, weights)[0]
            with_tools = rng.random() < self.tools_fraction
            request_seed = rng.getrandbits(31)
            # Drawn from the request's own generator: a range leaves the other draws as they were.
            own = random.Random(request_seed)
            prompt = synthetic_prompt(self.input_tokens, own)
            cap = None
            if self.min_max_tokens is not None:
                cap = own.randint(self.min_max_tokens, self.max_tokens)
            yield PlannedRequest(index, tier, with_tools, request_seed, prompt, cap)

    def body(self, request: PlannedRequest, model: str) -> dict[str, Any]:
        """The streaming chat-completion body of `request` for `model`."""
        cap = self.max_tokens if request.max_tokens is None else request.max_tokens
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": request.prompt}],
            "max_tokens": max(cap, TOOL_MIN_MAX_TOKENS) if request.with_tools else cap,
            "stream": True,
            "stream_options": {"include_usage": True},
            "seed": request.seed,
        }
        if request.with_tools:
            body["tools"] = [tool_definition()]
            # Forced: a reply without the call is then a tool-call error, not a choice.
            body["tool_choice"] = {"type": "function", "function": {"name": TOOL_NAME}}
        return body


def tool_definition() -> dict[str, Any]:
    """The OpenAI `tools` entry of the bench's tool."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": "Run a shell command in the project's sandbox.",
            "parameters": TOOL_SCHEMA,
        },
    }


def synthetic_prompt(input_tokens: int, rng: random.Random) -> str:
    """A user message of about `input_tokens` prompt tokens (chat overhead included)."""
    words = max(1, input_tokens - _CHAT_OVERHEAD_TOKENS)
    return "".join(rng.choice(_WORDS) if i == 0 else " " + rng.choice(_WORDS) for i in range(words))


def parse_max_tokens(text: str) -> tuple[int | None, int]:
    """`--max-tokens`: `N` -> (None, N); `LOW-HIGH` -> (LOW, HIGH), each request's cap drawn
    between them. Raises BenchError unless they are whole numbers with 1 <= LOW <= HIGH."""
    low_text, dash, high_text = text.strip().partition("-")
    try:
        low, high = int(low_text), int(high_text if dash else low_text)
    except ValueError:
        raise BenchError(f"--max-tokens: expected N or LOW-HIGH, got {text!r}") from None
    if not 1 <= low <= high:
        raise BenchError(f"--max-tokens: expected 1 <= LOW <= HIGH, got {text!r}")
    return (low if dash else None), high


def parse_mix(text: str) -> dict[str, float]:
    """`tier=weight[,tier=weight...]` -> {tier: weight}; weights are relative (need not sum
    to 1).

    Raises BenchError for bad syntax, an unknown or repeated tier, a negative or non-finite
    weight, or weights that add up to nothing.
    """
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = (s.strip() for s in part.partition("="))
        if not sep or not name or not value:
            raise BenchError(f"--mix: expected tier=weight[,tier=weight...], got {part.strip()!r}")
        if name not in TIERS:
            raise BenchError(f"--mix: unknown tier {name!r}; choose from {', '.join(TIERS)}")
        if name in mix:
            raise BenchError(f"--mix: tier {name!r} given twice")
        try:
            weight = float(value)
        except ValueError:
            raise BenchError(f"--mix: weight of {name} is not a number: {value!r}") from None
        if not weight >= 0 or weight == float("inf"):
            raise BenchError(f"--mix: weight of {name} must be a finite number >= 0, got {value}")
        mix[name] = weight
    if sum(mix.values()) <= 0:
        raise BenchError("--mix: the weights add up to 0; give at least one tier a weight > 0")
    return {tier: weight for tier, weight in mix.items() if weight > 0}
