"""One replica's engine: the scheduler's batches, timed by the performance model.

`Engine.step(now_s)` schedules a batch, prices it with `perf.step_terms` and advances every
sequence, returning what the step releases at its end. The engine owns no clock: the caller
says when a step starts (the realtime driver passes the wall clock, a simulation its virtual
time), which is what lets the same code serve HTTP streams and simulate a day in seconds.

Background load models the other users of a busy node: resident sequences that hold KV
blocks and batch slots and decode every step but never finish and emit nothing, so a lone
request sees the step times of a full batch. With turnover, each background user also sends
a new turn every `turn_output_tokens` tokens: its `turn_input_tokens` of new prompt are
prefilled in one step, as the other users of a shared fleet interrupt everyone's decoding.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..perf import Batching, Deployment, StepTerms, step_terms
from .errors import EngineCapacityError
from .kv_blocks import DEFAULT_BLOCK_SIZE, BlockAllocator, blocks_for
from .request import EngineRequest
from .scheduler import Completion, ScheduledBatch, Scheduler

__all__ = ["Background", "Engine", "StepOutcome", "StepSummary"]

FINISH_LENGTH = "length"


@dataclass(frozen=True, slots=True)
class Background:
    """`sequences` resident sequences of `context_tokens` each, decoding every step.

    turn_input_tokens: new (uncached) prompt tokens each background user sends per turn;
    turn_output_tokens: tokens it decodes between turns (0: it never takes a new turn).
    """

    sequences: int
    context_tokens: int
    turn_input_tokens: int = 0
    turn_output_tokens: int = 0

    def __post_init__(self) -> None:
        if self.sequences < 0:
            raise EngineCapacityError(
                f"background sequences must not be negative (got {self.sequences})"
            )
        if self.context_tokens < 1 and self.sequences:
            raise EngineCapacityError(
                f"background context must be at least 1 token (got {self.context_tokens})"
            )
        if self.turn_input_tokens < 0 or self.turn_output_tokens < 0:
            raise EngineCapacityError("background turn sizes must not be negative")
        if self.turn_input_tokens and not self.turn_output_tokens:
            raise EngineCapacityError("background turns need turn_output_tokens of at least 1")
        if self.turn_input_tokens > self.context_tokens:
            raise EngineCapacityError(
                f"a background turn ({self.turn_input_tokens} tokens) cannot exceed the "
                f"background context ({self.context_tokens} tokens)"
            )

    @property
    def turns_per_step(self) -> float:
        """Background turns (prefills) per engine step, on average."""
        if not (self.sequences and self.turn_input_tokens):
            return 0.0
        return self.sequences / self.turn_output_tokens


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """One step: what ran between `start_s` and `end_s` and what it released at `end_s`.

    emitted: (request_id, new tokens) for every sequence that produced tokens; a prefill that
    completes its prompt emits the request's first token.
    finished: (request_id, finish_reason) of requests that ended with this step.
    preempted: request ids sent back to waiting (their progress will be recomputed).
    """

    start_s: float
    end_s: float
    emitted: tuple[tuple[str, int], ...]
    finished: tuple[tuple[str, str], ...]
    preempted: tuple[str, ...]
    terms: StepTerms


@dataclass(frozen=True, slots=True)
class StepSummary:
    """The cheap view of a step a simulation needs: first tokens and finishes only."""

    start_s: float
    end_s: float
    first_token: tuple[str, ...]
    finished: tuple[str, ...]
    preempted: int


class Engine:
    """Continuous batching on one replica of `deployment` with `batching` limits."""

    def __init__(
        self,
        deployment: Deployment,
        batching: Batching,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        background: Background | None = None,
        seed: int = 0,
    ) -> None:
        """Raises EngineCapacityError if the weights or the background load do not fit."""
        if not deployment.weights_fit:
            raise EngineCapacityError(
                f"{deployment.model.name} weights do not fit on {deployment.chips} x "
                f"{deployment.accelerator.name}: no room left for a KV cache"
            )
        self.deployment = deployment
        self.batching = batching
        self.background = background or Background(0, 0)
        spec = deployment.speculative
        self._speculative_tokens = spec.tokens if spec else 0
        self._acceptance_rate = spec.acceptance_rate if spec else 0.0
        self._rng = random.Random(seed)
        self.blocks = BlockAllocator.for_deployment(deployment, block_size)
        bg = self.background
        context = deployment.model.max_context_tokens
        if bg.sequences and bg.context_tokens > context:
            raise EngineCapacityError(
                f"background sequences of {bg.context_tokens} tokens exceed the {context}-token "
                f"context {deployment.model.name} is served with"
            )
        bg_blocks = bg.sequences * blocks_for(bg.context_tokens, block_size)
        if bg.sequences and bg_blocks >= self.blocks.total_blocks:
            raise EngineCapacityError(
                f"background of {bg.sequences} sequences x {bg.context_tokens} tokens needs "
                f"{bg_blocks * block_size} tokens of KV cache but the replica holds "
                f"{self.blocks.total_blocks * block_size}"
            )
        self.blocks.allocate(bg_blocks)
        self._request_blocks_limit = self.blocks.total_blocks - bg_blocks
        self.scheduler = Scheduler(
            self.blocks,
            max_num_seqs=batching.max_num_seqs,
            max_batched_tokens=batching.max_batched_tokens,
            chunked_prefill=batching.chunked_prefill,
            decode_tokens_per_seq=self._speculative_tokens + 1,
            reserved_seqs=bg.sequences,
        )
        self._bg_context = bg.sequences * bg.context_tokens
        # Turns arrive at a steady rate; a credit makes them land in whole steps, on time.
        self._bg_turn_credit = 0.0
        self.steps = 0

    # -- requests ------------------------------------------------------------------------------

    def add(self, request: EngineRequest) -> None:
        """Queue a request. Raises EngineCapacityError if it can never fit, EngineError for a
        duplicate id."""
        total = request.prompt_tokens + request.max_output_tokens
        limit = self.deployment.model.max_context_tokens
        if total > limit:
            raise EngineCapacityError(
                f"request {request.request_id!r}: prompt {request.prompt_tokens} + output "
                f"{request.max_output_tokens} tokens exceed the {limit}-token context of "
                f"{self.deployment.model.name}"
            )
        if (
            not self.batching.chunked_prefill
            and request.prompt_tokens > self._step_budget_for_prompts
        ):
            raise EngineCapacityError(
                f"request {request.request_id!r}: a {request.prompt_tokens}-token prompt "
                f"exceeds the step budget of {self._step_budget_for_prompts} tokens and "
                "chunked prefill is off"
            )
        self.scheduler.add(request, max_blocks=self._request_blocks_limit)

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its KV blocks; False if unknown or already finished."""
        return self.scheduler.abort(request_id) is not None

    # -- stats ---------------------------------------------------------------------------------

    @property
    def has_work(self) -> bool:
        """Whether any request is waiting or running (background alone is not work)."""
        return self.scheduler.has_work

    @property
    def num_running(self) -> int:
        """Sequences in the batch, background included."""
        return self.scheduler.num_running + self.background.sequences

    @property
    def num_waiting(self) -> int:
        """Requests waiting for a slot (preempted ones included)."""
        return self.scheduler.num_waiting

    @property
    def kv_usage(self) -> float:
        """Fraction of KV blocks in use, 0..1, background included."""
        return self.blocks.usage

    @property
    def num_preemptions(self) -> int:
        """Preemptions since the engine started."""
        return self.scheduler.num_preemptions

    @property
    def background_sequences(self) -> int:
        """Resident background sequences."""
        return self.background.sequences

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV cache holds (whole blocks), background included."""
        return self.blocks.total_blocks * self.blocks.block_size

    # -- steps ---------------------------------------------------------------------------------

    def step(self, now_s: float) -> StepOutcome | None:
        """Run one step starting at `now_s`; None when there is nothing to run."""
        if not self.scheduler.has_work:
            return None
        batch, terms, done = self._run()
        emitted: list[tuple[str, int]]
        if done.extra_tokens:
            extra = done.extra_tokens
            emitted = [(s.request_id, 1 + extra.get(s, 0)) for s in batch.decode]
        else:
            emitted = [(s.request_id, 1) for s in batch.decode]
        emitted += [(s.request_id, 1) for s in done.prefilled]
        return StepOutcome(
            start_s=now_s,
            end_s=now_s + terms.total_s,
            emitted=tuple(emitted),
            finished=tuple((s.request_id, FINISH_LENGTH) for s in done.finished),
            preempted=tuple(s.request_id for s in batch.preempted),
            terms=terms,
        )

    def advance(self, now_s: float) -> StepSummary | None:
        """`step` without the per-token detail: what a simulation needs, at a fraction of the
        cost (no per-sequence work for decodes)."""
        if not self.scheduler.has_work:
            return None
        batch, terms, done = self._run()
        return StepSummary(
            start_s=now_s,
            end_s=now_s + terms.total_s,
            first_token=tuple(s.request_id for s in done.first_token),
            finished=tuple(s.request_id for s in done.finished),
            preempted=len(batch.preempted),
        )

    def batch_terms(self, batch: ScheduledBatch, background_turns: int = 0) -> StepTerms:
        """What `batch` costs on this replica: background decodes included, plus the prefill
        of `background_turns` background users' new turns."""
        bg = self.background
        new = background_turns * bg.turn_input_tokens
        prefix = bg.context_tokens - bg.turn_input_tokens
        return step_terms(
            self.deployment,
            decode_seqs=len(batch.decode) + bg.sequences,
            decode_context_tokens=batch.decode_context_tokens + self._bg_context,
            prefill_tokens=batch.prefill_tokens + new,
            prefill_prefix_tokens=batch.prefill_prefix_tokens + background_turns * prefix,
            prefill_attended_positions=batch.prefill_attended_positions
            + new * (prefix + bg.turn_input_tokens / 2.0),
        )

    @property
    def _step_budget_for_prompts(self) -> int:
        per_decode = self._speculative_tokens + 1
        return self.batching.max_batched_tokens - self.background.sequences * per_decode

    def _run(self) -> tuple[ScheduledBatch, StepTerms, Completion]:
        batch = self.scheduler.schedule()
        if batch.empty:
            # Only a step that preempted skips admission; the next schedule admits.
            batch = self.scheduler.schedule()
            if batch.empty:
                raise RuntimeError("scheduler produced an empty batch while work is pending")
        turns = 0
        rate = self.background.turns_per_step
        if rate:
            self._bg_turn_credit += rate
            turns = int(self._bg_turn_credit)
            self._bg_turn_credit -= turns
        terms = self.batch_terms(batch, turns)
        extra = self._draw_accepted(len(batch.decode)) if self._speculative_tokens else None
        done = self.scheduler.complete(batch, extra)
        self.steps += 1
        return batch, terms, done

    def _draw_accepted(self, decodes: int) -> list[int]:
        """Accepted draft tokens per decode: consecutive successes, truncated at k."""
        rng, rate, k = self._rng.random, self._acceptance_rate, self._speculative_tokens
        accepted = []
        for _ in range(decodes):
            n = 0
            while n < k and rng() < rate:
                n += 1
            accepted.append(n)
        return accepted
