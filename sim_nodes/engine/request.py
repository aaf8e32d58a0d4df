"""What a caller submits (`EngineRequest`) and the scheduler's mutable view of it (`Sequence`).

`Sequence` is internal and deliberately plain (`__slots__`, no validation): the scheduler
touches it on every step, and a simulation runs hundreds of thousands of steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .errors import EngineError

__all__ = ["EngineRequest", "Sequence", "Status"]


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request: a prompt of `prompt_tokens`, up to `max_output_tokens` out.

    `priority`: lower is more urgent (vLLM's convention); equal priorities are served in
    arrival order. `cached_prompt_tokens`: the prompt's leading tokens found in the prefix
    cache: they hold KV blocks from admission but are never prefilled.
    """

    request_id: str
    prompt_tokens: int
    max_output_tokens: int
    priority: int = 0
    arrival_s: float = 0.0
    cached_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise EngineError(f"prompt tokens must be at least 1 (got {self.prompt_tokens})")
        if not 0 <= self.cached_prompt_tokens < self.prompt_tokens:
            raise EngineError(
                f"cached prompt tokens must be in [0, {self.prompt_tokens}) "
                f"(got {self.cached_prompt_tokens})"
            )
        if self.max_output_tokens < 1:
            raise EngineError(
                f"max output tokens must be at least 1 (got {self.max_output_tokens})"
            )


class Status(IntEnum):
    """Where a sequence is in its life."""

    WAITING = 0
    PREFILLING = 1
    DECODING = 2
    FINISHED = 3
    ABORTED = 4


class Sequence:
    """The scheduler's state of one request.

    Decoding sequences advance lazily: every decoding sequence gains one token per step, so
    instead of touching each one per step the scheduler keeps a global step counter and each
    sequence remembers `output_tokens` as of `tick_base`. Its current output is
    `output_tokens + (tick - tick_base)`.
    """

    __slots__ = (
        "request",
        "request_id",
        "key",
        "prompt_tokens",
        "max_output_tokens",
        "status",
        "target_tokens",
        "computed_tokens",
        "output_tokens",
        "tick_base",
        "phase",
        "generation",
        "blocks",
    )

    def __init__(self, request: EngineRequest, seq_no: int) -> None:
        self.request = request
        self.request_id = request.request_id
        # Waiting order: priority, then arrival, then submission order (FCFS on ties).
        self.key = (request.priority, request.arrival_s, seq_no)
        self.prompt_tokens = request.prompt_tokens
        self.max_output_tokens = request.max_output_tokens
        self.status = Status.WAITING
        # Tokens to prefill before decoding: the prompt, plus generated tokens after a
        # recompute-style preemption.
        self.target_tokens = request.prompt_tokens
        # A prefix-cache hit: those tokens' KV is allocated with the first chunk, not computed.
        self.computed_tokens = request.cached_prompt_tokens
        self.output_tokens = 0
        self.tick_base = 0
        self.phase = 0
        # Bumped whenever the sequence's finish-heap entry goes stale.
        self.generation = 0
        # KV blocks held (exact while waiting/prefilling; derived from context while decoding).
        self.blocks = 0

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, status={self.status.name}, "
            f"computed={self.computed_tokens}/{self.target_tokens}, out={self.output_tokens})"
        )
