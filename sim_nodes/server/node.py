"""One simulated replica's runtime: deployment, engine, metrics, seeded random streams.

`Node` is built from a `NodeConfig` (configuration errors surface here, before serving) and
started/stopped by the app's lifespan, or by tests through `running(app)`.
"""

from __future__ import annotations

import logging
import random
import time

from ..catalogs import Catalog, ModelProfile, default_catalog
from ..engine.clock import Clock, MonotonicClock
from ..engine.engine import Background, Engine
from ..engine.realtime import RealtimeEngine
from ..perf import Deployment, build_deployment, layered_catalog
from .config import NodeConfig
from .faults import FaultInjector
from .logs import log_event
from .metrics import NodeMetrics

__all__ = ["Node"]


class Node:
    """The state every route shares."""

    def __init__(
        self, config: NodeConfig, *, clock: Clock | None = None, catalog: Catalog | None = None
    ) -> None:
        self.config = config
        self.names = config.names
        self.clock: Clock = clock or MonotonicClock()
        serving = config.serving
        # The pool's inline profiles (if any) join the catalog before any name is looked up.
        catalog = layered_catalog(serving, catalog or default_catalog())
        self.deployment: Deployment = build_deployment(
            serving, catalog, kv_tokens=_sizing_kv_tokens(config, catalog)
        )
        background = None
        if config.background_sequences > 0:
            background = Background(
                config.background_sequences,
                config.background_context_tokens,
                config.background_turn_input_tokens,
                config.background_turn_output_tokens,
            )
        self.engine = Engine(
            self.deployment,
            serving.batching.to_batching(),
            block_size=config.block_size,
            background=background,
            seed=config.seed,
        )
        self.realtime = RealtimeEngine(self.engine, clock=self.clock, on_failure=_engine_failed)
        self.metrics = NodeMetrics(self.names[0])
        self.metrics.attach_engine(self.engine)
        self.faults = FaultInjector(
            config.failure_rate,
            random.Random(f"{config.seed}:faults"),
            header_enabled=config.fault_header_enabled,
        )
        self._requests = 0
        self.ready = False
        self.started = int(time.time())

    @property
    def model(self) -> ModelProfile:
        return self.deployment.model

    @property
    def healthy(self) -> bool:
        """False once the engine's step loop has failed: nothing would be served again, so
        `/health` says so and the pod's liveness probe restarts it."""
        return self.realtime.failure is None

    def request_rng(self, request_seed: int | None) -> random.Random:
        """The random stream of the next request: from its own `seed`, else the node's."""
        self._requests += 1
        if request_seed is not None:
            return random.Random(f"request:{request_seed}")
        return random.Random(f"{self.config.seed}:{self._requests}")

    async def start(self) -> None:
        """Start the engine's driver task; the node is ready once it runs."""
        await self.realtime.start()
        self.ready = True

    async def stop(self) -> None:
        """Stop taking requests, then stop the engine (open streams end as aborted)."""
        self.ready = False
        await self.realtime.stop()


def _sizing_kv_tokens(config: NodeConfig, catalog: Catalog) -> int:
    """KV tokens `chips: auto` must hold besides the weights.

    A pipeline layout (SRAM chips) holds the KV cache in the same scarce memory as the
    weights, so a full batch of `sizing_tokens_per_sequence` each is provisioned; a
    tensor-parallel layout takes the fewest chips that hold the weights and one sequence of the
    whole context (`build_deployment`; the KV cache gets what is left), as vLLM needs.
    """
    accelerator = catalog.accelerator(config.serving.hardware())
    if accelerator.layout != "pipeline":
        return 0
    return config.serving.batching.max_num_seqs * config.sizing_tokens_per_sequence


def _engine_failed(error: str) -> None:
    log_event("engine_failed", logging.ERROR, error=error, action="reporting unhealthy")
