"""The batching engine: continuous batching (vLLM V1 style) timed by the performance model.

`Engine` is pure (the caller says when each step starts); `RealtimeEngine` drives it on a
clock and streams tokens to asyncio readers; `simulate` runs replicas in virtual time.
"""

from .clock import Clock, MonotonicClock, SleepingClock, VirtualClock
from .engine import Background, Engine, StepOutcome, StepSummary
from .errors import EngineCapacityError, EngineError, EngineStoppedError
from .kv_blocks import DEFAULT_BLOCK_SIZE, BlockAllocator, blocks_for
from .realtime import RealtimeEngine, RequestStream, TokenEvent
from .request import EngineRequest
from .scheduler import Completion, ScheduledBatch, Scheduler

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "Background",
    "BlockAllocator",
    "Clock",
    "Completion",
    "Engine",
    "EngineCapacityError",
    "EngineError",
    "EngineRequest",
    "EngineStoppedError",
    "MonotonicClock",
    "RealtimeEngine",
    "RequestStream",
    "ScheduledBatch",
    "Scheduler",
    "SleepingClock",
    "StepOutcome",
    "StepSummary",
    "TokenEvent",
    "VirtualClock",
    "blocks_for",
]
