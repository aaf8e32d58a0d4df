"""Continuous batching in the style of vLLM V1: pure scheduling decisions, no clock, no I/O.

Every step has a token budget (`max_batched_tokens`). It is spent in this order:

1. every running decoding sequence gets its token (k+1 with speculative decoding); when a
   sequence's context crosses a block boundary it needs a new KV block, and if none is free
   the running sequence with the worst (priority, arrival) is preempted (recompute style: its
   blocks are freed and it goes back to waiting, to prefill prompt + generated tokens again);
2. partially prefilled sequences continue with the next chunk of their prompt;
3. waiting sequences are admitted in (priority, arrival) order while a batch slot, KV blocks
   and budget remain. With chunked prefill a prompt may be split (chunk = what is left of the
   budget); without it a prompt is scheduled whole or waits (head-of-line, as vLLM does).
   Nothing is admitted in a step that preempted, so a victim is not readmitted at once.

Decoding sequences are never touched one by one: all of them advance one token per step, so
the scheduler keeps a step counter (`tick`), a running sum of their contexts, a count of them
per block-boundary phase (how many need a new block this step) and a heap of finish steps.
A step costs O(prefills + finishes + log waiting), not O(running), which is what lets a
simulation push millions of tokens per second of wall time.

The running cap is `max_num_seqs`, further limited so that every running sequence's decode
fits in the token budget (vLLM requires max_num_batched_tokens >= max_num_seqs). Resident
"reserved" sequences (the engine's background load) take slots, budget and blocks up front.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from collections.abc import Sequence as SequenceOf
from dataclasses import dataclass, field
from itertools import chain

from .errors import EngineCapacityError, EngineError
from .kv_blocks import BlockAllocator, blocks_for
from .request import EngineRequest, Sequence, Status

__all__ = ["Completion", "PrefillChunk", "ScheduledBatch", "Scheduler"]

#: (sequence, chunk tokens computed this step, tokens of it already in cache before the chunk)
PrefillChunk = tuple[Sequence, int, int]


@dataclass(slots=True)
class ScheduledBatch:
    """What one step runs. Aggregates exclude reserved (background) sequences."""

    decode: tuple[Sequence, ...]
    prefills: list[PrefillChunk]
    preempted: list[Sequence]
    decode_context_tokens: int
    prefill_tokens: int
    prefill_prefix_tokens: int
    prefill_attended_positions: float

    @property
    def empty(self) -> bool:
        """Nothing to run (no decodes, no prefill chunks)."""
        return not self.decode and not self.prefills


@dataclass(slots=True)
class Completion:
    """What a step produced once it ran."""

    #: Sequences whose prefill finished this step (each emitted one token).
    prefilled: list[Sequence] = field(default_factory=list)
    #: Sequences that emitted their very first token this step (TTFT).
    first_token: list[Sequence] = field(default_factory=list)
    #: Sequences that reached max_output_tokens this step.
    finished: list[Sequence] = field(default_factory=list)
    #: Extra speculative tokens accepted per decoding sequence (absent: none).
    extra_tokens: dict[Sequence, int] = field(default_factory=dict)


class Scheduler:
    """Waiting queue + running set + KV blocks; `schedule()` then `complete()` each step."""

    def __init__(
        self,
        blocks: BlockAllocator,
        *,
        max_num_seqs: int | None,
        max_batched_tokens: int,
        chunked_prefill: bool = True,
        decode_tokens_per_seq: int = 1,
        reserved_seqs: int = 0,
    ) -> None:
        """`decode_tokens_per_seq`: budget one decode takes (k+1 with speculative decoding).

        `reserved_seqs`: resident sequences that decode every step, holding a slot and budget
        (their KV blocks must already be allocated in `blocks` by the caller).
        """
        if max_batched_tokens < 1:
            raise EngineError(f"max_batched_tokens must be at least 1 (got {max_batched_tokens})")
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.max_batched_tokens = max_batched_tokens
        self.chunked_prefill = chunked_prefill
        self.decode_tokens_per_seq = decode_tokens_per_seq
        self.reserved_seqs = reserved_seqs
        by_budget = max_batched_tokens // decode_tokens_per_seq
        self.max_running = by_budget if max_num_seqs is None else min(max_num_seqs, by_budget)
        if reserved_seqs >= self.max_running:
            raise EngineCapacityError(
                f"{reserved_seqs} resident sequences leave no batch slot: the running cap is "
                f"{self.max_running} (max_num_seqs {max_num_seqs}, token budget "
                f"{max_batched_tokens} at {decode_tokens_per_seq} tokens per decode)"
            )
        self.num_preemptions = 0
        self._tick = 0
        self._seq_no = 0
        self._waiting: list[tuple[tuple[int, float, int], Sequence]] = []
        self._num_waiting = 0
        # Insertion-ordered sets: admission order is the order partial prefills continue in.
        self._prefilling: dict[Sequence, None] = {}
        self._decoding: dict[Sequence, None] = {}
        self._by_id: dict[str, Sequence] = {}
        self._phase_count = [0] * self.block_size
        self._decode_context = 0
        self._finish_heap: list[tuple[int, int, int, Sequence]] = []

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for admission (including preempted ones)."""
        return self._num_waiting

    @property
    def num_running(self) -> int:
        """Admitted sequences (prefilling or decoding), excluding reserved ones."""
        return len(self._prefilling) + len(self._decoding)

    @property
    def has_work(self) -> bool:
        """Whether a step would run anything."""
        return bool(self._num_waiting or self._prefilling or self._decoding)

    def get(self, request_id: str) -> Sequence | None:
        """The live (not finished, not aborted) sequence of `request_id`, if any."""
        return self._by_id.get(request_id)

    def output_tokens(self, seq: Sequence) -> int:
        """Tokens `seq` has generated so far."""
        if seq.status is Status.DECODING:
            return seq.output_tokens + self._tick - seq.tick_base
        return seq.output_tokens

    def running(self) -> Iterator[Sequence]:
        """Running sequences, prefilling first, each in admission order."""
        return self._running()

    def held_blocks(self, seq: Sequence) -> int:
        """KV blocks `seq` holds now."""
        return self._held_blocks(seq)

    # -- requests ------------------------------------------------------------------------------

    def add(self, request: EngineRequest, *, max_blocks: int | None = None) -> Sequence:
        """Queue `request`. Raises EngineError for a duplicate id and EngineCapacityError if
        its prompt + output could never fit the KV cache (or `max_blocks`)."""
        if request.request_id in self._by_id:
            raise EngineError(f"request id {request.request_id!r} is already in the engine")
        limit = self.blocks.total_blocks if max_blocks is None else max_blocks
        tokens = request.prompt_tokens + request.max_output_tokens
        if blocks_for(tokens, self.block_size) > limit:
            raise EngineCapacityError(
                f"request {request.request_id!r} needs {tokens} tokens of KV cache "
                f"(prompt {request.prompt_tokens} + output {request.max_output_tokens}) but "
                f"the cache holds {limit * self.block_size} for one request"
            )
        seq = Sequence(request, self._seq_no)
        self._seq_no += 1
        self._by_id[seq.request_id] = seq
        self._push_waiting(seq)
        return seq

    def abort(self, request_id: str) -> Sequence | None:
        """Drop a live request and free its KV blocks; None if unknown or already done."""
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return None
        if seq.status is Status.WAITING:
            # Removed from the heap lazily: schedule() skips aborted entries.
            self._num_waiting -= 1
        else:
            self._leave_running(seq)
        seq.status = Status.ABORTED
        return seq

    # -- one step ------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        """Decide the next step's batch (see the module docstring). May preempt."""
        preempted: list[Sequence] = []
        blocks = self.blocks
        # 1. Decodes: the sequences whose context is at a block boundary need a block now.
        crossing = (1 - self._tick) % self.block_size
        while self._phase_count[crossing] > blocks.total_blocks - blocks.used_blocks:
            victim = max(self._running(), key=_priority_key)
            self._preempt(victim)
            preempted.append(victim)
        blocks.used_blocks += self._phase_count[crossing]
        decode = tuple(self._decoding)
        budget = (
            self.max_batched_tokens
            - (len(decode) + self.reserved_seqs) * self.decode_tokens_per_seq
        )
        prefills: list[PrefillChunk] = []
        # 2. Partial prefills continue, in admission order.
        if self._prefilling:
            budget = self._continue_prefills(budget, prefills, preempted)
        # 3. Admission.
        if not preempted and self._num_waiting and budget > 0:
            self._admit(budget, prefills)
        prefill_tokens = prefix_tokens = 0
        attended = 0.0
        for _seq, chunk, prefix in prefills:
            prefill_tokens += chunk
            prefix_tokens += prefix
            attended += chunk * (prefix + chunk / 2.0)
        return ScheduledBatch(
            decode=decode,
            prefills=prefills,
            preempted=preempted,
            decode_context_tokens=self._decode_context,
            prefill_tokens=prefill_tokens,
            prefill_prefix_tokens=prefix_tokens,
            prefill_attended_positions=attended,
        )

    def complete(
        self, batch: ScheduledBatch, extra_tokens: SequenceOf[int] | None = None
    ) -> Completion:
        """Apply a scheduled batch once it ran: advance decodes and prefills, finish sequences.

        `extra_tokens`: speculative tokens accepted beyond the one every decode emits, aligned
        with `batch.decode`; capped at the remaining output and at the free KV blocks.
        """
        self._tick += 1
        tick = self._tick
        self._decode_context += len(batch.decode)
        done = Completion()
        if extra_tokens is not None:
            for seq, extra in zip(batch.decode, extra_tokens, strict=True):
                if extra > 0:
                    accepted = self._accept_extra(seq, extra)
                    if accepted:
                        done.extra_tokens[seq] = accepted
        heap = self._finish_heap
        while heap and heap[0][0] <= tick:
            _, _, generation, seq = heapq.heappop(heap)
            if seq.generation != generation or seq.status is not Status.DECODING:
                continue  # stale entry: the sequence was preempted, aborted or rebased
            self._finish(seq)
            done.finished.append(seq)
        for seq, chunk, _prefix in batch.prefills:
            seq.computed_tokens += chunk
            if seq.computed_tokens < seq.target_tokens:
                continue
            del self._prefilling[seq]
            seq.output_tokens += 1
            done.prefilled.append(seq)
            if seq.output_tokens == 1:
                done.first_token.append(seq)
            if seq.output_tokens >= seq.max_output_tokens:
                self.blocks.used_blocks -= seq.blocks
                seq.blocks = 0
                self._finish(seq)
                done.finished.append(seq)
            else:
                self._enter_decoding(seq)
        return done

    # -- internals -----------------------------------------------------------------------------

    def _running(self) -> Iterator[Sequence]:
        return chain(self._prefilling, self._decoding)

    def _push_waiting(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        heapq.heappush(self._waiting, (seq.key, seq))
        self._num_waiting += 1

    def _held_blocks(self, seq: Sequence) -> int:
        if seq.status is Status.DECODING:
            # KV is written for every token but the newest: context - 1 tokens.
            context = seq.prompt_tokens + seq.output_tokens + self._tick - seq.tick_base
            return blocks_for(context - 1, self.block_size)
        return seq.blocks

    def _enter_decoding(self, seq: Sequence) -> None:
        seq.status = Status.DECODING
        seq.tick_base = self._tick
        context = seq.prompt_tokens + seq.output_tokens
        # A decode at tick t writes slot `context`; it opens a new block when that slot is the
        # first of a block, i.e. when (phase + t) % block_size == 1.
        seq.phase = (context - self._tick) % self.block_size
        self._phase_count[seq.phase] += 1
        self._decode_context += context
        self._decoding[seq] = None
        seq.generation += 1
        finish_tick = self._tick + seq.max_output_tokens - seq.output_tokens
        heapq.heappush(self._finish_heap, (finish_tick, seq.key[2], seq.generation, seq))

    def _leave_decoding(self, seq: Sequence) -> None:
        """Materialise a decoding sequence's lazy state and take it out of the aggregates."""
        out = seq.output_tokens + self._tick - seq.tick_base
        context = seq.prompt_tokens + out
        self._phase_count[seq.phase] -= 1
        self._decode_context -= context
        del self._decoding[seq]
        seq.output_tokens = out
        seq.blocks = blocks_for(context - 1, self.block_size)
        seq.generation += 1

    def _leave_running(self, seq: Sequence) -> None:
        if seq.status is Status.DECODING:
            self._leave_decoding(seq)
        else:
            del self._prefilling[seq]
        self.blocks.used_blocks -= seq.blocks
        seq.blocks = 0

    def _finish(self, seq: Sequence) -> None:
        if seq.status is Status.DECODING:
            self._leave_running(seq)
        seq.status = Status.FINISHED
        self._by_id.pop(seq.request_id, None)

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: free everything, prefill prompt + output again later."""
        self._leave_running(seq)
        seq.target_tokens = seq.prompt_tokens + seq.output_tokens
        seq.computed_tokens = 0
        self.num_preemptions += 1
        self._push_waiting(seq)

    def _accept_extra(self, seq: Sequence, extra: int) -> int:
        """Add accepted speculative tokens to a decoding sequence (after this step's tick)."""
        out = seq.output_tokens + self._tick - seq.tick_base
        extra = min(extra, seq.max_output_tokens - out)
        if extra <= 0:
            return 0
        context = seq.prompt_tokens + out
        held = blocks_for(context - 1, self.block_size)
        free = self.blocks.total_blocks - self.blocks.used_blocks
        # Without free blocks the extra drafts' KV has nowhere to go: accept fewer.
        extra = min(extra, (held + free) * self.block_size - (context - 1))
        if extra <= 0:
            return 0
        self.blocks.used_blocks += blocks_for(context - 1 + extra, self.block_size) - held
        self._leave_decoding(seq)
        seq.output_tokens += extra
        self._enter_decoding(seq)
        return extra

    def _continue_prefills(
        self, budget: int, prefills: list[PrefillChunk], preempted: list[Sequence]
    ) -> int:
        blocks = self.blocks
        pending = list(self._prefilling)
        for index, seq in enumerate(pending):
            if budget <= 0:
                break
            if seq.status is not Status.PREFILLING:
                continue  # preempted earlier in this loop
            chunk = min(seq.target_tokens - seq.computed_tokens, budget)
            need = blocks_for(seq.computed_tokens + chunk, self.block_size) - seq.blocks
            while need > blocks.total_blocks - blocks.used_blocks:
                # Victims: this sequence or a later, not yet scheduled, partial prefill
                # (decodes of this step are already committed).
                candidates = [s for s in pending[index:] if s.status is Status.PREFILLING]
                victim = max(candidates, key=_priority_key)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.PREFILLING:
                continue
            blocks.used_blocks += need
            seq.blocks += need
            prefills.append((seq, chunk, seq.computed_tokens))
            budget -= chunk
        return budget

    def _admit(self, budget: int, prefills: list[PrefillChunk]) -> None:
        waiting = self._waiting
        blocks = self.blocks
        room = self.max_running - self.reserved_seqs - len(self._prefilling) - len(self._decoding)
        full_budget = self.max_batched_tokens - self.reserved_seqs * self.decode_tokens_per_seq
        while waiting and room > 0 and budget > 0:
            seq = waiting[0][1]
            if seq.status is not Status.WAITING:
                heapq.heappop(waiting)  # aborted while waiting
                continue
            remaining = seq.target_tokens - seq.computed_tokens
            if remaining <= budget:
                chunk = remaining
            elif self.chunked_prefill or remaining > full_budget:
                # Without chunked prefill only a recomputed prompt longer than any step's
                # budget gets here; splitting it is the only way it can ever run.
                chunk = budget
            else:
                break  # the whole prompt waits for an emptier step
            need = blocks_for(seq.computed_tokens + chunk, self.block_size) - seq.blocks
            if need > blocks.total_blocks - blocks.used_blocks:
                break
            heapq.heappop(waiting)
            self._num_waiting -= 1
            blocks.used_blocks += need
            seq.blocks += need
            seq.status = Status.PREFILLING
            self._prefilling[seq] = None
            prefills.append((seq, chunk, seq.computed_tokens))
            budget -= chunk
            room -= 1


def _priority_key(seq: Sequence) -> tuple[int, float, int]:
    return seq.key
